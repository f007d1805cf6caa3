"""Resource profiles: rounding up, minimums, refusals and whole GPUs, table by table; and
the policy's ``kubernetes:`` section they read."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ebbtide.config.policy import (
    DEFAULT_MIG_PROFILES,
    KubernetesSettings,
    Policy,
    ProfileName,
    Toleration,
    parse_policy,
)
from ebbtide.errors import ConfigError, SpecError
from ebbtide.kube.profiles import (
    PROFILES,
    Grant,
    MigProfile,
    ProfileError,
    Slice,
    grant_for,
    profile_named,
    slice_words,
)
from ebbtide.queue.spec import JobSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "ebbtide.yaml"
CARD = KubernetesSettings()  # 80 GiB cards, the A100/H100 MIG profiles


def _grant(profile: str, pct: float, gpus: int, mib: int, **settings: object) -> Grant:
    return profile_named(profile, KubernetesSettings(**settings)).grant(pct, gpus, mib)


def _as_tuple(g: Grant) -> tuple[float, int, int, dict[str, str]]:
    return (g.compute_pct, g.gpus, g.memory_mib, g.resources)


# -- the table of grants -----------------------------------------------------------------

QGPU_CORE, QGPU_MEM = "tke.cloud.tencent.com/qgpu-core", "tke.cloud.tencent.com/qgpu-memory"
HAMI = ("nvidia.com/gpu", "nvidia.com/gpucores", "nvidia.com/gpumem", "nvidia.com/priority")
VOLCANO = ("volcano.sh/vgpu-number", "volcano.sh/vgpu-cores", "volcano.sh/vgpu-memory")
#: A whole card under HAMi and Volcano: all of its memory as a percent, never in MiB (an
#: H100 80GB registers 81559 MiB, less than the 80GiB of kubernetes.gpu_memory_mib).
HAMI_WHOLE = {
    "nvidia.com/gpu": "1",
    "nvidia.com/gpucores": "100",
    "nvidia.com/gpumem-percentage": "100",
    "nvidia.com/priority": "1",
}
VOLCANO_WHOLE = {
    "volcano.sh/vgpu-number": "1",
    "volcano.sh/vgpu-cores": "100",
    "volcano.sh/vgpu-memory-percentage": "100",
}
KOORD = ("koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio")
DIRECT = ("ebbtide.io/gpu-core", "ebbtide.io/gpu-memory")

GRANTS = [
    # qGPU: compute up to a step of 5 (at least 5), memory up to whole GiB (at least 1)
    ("qgpu", (23, 0, 4500), (25.0, 0, 5120, {QGPU_CORE: "25", QGPU_MEM: "5"})),
    ("qgpu", (25, 0, 8192), (25.0, 0, 8192, {QGPU_CORE: "25", QGPU_MEM: "8"})),
    ("qgpu", (0.01, 0, 1), (5.0, 0, 1024, {QGPU_CORE: "5", QGPU_MEM: "1"})),
    ("qgpu", (95.01, 0, 81920), (100.0, 0, 81920, {QGPU_CORE: "100", QGPU_MEM: "80"})),
    ("qgpu", (100, 2, 40960), (100.0, 2, 81920, {QGPU_CORE: "200"})),
    # HAMi: whole percents, MiB as asked, the low task priority
    (
        "hami",
        (23, 0, 4500),
        (23.0, 0, 4500, dict(zip(HAMI, ("1", "23", "4500", "1"), strict=True))),
    ),
    (
        "hami",
        (12.5, 0, 1000),
        (13.0, 0, 1000, dict(zip(HAMI, ("1", "13", "1000", "1"), strict=True))),
    ),
    (
        "hami",
        (100, 3, 20480),  # whole cards come with all their memory, as a percent of it
        (100.0, 3, 81920, {**HAMI_WHOLE, "nvidia.com/gpu": "3"}),
    ),
    ("hami", (100, 1, 81920), (100.0, 1, 81920, HAMI_WHOLE)),
    # Volcano vGPU: the same units, no priority resource
    ("volcano", (0.5, 0, 300), (1.0, 0, 300, dict(zip(VOLCANO, ("1", "1", "300"), strict=True)))),
    ("volcano", (100, 1, 81920), (100.0, 1, 81920, VOLCANO_WHOLE)),
    (
        "volcano",
        (100, 2, 8192),
        (100.0, 2, 81920, {**VOLCANO_WHOLE, "volcano.sh/vgpu-number": "2"}),
    ),
    # Koordinator: the memory ratio rounds up, so the grant holds the request
    ("koordinator", (25, 0, 8192), (25.0, 0, 8192, dict(zip(KOORD, ("25", "10"), strict=True)))),
    ("koordinator", (23, 0, 4500), (23.0, 0, 4915, dict(zip(KOORD, ("23", "6"), strict=True)))),
    (
        "koordinator",
        (100, 2, 100),
        (100.0, 2, 81920, dict(zip(KOORD, ("200", "200"), strict=True))),
    ),
    # MIG: the smallest instance that holds both
    ("mig", (10, 0, 4096), (14.29, 0, 9536, {"nvidia.com/mig-1g.10gb": "1"})),
    ("mig", (10, 0, 12288), (14.29, 0, 19073, {"nvidia.com/mig-1g.20gb": "1"})),
    ("mig", (25, 0, 8192), (28.57, 0, 19073, {"nvidia.com/mig-2g.20gb": "1"})),
    ("mig", (40, 0, 30000), (42.86, 0, 38146, {"nvidia.com/mig-3g.40gb": "1"})),
    ("mig", (50, 0, 1024), (57.14, 0, 38146, {"nvidia.com/mig-4g.40gb": "1"})),
    ("mig", (90, 0, 10240), (100.0, 0, 76293, {"nvidia.com/mig-7g.80gb": "1"})),
    # whole: a share gets one card, with all its memory
    ("whole", (25, 0, 8192), (100.0, 1, 81920, {"nvidia.com/gpu": "1"})),
    ("whole", (100, 4, 81920), (100.0, 4, 81920, {"nvidia.com/gpu": "4"})),
    # direct: ebbtide's own resources, node totals
    ("direct", (23.5, 0, 4500), (24.0, 0, 4500, dict(zip(DIRECT, ("24", "4500"), strict=True)))),
    # whole cards ask for what the planner packs, which the node's advertised spare holds:
    # the compute it keeps free on each card and the memory asked (at most a card's)
    (
        "direct",
        (100, 2, 40960),
        (100.0, 2, 81920, dict(zip(DIRECT, ("100", "81920"), strict=True))),
    ),
    ("direct", (100, 1, 79511), (100.0, 1, 81920, dict(zip(DIRECT, ("50", "79511"), strict=True)))),
    ("direct", (25, 0, 8192), (25.0, 0, 8192, dict(zip(DIRECT, ("25", "8192"), strict=True)))),
]


@pytest.mark.parametrize(("profile", "asked", "granted"), GRANTS)
def test_grants(
    profile: str,
    asked: tuple[float, int, int],
    granted: tuple[float, int, int, dict[str, str]],
) -> None:
    grant = _grant(profile, *asked)
    assert _as_tuple(grant) == granted
    assert grant.profile == profile
    assert grant.asked == Slice(*asked)


def test_every_profile_of_the_policy_is_in_the_table() -> None:
    assert set(PROFILES) == set(get_args(ProfileName))
    assert {profile for profile, _, _ in GRANTS} == set(PROFILES)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_grants_hold_the_request_and_are_whole_numbers(profile: str) -> None:
    shares = [(0.01, 0, 1), (33.33, 0, 3333), (99.99, 0, 70000)]
    for asked in shares if profile == "mig" else [*shares, (100, 1, 1)]:
        grant = _grant(profile, *asked)
        assert grant.compute_pct >= asked[0]
        assert grant.memory_mib >= asked[2]
        assert grant.gpus >= asked[1]
        for name, quantity in grant.resources.items():
            assert quantity.isdigit() and int(quantity) > 0, (name, quantity)


REQUESTS = st.one_of(
    st.tuples(st.integers(1, 10_000).map(lambda c: c / 100), st.just(0), st.integers(1, 76_000)),
    st.tuples(st.just(100.0), st.integers(1, 8), st.integers(1, 81_920)),
)


@given(REQUESTS, st.sampled_from(sorted(PROFILES)))
def test_granting_a_grant_again_changes_nothing(
    asked: tuple[float, int, int], profile: str
) -> None:
    """The executor sizes the pod from the job's row, which holds the grant already (for
    whole cards, the memory the planner packs: what was asked, at most the grant's)."""
    try:
        first = _grant(profile, *asked)
    except ProfileError:
        return
    row_mib = min(first.memory_mib, asked[2]) if first.gpus else first.memory_mib
    again = _grant(profile, first.compute_pct, first.gpus, row_mib)
    assert _as_tuple(again) == _as_tuple(first)
    assert first.memory_mib >= asked[2]
    assert first.compute_pct >= asked[0]


