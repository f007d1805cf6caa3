"""Checks of what callers hand the SDK: ids and counts in bounds, names to filter on.

Both clients (the store's and ``ebb server``'s) check before they use a value, so a bad
one is a :class:`SpecError` naming the argument, never a database error or a bad URL.
"""

from __future__ import annotations

import operator
from typing import Any

from ebbtide.errors import SpecError
from ebbtide.units import MAX_INT64, shown


def whole(value: Any, name: str, low: int = 1, high: int = MAX_INT64) -> int:
    """An int argument from ``low`` to ``high`` (ids: what the store holds), else a
    :class:`SpecError` naming the argument and the bounds."""
    try:
        number = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        number = None
    if number is None:
        raise SpecError(name, f"expected a whole number (an int), got {shown(value)}")
    if not low <= number <= high:
        raise SpecError(name, f"must be from {low} to {high}, got {number}")
    return number


def flag(value: Any, name: str) -> bool:
    """A bool argument (not merely something truthy), else a :class:`SpecError`."""
    if not isinstance(value, bool):
        raise SpecError(name, f"expected True or False, got {shown(value)}")
    return value


#: Longest user or queue name a filter takes, in characters.
MAX_FILTER_CHARS = 256


def text(value: Any, name: str, *, max_chars: int, empty: bool = False) -> str:
    """A string of at most ``max_chars`` (not empty unless ``empty``) that a database
    takes (no NUL byte, valid UTF-8), else a :class:`SpecError`."""
    if (
        not isinstance(value, str)
        or len(value) > max_chars
        or (not value and not empty)
        or "\0" in value
    ):
        low = 0 if empty else 1
        raise SpecError(
            name, f"expected text of {low}-{max_chars} characters, no NUL, got {shown(value)}"
        )
    try:
        value.encode()
    except UnicodeEncodeError:
        raise SpecError(name, "is not valid UTF-8 text") from None
    return value


def filter_name(value: Any, name: str) -> str | None:
    """A user or queue name to filter on (None: no filter), else a :class:`SpecError`."""
    return None if value is None else text(value, name, max_chars=MAX_FILTER_CHARS)
