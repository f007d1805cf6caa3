"""A stand-in ``libnvidia-ml.so.1`` (``nvml_stub.c``) under the real nvidia-ml-py bindings.

:meth:`NvmlStub.build` compiles ``nvml_stub.c`` with the C compiler (``$CC``, else ``cc``)
into a directory and loads it; from then on ``import pynvml`` in this process talks to
it, since pynvml opens ``libnvidia-ml.so.1`` by that name and the stub's soname is that
name (already loaded, so the dynamic linker looks no further).  Load it before anything
calls ``pynvml.nvmlInit()``: a process whose pynvml already opened a library keeps it.

The machine is declared through the stub: ``reset`` (GPUs, memory, what no process
owns), ``set_process`` / ``remove_process`` (what the driver lists on a GPU, with its
share of the SMs in per-process samples), ``set_utilization``; ``set_call_cost`` makes
every NVML call spend that long in C (busy, or asleep), and ``calls`` counts them by entry point.

Used by ``agent_overhead.py --nvml stub`` (the node agent over pynvml's own Python) and by
``tests/integration/test_nvml_stub.py`` (``NvmlSource`` over the real bindings).
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("nvml_stub.c")
SONAME = "libnvidia-ml.so.1"
MIB_B = 1024 * 1024


class StubUnavailable(RuntimeError):
    """The stub cannot be built or loaded here (no C compiler, or NVML already open)."""


class NvmlStub:
    """The loaded stub library and its ``ebbstub_*`` controls."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        lib = self._lib
        lib.ebbstub_reset.argtypes = [ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong]
        lib.ebbstub_set_process.argtypes = [
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_ulonglong,
            ctypes.c_uint,
        ]
        lib.ebbstub_remove_process.argtypes = [ctypes.c_int, ctypes.c_uint]
        lib.ebbstub_set_utilization.argtypes = [ctypes.c_int, ctypes.c_uint]
        lib.ebbstub_set_call_cost_ns.argtypes = [ctypes.c_longlong, ctypes.c_int]
        lib.ebbstub_calls.argtypes = [ctypes.c_char_p]
        lib.ebbstub_calls.restype = ctypes.c_longlong
        lib.ebbstub_call_name.argtypes = [ctypes.c_int]
        lib.ebbstub_call_name.restype = ctypes.c_char_p

    @classmethod
    def build(cls, directory: Path) -> NvmlStub:
        """Compile the stub into ``directory`` and load it into this process."""
        _check_pynvml_not_open()
        compiler = shlex.split(os.environ.get("CC", "cc"))
        if not compiler or shutil.which(compiler[0]) is None:
            raise StubUnavailable(
                f"no C compiler ({' '.join(compiler) or '$CC'}) to build {SOURCE.name}: "
                "install one (e.g. gcc) or set CC"
            )
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / SONAME
        cmd = [
            *compiler,
            "-O2",
            "-shared",
            "-fPIC",
            f"-Wl,-soname,{SONAME}",
            "-o",
            str(path),
            str(SOURCE),
            "-lpthread",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise StubUnavailable(f"building {SOURCE.name} failed:\n{proc.stderr.strip()}")
        return cls(path)

    def reset(self, gpus: int, memory_mib: float, *, reserved_mib: float = 0) -> None:
        """``gpus`` GPUs of ``memory_mib``, each holding ``reserved_mib`` no process owns;
        no process, 0 % utilisation; the call counts back to zero."""
        if self._lib.ebbstub_reset(gpus, int(memory_mib * MIB_B), int(reserved_mib * MIB_B)):
            raise ValueError(f"cannot declare {gpus} GPUs of {memory_mib} MiB ({reserved_mib})")

    def set_process(self, gpu: int, pid: int, memory_mib: float, sm_pct: float) -> None:
        """List ``pid`` on ``gpu`` (or change it), holding ``memory_mib`` and using
        ``sm_pct`` of the SMs in its per-process samples."""
        if self._lib.ebbstub_set_process(gpu, pid, int(memory_mib * MIB_B), round(sm_pct)):
            raise ValueError(f"cannot list process {pid} on GPU {gpu}")

    def remove_process(self, gpu: int, pid: int) -> None:
        if self._lib.ebbstub_remove_process(gpu, pid):
            raise ValueError(f"process {pid} is not listed on GPU {gpu}")

    def set_utilization(self, gpu: int, pct: float) -> None:
        if self._lib.ebbstub_set_utilization(gpu, round(pct)):
            raise ValueError(f"cannot set GPU {gpu}'s utilisation to {pct}")

    def set_call_cost(self, seconds: float, wait: str = "busy") -> None:
        """Every NVML call takes at least ``seconds``, spent ``busy`` or ``sleep``-ing."""
        if seconds < 0 or wait not in ("busy", "sleep"):
            raise ValueError(f"a call's cost: seconds ≥ 0, busy or sleep; got {seconds}, {wait!r}")
        self._lib.ebbstub_set_call_cost_ns(round(seconds * 1e9), wait == "sleep")

    def calls(self) -> dict[str, int]:
        """Calls of each entry point since the last ``reset`` (those called only)."""
        counts: dict[str, int] = {}
        for i in range(self._lib.ebbstub_call_count()):
            name = self._lib.ebbstub_call_name(i)
            n = int(self._lib.ebbstub_calls(name))
            if n:
                counts[name.decode()] = n
        return counts


def _check_pynvml_not_open() -> None:
    import pynvml

    if pynvml.nvmlLib is not None:
        raise StubUnavailable(
            f"pynvml has already opened {pynvml.nvmlLib}: load the stub before nvmlInit()"
        )
