"""How fast an attempt's whole process tree can be paused and resumed, on real processes.

The node agent can pause an offline attempt instead of evicting it (online compute rose,
its memory still fits) and resume it when the headroom returns.  This script measures the
two ways to do that on this host, over ``--rounds`` attempts (50):

1. start an attempt through :class:`~ebbtide.workers.executor.LocalExecutor` (below its
   shim) whose job is a process tree like a training job with data-loader workers: a
   Python leader that forks ``--procs`` − 1 workers (4 processes in all by default).  Each
   process bumps a progress counter in a shared file, every ``--step-ms`` (1 ms) with
   ``--work sleep`` or all the time with ``--work busy``; wait until every process runs;
2. **SIGSTOP / SIGCONT**: ``executor.pause(handle)`` (SIGSTOP: it signals every
   descendant of the shim), then poll ``/proc/PID/stat`` of every process of the tree
   until each is stopped (state ``T``): the *freeze* time, from the call.  Hold it
   ``--hold-ms`` (20) and check that no counter moved; ``signal(handle, SIGCONT)`` and
   poll until none is ``T`` (*thaw*), then until every counter moved (*resumed*).  The
   polls spin; ``--poll-us N`` sleeps N µs between looks (a spinning poller takes a CPU
   the processes it waits for may need on a small machine);
3. **cgroup v2 freezer** (``--cgroup``; needs root and a writable cgroup v2 hierarchy:
   ``/sys/fs/cgroup``, or where a hybrid system mounts it), as where an attempt has its
   own cgroup (a pod, a systemd scope): move the tree into a fresh child cgroup of this
   process's own, write ``1`` to its ``cgroup.freeze`` and poll ``cgroup.events`` until
   it says ``frozen 1`` (*freeze*); hold and check as above; write ``0`` and poll until
   ``frozen 0`` (*thaw*, which the kernel says at once), then until every counter moved
   (*resumed*).  Skipped, with the reason, where it cannot work;
4. sweep the attempt (``executor.sweep``), check that none of its processes is left and
   remove the cgroup.

Also timed: the *call* alone (``signal`` lists the shim's descendants from ``/proc`` and
signals each, so its time grows with the processes on the host: ``--extra-procs N``
starts N idle ones for the run; the cgroup write).  Usage (from the repository root)::

    python benchmarks/pause_latency.py [--rounds 50] [--procs 4] [--work sleep|busy]
                                       [--poll-us 0] [--extra-procs 0] [--cgroup]
                                       [--json] [--check]

Prints p50 / p99 / max in milliseconds per method and measure, how many processes were
seen stopped and resumed, and whether the target holds: freeze p99 ≤ 20 ms (for a
4-process tree) for every method measured, every process stopped and resumed.  With
``--json`` exactly one JSON object instead; ``--check`` exits 1 unless the target holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebbtide.workers import shim
from ebbtide.workers.executor import Handle, Launch, LocalExecutor, start_ticks

#: Target: p99 of the freeze time of a 4-process tree, in milliseconds.
TARGET_FREEZE_P99_MS = 20.0
#: How long to wait for an attempt's processes to run, in seconds.
READY_TIMEOUT_S = 10.0
#: How long a freeze or a thaw may take before the run is given up, in seconds.
STATE_TIMEOUT_S = 5.0
#: How long every process gets to make progress again after a thaw, in seconds.
RESUME_TIMEOUT_S = 5.0
#: The attempts' lease: long, the script renews it only between steps.
LEASE_S = 60.0
#: How long to wait for a swept attempt's cgroup to empty, in seconds.
CGROUP_EMPTY_TIMEOUT_S = 2.0
#: One slot of the shared progress file per process: its pid, its progress counter.
SLOT = struct.Struct("qq")
#: Where cgroup v2 is mounted on a system that uses it only.
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Name prefix of the temporary directory (its path is in every job process's argv).
TMP_PREFIX = "ebbtide-pause-bench-"

#: The job: a leader that forks ``procs - 1`` workers; each process writes its pid to its
#: slot of the shared file, then bumps its counter every step (``sleep``) or all the time
#: (``busy``) until it is killed.
JOB_SOURCE = """\
import mmap, os, struct, sys, time

