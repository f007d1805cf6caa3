"""No module in ``src/ebbtide`` over ``MAX_LINES`` lines without a reason written at its top.

A module holds one concept and stays a few hundred lines long; one that is longer says
why in its docstring, in a paragraph that starts with ``MARKER`` (see
``ebbtide/workers/agent.py``): "(Longer than our modules should be: it is the one loop
that owns the attempts' processes, ...)".  The reason must be within the docstring's
first ``REASON_WITHIN_LINES`` lines, where a reader opening the file sees it.  A module
that holds more than one concept is split instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ebbtide

SRC = Path(ebbtide.__file__).resolve().parent

#: Longest a module may be without a reason, in lines.
MAX_LINES = 400
#: The phrase that opens the reason.
MARKER = "Longer than our modules should be"
#: How far into the docstring the reason must start, in lines.
REASON_WITHIN_LINES = 40


def long_modules() -> dict[str, int]:
    """Every module over ``MAX_LINES`` lines, with its length, by path under ``src``."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            found[str(path.relative_to(SRC.parent))] = lines
    return found


def has_reason(path: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False) or ""
    return MARKER in "\n".join(doc.splitlines()[:REASON_WITHIN_LINES])


def test_long_modules_say_why() -> None:
    missing = [
        f"{name} ({lines} lines)"
        for name, lines in long_modules().items()
        if not has_reason(SRC.parent / name)
    ]
    assert not missing, (
        f"over {MAX_LINES} lines with no reason at the top of the docstring "
        f"({MARKER!r}...): split them, or say why they are one concept:\n" + "\n".join(missing)
    )


def test_the_check_sees_a_reason(tmp_path: Path) -> None:
    body = "x = 1\n" * (MAX_LINES + 1)
    with_reason = tmp_path / "with_reason.py"
    with_reason.write_text(f'"""Summary.\n\n({MARKER}: one concept.)\n"""\n\n{body}')
    without = tmp_path / "without.py"
    without.write_text(f'"""Summary."""\n\n{body}')
    late = tmp_path / "late.py"
    late.write_text('"""Summary.\n' + "\n" * REASON_WITHIN_LINES + f'({MARKER}.)\n"""\n{body}')
    assert has_reason(with_reason)
    assert not has_reason(without)
    assert not has_reason(late)