# -- notes ---------------------------------------------------------------------------------


def test_a_rounded_grant_says_what_was_rounded_in_words() -> None:
    grant = _grant("qgpu", 23, 0, 4500)
    assert grant.note == (
        "compute 23% → 25% (qGPU steps of 5%); memory 4500MiB → 5GiB (qGPU gives whole GiB)"
    )
    assert grant.words() == "25% 5GiB (qgpu)"
    assert grant.asked.words() == "23% 4500MiB"
    assert _grant("hami", 25, 0, 8192).note == ""
    assert "MIG 2g.20gb" in _grant("mig", 25, 0, 8192).note
    assert "one whole card" in _grant("whole", 25, 0, 8192).note


def test_slice_words() -> None:
    assert slice_words(23.0, 0, 4500) == "23% 4500MiB"
    assert slice_words(25.0, 0, 5120) == "25% 5GiB"
    assert slice_words(100.0, 1, 81920) == "1 GPU 80GiB"
    assert slice_words(100.0, 2, 40000) == "2 GPUs 40000MiB"


# -- refusals ------------------------------------------------------------------------------

REFUSALS = [
    ("qgpu", (25, 0, 81921), {}, "gpumem", "more than one card holds"),
    ("qgpu", (25, 0, 39_937), {"gpu_memory_mib": 40_000}, "gpumem", "rounds up to 40GiB"),
    ("qgpu", (100, 1, 90000), {}, "gpumem", "more than one card holds"),
    ("koordinator", (25, 0, 90000), {}, "gpumem", "kubernetes.gpu_memory_mib"),
    ("whole", (25, 0, 100_000), {}, "gpumem", "more than one card holds"),
    ("mig", (100, 1, 1024), {}, "gpu", "whole profile"),
    ("mig", (100, 2, 1024), {}, "gpu", "cannot be given as a MIG instance"),
    ("mig", (25, 0, 80 * 1024), {}, "gpumem", "7g.80gb: 76293MiB"),
    ("mig", (50, 0, 1024), {"mig_profiles": ["1g.10gb", "2g.20gb"]}, "gpu", "2g.20gb: 28.57%"),
    ("mig", (10, 0, 20_000), {"mig_profiles": ["1g.10gb", "1g.20gb"]}, "gpumem", "1g.20gb"),
]


