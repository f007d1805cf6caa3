"""End to end: a PBS array script and a Slurm array script run under ``ebb up`` as they
are written — their output lands where ``-o``/``--output`` say, named as PBS and Slurm
name it, and each task sees the variables its scheduler would have set."""

from __future__ import annotations

import re
import socket
import subprocess
import textwrap

import pytest

from tests.e2e.helpers import EBB, ebb_env, start, stop, wait_final

pytestmark = pytest.mark.e2e

PBS = textwrap.dedent(
    """\
    #!/bin/bash
    #PBS -N pbsjob
    #PBS -l select=1:ncpus=2:ngpus=1:mem=1gb
    #PBS -l walltime=00:05:00
    #PBS -J 1-2
    #PBS -j oe
    #PBS -o pbs-out/
    #PBS -m abe
    cd $PBS_O_WORKDIR
    echo "id=$PBS_JOBID name=$PBS_JOBNAME index=$PBS_ARRAY_INDEX torque=$PBS_ARRAYID"
    echo "host=$PBS_O_HOST queue=$PBS_QUEUE ncpus=$NCPUS node=$(cat $PBS_NODEFILE)"
    echo to-stderr >&2
    """
)

SLURM = textwrap.dedent(
    """\
    #!/bin/bash
    #SBATCH --job-name=slurmjob
    #SBATCH --gres=gpu:1
    #SBATCH --time=5
    #SBATCH --array=0-1
    #SBATCH --output=slurm-out-%A_%a.log
    echo "id=$SLURM_JOB_ID task=$SLURM_ARRAY_TASK_ID array=$SLURM_ARRAY_JOB_ID"
    echo "dir=$SLURM_SUBMIT_DIR name=$SLURM_JOB_NAME exported=$FROM_MY_SHELL"
    echo to-stderr >&2
    """
)


def test_pbs_and_slurm_array_scripts_run_as_written(tmp_path):  # type: ignore[no-untyped-def]
    env = ebb_env(tmp_path / "home", FROM_MY_SHELL="kept")
    (tmp_path / "pbs-out").mkdir()
    (tmp_path / "job.pbs").write_text(PBS)
    (tmp_path / "job.sbatch").write_text(SLURM)

    def submit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*EBB, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )

    pbs = submit("qsub", "job.pbs")
    assert pbs.returncode == 0, pbs.stderr
    assert "-m abe: accepted, without effect: mail is not sent" in pbs.stderr
    pbs_first = int(pbs.stdout.strip().rstrip("[]"))
    slurm = submit("sbatch", "job.sbatch")
    assert slurm.returncode == 0, slurm.stderr
    slurm_first = int(re.fullmatch(r"Submitted batch job (\d+)\n", slurm.stdout).group(1))  # type: ignore[union-attr]

    up = start(env, "up", "--node", "box", "--devices", "2x80GiB", log=tmp_path / "up.log")
    try:
        tasks = [pbs_first, pbs_first + 1, slurm_first, slurm_first + 1]
        jobs = wait_final(env, tasks, timeout=90)
    finally:
        stop(up)
    assert {j["state"] for j in jobs.values()} == {"succeeded"}, (tmp_path / "up.log").read_text()

    host = socket.gethostname()
    for index, job_id in enumerate((pbs_first, pbs_first + 1), start=1):
        # -o DIR/ with -j oe: PBS's NAME.oID in it, stderr joined
        text = (tmp_path / "pbs-out" / f"pbsjob.o{job_id}").read_text()
        # PBS's subjob id, as PBS gives it: task INDEX of the array
        assert f"id={pbs_first}[{index}] name=pbsjob index={index} torque={index}" in text
        assert f"host={host} queue=default ncpus=2 node=box" in text
        assert "to-stderr" in text
    for task, job_id in enumerate((slurm_first, slurm_first + 1)):
        text = (tmp_path / f"slurm-out-{slurm_first}_{task}.log").read_text()
        assert f"id={job_id} task={task} array={slurm_first}" in text
        assert f"dir={tmp_path} name=slurmjob exported=kept" in text  # --export=ALL
        assert "to-stderr" in text  # --output alone: stderr goes with stdout