path, procs, work, step_s = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
slot_struct = struct.Struct("qq")
with open(path, "r+b") as f:
    mem = mmap.mmap(f.fileno(), slot_struct.size * procs)


def run(slot):
    offset = slot_struct.size * slot
    struct.pack_into("q", mem, offset, os.getpid())
    n = 0
    if work == "busy":
        while True:
            n += 1
            struct.pack_into("q", mem, offset + 8, n)
    while True:
        n += 1
        struct.pack_into("q", mem, offset + 8, n)
        time.sleep(step_s)


for slot in range(1, procs):
    if os.fork() == 0:
        try:
            run(slot)
        finally:
            os._exit(0)
run(0)
"""


# -- the job's process tree ---------------------------------------------------------------


@dataclass
class Tree:
    """One attempt's processes, as the shared progress file shows them."""

    handle: Handle
    mem: mmap.mmap
    procs: int
    pids: list[int] = field(default_factory=list)
    ticks: dict[int, int] = field(default_factory=dict)

    def slots(self) -> list[tuple[int, int]]:
        return [SLOT.unpack_from(self.mem, SLOT.size * i) for i in range(self.procs)]

    def counters(self) -> list[int]:
        return [n for _, n in self.slots()]


def state(pid: int) -> bytes:
    """The process's state letter (``R``, ``S``, ``T``…), or ``b""`` when it is gone."""
    fields = shim.stat_fields(pid)
    return fields[0] if fields else b""


def wait_for(what: str, done: Callable[[], bool], timeout_s: float, poll_s: float) -> float:
    """Poll ``done`` until it holds, sleeping ``poll_s`` between looks (0: spin); return
    ``perf_counter`` then."""
    give_up = time.perf_counter() + timeout_s
    while not done():
        if time.perf_counter() > give_up:
            raise SystemExit(f"pause_latency: {what} not seen within {timeout_s:g}s")
        if poll_s:
            time.sleep(poll_s)
    return time.perf_counter()


def wait_ready(executor: LocalExecutor, tree: Tree) -> None:
    """Wait until every process of the tree has written its slot and is running, and the
    shim's descendants are exactly those processes."""
    give_up = time.monotonic() + READY_TIMEOUT_S
    while True:
        slots = tree.slots()
        pids = [pid for pid, _ in slots]
        if all(pid and n for pid, n in slots) and sorted(pids) == sorted(
            shim.descendants(tree.handle.pid)
        ):
            tree.pids = pids
            tree.ticks = {pid: start_ticks(pid) for pid in pids}
            return
        if executor.poll(tree.handle) is not None:
            raise SystemExit("pause_latency: the job ended before it was ready (see its log)")
        if time.monotonic() > give_up:
            raise SystemExit(
                f"pause_latency: the job's {tree.procs} processes not running after "
                f"{READY_TIMEOUT_S:g}s (slots {slots})"
            )
        time.sleep(0.002)


# -- one method, one round ----------------------------------------------------------------


@dataclass
class Method:
    """The samples of one way of pausing, in milliseconds, and what was checked."""

    freeze: list[float] = field(default_factory=list)
    thaw: list[float] = field(default_factory=list)
    call: list[float] = field(default_factory=list)
    thaw_call: list[float] = field(default_factory=list)
    resume: list[float] = field(default_factory=list)
    #: processes seen stopped that made no progress during the hold
    stopped: int = 0
    #: processes that made progress again after the thaw
    resumed: int = 0