@pytest.mark.parametrize(("profile", "asked", "settings", "field", "words"), REFUSALS)
def test_refusals_name_the_field(
    profile: str, asked: tuple[float, int, int], settings: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(ProfileError) as caught:
        _grant(profile, *asked, **settings)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert words in str(caught.value)
    assert isinstance(caught.value, SpecError)


@pytest.mark.parametrize("profile", ["hami", "volcano", "direct"])
def test_profiles_that_do_not_know_the_card_take_any_memory(profile: str) -> None:
    assert _grant(profile, 25, 0, 200_000).memory_mib == 200_000


def test_an_unknown_profile_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"unknown profile 'gpushare'; choose one of qgpu, hami"):
        profile_named("gpushare", CARD)


def test_schedulers_by_profile_and_the_setting_wins() -> None:
    assert profile_named("volcano", CARD).scheduler_name == "volcano"
    assert profile_named("hami", CARD).scheduler_name == "hami-scheduler"
    assert profile_named("koordinator", CARD).scheduler_name == "koord-scheduler"
    assert profile_named("qgpu", CARD).scheduler_name is None
    chosen = KubernetesSettings(scheduler_name="my-scheduler")
    assert profile_named("hami", chosen).scheduler_name == "my-scheduler"


def test_grant_for_a_spec_uses_the_sections_profile() -> None:
    spec = JobSpec(command=["true"], gpu="23%", gpumem="4500MiB")
    grant = grant_for(spec, KubernetesSettings(profile="qgpu"))
    assert (grant.compute_pct, grant.memory_mib, grant.profile) == (25.0, 5120, "qgpu")


