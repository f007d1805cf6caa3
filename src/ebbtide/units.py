"""Parsers for the quantities users write: memory sizes, durations, GPU shares, signals.

Each parser raises ``ValueError`` with a message that names the allowed forms; callers
wrap it into a :class:`~ebbtide.errors.SpecError` naming the field.
"""

from __future__ import annotations

import re
import signal

_MEM_UNITS_MIB = {
    "": 1 / (1024 * 1024),  # bare numbers are bytes
    "b": 1 / (1024 * 1024),
    "k": 1 / 1024,
    "kb": 1000 / (1024 * 1024),
    "kib": 1 / 1024,
    "m": 1,
    "mb": 1_000_000 / (1024 * 1024),
    "mib": 1,
    "g": 1024,
    "gb": 1_000_000_000 / (1024 * 1024),
    "gib": 1024,
    "t": 1024 * 1024,
    "tb": 1_000_000_000_000 / (1024 * 1024),
    "tib": 1024 * 1024,
}
_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")

MEMORY_FORMS = "a size like 4GiB, 512MiB, 16GB or a byte count"
DURATION_FORMS = "a duration like 30s, 5m, 2h, 1.5s, 02:00:00 or 90 (seconds)"
GPU_FORMS = "a share of one GPU (25%, 0.25) or a whole number of GPUs (1, 2)"


def parse_memory_mib(text: str | int | float) -> int:
    """Parse a memory size into MiB (rounded up).  Bare numbers are bytes, as in PBS."""
    if isinstance(text, bool):
        raise ValueError(f"expected {MEMORY_FORMS}, got {text!r}")
    if isinstance(text, int | float):
        value, unit = float(text), ""
    else:
        m = _MEM_RE.match(text)
        if not m:
            raise ValueError(f"expected {MEMORY_FORMS}, got {text!r}")
        value, unit = float(m.group(1)), m.group(2).lower()
    if unit not in _MEM_UNITS_MIB:
        raise ValueError(f"unknown unit {unit!r}; expected {MEMORY_FORMS}")
    mib = value * _MEM_UNITS_MIB[unit]
    if mib < 0:
        raise ValueError("must not be negative")
    return max(0, int(-(-mib // 1)))


def format_mib(mib: float) -> str:
    """Format MiB for people: ``81920`` → ``80GiB``, ``1536`` → ``1.5GiB``."""
    if mib >= 1024:
        gib = mib / 1024
        return f"{gib:g}GiB" if gib == round(gib, 1) else f"{gib:.1f}GiB"
    return f"{mib:g}MiB"


_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$")
_DUR_UNITS_S = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration_s(text: str | int | float) -> float:
    """Parse a duration into seconds: ``30s``, ``5m``, ``2h``, ``HH:MM:SS``, ``MM:SS``, ``90``."""
    if isinstance(text, bool):
        raise ValueError(f"expected {DURATION_FORMS}, got {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError("must not be negative")
        return float(text)
    if ":" in text:
        parts = text.strip().split(":")
        if len(parts) > 3 or not all(re.fullmatch(r"\d+(\.\d+)?", p) for p in parts):
            raise ValueError(f"expected {DURATION_FORMS}, got {text!r}")
        seconds = 0.0
        for part in parts:
            seconds = seconds * 60 + float(part)
        return seconds
    m = _DUR_RE.match(text)
    if not m:
        raise ValueError(f"expected {DURATION_FORMS}, got {text!r}")
    return float(m.group(1)) * _DUR_UNITS_S[m.group(2)]


def parse_gpu(text: str | int | float) -> tuple[float, int]:
    """Parse a GPU request into ``(compute_pct, whole_gpus)``.

    ``25%`` and ``0.25`` are a quarter of one GPU → ``(25.0, 0)``; ``1`` and ``2`` are
    whole GPUs → ``(100.0, 1)`` and ``(100.0, 2)`` (compute per device).
    """
    if isinstance(text, bool):
        raise ValueError(f"expected {GPU_FORMS}, got {text!r}")
    raw = str(text).strip()
    try:
        if raw.endswith("%"):
            pct = float(raw[:-1])
            if not 0 < pct <= 100:
                raise ValueError(f"a percentage must be in (0, 100], got {raw!r}")
            return (100.0, 1) if pct == 100 else (pct, 0)
        value = float(raw)
    except ValueError as exc:
        if "percentage" in str(exc):
            raise
        raise ValueError(f"expected {GPU_FORMS}, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"must be positive; expected {GPU_FORMS}")
    if value < 1:
        return value * 100.0, 0
    if value != int(value):
        raise ValueError(f"more than one GPU must be a whole number; expected {GPU_FORMS}")
    return 100.0, int(value)


def parse_signal(text: str | int) -> int:
    """Parse a signal name or number: ``USR1``, ``SIGUSR1``, ``10``."""
    if isinstance(text, int) and not isinstance(text, bool):
        try:
            return int(signal.Signals(text))
        except ValueError:
            raise ValueError(f"unknown signal number {text}") from None
    name = str(text).strip().upper()
    if name.isdigit():
        return parse_signal(int(name))
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise ValueError(f"unknown signal {text!r}; expected a name like TERM, USR1, INT") from None


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name.removeprefix("SIG")