def pause_round(
    method: Method,
    tree: Tree,
    *,
    freeze: Callable[[], None],
    frozen: Callable[[], bool],
    thaw: Callable[[], None],
    thawed: Callable[[], bool],
    stopped: Callable[[int], bool],
    hold_s: float,
    poll_s: float,
) -> None:
    """Freeze, hold, thaw and check one tree, recording the times in ``method``."""
    t0 = time.perf_counter()
    freeze()
    t1 = time.perf_counter()
    t2 = wait_for("the freeze", frozen, STATE_TIMEOUT_S, poll_s)
    before = tree.counters()
    time.sleep(hold_s)
    after = tree.counters()
    method.stopped += sum(
        b == a and stopped(pid) for pid, b, a in zip(tree.pids, before, after, strict=True)
    )
    t3 = time.perf_counter()
    thaw()
    t4 = time.perf_counter()
    t5 = wait_for("the thaw", thawed, STATE_TIMEOUT_S, poll_s)
    give_up = t5 + RESUME_TIMEOUT_S
    while True:
        now = tree.counters()
        moved = sum(n > b for n, b in zip(now, after, strict=True))
        if moved == tree.procs or time.perf_counter() > give_up:
            break
        if poll_s:
            time.sleep(poll_s)
    t6 = time.perf_counter()
    method.resumed += moved
    method.freeze.append((t2 - t0) * 1e3)
    method.call.append((t1 - t0) * 1e3)
    method.thaw.append((t5 - t3) * 1e3)
    method.thaw_call.append((t4 - t3) * 1e3)
    if moved == tree.procs:
        method.resume.append((t6 - t3) * 1e3)


def sigstop_round(
    executor: LocalExecutor, tree: Tree, method: Method, hold_s: float, poll_s: float
) -> None:
    pids = tree.pids
    pause_round(
        method,
        tree,
        freeze=lambda: executor.pause(tree.handle),
        frozen=lambda: all(state(pid) == b"T" for pid in pids),
        thaw=lambda: executor.thaw(tree.handle),
        thawed=lambda: all(state(pid) not in (b"T", b"") for pid in pids),
        stopped=lambda pid: state(pid) == b"T",
        hold_s=hold_s,
        poll_s=poll_s,
    )


# -- the cgroup v2 freezer ----------------------------------------------------------------


def write(path: Path, text: str) -> None:
    """One ``write(2)`` of ``text`` (cgroup files take one value per write)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def cgroup2_mounts() -> list[tuple[Path, str]]:
    """The cgroup v2 mounts: (mount point, root of the hierarchy it shows)."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        before, _, after = line.partition(" - ")
        fields = before.split()
        if after.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            out.append((Path(fields[4]), fields[3]))
    return out