def test_mig_profile_memory_is_decimal_gigabytes_in_mib() -> None:
    assert [MigProfile.parse(n).memory_mib for n in DEFAULT_MIG_PROFILES] == [
        9536,
        19073,
        19073,
        38146,
        38146,
        76293,
    ]
    assert MigProfile.parse("3g.40gb").compute_pct == 42.86


# -- the policy's kubernetes section -----------------------------------------------------


def _policy(text: str) -> Policy:
    return parse_policy(textwrap.dedent(text).lstrip("\n"), "p.yaml")


def test_no_section_by_default_and_its_defaults() -> None:
    assert Policy().kubernetes is None
    k8s = _policy("kubernetes: {}\n").kubernetes
    assert k8s == KubernetesSettings()
    assert (k8s.profile, k8s.namespace, k8s.image) == ("whole", "ebbtide-jobs", None)
    assert (k8s.priority_class, k8s.runtime_class, k8s.scheduler_name) == (
        "ebbtide-offline",
        "nvidia",
        None,
    )
    assert (k8s.checkpoint_claim, k8s.checkpoint_mount, k8s.state_dir) == (
        None,
        "/var/lib/ebbtide/checkpoints",
        "/var/lib/ebbtide",
    )
    assert (k8s.gpu_memory_mib, k8s.grace_margin_s, k8s.start_timeout_s) == (81920, 1.0, 300.0)
    assert k8s.mig_profiles == list(DEFAULT_MIG_PROFILES)


def test_section_with_units_and_queue_overrides() -> None:
    policy = _policy(
        """
        kubernetes:
          profile: koordinator
          image: reg.example.com/ml/train:1
          gpu_memory_mib: 40GiB
          start_timeout_s: 10m
          checkpoint_claim: ckpt
        queues:
          research:
            image: reg.example.com/ml/research:2
            checkpoint_claim: research-ckpt
        """
    )
    assert policy.kubernetes is not None
    assert policy.kubernetes.gpu_memory_mib == 40960
    assert policy.kubernetes.start_timeout_s == 600.0
    assert policy.image_for("default") == "reg.example.com/ml/train:1"
    assert policy.image_for("research") == "reg.example.com/ml/research:2"
    assert policy.image_for("research", "mine:3") == "mine:3"
    assert policy.checkpoint_claim_for("default") == "ckpt"
    assert policy.checkpoint_claim_for("research") == "research-ckpt"
    assert "kubernetes (koordinator)" in policy.summary()


