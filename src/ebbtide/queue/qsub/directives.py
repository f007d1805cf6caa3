"""Directive lines at the top of a job script (``#EBB``, ``#PBS``, ``#SBATCH``), read
into :class:`~ebbtide.queue.qsub.options.QsubOptions`.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import fields

from ebbtide.errors import SpecError
from ebbtide.queue.qsub.options import _DIRECTIVE_OPTIONS, _LIST_FIELDS, PBS_IGNORED, QsubOptions
from ebbtide.scriptfile import read_script

#: Directive prefixes recognised at the top of a script.
DIRECTIVE_PREFIXES = ("#EBB", "#PBS", "#SBATCH")


def _strip_comment(line: str) -> str:
    """Drop a trailing ``# comment`` (a ``#`` that starts a word, outside quotes)."""
    quote, escaped = "", False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif quote:
            quote = "" if char == quote else quote
        elif char == "\\":
            escaped = True
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def parse_directives(
    script_text: str, *, source: str = "script", prefixes: tuple[str, ...] = ("#EBB", "#PBS")
) -> list[tuple[int, list[str]]]:
    """Find the directive lines (by default ``#EBB`` and ``#PBS``) at the top of a script,
    as ``(lineno, tokens)``.

    Scanning skips an optional ``#!`` first line, blank lines and plain ``#`` comments,
    and stops at the first line that is none of these (the first command), as PBS and
    Slurm do.
    """
    return [
        (lineno, tokens)
        for lineno, prefix, tokens in directive_lines(script_text, source=source)
        if prefix in prefixes
    ]


def directive_lines(
    script_text: str, *, source: str = "script"
) -> list[tuple[int, str, list[str]]]:
    """Every ``#EBB``, ``#PBS`` and ``#SBATCH`` line at the top of a script, as
    ``(lineno, prefix, tokens)`` (see :func:`parse_directives`)."""
    found: list[tuple[int, str, list[str]]] = []
    # lines end at "\n" only, as for the shell (str.splitlines also splits at form feeds
    # and other separators, which would put errors on the wrong line)
    for lineno, line in enumerate(script_text.split("\n"), start=1):
        stripped = line.strip()
        if lineno == 1 and stripped.startswith("#!"):
            continue
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        for prefix in DIRECTIVE_PREFIXES:
            rest = stripped[len(prefix) :]
            if stripped.startswith(prefix) and (not rest or rest[0].isspace()):
                try:
                    tokens = shlex.split(_strip_comment(rest))
                except ValueError as exc:
                    raise SpecError(f"{source} line {lineno}", f"cannot split: {exc}") from None
                if tokens:
                    found.append((lineno, prefix, tokens))
                break
    return found


def parse_directive_tokens(tokens: list[str], where: str) -> QsubOptions:
    """Parse one directive line's options (``-N train -l gpu=1``) into :class:`QsubOptions`.

    Values are checked later, by :func:`build_spec_kwargs`, which names ``where``.
    """
    opts = QsubOptions()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        option, value = token, None
        if token.startswith("--") and "=" in token:
            option, value = token.split("=", 1)
        elif token[:2] in _DIRECTIVE_OPTIONS and len(token) > 2 and not token.startswith("--"):
            option, value = token[:2], token[2:]
        if token[:2] in PBS_IGNORED and not token.startswith("--"):
            option, value = token[:2], token[2:] or None
            takes, why = PBS_IGNORED[option]
            if takes and value is None:
                if i + 1 >= len(tokens):
                    raise SpecError(where, f"{option} needs a value")
                value = tokens[i + 1]
                i += 1
            i += 1
            shown_value = f" {value}" if takes else ""
            opts.notes.append(f"{where}: {option}{shown_value}: accepted, without effect: {why}")
            continue
        if option not in _DIRECTIVE_OPTIONS:
            if token.startswith("-"):
                raise SpecError(where, f"unknown directive option {option}")
            raise SpecError(where, f"unexpected argument {token!r}; directives hold options only")
        name, takes_value = _DIRECTIVE_OPTIONS[option]
        if not takes_value:
            if value is not None:
                raise SpecError(where, f"{option} takes no value")
            if name == "pause":
                opts.pause = option == "--pause"
            elif name == "export":
                opts.export = "ALL"
            else:
                opts.hold = True
            opts.origin[name] = where
            i += 1
            continue
        if value is None:
            if i + 1 >= len(tokens):
                raise SpecError(where, f"{option} needs a value")
            value = tokens[i + 1]
            i += 1
        i += 1
        if name in _LIST_FIELDS:
            entries = getattr(opts, name)
            opts.origin[f"{name}.{len(entries)}"] = where
            entries.append(value)
        else:
            setattr(opts, name, value)
            opts.origin[name] = where
    return opts


