"""Running ``ebb`` as a user does, for the benchmarks that time it: the installed script,
an ``ebb server`` on a Unix socket (the thin client's), and percentiles of the times.
(Imported by the benchmark scripts beside it, which run as ``python benchmarks/NAME.py``.)"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path


def ebb_argv() -> list[str]:
    """The installed ``ebb`` script next to this interpreter (as a user runs it)."""
    script = Path(sys.executable).with_name("ebb")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ebbtide.cli.main"]


def serve_socket(env: dict[str, str], sock: Path) -> subprocess.Popen[bytes]:
    """``ebb server --socket SOCK`` on the store of ``env``, once it answers."""
    server = subprocess.Popen(
        [*ebb_argv(), "server", "--socket", str(sock), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    give_up = time.monotonic() + 60
    while True:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(sock))
            return server
        except OSError:
            if server.poll() is not None or time.monotonic() > give_up:
                server.kill()
                why = server.communicate()[1][-500:]
                raise SystemExit(f"ebb server did not start: {why!r}") from None
            time.sleep(0.1)
        finally:
            probe.close()


def stats(prefix: str, times: list[float]) -> dict[str, float]:
    """``PREFIX_p50_s``, ``PREFIX_p99_s`` and ``PREFIX_max_s`` of ``times``."""
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        f"{prefix}_p50_s": round(statistics.median(ordered), 4),
        f"{prefix}_p99_s": round(p99, 4),
        f"{prefix}_max_s": round(ordered[-1], 4),
    }
