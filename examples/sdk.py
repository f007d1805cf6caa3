"""Submit, watch and collect jobs from Python, as with submitit or Ray's job client.

Run it where ``ebb up`` (or a fleet) runs jobs, from the repository's root::

    ebb up --devices 1x80GiB &       # or: ebb demo, or a fleet (EBBTIDE_URL / EBBTIDE_DB_URL)
    python examples/sdk.py

It submits ``examples/count.py`` once and as a small array, waits for them, and prints
each one's output and the result it gave with ``ebbtide.job.result(...)``.
"""

from __future__ import annotations

import sys

from ebbtide import Client, JobFailed, JobSpec, SpecError, WaitTimeout


def main() -> int:
    with Client() as client:
        try:
            job = client.submit(
                JobSpec(
                    name="count",
                    command=[sys.executable, "examples/count.py", "50", "--step-s", "0.02"],
                    gpu="10%",
                    gpumem="1GiB",
                    deadline="10s",
                    kind="batch",
                )
            )
            # an array of three, at most two at once: client.submit_many gives every task
            tasks = client.submit_many(
                command=[sys.executable, "examples/count.py", "20", "--step-s", "0.02"],
                array="1-3%2",
            )
        except SpecError as exc:  # a bad field, named with the values it may take
            print(f"not submitted: {exc}", file=sys.stderr)
            return 2
        print(f"submitted job {job.id} ({job.state}) and array tasks {tasks}")
        try:
            print("result:", job.result(timeout=600))  # waits for the job to end
        except WaitTimeout:
            print(f"job {job.id} is still {job.state}; it goes on without us")
            return 1
        except JobFailed as exc:  # failed or cancelled: no result
            print(exc, file=sys.stderr)
            return 1
        print(job.logs().strip())
        for task in (client.handle(t) for t in tasks):
            ended = task.wait(timeout=600)
            print(f"task {task.id}: {ended.state}, result {task.result()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