def _accumulate(base: QsubOptions, top: QsubOptions) -> QsubOptions:
    """Combine two option sets from one source: later values win, lists append."""
    merged = QsubOptions(origin=dict(base.origin))
    for f in fields(QsubOptions):
        if f.name == "origin":
            continue
        old, new = getattr(base, f.name), getattr(top, f.name)
        if f.name in _LIST_FIELDS:
            setattr(merged, f.name, old + new)
            for i in range(len(new)):
                if f"{f.name}.{i}" in top.origin:
                    merged.origin[f"{f.name}.{len(old) + i}"] = top.origin[f"{f.name}.{i}"]
        elif new is not None and new is not False:
            setattr(merged, f.name, new)
            merged.origin.pop(f"{f.name}.flag", None)  # (the flag that set the old value)
            for key in (f.name, f"{f.name}.flag"):
                if key in top.origin:
                    merged.origin[key] = top.origin[key]
        else:
            setattr(merged, f.name, old)
    return merged


def parse_script_directives(
    script_text: str, *, source: str = "script", dialect: str = "pbs"
) -> QsubOptions:
    """All directive lines of a script as one :class:`QsubOptions` (later lines win).

    ``#EBB`` lines always count.  For ``ebb qsub`` (``dialect`` ``pbs``) the ``#PBS``
    lines do; a script with ``#SBATCH`` lines and no ``#PBS`` line is read as Slurm's.
    For ``ebb sbatch`` (``slurm``) the ``#SBATCH`` lines do.  Lines of the other kind are
    left, with a note saying so.
    """
    from ebbtide.queue import slurm

    lines = directive_lines(script_text, source=source)
    kinds = {prefix for _, prefix, _ in lines}
    if dialect == "pbs" and "#SBATCH" in kinds and "#PBS" not in kinds:
        dialect = "slurm"
    read = "#SBATCH" if dialect == "slurm" else "#PBS"
    opts = QsubOptions(compat=dialect)
    unread = [lineno for lineno, prefix, _ in lines if prefix not in ("#EBB", read)]
    if unread:
        other = "#PBS" if read == "#SBATCH" else "#SBATCH"
        opts.notes.append(
            f"{source} line{'s' if len(unread) > 1 else ''} {', '.join(map(str, unread))}: "
            f"{other} lines not read; this is read as a "
            f"{'Slurm' if dialect == 'slurm' else 'PBS'} script "
            f"({'ebb qsub' if other == '#PBS' else 'ebb sbatch'} reads them)"
        )
    for lineno, prefix, tokens in lines:
        where = f"{source} line {lineno}"
        if prefix == "#EBB":
            line_opts = parse_directive_tokens(tokens, where)
        elif prefix != read:
            continue
        elif prefix == "#SBATCH":
            line_opts = slurm.parse_sbatch_tokens(tokens, where)
        else:
            line_opts = parse_directive_tokens(tokens, where)
        opts = _accumulate(opts, line_opts)
    return opts


def load_script(path: str | os.PathLike[str], *, dialect: str = "pbs") -> tuple[str, QsubOptions]:
    """Read a job script (:func:`~ebbtide.scriptfile.read_script`: errors name ``SCRIPT``);
    return its text and its directives, read as ``dialect``'s (see
    :func:`parse_script_directives`)."""
    text = read_script(path)
    return text, parse_script_directives(text, source=os.fspath(path), dialect=dialect)


def unread_directives_note(script_text: str | None, script_path: str | None) -> list[str]:
    """A note when a job's script holds directive lines that nothing read: its text was
    handed in as it is (the SDK's ``JobSpec(script=text)``), not read from a file as
    qsub and sbatch read it (``script_path`` set), so its ``#PBS -l gpu=...`` changes
    nothing (a trial's trap: the job ran with the defaults, and nothing said so)."""
    if script_text is None or script_path is not None:
        return []
    try:
        lines = directive_lines(script_text)
    except SpecError:  # a line that does not split: not read either way
        return []
    if not lines:
        return []
    lineno, prefix, _ = lines[0]
    return [
        f"script line {lineno}: its {prefix} lines are not read when the script's text is "
        "submitted as it is (they set nothing); JobSpec.from_script(PATH) reads them as "
        "ebb qsub PATH does"
    ]