def test_tolerations_by_default_of_the_section_and_per_queue() -> None:
    gpu = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    assert _policy("kubernetes: {}\n").tolerations_for("default") == [gpu]
    assert Policy().tolerations_for("default") == []  # no pods without the section
    policy = _policy(
        """
        kubernetes:
          tolerations:
            - {key: pool, value: batch, effect: NoSchedule}
            - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute,
               tolerationSeconds: 30}
        queues:
          untainted: {tolerations: []}
          gpu: {tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]}
        """
    )
    assert [t.manifest() for t in policy.tolerations_for("default")] == [
        {"key": "pool", "operator": "Equal", "value": "batch", "effect": "NoSchedule"},
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        },
    ]
    assert policy.tolerations_for("untainted") == []
    assert policy.tolerations_for("gpu") == [gpu]
    assert policy.tolerations_for("no-such-queue") == policy.tolerations_for("default")


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        ("kubernetes: {profile: gpushare}\n", "p.yaml:1:14: kubernetes.profile", "'qgpu'"),
        ("kubernetes: {namespace: Jobs}\n", "p.yaml:1:14: kubernetes.namespace", "DNS label"),
        ("kubernetes:\n  image: 'a b'\n", "p.yaml:2:3: kubernetes.image", "whitespace"),
        (
            "kubernetes:\n  mig_profiles: [1g.10gb, 8g.90gb]\n",
            "p.yaml:2:27: kubernetes.mig_profiles.1",
            "not a MIG profile",
        ),
        ("kubernetes:\n  mig_profiles: []\n", "kubernetes.mig_profiles", "at least 1"),
        ("kubernetes:\n  state_dir: relative\n", "kubernetes.state_dir", "absolute path"),
        ("kubernetes:\n  state_dir: /a/../b\n", "kubernetes.state_dir", "'..'"),
        (
            "kubernetes:\n  checkpoint_mount: /var/lib/ebbtide\n",
            "p.yaml:2:3: kubernetes.checkpoint_mount",
            "same path as state_dir",
        ),
        ("kubernetes:\n  grace_margin_s: 2m\n", "kubernetes.grace_margin_s", "from 0s to 1m"),
        ("kubernetes:\n  gpu_memory_mib: 0\n", "kubernetes.gpu_memory_mib", "greater than 0"),
        ("kubernetes:\n  start_timeout_s: yes\n", "kubernetes.start_timeout_s", "boolean"),
        ("kubernetes:\n  priority_class: Low_\n", "kubernetes.priority_class", "Kubernetes"),
        ("kubernetes:\n  profiles: hami\n", "kubernetes.profiles", "unknown key"),
        ("queues:\n  default:\n    image: ''\n", "queues.default.image", "must not be empty"),
        (
            "kubernetes:\n  tolerations:\n    - {key: a, operator: Exists, value: b}\n",
            "p.yaml:3:7: kubernetes.tolerations.0",
            "takes no value",
        ),
        (
            "kubernetes:\n  tolerations: [{value: b}]\n",
            "kubernetes.tolerations.0",
            "without a key must have operator Exists",
        ),
        (
            "kubernetes:\n  tolerations: [{key: a, effect: NoSchedule, tolerationSeconds: 5}]\n",
            "kubernetes.tolerations.0",
            "NoExecute effect only",
        ),
        ("kubernetes:\n  tolerations: [{key: 'a b'}]\n", "tolerations.0.key", "not a taint key"),
        (
            "kubernetes:\n  tolerations: [{key: a, value: -b}]\n",
            "tolerations.0.value",
            "taint value",
        ),
        (
            "kubernetes:\n  tolerations: [{key: a, effect: NoRun}]\n",
            "tolerations.0.effect",
            "NoExecute",
        ),
        (
            "kubernetes:\n  tolerations: [{key: a, operator: In}]\n",
            "tolerations.0.operator",
            "Exists",
        ),
        (
            "kubernetes:\n  tolerations: [{key: a, seconds: 1}]\n",
            "tolerations.0.seconds",
            "unknown key",
        ),
        (
            "queues:\n  gpu:\n    tolerations:\n"
            "      - {key: a, tolerationSeconds: -1, effect: NoExecute}\n",
            "queues.gpu.tolerations.0.tolerationSeconds",
            "greater than or equal to 0",
        ),
    ],
)
def test_section_errors_name_file_line_column_and_field(text: str, where: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy(text, "p.yaml")
    message = str(caught.value)
    assert where in message and words in message, message


def test_the_example_policy_documents_a_section_that_loads() -> None:
    lines = EXAMPLE.read_text().split("\n")
    start = lines.index("#kubernetes:")
    block = [line[1:] for line in lines[start:] if line.startswith("#")]
    policy = parse_policy("\n".join(lines[:start] + block), str(EXAMPLE))
    assert policy.kubernetes is not None
    assert policy.kubernetes.profile == "hami"
    assert policy.kubernetes.gpu_memory_mib == 81920


def test_the_schema_describes_the_section() -> None:
    schema = Policy.model_json_schema(by_alias=True)
    section = schema["$defs"]["KubernetesSettings"]["properties"]
    assert {"profile", "namespace", "image", "mig_profiles", "start_timeout_s"} <= set(section)
