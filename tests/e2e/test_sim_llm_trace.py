"""``ebb sim`` end to end on the shipped LLM-serving trace (``azure_code_llm_load.csv``): a
short slice, every policy, one JSON object."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.e2e.helpers import EBB, REPO

pytestmark = pytest.mark.e2e

TRACE = "src/ebbtide/data/azure_code_llm_load.csv"
ARGS = ("--online", f"trace:{TRACE}", "--jobs", "synthetic", "--hours", "0.1", "--json")
POLICIES = ["ebbtide", "exclusive", "static-night", "greedy"]


def test_sim_on_the_llm_trace() -> None:
    proc = subprocess.run(
        [*EBB, "sim", *ARGS],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    workload = result["workload"]
    assert (workload["devices"], workload["span_h"]) == (8, 0.1)
    assert list(result["policies"]) == POLICIES
    ebbtide, greedy = result["policies"]["ebbtide"], result["policies"]["greedy"]
    assert ebbtide["harvest_efficiency"] > 0.0
    assert ebbtide["oom_events"] == 0
    assert ebbtide["deadline_misses"] == 0
    # the bursts force evictions; ebbtide's forecast keeps out of more of them than greedy
    assert ebbtide["evictions"] < greedy["evictions"]  # pauses stand in for most
    assert ebbtide["interference_compute_frac"] < greedy["interference_compute_frac"]
