"""Parsers for the quantities users write: memory sizes, durations, GPU shares, signals,
ids; and the bounds every such number is held to.

Each parser raises ``ValueError`` with a message that names the allowed forms (or the
bound that was passed); callers wrap it into a :class:`~ebbtide.errors.SpecError` naming
the field.  Numbers are written in ASCII digits only, never with an exponent, ``inf`` or
``nan``, and every parser refuses values past its bound before they reach the store
(64-bit signed integers) or a timer.
"""

from __future__ import annotations

import math
import re
import signal
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

#: The largest integer the store keeps (a signed 64-bit column in SQLite and
#: PostgreSQL): no job id may be larger.
MAX_INT64 = 2**63 - 1
#: The longest duration anything may give, in seconds (366 days): far below where
#: dates and timers overflow, and longer than any job or window means.
MAX_DURATION_S = 366 * 86400.0
#: The most GPU memory one device may have or one job may ask for, in MiB (1 TiB).
MAX_MEMORY_MIB = 1024 * 1024
#: The most whole GPUs one job may ask for.
MAX_GPUS = 64
#: The finest GPU share, in percent of one GPU: shares are given to two decimals.
GPU_SHARE_STEP_PCT = 0.01
#: Longest text a number may be written in, in characters (a 1 TiB byte count has 13
#: digits; longer text is a mistake, and ``int()`` refuses past 4300 digits anyway).
MAX_NUMBER_CHARS = 64
#: The signals a job may be warned with: catchable, sent only by another process, and
#: ending a job that ignores them.  The attempt shim (``workers/shim.py``) ignores exactly
#: these, so a warning reaches the job and never ends the shim.
WARNING_SIGNALS = ("TERM", "INT", "HUP", "USR1", "USR2", "QUIT", "ALRM", "XCPU")

#: MiB per unit.  ``kb``, ``mb``, ``gb`` and ``tb`` are powers of 1024, as PBS (``mem=``)
#: and Slurm (``--mem``) read them and as a GPU's "80GB" is meant: one reading wherever
#: a size is given (``-l``, the SDK, policy files, ``--devices``); a trial found ``4GB``
#: 4096 MiB in ``-l`` and 3815 MiB through the SDK.
_MEM_UNITS_MIB = {
    "": 1 / (1024 * 1024),  # 0 only: other bare numbers are refused
    "b": 1 / (1024 * 1024),
    "k": 1 / 1024,
    "kb": 1 / 1024,
    "kib": 1 / 1024,
    "m": 1,
    "mb": 1,
    "mib": 1,
    "g": 1024,
    "gb": 1024,
    "gib": 1024,
    "t": 1024 * 1024,
    "tb": 1024 * 1024,
    "tib": 1024 * 1024,
}
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_MEM_RE = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Z]*)\s*")

MEMORY_FORMS = "a size with a unit, like 4GiB, 512MiB or 16GB"
DURATION_FORMS = "a duration like 30s, 5m, 2h, 1.5s, 02:00:00, 1:00:00:00 or 90 (seconds)"
GPU_FORMS = "a share of one GPU (25%, 0.25) or a whole number of GPUs (1, 2)"


def shown(value: object, limit: int = 40) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters (``'9999…'``)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    closing = text[-1] if text[-1] in "'\"" else ""
    return text[: limit - 1 - len(closing)] + "…" + closing


def _text(text: object, forms: str) -> str:
    """``text`` as a string no longer than a number can be, else a ``ValueError``."""
    if not isinstance(text, str):
        raise ValueError(f"expected {forms}, got {type(text).__name__} {shown(text)}")
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"expected {forms}, got {len(text)} characters")
    return text


