"""An attempt's processes, real ones: the shim keeps every one of them below it, ends
them all with the job's leader, and kills them when its lease is not renewed; the local
executor signals and sweeps whole trees; ownership tells them from online processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from ebbtide.workers import shim
from ebbtide.workers.executor import Launch, Leftover, LocalExecutor
from ebbtide.workers.ownership import ProcessOwnership, Tree
from tests.e2e.helpers import wait_for

#: A job that leaves a background child and a daemon (setsid + double fork) behind, each
#: writing its pid to a file, then waits for a go-ahead file before its leader exits.
LEAVER = textwrap.dedent(
    """\
    #!/bin/bash
    python3 -c "import os,time; open('$1/bg.pid','w').write(str(os.getpid())); time.sleep(300)" &
    setsid python3 -c "
    import os, time
    if os.fork(): os._exit(0)
    open('$1/daemon.pid', 'w').write(str(os.getpid()))
    time.sleep(300)" &
    while [ ! -e "$1/go" ]; do sleep 0.02; done
    exit ${2:-0}
    """
)


def wait_until(predicate, timeout=20.0, what="condition"):  # type: ignore[no-untyped-def]
    return wait_for(predicate, timeout, what, interval=0.02)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pid_in(path: Path) -> int:
    wait_until(lambda: path.exists() and path.read_text().strip() != "")
    return int(path.read_text())


@pytest.fixture
def leaver(tmp_path: Path) -> Path:
    script = tmp_path / "leaver.sh"
    script.write_text(LEAVER)
    script.chmod(0o755)
    return script


def start_shim(tmp_path: Path, argv: list[str], *, lease_s: float | None = None):  # type: ignore[no-untyped-def]
    """The shim as the executor starts it; returns (process, lease write end or None)."""
    args = [sys.executable, "-I", shim.__file__, "--status", str(tmp_path / "shim.json")]
    lease_w = None
    pass_fds: tuple[int, ...] = ()
    if lease_s is not None:
        lease_r, lease_w = os.pipe()
        args += ["--lease-fd", str(lease_r), "--lease-s", str(lease_s)]
        pass_fds = (lease_r,)
    proc = subprocess.Popen([*args, "--", *argv], pass_fds=pass_fds, start_new_session=True)
    if lease_s is not None:
        os.close(pass_fds[0])
    return proc, lease_w


def report(tmp_path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((tmp_path / "shim.json").read_text())


# -- the shim ---------------------------------------------------------------------------


def test_the_leaders_exit_ends_every_process_and_keeps_its_code(tmp_path, leaver):  # type: ignore[no-untyped-def]
    proc, _ = start_shim(tmp_path, [str(leaver), str(tmp_path), "3"])
    bg, daemon = pid_in(tmp_path / "bg.pid"), pid_in(tmp_path / "daemon.pid")
    # the daemon escaped its session, but not the shim: it was re-parented to it
    assert psutil.Process(daemon).ppid() == proc.pid
    (tmp_path / "go").touch()
    assert proc.wait(10) == 3
    assert not alive(bg) and not alive(daemon)
    assert report(tmp_path)["cause"] == "job" and report(tmp_path)["exit_code"] == 3


def test_a_lease_not_renewed_kills_the_whole_attempt(tmp_path, leaver):  # type: ignore[no-untyped-def]
    proc, lease_w = start_shim(tmp_path, [str(leaver), str(tmp_path)], lease_s=2.0)
    assert lease_w is not None
    renewing = threading.Event()
    renewing.set()

    def renew() -> None:  # as the agent does, from the shim's start (a slow machine's
        while renewing.is_set():  # python start-up must not outlast the lease)
            os.write(lease_w, b".")
            time.sleep(0.1)

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    daemon = pid_in(tmp_path / "daemon.pid")
    time.sleep(1.0)  # renewed for a while: it lives on
    assert proc.poll() is None
    renewing.clear()
    renewer.join(5)
    assert proc.wait(10) == shim.LEASE_EXIT  # renewals stopped (the agent paused, say)
    assert not alive(daemon)
    assert report(tmp_path)["cause"] == "lease"
    os.close(lease_w)


def test_the_agent_going_away_kills_the_attempt_at_once(tmp_path, leaver):  # type: ignore[no-untyped-def]
    proc, lease_w = start_shim(tmp_path, [str(leaver), str(tmp_path)], lease_s=60)
    assert lease_w is not None
    daemon, bg = pid_in(tmp_path / "daemon.pid"), pid_in(tmp_path / "bg.pid")
    os.close(lease_w)  # what the kernel does when the agent dies, kill -9 included
    assert proc.wait(5) == shim.LEASE_EXIT
    assert not alive(daemon) and not alive(bg)
    assert report(tmp_path)["cause"] == "agent_gone"


@pytest.mark.parametrize(
    ("argv", "cwd", "says"),
    [
        (["/nonexistent/binary"], None, "No such file"),
        ([sys.executable, "-c", "pass"], "/nonexistent/dir", "/nonexistent/dir"),
    ],
)
def test_a_job_that_cannot_start_says_why(tmp_path, argv, cwd, says):  # type: ignore[no-untyped-def]
    extra = ["--cwd", cwd] if cwd else []
    status = str(tmp_path / "shim.json")
    proc = subprocess.run(
        [sys.executable, "-I", shim.__file__, "--status", status, *extra, "--", *argv],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert proc.returncode == shim.START_FAILED_EXIT
    assert report(tmp_path)["cause"] == "start"
    assert says in report(tmp_path)["error"] and says in proc.stderr


def test_the_warning_signal_is_for_the_job_not_the_shim(tmp_path):  # type: ignore[no-untyped-def]
    ready = tmp_path / "ready"
    job = (
        "import pathlib,signal,sys,time; signal.signal(15, lambda *a: sys.exit(42)); "
        "pathlib.Path(sys.argv[1]).touch(); time.sleep(30)"
    )
    proc, _ = start_shim(tmp_path, [sys.executable, "-c", job, str(ready)])
    wait_until(ready.exists)
    os.kill(proc.pid, signal.SIGTERM)  # the shim does not die of it: it forwards it ...
    assert proc.wait(10) == 42  # ... and the job takes it, once


# -- the local executor -----------------------------------------------------------------


def launch(tmp_path: Path, argv: list[str], lease_s: float = 5.0) -> Launch:
    return Launch(
        job_id=7,
        attempt=1,
        argv=argv,
        env=dict(os.environ),
        cwd=None,
        stdout_path=tmp_path / "out.log",
        stderr_path=tmp_path / "err.log",
        lease_s=lease_s,
    )


def test_signal_reaches_processes_that_left_the_group_and_sweep_kills_them(tmp_path, leaver):  # type: ignore[no-untyped-def]
    ex = LocalExecutor(run_dir=tmp_path / "run")
    handle = ex.start(launch(tmp_path, [str(leaver), str(tmp_path)]))
    daemon = pid_in(tmp_path / "daemon.pid")
    ex.signal(handle, signal.SIGSTOP)
    wait_until(lambda: psutil.Process(daemon).status() == psutil.STATUS_STOPPED)
    ex.signal(handle, signal.SIGCONT)
    ex.sweep(handle)
    assert not alive(daemon) and not alive(handle.pid)
    assert ex.poll(handle) is not None
    assert list((tmp_path / "run").iterdir()) == []  # its record is gone with it


def test_a_restarted_agent_kills_what_its_previous_incarnation_left(tmp_path, leaver):  # type: ignore[no-untyped-def]
    before = LocalExecutor(run_dir=tmp_path / "run")
    handle = before.start(launch(tmp_path, [str(leaver), str(tmp_path)], lease_s=3600))
    daemon = pid_in(tmp_path / "daemon.pid")
    # the old agent "crashed" without its shims noticing (they were given a lease that
    # never runs out and their pipe stays open): the new one finds them on record
    after = LocalExecutor(run_dir=tmp_path / "run")
    assert after.reap_leftovers() == [Leftover(job_id=7, attempt=1)]  # requeued as lost
    assert not alive(daemon)
    handle.popen.wait(5)  # type: ignore[union-attr]
    assert after.reap_leftovers() == []


def test_a_job_that_cannot_start_is_reported_as_such(tmp_path):  # type: ignore[no-untyped-def]
    ex = LocalExecutor()
    handle = ex.start(launch(tmp_path, ["/nonexistent/binary"]))
    wait_until(lambda: ex.poll(handle) is not None)
    ended = ex.poll(handle)
    assert ended is not None and ended.cause == "start" and ended.code == 127
    assert "/nonexistent/binary" in ended.detail


# -- ownership --------------------------------------------------------------------------

LAUNCHER = textwrap.dedent(
    """\
    import subprocess, sys, time
    workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
               for _ in range(4)]
    open(sys.argv[1], "w").write(" ".join(str(w.pid) for w in workers))
    time.sleep(300)
    """
)


def test_ownership_finds_wrapped_launched_and_daemonised_processes(tmp_path, leaver):  # type: ignore[no-untyped-def]
    ex = LocalExecutor()
    wrapped = ex.start(launch(tmp_path, [str(leaver), str(tmp_path)]))
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    workers_file = tmp_path / "workers.txt"
    launched = ex.start(
        launch(tmp_path, [sys.executable, str(tmp_path / "launcher.py"), str(workers_file)])
    )
    online = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        ownership = ProcessOwnership()
        ownership.update(
            [
                Tree(1, wrapped.pid, psutil.Process(wrapped.pid).create_time()),
                Tree(2, launched.pid, psutil.Process(launched.pid).create_time()),
            ],
            {0: (30.0, 4096.0)},
        )
        bg, daemon = pid_in(tmp_path / "bg.pid"), pid_in(tmp_path / "daemon.pid")
        wait_until(lambda: workers_file.exists() and len(workers_file.read_text().split()) == 4)
        workers = [int(p) for p in workers_file.read_text().split()]
        assert ownership.owner(bg) == 1 and ownership.owner(daemon) == 1
        assert [ownership.owner(w) for w in workers] == [2, 2, 2, 2]
        assert ownership.owner(online.pid) is None
        assert ownership.owner(os.getpid()) is None
        assert ownership.owner(2**22 + 12345) is None  # no such process
        assert ownership.granted_compute_pct(0) == 30.0 and ownership.granted_memory_mib(1) == 0
        # the attempt ended: its processes' verdicts are not kept
        ownership.update([Tree(2, launched.pid, psutil.Process(launched.pid).create_time())])
        assert ownership.owner(bg) is None
    finally:
        online.kill()
        online.wait()
        ex.sweep(wrapped)
        ex.sweep(launched)


def test_ownership_by_cgroup_for_processes_in_their_own_pid_namespace(tmp_path):  # type: ignore[no-untyped-def]
    # a container's process: its ancestry on the host runs through the container runtime,
    # but its cgroup names the pod
    proc_root = tmp_path / "proc"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        (proc_root / str(sleeper.pid)).mkdir(parents=True)
        (proc_root / str(sleeper.pid) / "cgroup").write_text(
            "0::/kubepods.slice/kubepods-besteffort.slice/"
            "kubepods-besteffort-pod1f2e3d4c_5b6a_7980_a1b2_c3d4e5f60718.slice/cri-containerd-ab.scope\n"
        )
        ownership = ProcessOwnership(proc=proc_root)
        ownership.update([Tree(9, 999_999, 0.0, cgroup_markers=("pod1f2e3d4c_5b6a",))])
        assert ownership.owner(sleeper.pid) == 9
        ownership.update([Tree(9, 999_999, 0.0, cgroup_markers=("podffff",))])
        assert ownership.owner(sleeper.pid) is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_sweep_has_the_shim_kill_and_reap_everything(tmp_path, leaver):  # type: ignore[no-untyped-def]
    ex = LocalExecutor()
    handle = ex.start(launch(tmp_path, [str(leaver), str(tmp_path)]))
    bg, daemon = pid_in(tmp_path / "bg.pid"), pid_in(tmp_path / "daemon.pid")
    ex.sweep(handle)
    # gone, not zombies left for init to reap: the shim reaped them before it exited
    assert not psutil.pid_exists(bg) and not psutil.pid_exists(daemon)
    ended = ex.poll(handle)
    assert ended is not None and ended.cause == "killed" and ended.code == 137
    assert json.loads((tmp_path / "shim.json").read_text())["cause"] == "killed"


def test_the_shim_keeps_an_eviction_deadline_by_itself(tmp_path):  # type: ignore[no-untyped-def]
    """Told the deadline at the warning, the shim kills the attempt then, whatever the
    agent does meanwhile (paused, busy, gone quiet)."""
    ex = LocalExecutor()
    ready = tmp_path / "ready"
    stubborn = (
        "import pathlib,signal,sys,time; signal.signal(15, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).touch(); time.sleep(60)"
    )
    handle = ex.start(launch(tmp_path, [sys.executable, "-c", stubborn, str(ready)], lease_s=3600))
    wait_until(ready.exists)
    job = psutil.Process(handle.pid).children()[0]
    ex.signal(handle, signal.SIGTERM)  # the warning: ignored
    ex.kill_at(handle, time.monotonic() + 0.5)
    job.wait(timeout=5)  # no renewal, no K: the shim alone
    wait_until(lambda: ex.poll(handle) is not None)
    ended = ex.poll(handle)
    assert ended is not None and ended.cause == "deadline" and ended.at is not None


def test_a_warning_sent_before_the_job_is_even_forked_still_reaches_it(tmp_path):  # type: ignore[no-untyped-def]
    """Warned the moment its shim starts (an online spike right after a dispatch), the
    job must still be warned: the shim forwards the signal once the job exists, and the
    job lets it in only with its default action back (never the shim's own handler)."""
    ex = LocalExecutor()
    for _ in range(5):
        handle = ex.start(launch(tmp_path, ["sleep", "30"]))
        ex.signal(handle, signal.SIGTERM)  # at once: the shim is still starting
        give_up = time.monotonic() + 10
        while (ended := ex.poll(handle)) is None:
            assert time.monotonic() < give_up, "the warning was lost"
            time.sleep(0.01)
        assert ended.code == 128 + signal.SIGTERM
        ex.sweep(handle)


def test_the_jobs_environment_never_acts_on_the_shim(tmp_path):  # type: ignore[no-untyped-def]
    """The shim may be root (jobs run as their owners): an LD_PRELOAD the job sets must
    load into the job only, never into the shim, which gets an environment of its own;
    the job's reaches the job through a pipe, whole."""
    import shutil

    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("a C compiler is needed to build the preloaded library")
    source = tmp_path / "mark.c"
    source.write_text(
        textwrap.dedent(
            """\
            #include <stdio.h>
            #include <stdlib.h>
            #include <unistd.h>
            __attribute__((constructor)) static void mark(void) {
                char path[4096];
                snprintf(path, sizeof path, "%s/loaded.%d", getenv("MARK_DIR"), getpid());
                FILE *f = fopen(path, "w");
                if (f) fclose(f);
            }
            """
        )
    )
    library = tmp_path / "mark.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", library, source], check=True)
    marks = tmp_path / "marks"
    marks.mkdir()
    # more than a pipe holds (64 KiB): the shim reads it all
    big = {f"BIG_{i}": "x" * 50_000 for i in range(4)}
    count = "import os; print(sum(len(v) for k, v in os.environ.items() if k[:4] == 'BIG_'))"
    job = launch(tmp_path, [sys.executable, "-c", count])
    job.env.update(LD_PRELOAD=str(library), MARK_DIR=str(marks), **big)
    ex = LocalExecutor(run_dir=tmp_path / "run")
    handle = ex.start(job)
    wait_until(lambda: ex.poll(handle) is not None)
    loaded = {int(p.name.split(".")[1]) for p in marks.iterdir()}
    assert loaded and handle.pid not in loaded  # the job loaded it; the shim did not
    assert (tmp_path / "out.log").read_text().strip() == "200000"
