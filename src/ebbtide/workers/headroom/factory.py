"""Open a headroom source from its command-line spelling (``--headroom``).

Accepted forms:

- ``nvml`` — measure the real GPUs (devices come from NVML; ``--devices`` is ignored);
- ``static`` — no online usage at all;
- ``static:COMPUTE%,MEM`` — a fixed online usage on every device, e.g. ``static:20%,8GiB``;
- ``trace:PATH`` — replay a trace CSV (``.csv`` or ``.csv.gz``); a bare file name that is
  not found is looked up among the traces shipped with ebbtide (``trace:genai_sample.csv``);
- ``trace:PATH@10x`` — the same, ten times faster than recorded.  Once a trace ended
  its last row holds (a spike replayed in a test stays), and the source logs a warning
  once, so a flat line is not taken for the trace;
- ``prometheus:URL`` — NVIDIA DCGM exporter figures, for planning only, from a Prometheus
  server (``prometheus:http://HOST:9090``) or the exporter itself
  (``prometheus:http://HOST:9400/metrics``), optionally with ``?LABEL=VALUE`` selectors
  (devices come from DCGM; ``--devices`` is ignored).

For ``static`` and ``trace`` the devices are the ``--devices`` list; without one,
``static`` has one 80 GiB device and ``trace`` as many 80 GiB devices as the trace names.
"""

from __future__ import annotations

import re

from ebbtide.shipped import shipped_or_path
from ebbtide.units import parse_memory_mib
from ebbtide.workers.devices import DEFAULT_DEVICE_MEMORY_MIB
from ebbtide.workers.headroom.base import DeviceInfo, HeadroomSource
from ebbtide.workers.headroom.nvml import NvmlSource
from ebbtide.workers.headroom.prometheus import PrometheusSource
from ebbtide.workers.headroom.static import StaticSource
from ebbtide.workers.headroom.trace import TraceSource

HEADROOM_FORMS = (
    "nvml, static, static:COMPUTE%,MEM (e.g. static:20%,8GiB), trace:PATH, trace:PATH@10x "
    "or prometheus:URL"
)

_SPEEDUP_RE = re.compile(r"^(?P<path>.+)@(?P<speedup>\d+(?:\.\d+)?)[xX]?$")


def _bad(spec: str, why: str) -> ValueError:
    return ValueError(f"--headroom {spec!r}: {why}; expected {HEADROOM_FORMS}")


def _default_devices() -> list[DeviceInfo]:
    return [DeviceInfo(index=0, memory_mib=DEFAULT_DEVICE_MEMORY_MIB)]


def _parse_static(spec: str, arg: str) -> tuple[float, int]:
    """``20%,8GiB`` → ``(20.0, 8192)``."""
    parts = [p.strip() for p in arg.split(",")]
    if len(parts) != 2:
        raise _bad(spec, "static needs a compute share and a memory size")
    compute_text, memory_text = parts
    try:
        compute_pct = float(compute_text.removesuffix("%"))
    except ValueError:
        raise _bad(spec, f"cannot read the compute share {compute_text!r}") from None
    if not 0.0 <= compute_pct <= 100.0:
        raise _bad(spec, f"the compute share must be in [0%, 100%], got {compute_text!r}")
    if memory_text.replace(".", "", 1).isdigit():
        raise _bad(spec, f"the memory {memory_text!r} needs a unit (e.g. 8GiB)")
    try:
        memory_mib = parse_memory_mib(memory_text)
    except ValueError as exc:
        raise _bad(spec, f"memory: {exc}") from None
    return compute_pct, memory_mib


def open_source(
    spec: str,
    devices: list[DeviceInfo] | None,
    *,
    speedup: float = 1.0,
    loop: bool = False,
    node: str | None = None,
) -> HeadroomSource:
    """Open the headroom source ``spec`` names (see the module doc).

    ``speedup`` and ``loop`` apply to traces (``loop`` True: start over once the trace
    ended, as ``ebb demo`` does); a ``@Nx`` suffix in the spec overrides ``speedup``.
    ``node`` is this node's name: a Prometheus server is asked for the series whose
    ``Hostname`` is it, unless the spec names selectors of its own.
    Raises ``ValueError`` naming the accepted forms on a bad spec.
    """
    text = spec.strip()
    kind, sep, arg = text.partition(":")
    kind = kind.strip().lower()
    if kind == "nvml" and not sep:
        return NvmlSource()
    if kind == "static":
        if not sep:
            return StaticSource(devices or _default_devices(), steady=True)
        compute_pct, memory_mib = _parse_static(spec, arg)
        return StaticSource(devices or _default_devices(), compute_pct, memory_mib, steady=True)
    if kind == "trace" and arg.strip():
        path_text = arg.strip()
        m = _SPEEDUP_RE.match(path_text)
        if m:
            path_text = m.group("path")
            speedup = float(m.group("speedup"))
            if speedup <= 0:
                raise _bad(spec, "the speed-up must be positive")
        return TraceSource(shipped_or_path(path_text), devices, speedup=speedup, loop=loop)
    if kind == "trace":
        raise _bad(spec, "trace needs a file path")
    if kind == "prometheus":
        return PrometheusSource(arg.strip(), node_labels={"Hostname": node} if node else None)
    raise _bad(spec, "unknown headroom source")