def _finite(value: int | float, forms: str) -> float:
    """A real number as a finite float (``ValueError`` for inf, nan and huge ints)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected {forms}, got {shown(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"expected {forms}, got {shown(value)} (not a finite number)")
    return number


def parse_int(text: str | int, low: int, high: int, what: str = "a whole number") -> int:
    """A whole number from ``low`` to ``high`` written in ASCII digits (a sign allowed)."""
    expected = f"expected {what} from {low} to {high}"
    if isinstance(text, int) and not isinstance(text, bool):
        number = text
    elif isinstance(text, str) and re.fullmatch(r"\s*[+-]?[0-9]{1,30}\s*", text):
        number = int(text)
    else:
        raise ValueError(f"{expected}, got {shown(text)}")
    if not low <= number <= high:
        raise ValueError(f"{expected}, got {shown(text)}")
    return number


def parse_memory_mib(text: str | int | float) -> int:
    """Parse a memory size into MiB (rounded up): a number with a unit (``4GiB``,
    ``512MiB``, ``16GB``, ``4g``; every unit a power of 1024, ``GB`` as ``GiB``).  A bare
    number other than 0 is refused: PBS reads it as bytes, Slurm as MB, a person often as
    GiB, so no reading of it is safe.  (Fields whose name gives the unit, like the
    policy's ``*_mib``, take bare numbers as MiB.)

    At most :data:`MAX_MEMORY_MIB` (1 TiB).
    """
    if isinstance(text, str):
        m = _MEM_RE.fullmatch(_text(text, MEMORY_FORMS))
        if not m:
            raise ValueError(f"expected {MEMORY_FORMS}, got {text!r}")
        value, unit = float(m.group(1)), m.group(2).lower()
    else:
        value, unit = _finite(text, MEMORY_FORMS), ""
    if unit == "" and value != 0:
        raise ValueError(
            f"{shown(text)} needs a unit, like 4GiB, 512MiB or 16GB (a bare number is "
            "bytes to PBS, MB to Slurm and GiB to many people, so it is not guessed)"
        )
    if unit not in _MEM_UNITS_MIB:
        raise ValueError(f"unknown unit {unit!r}; expected {MEMORY_FORMS}")
    mib = value * _MEM_UNITS_MIB[unit]
    if mib < 0:
        raise ValueError("must not be negative")
    if mib > MAX_MEMORY_MIB:
        raise ValueError(f"must be at most 1TiB ({MAX_MEMORY_MIB} MiB), got {shown(text)}")
    return max(0, int(-(-mib // 1)))


def format_mib(mib: float) -> str:
    """Format MiB for people: ``81920`` → ``80GiB``, ``1536`` → ``1.5GiB``."""
    if mib >= 1024:
        gib = mib / 1024
        return f"{gib:g}GiB" if gib == round(gib, 1) else f"{gib:.1f}GiB"
    return f"{mib:g}MiB"


_DUR_RE = re.compile(rf"\s*({_NUMBER})\s*(ms|s|m|min|h|d)?\s*")
#: The fields of ``DD:HH:MM:SS``, each with how many of it make one of the field before.
CLOCK_FIELDS = (("days", 1), ("hours", 24), ("minutes", 60), ("seconds", 60))
_DUR_UNITS_S = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def clock_value(text: str, parts: Sequence[str], fields: Sequence[tuple[str, int]]) -> float:
    """``parts`` (the numbers of ``text``) read as the clock ``fields`` (of
    :data:`CLOCK_FIELDS`), in units of the last: the first field that is not zero may run
    past its clock (``25:00:00``, ``90:00``, ``00:00:60``), none after it may (minutes and
    seconds 0-59, hours 0-23 after days: ``25:99:00`` is a ``ValueError``)."""
    value = 0.0
    for part, (name, base) in zip(parts, fields, strict=True):
        if value and float(part) >= base:
            raise ValueError(f"{name} must be 0-{base - 1} in {text.strip()!r}, got {part} {name}")
        value = value * base + float(part)
    return value


def parse_duration_s(text: str | int | float) -> float:
    """Parse a duration into seconds: ``30s``, ``5m``, ``2h``, ``HH:MM:SS``, ``MM:SS``,
    ``DD:HH:MM:SS``, ``90``.  In the clock forms the first field that is not zero may run
    past its clock (``25:00:00``, ``90:00``, ``00:00:60``, as PBS takes them) but none
    after it may: there minutes and seconds are 0-59 and hours 0-23, so ``25:99:00`` is
    refused, not read as 26:39:00.

    At most :data:`MAX_DURATION_S` (366 days).
    """
    if not isinstance(text, str):
        seconds = _finite(text, DURATION_FORMS)
        if seconds < 0:
            raise ValueError("must not be negative")
    elif ":" in _text(text, DURATION_FORMS):
        parts = text.strip().split(":")
        if len(parts) > 4 or not all(re.fullmatch(_NUMBER, p) for p in parts):
            raise ValueError(f"expected {DURATION_FORMS}, got {text!r}")
        # DD:HH:MM:SS (Torque's walltime): the first of four counts days
        seconds = clock_value(text, parts, CLOCK_FIELDS[-len(parts) :])
    else:
        m = _DUR_RE.fullmatch(text)
        if not m:
            raise ValueError(f"expected {DURATION_FORMS}, got {text!r}")
        seconds = float(m.group(1)) * _DUR_UNITS_S[m.group(2)]
    if seconds > MAX_DURATION_S:
        raise ValueError(f"must be at most 366 days ({MAX_DURATION_S:.0f}s), got {shown(text)}")
    return seconds


_GPU_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(%?)\s*")


def parse_gpu(text: str | int | float) -> tuple[float, int]:
    """Parse a GPU request into ``(compute_pct, whole_gpus)``.

    ``25%`` and ``0.25`` are a quarter of one GPU → ``(25.0, 0)``; ``1`` and ``2`` are
    whole GPUs → ``(100.0, 1)`` and ``(100.0, 2)`` (compute per device).  A share is in
    (0, 100] percent to :data:`GPU_SHARE_STEP_PCT` (two decimals of a percent); a count
    is at most :data:`MAX_GPUS`.
    """
    if isinstance(text, str):
        m = _GPU_RE.fullmatch(_text(text, GPU_FORMS))
        if not m:
            raise ValueError(f"expected {GPU_FORMS}, got {text!r}")
        raw, percent = m.group(1), bool(m.group(2))
        try:
            value = Decimal(raw)
        except InvalidOperation:  # pragma: no cover - the pattern admits decimals only
            raise ValueError(f"expected {GPU_FORMS}, got {text!r}") from None
        if percent:
            if not 0 < value <= 100:
                raise ValueError(f"a percentage must be in (0, 100], got {text.strip()!r}")
            pct = value
        elif value <= 0:
            raise ValueError(f"must be positive; expected {GPU_FORMS}")
        elif value < 1:
            pct = value * 100
        else:
            return 100.0, _whole_gpus(value, text)
        if pct != pct.quantize(Decimal("0.01")):
            raise ValueError(
                f"a share is given to {GPU_SHARE_STEP_PCT:g}% (two decimals of a percent), "
                f"got {text.strip()!r}"
            )
        return (100.0, 1) if pct == 100 else (float(pct), 0)
    number = _finite(text, GPU_FORMS)
    if number <= 0:
        raise ValueError(f"must be positive; expected {GPU_FORMS}")
    if number >= 1:
        return 100.0, _whole_gpus(Decimal(number), text)
    share_pct = round(number * 100, 2)
    if share_pct < GPU_SHARE_STEP_PCT or abs(share_pct - number * 100) > 1e-9:
        raise ValueError(
            f"a share is given to {GPU_SHARE_STEP_PCT:g}% (two decimals of a percent), got {text!r}"
        )
    return share_pct, 0


def _whole_gpus(value: Decimal, text: object) -> int:
    if value != value.to_integral_value():
        raise ValueError(f"more than one GPU must be a whole number; expected {GPU_FORMS}")
    if value > MAX_GPUS:
        raise ValueError(f"at most {MAX_GPUS} whole GPUs, got {shown(text)}")
    return int(value)


def parse_signal(text: str | int) -> int:
    """Parse a signal name or number: ``USR1``, ``SIGUSR1``, ``10``."""
    if isinstance(text, int) and not isinstance(text, bool):
        try:
            return int(signal.Signals(text))
        except ValueError:
            raise ValueError(f"unknown signal number {text}") from None
    if not isinstance(text, str):
        raise ValueError(f"expected a signal name like TERM, USR1, INT, got {shown(text)}")
    name = text.strip().upper()
    if re.fullmatch(r"[0-9]{1,4}", name):
        return parse_signal(int(name))
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise ValueError(
            f"unknown signal {shown(text)}; expected a name like TERM, USR1, INT"
        ) from None


def parse_warning_signal(text: str | int) -> int:
    """Parse the eviction warning signal: one of :data:`WARNING_SIGNALS` (by name or
    number).  KILL and STOP cannot be caught, so they cannot warn; others would end or
    stop the attempt's shim, or mean something else to the job."""
    signum = parse_signal(text)
    name = signal_name(signum)
    if name not in WARNING_SIGNALS:
        raise ValueError(
            f"{name} cannot be a warning signal (a job must be able to catch it); "
            f"use one of {', '.join(WARNING_SIGNALS)}"
        )
    return signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name.removeprefix("SIG")