def own_cgroup() -> Path | str:
    """This process's cgroup v2 directory (new cgroups go below it), or why there is
    none that can be used."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if os.geteuid() != 0:
        return "not running as root"
    mounts = cgroup2_mounts()
    if not mounts:
        return "no cgroup v2 hierarchy is mounted"
    # /sys/fs/cgroup on a cgroup v2 system; elsewhere (a hybrid one) where it is
    mount, root = next(((m, r) for m, r in mounts if m == CGROUP_ROOT), mounts[0])
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        return f"cannot read /proc/self/cgroup: {exc}"
    rel = next((line[3:] for line in lines if line.startswith("0::")), None)
    if rel is None:
        return "this process is in no cgroup v2 cgroup"
    if root != "/" and (rel == root or rel.startswith(root + "/")):
        rel = rel[len(root) :]
    parent = mount / rel.lstrip("/")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        return f"{parent} is not writable"
    probe = parent / f"{TMP_PREFIX}{os.getpid()}-probe"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"cannot create a cgroup below {parent}: {exc}"
    try:
        if not (probe / "cgroup.freeze").exists():
            return "the kernel has no cgroup v2 freezer (cgroup.freeze: Linux 5.2 or later)"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return parent


def cgroup_round(tree: Tree, method: Method, cgroup: Path, hold_s: float, poll_s: float) -> None:
    """Move the tree into ``cgroup`` (created by the caller) and freeze it there."""
    for pid in tree.pids:
        write(cgroup / "cgroup.procs", str(pid))
    members = sorted(int(p) for p in read(cgroup / "cgroup.procs").split())
    if members != sorted(tree.pids):
        raise OSError(f"cgroup.procs lists {members}, not the tree's {sorted(tree.pids)}")
    freeze_file = cgroup / "cgroup.freeze"
    events = cgroup / "cgroup.events"
    pause_round(
        method,
        tree,
        freeze=lambda: write(freeze_file, "1"),
        frozen=lambda: b"frozen 1" in read(events),
        thaw=lambda: write(freeze_file, "0"),
        thawed=lambda: b"frozen 0" in read(events),
        stopped=lambda pid: b"frozen 1" in read(events),
        hold_s=hold_s,
        poll_s=poll_s,
    )


def remove_cgroup(cgroup: Path) -> bool:
    """Thaw and remove a cgroup once its processes are gone; whether it is gone."""
    with contextlib.suppress(OSError):
        write(cgroup / "cgroup.freeze", "0")
    give_up = time.monotonic() + CGROUP_EMPTY_TIMEOUT_S
    while True:
        try:
            cgroup.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > give_up:
                return False
            time.sleep(0.005)


# -- the rounds ---------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    home: Path
    executor: LocalExecutor
    cgroup_parent: Path | None
    cgroup_skipped: str | None
    sigstop: Method = field(default_factory=Method)
    cgroup: Method = field(default_factory=Method)
    leftovers: int = 0
    cgroups_left: int = 0

    def round(self, n: int) -> None:
        a = self.args
        progress = self.home / f"progress-{n}"
        progress.write_bytes(bytes(SLOT.size * a.procs))
        launch = Launch(
            job_id=n,
            attempt=1,
            argv=[
                sys.executable,
                str(self.home / "pause_job.py"),
                str(progress),
                str(a.procs),
                a.work,
                f"{a.step_ms / 1e3:g}",
            ],
            env=dict(os.environ),
            cwd=None,
            stdout_path=self.home / "logs" / str(n) / "stdout",
            stderr_path=self.home / "logs" / str(n) / "stderr",
            lease_s=LEASE_S,
        )
        cgroup: Path | None = None
        with open(progress, "r+b") as f:
            mem = mmap.mmap(f.fileno(), SLOT.size * a.procs)
        handle = self.executor.start(launch)
        tree = Tree(handle=handle, mem=mem, procs=a.procs)
        try:
            wait_ready(self.executor, tree)
            hold_s, poll_s = a.hold_ms / 1e3, a.poll_us / 1e6
            sigstop_round(self.executor, tree, self.sigstop, hold_s, poll_s)
            self.executor.renew(handle)
            if self.cgroup_parent is not None:
                cgroup = self.cgroup_parent / f"{TMP_PREFIX}{os.getpid()}-{n}"
                try:
                    cgroup.mkdir()
                    cgroup_round(tree, self.cgroup, cgroup, hold_s, poll_s)
                except OSError as exc:
                    # it could not work after all (the first round tells): say why
                    self.cgroup_skipped = f"cannot freeze through {cgroup}: {exc}"
                    self.cgroup_parent = None
                    self.cgroup = Method()
                self.executor.renew(handle)
        finally:
            self.executor.signal(handle, signal.SIGCONT)
            if cgroup is not None:
                with contextlib.suppress(OSError):
                    write(cgroup / "cgroup.freeze", "0")
            self.executor.sweep(handle)
            self.leftovers += kill_leftovers(tree)
            if cgroup is not None and not remove_cgroup(cgroup):
                self.cgroups_left += 1
            mem.close()
            progress.unlink()


def kill_leftovers(tree: Tree) -> int:
    """Kill any process of the tree still alive after its sweep; return how many."""
    left = 0
    for pid, ticks in tree.ticks.items():
        if ticks and start_ticks(pid) == ticks and state(pid) not in (b"Z", b""):
            left += 1
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return left


# -- figures ------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0–100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


def figures(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "p50": round(percentile(values, 50), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3),
    }


def report(bench: Bench, elapsed_s: float, host_processes: int) -> dict[str, Any]:
    a = bench.args
    measured = bench.cgroup_parent is not None
    out: dict[str, Any] = {"procs": a.procs, "rounds": a.rounds}
    for name, method in (("sigstop", bench.sigstop), ("cgroup", bench.cgroup)):
        on = name == "sigstop" or measured
        out[f"{name}_freeze_ms"] = figures(method.freeze) if on else None
        out[f"{name}_thaw_ms"] = figures(method.thaw) if on else None
        out[f"{name}_call_ms"] = figures(method.call) if on else None
        out[f"{name}_thaw_call_ms"] = figures(method.thaw_call) if on else None
        out[f"{name}_resume_ms"] = figures(method.resume) if on else None
    out["verified"] = {
        "processes": a.rounds * a.procs,
        "sigstop": {"stopped": bench.sigstop.stopped, "resumed": bench.sigstop.resumed},
        "cgroup": {"stopped": bench.cgroup.stopped, "resumed": bench.cgroup.resumed}
        if measured
        else None,
    }
    out["cgroup_path"] = str(bench.cgroup_parent) if measured else None
    out["cgroup_skipped"] = bench.cgroup_skipped
    out["leftovers"] = bench.leftovers
    out["cgroups_left"] = bench.cgroups_left

    def met(name: str) -> bool | None:
        f = out[f"{name}_freeze_ms"]
        v = out["verified"][name]
        if f is None or v is None:
            return None
        every = out["verified"]["processes"]
        return f["p99"] <= TARGET_FREEZE_P99_MS and v["stopped"] == v["resumed"] == every

    sigstop_met, cgroup_met = met("sigstop"), met("cgroup")
    out["target"] = {
        "freeze_p99_ms": TARGET_FREEZE_P99_MS,
        "procs": 4,
        "sigstop_met": sigstop_met,
        "cgroup_met": cgroup_met,
        "met": bool(sigstop_met) and cgroup_met is not False,
    }
    out["config"] = {
        "work": a.work,
        "step_ms": a.step_ms,
        "hold_ms": a.hold_ms,
        "poll_us": a.poll_us,
        "cpus": os.cpu_count(),
        "extra_procs": a.extra_procs,
        # signal() reads /proc/PID/stat of every process of the host to find the tree
        "host_processes": host_processes,
    }
    out["elapsed_s"] = round(elapsed_s, 1)
    return out


def print_summary(r: dict[str, Any]) -> None:
    c = r["config"]
    work = f"sleep, {c['step_ms']:g} ms steps" if c["work"] == "sleep" else "busy"
    poll = f"polled every {c['poll_us']:g} µs" if c["poll_us"] else "polled spinning"
    print(
        f"pause_latency: {r['rounds']} round{'' if r['rounds'] == 1 else 's'}, "
        f"{r['procs']} processes per attempt ({work}), "
        f"hold {c['hold_ms']:g} ms, {poll}, {c['cpus']} CPUs, {c['host_processes']} processes on "
        f"the host, {r['elapsed_s']:g}s"
    )
    print(f"  {'':<26}{'p50':>9}{'p99':>9}{'max':>9}    stopped    resumed")
    every = r["verified"]["processes"]
    for name, title in (("sigstop", "SIGSTOP/SIGCONT"), ("cgroup", "cgroup freezer")):
        if r[f"{name}_freeze_ms"] is None:
            continue
        v = r["verified"][name]
        for i, measure in enumerate(("freeze", "call", "thaw", "thaw_call", "resume")):
            f = r[f"{name}_{measure}_ms"]
            label = f"{title if i == 0 else '':<16}{measure.replace('_', ' '):<10}"
            row = "    (none)" if f is None else f"{f['p50']:>9.3f}{f['p99']:>9.3f}{f['max']:>9.3f}"
            tail = f"  {v['stopped']:>5}/{every:<5}{v['resumed']:>5}/{every}" if i == 0 else ""
            print(f"  {label}{row}{tail}")
    print(
        "  milliseconds from the call; freeze: until every process is stopped (/proc state T; "
        "cgroup.events: frozen 1);\n  call: the pause call alone; thaw: until none is "
        "(frozen 0); thaw call: the resume call alone;\n  resume: until every process made "
        "progress again; stopped: seen stopped, no progress while held; resumed: progress after"
    )
    if r["cgroup_freeze_ms"] is None:
        print(f"  cgroup freezer: skipped: {r['cgroup_skipped'] or 'not asked for (--cgroup)'}")
    if r["leftovers"] or r["cgroups_left"]:
        print(
            f"  NOT clean: {r['leftovers']} processes left after a sweep (killed), "
            f"{r['cgroups_left']} cgroups not removed"
        )
    t = r["target"]
    verdicts = [
        f"{title} {'met' if t[key] else 'NOT met'}"
        for key, title in (("sigstop_met", "SIGSTOP"), ("cgroup_met", "cgroup freezer"))
        if t[key] is not None
    ]
    note = "" if r["procs"] == t["procs"] else f"; set for {t['procs']} processes"
    print(
        f"  target (freeze p99 ≤ {t['freeze_p99_ms']:g} ms, every process stopped and "
        f"resumed{note}): {', '.join(verdicts)}"
    )


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=50, help="attempts to pause and resume (50)")
    p.add_argument("--procs", type=int, default=4, help="processes of the job, leader too (4)")
    p.add_argument(
        "--work",
        choices=("sleep", "busy"),
        default="sleep",
        help="each process sleeps in small steps (sleep) or spins (busy) (sleep)",
    )
    p.add_argument("--step-ms", type=float, default=1.0, help="sleep step, in ms (1)")
    p.add_argument("--hold-ms", type=float, default=20.0, help="how long a pause lasts (20)")
    p.add_argument(
        "--poll-us",
        type=float,
        default=0.0,
        help="sleep between looks at /proc or cgroup.events, in µs (0: spin)",
    )
    p.add_argument(
        "--extra-procs",
        type=int,
        default=0,
        help="idle processes to start on the host for the run, as on a busy node (0)",
    )
    p.add_argument(
        "--cgroup",
        action="store_true",
        help="also measure the cgroup v2 freezer (root and a writable cgroup v2 hierarchy)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--check", action="store_true", help="exit 1 unless the target is met")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.procs < 1:
        p.error("--procs must be at least 1")
    if args.step_ms <= 0 or args.hold_ms <= 0:
        p.error("--step-ms and --hold-ms must be positive")
    if args.poll_us < 0 or args.extra_procs < 0:
        p.error("--poll-us and --extra-procs must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not sys.platform.startswith("linux"):
        raise SystemExit("pause_latency: needs Linux (/proc, the attempt shim)")
    parent: Path | None = None
    skipped: str | None = None
    if args.cgroup:
        found = own_cgroup()
        if isinstance(found, Path):
            parent = found
        else:
            skipped = found
            print(f"pause_latency: cgroup freezer skipped: {skipped}", file=sys.stderr)
    home = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
    (home / "pause_job.py").write_text(JOB_SOURCE)
    bench = Bench(
        args=args,
        home=home,
        executor=LocalExecutor(),
        cgroup_parent=parent,
        cgroup_skipped=skipped,
    )
    extra: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    try:
        for _ in range(args.extra_procs):
            extra.append(subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL))
        for n in range(1, args.rounds + 1):
            bench.round(n)
        host_processes = sum(e.isdigit() for e in os.listdir("/proc"))
    finally:
        for p in extra:
            p.kill()
        for p in extra:
            p.wait()
        shutil.rmtree(home, ignore_errors=True)
    if bench.cgroup_skipped and parent is not None:
        print(f"pause_latency: cgroup freezer skipped: {bench.cgroup_skipped}", file=sys.stderr)
    result = report(bench, time.monotonic() - started, host_processes)
    if args.json:
        print(json.dumps(result))
    else:
        print_summary(result)
    return 1 if args.check and not result["target"]["met"] else 0


if __name__ == "__main__":
    sys.exit(main())
