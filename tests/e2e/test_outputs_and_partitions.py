"""End to end, as a user arriving from Slurm or PBS works: a Slurm script whose
``--partition`` is another site's name for a queue, and jobs whose output goes where
``-o``/``-e`` or Slurm's default ``slurm-%j.out`` say — and ``ebb logs`` (with ``-f``,
``--stderr``, ``--json``) shows it from there, says which file, and says so when the
file is gone."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap

import pytest

from tests.e2e.helpers import EBB, ebb_env, job, start, stop, wait_final

pytestmark = pytest.mark.e2e

POLICY = textwrap.dedent(
    """\
    defaults:
      forecast_warmup_s: 0s
    queues:
      default: {}
      batch:
        aliases: [gpu, workq]
    """
)

SLURM = textwrap.dedent(
    """\
    #!/bin/bash
    #SBATCH --job-name=slurmy
    #SBATCH --partition=gpu
    #SBATCH --time=5
    echo "out line on $SLURM_JOB_PARTITION"
    echo "err line" >&2
    """
)


def test_partition_aliases_and_logs_of_output_files(tmp_path):  # type: ignore[no-untyped-def]
    (tmp_path / "ebbtide.yaml").write_text(POLICY)
    env = ebb_env(tmp_path / "home", EBBTIDE_POLICY=str(tmp_path / "ebbtide.yaml"))
    (tmp_path / "job.sbatch").write_text(SLURM)
    (tmp_path / "bad.sbatch").write_text(SLURM.replace("=gpu", "=nope"))

    def ebb(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*EBB, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout
        )

    slurm = ebb("sbatch", "job.sbatch")
    assert slurm.returncode == 0, slurm.stderr
    assert "ebb sbatch: note: partition 'gpu' is queue 'batch' here" in slurm.stderr
    slurm_id = int(re.fullmatch(r"Submitted batch job (\d+)\n", slurm.stdout).group(1))  # type: ignore[union-attr]
    bad = ebb("sbatch", "bad.sbatch")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "unknown queue 'nope'; known queues: batch (aliases: gpu, workq), default" in (
        bad.stderr
    )
    pbs = ebb(
        "qsub", "-q", "workq", "-o", "pbs.out", "-e", "pbs.err", "--", "sh", "-c",
        "echo pbs-out; echo pbs-err >&2",
    )  # fmt: skip
    assert pbs.returncode == 0, pbs.stderr
    assert "ebb qsub: note: queue 'workq' is queue 'batch' here" in pbs.stderr
    pbs_id = int(pbs.stdout)
    both = "echo j-out; echo j-err >&2"
    joined = ebb("qsub", "-j", "oe", "--", "sh", "-c", both)
    assert joined.returncode == 0 and "-j oe" not in joined.stderr, joined.stderr
    joined_id = int(joined.stdout)
    # PBS: with -j oe the -e path is not used (it was, and stderr went there alone)
    unused = ebb("qsub", "-j", "oe", "-e", "unused.err", "--json", "--", "sh", "-c", both)
    assert unused.returncode == 0, unused.stderr
    submitted = json.loads(unused.stdout)
    unused_id = submitted["id"]
    said = "-e unused.err: not used: -j oe sends stderr with stdout, to the attempt's log"
    assert any(note.startswith(said) for note in submitted["notes"]), submitted
    slow = ebb(
        "qsub", "-o", "follow-%j.out", "--", "sh", "-c",
        "for i in 1 2 3; do echo line $i; sleep 0.5; done",
    )  # fmt: skip
    slow_id = int(slow.stdout)
    follow = subprocess.Popen(
        [*EBB, "logs", "-f", str(slow_id)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    up = start(env, "up", "--node", "box", "--devices", "2x80GiB", log=tmp_path / "up.log")
    try:
        jobs = wait_final(env, [slurm_id, pbs_id, slow_id, joined_id, unused_id], timeout=90)
        followed, follow_err = follow.communicate(timeout=60)
    finally:
        follow.kill()
        stop(up)
    assert {j["state"] for j in jobs.values()} == {"succeeded"}, (tmp_path / "up.log").read_text()
    assert jobs[slurm_id]["queue"] == jobs[pbs_id]["queue"] == "batch"

    # Slurm's default: slurm-%j.out in the job's directory, stderr with stdout
    out = tmp_path / f"slurm-{slurm_id}.out"
    logs = ebb("logs", str(slurm_id))
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == out.read_text() == "out line on batch\nerr line\n"
    assert f"ebb: job {slurm_id} attempt 1: stdout from {out}" in logs.stderr
    err = ebb("logs", "--stderr", str(slurm_id))
    assert err.stdout == "out line on batch\nerr line\n"
    assert f"stderr from {out}" in err.stderr
    as_json = json.loads(ebb("logs", "--json", str(slurm_id)).stdout)
    assert (as_json["path"], as_json["attempt"]) == (str(out), 1)

    # PBS -o and -e: one file each
    assert ebb("logs", str(pbs_id)).stdout == "pbs-out\n"
    assert ebb("logs", "-e", str(pbs_id)).stdout == "pbs-err\n"

    # -j oe and no -o: both streams in the attempt's own log, which -e shows too
    for job_id in (joined_id, unused_id):
        for flags in ((), ("-e",)):
            shown = ebb("logs", *flags, str(job_id))
            assert (shown.returncode, shown.stdout) == (0, "j-out\nj-err\n"), shown.stderr
    assert not (tmp_path / "unused.err").exists()
    assert json.loads(ebb("logs", "-e", "--json", str(joined_id)).stdout)["stream"] == "stderr"

    # -f followed the file the job named as it grew, from before the job started
    assert followed == "line 1\nline 2\nline 3\n", follow_err
    assert f"stdout from {tmp_path / f'follow-{slow_id}.out'}" in follow_err
    assert job(env, slow_id)["state"] == "succeeded"

    # the file deleted: said in one line, no traceback
    (tmp_path / "pbs.out").unlink()
    gone = ebb("logs", str(pbs_id))
    assert gone.returncode != 0 and "Traceback" not in gone.stderr
    assert f"sent its stdout to {tmp_path / 'pbs.out'}, which is not there" in gone.stderr
    assert len(gone.stderr.strip().splitlines()) == 1
    gone_f = ebb("logs", "-f", str(pbs_id))
    assert gone_f.returncode == 0 and gone_f.stdout == ""
    assert "ebb: note: job" in gone_f.stderr and "which is not there" in gone_f.stderr
