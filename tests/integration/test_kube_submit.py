"""Submitting under a ``kubernetes:`` section: the job's row holds what the profile grants
(the planner packs that), the spec keeps what was asked, and what the profile cannot
express is refused with nothing stored."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ebbtide.client import Client
from ebbtide.config.policy import parse_policy
from ebbtide.config.settings import Settings
from ebbtide.errors import SpecError
from ebbtide.identity import Caller
from ebbtide.queue.spec import JobSpec

QGPU = """
kubernetes:
  profile: qgpu
  image: reg.example.com/ml/train:1
queues:
  default: {}
  research:
    image: reg.example.com/ml/research:2
"""


def _client(tmp_path: Path, policy_text: str | None) -> Client:
    settings = Settings.from_env({"EBBTIDE_HOME": str(tmp_path)})
    policy = parse_policy(policy_text, "p.yaml") if policy_text is not None else None
    return Client(settings, policy=policy, caller=Caller("alice"))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    with _client(tmp_path, QGPU) as c:
        yield c


def test_the_row_holds_the_grant_and_the_spec_what_was_asked(client: Client) -> None:
    job_id = client.submit(command=["python", "train.py"], gpu="23%", gpumem="4500MiB")
    job = client.get(job_id)
    assert (job.compute_pct, job.gpus, job.memory_mib) == (25.0, 0, 5120)
    spec = json.loads(job.spec_json)
    assert (spec["compute_pct"], spec["gpus"], spec["memory_mib"]) == (23.0, 0, 4500)
    full = client.describe(job_id)
    assert full["slice"] == {"compute_pct": 25.0, "gpus": 0, "memory_mib": 5120}
    assert full["slice_asked"] == {"compute_pct": 23.0, "gpus": 0, "memory_mib": 4500}
    granted = full["slice_granted"]
    assert (granted["compute_pct"], granted["memory_mib"], granted["profile"]) == (
        25.0,
        5120,
        "qgpu",
    )
    assert "qGPU steps of 5%" in granted["note"]
    assert full["image"] == "reg.example.com/ml/train:1"
    [submitted] = client.events(job_id)
    assert submitted["granted"]["profile"] == "qgpu"


def test_every_task_of_an_array_holds_the_grant(client: Client) -> None:
    ids = client.submit_many(
        JobSpec(command=["x"], gpu="12%", gpumem="1GiB", array={"start": 1, "end": 3})
    )
    assert [(client.get(i).compute_pct, client.get(i).memory_mib) for i in ids] == [
        (15.0, 1024)
    ] * 3


def test_the_image_comes_from_the_job_else_the_queue_else_the_section(client: Client) -> None:
    own = client.submit(command=["x"], image="mine:3", queue="research")
    queue = client.submit(command=["x"], queue="research")
    assert client.describe(own)["image"] == "mine:3"
    assert client.describe(queue)["image"] == "reg.example.com/ml/research:2"
    assert json.loads(client.get(queue).spec_json)["image"] is None


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"gpumem": "81GiB"}, "gpumem", "more than one card holds under the qgpu profile"),
        ({"signal": "USR1"}, "signal", "the kubelet warns a pod with SIGTERM only"),
    ],
)
def test_refusals_store_nothing(
    client: Client, fields: dict[str, str], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as caught:
        client.submit(command=["x"], **fields)
    assert caught.value.field == field
    assert words in str(caught.value)
    assert client.list() == []


def test_no_image_anywhere_is_refused(tmp_path: Path) -> None:
    with _client(tmp_path, "kubernetes: {profile: hami}\n") as c:
        with pytest.raises(SpecError) as caught:
            c.submit(command=["x"])
        assert caught.value.field == "image"
        assert "names no image" in str(caught.value)
        assert c.list() == []
        assert c.submit(command=["x"], image="mine:1") == 1


def test_mig_refuses_whole_gpus(tmp_path: Path) -> None:
    with _client(tmp_path, "kubernetes: {profile: mig, image: i}\n") as c:
        with pytest.raises(SpecError, match=r"^gpu: 1 whole GPU"):
            c.submit(command=["x"], gpu=1)
        job = c.get(c.submit(command=["x"], gpu="90%", gpumem="10GiB"))
        assert (job.compute_pct, job.memory_mib) == (100.0, 76293)


def test_without_a_section_nothing_is_rounded_or_refused(tmp_path: Path) -> None:
    with _client(tmp_path, None) as c:
        job_id = c.submit(command=["x"], gpu="23%", gpumem="4500MiB", signal="USR1")
        job = c.get(job_id)
        assert (job.compute_pct, job.memory_mib) == (23.0, 4500)
        full = c.describe(job_id)
        assert full["slice_asked"] == {"compute_pct": 23.0, "gpus": 0, "memory_mib": 4500}
        assert full["slice_granted"]["profile"] is None
        assert full["image"] is None
        assert "granted" not in c.events(job_id)[0]


def test_a_whole_card_is_packed_at_what_fits_beside_the_margin(client: Client) -> None:
    """A platform engineer's trap: a whole card's row held the card's nominal size
    (``kubernetes.gpu_memory_mib``, 81920), more than any card has free beside the 2GiB
    margin, so the planner never placed it; its pod still gets the whole card."""
    import time

    client.store.heartbeat(
        "gpu-a", started_at=time.time(), devices=[{"index": 0, "memory_mib": 81559}]
    )
    job_id = client.submit(command=["python", "train.py"], gpu="1")
    job = client.get(job_id)
    assert (job.gpus, job.memory_mib) == (1, 81559 - 2048)  # the smallest card less the margin
    [submitted] = client.events(job_id)
    granted = submitted["granted"]  # what the pod gets: all of the card
    assert (granted["gpus"], granted["memory_mib"]) == (1, 81920)
    assert "whole cards come with all their memory" in granted["note"]
    asked = client.submit(command=["python", "train.py"], gpu="1", gpumem="40GiB")
    assert client.get(asked).memory_mib == 40 * 1024
