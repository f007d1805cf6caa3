"""A trial's trap: ``ebb demo --speedup 11`` (up to 20 is allowed) failed at once with
``checkpoint_interval_s: Input should be greater than or equal to 0.1``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ebbtide.cli.demo import job_spec, pick_jobs


@pytest.mark.parametrize("speedup", [0.25, 1, 10, 11, 15, 20])
def test_every_demo_job_is_a_valid_spec_at_every_allowed_speedup(
    speedup: float, tmp_path: Path
) -> None:
    for job in pick_jobs(8):
        spec = job_spec(job, speedup, tmp_path)
        assert spec.checkpoint_interval_s is not None and spec.checkpoint_interval_s >= 0.1
