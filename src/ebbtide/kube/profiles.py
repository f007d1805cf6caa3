"""Resource profiles: how a fleet's nodes share a GPU, and so what an attempt's pod asks
for.

(Longer than our modules should be: each profile (qGPU, HAMi, Volcano, Koordinator, MIG,
whole GPUs, direct) is a short function from the same ``Slice`` to the same ``Grant``, meant
to be read side by side; apart, their rounding rules could not be compared at a glance.)

A job asks for a slice: ``compute_pct`` (percent of one GPU's SMs), ``gpus`` (whole GPUs;
0 means a share of one GPU) and ``memory_mib`` (GPU memory per device, in MiB).  The
platform team picks one profile for its GPU nodes (``kubernetes.profile`` in the policy);
the profile turns the request into a :class:`Grant`: what the node really grants, in the
request's units (so the planner packs that), and the container's resource limits as
Kubernetes quantity strings.  A request the profile cannot express raises
:class:`ProfileError`, naming the field (``gpu`` or ``gpumem``).

======================  ==============================================================
profile                 the pod asks for
======================  ==============================================================
``qgpu`` (Tencent)      ``qgpu-core`` in steps of 5 % (at least 5; 100 per card) and
                        ``qgpu-memory`` in whole GiB (at least 1)
``hami``                ``nvidia.com/gpu`` (count), ``gpucores`` (1..100 %), ``gpumem``
                        (MiB; whole cards: ``gpumem-percentage`` 100), and HAMi's low
                        task priority
``volcano``             ``volcano.sh/vgpu-number``, ``vgpu-cores`` (%), ``vgpu-memory``
                        (MiB; whole cards: ``vgpu-memory-percentage`` 100); bound by the
                        ``volcano`` scheduler
``koordinator``         ``koordinator.sh/gpu-core`` (100 per card) and
                        ``gpu-memory-ratio`` (percent of a card's memory, rounded up)
``mig``                 one ``nvidia.com/mig-<g>g.<mem>gb``: the smallest MIG instance
                        that holds both the compute and the memory
``whole``               ``nvidia.com/gpu``: whole cards; a share gets one card
``direct``              ebbtide's own ``ebbtide.io/gpu-core`` (percent) and
                        ``ebbtide.io/gpu-memory`` (MiB), the node's spare as its agent
                        advertises it; whole cards ask what the planner packs (50 % and
                        the memory asked, per card); the card comes through the NVIDIA
                        runtime
======================  ==============================================================

Everything here is pure: no clock, no I/O, no Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Final, get_args

from ebbtide.config.policy import KubernetesSettings, ProfileName
from ebbtide.errors import ConfigError, SpecError
from ebbtide.queue.spec import SliceRequest
from ebbtide.scheduling.fit import MIN_WHOLE_GPU_HEADROOM_PCT
from ebbtide.units import MAX_GPUS, MAX_MEMORY_MIB

# -- resource names ----------------------------------------------------------------------

#: Tencent qGPU: compute in percent of a card (5..100 in steps of 5; N cards: 100·N).
QGPU_CORE: Final = "tke.cloud.tencent.com/qgpu-core"
#: Tencent qGPU: memory in whole GiB (at least 1).
QGPU_MEMORY: Final = "tke.cloud.tencent.com/qgpu-memory"
#: HAMi: the number of (virtual) GPUs.
HAMI_GPU: Final = "nvidia.com/gpu"
#: HAMi: percent of each GPU's SMs, 1..100.
HAMI_CORES: Final = "nvidia.com/gpucores"
#: HAMi: memory per GPU, in MiB (HAMi's docs say "MB"; see :func:`_hami`).
HAMI_MEMORY: Final = "nvidia.com/gpumem"
#: HAMi: memory per GPU as a percent of the card's (never with ``gpumem``).
HAMI_MEMORY_PCT: Final = "nvidia.com/gpumem-percentage"
#: HAMi: the task priority (0 high, 1 low); HAMi's webhook passes it on as
#: ``CUDA_TASK_PRIORITY``.
HAMI_PRIORITY: Final = "nvidia.com/priority"
#: HAMi's low task priority, the one offline work runs at.
HAMI_LOW_PRIORITY: Final = "1"
#: Volcano vGPU: the number of vGPUs.
VOLCANO_NUMBER: Final = "volcano.sh/vgpu-number"
#: Volcano vGPU: percent of each GPU's SMs.
VOLCANO_CORES: Final = "volcano.sh/vgpu-cores"
#: Volcano vGPU: memory per vGPU, in MiB (see :func:`_volcano`).
VOLCANO_MEMORY: Final = "volcano.sh/vgpu-memory"
#: Volcano vGPU: memory per vGPU as a percent of the card's (never with ``vgpu-memory``).
VOLCANO_MEMORY_PCT: Final = "volcano.sh/vgpu-memory-percentage"
#: A whole card's memory, as a percent resource asks for it.
WHOLE_CARD_PCT: Final = "100"
#: Koordinator: compute, 100 per card.
KOORD_CORE: Final = "koordinator.sh/gpu-core"
#: Koordinator: memory as a percent of one card's, 100 per card.
KOORD_MEMORY_RATIO: Final = "koordinator.sh/gpu-memory-ratio"
#: NVIDIA's device plugin: whole GPUs (``whole``).
NVIDIA_GPU: Final = "nvidia.com/gpu"
#: NVIDIA's device plugin, mixed MIG strategy: one instance of a MIG profile.
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
#: ebbtide's own extended resource (``direct``): compute, percent, 100 per card; the node
#: agent advertises it in the node's status.
EBBTIDE_GPU_CORE: Final = "ebbtide.io/gpu-core"
#: ebbtide's own extended resource (``direct``): GPU memory, in MiB.
EBBTIDE_GPU_MEMORY: Final = "ebbtide.io/gpu-memory"

#: qGPU's compute step, in percent (also its least compute).
QGPU_CORE_STEP_PCT: Final = 5
#: MiB in one GiB.
MIB_PER_GIB: Final = 1024
#: A GPU's MIG compute slices: a ``<g>g`` instance has g/7 of the SMs.
MIG_SLICES: Final = 7


# -- what is asked and what is granted ---------------------------------------------------


@dataclass(frozen=True)
class Slice:
    """A slice in the job's units: ``compute_pct`` (percent of one GPU's SMs; 100 for
    whole GPUs), ``gpus`` (whole GPUs, 0 for a share of one) and ``memory_mib`` (MiB per
    device)."""

    compute_pct: float
    gpus: int
    memory_mib: int

    def words(self) -> str:
        """``23% 4500MiB``, ``25% 5GiB``, ``2 GPUs 80GiB``."""
        return slice_words(self.compute_pct, self.gpus, self.memory_mib)


def slice_words(compute_pct: float, gpus: int, memory_mib: int) -> str:
    """A slice for people: ``23% 4500MiB``, ``1 GPU 80GiB`` (memory per device)."""
    share = f"{gpus} GPU{'s' if gpus > 1 else ''}" if gpus else f"{compute_pct:g}%"
    return f"{share} {_mib_words(memory_mib)}"


def _mib_words(mib: int) -> str:
    return f"{mib // MIB_PER_GIB}GiB" if mib % MIB_PER_GIB == 0 else f"{mib}MiB"


@dataclass(frozen=True)
class Grant:
    """What a node really grants for a request, in the request's units (the planner packs
    this), and the container's resource limits (Kubernetes quantity strings; requests
    equal them).  ``note`` says in words what was rounded, or is empty."""

    compute_pct: float
    gpus: int
    memory_mib: int
    resources: dict[str, str] = field(hash=False)
    #: the profile that granted it
    profile: str
    #: what was asked
    asked: Slice
    note: str = ""

    @property
    def slice(self) -> Slice:
        return Slice(self.compute_pct, self.gpus, self.memory_mib)

    def words(self) -> str:
        """``25% 5GiB (qgpu)``."""
        return f"{self.slice.words()} ({self.profile})"


class ProfileError(SpecError):
    """The fleet's resource profile cannot express a job's slice request.  ``field`` is
    the request's field: ``gpu`` (compute or whole GPUs) or ``gpumem`` (memory)."""


# -- the profiles ------------------------------------------------------------------------

_Rule = Callable[[Slice, KubernetesSettings], tuple[Slice, dict[str, str], list[str]]]


@dataclass(frozen=True)
class Profile:
    """One way nodes share a GPU: its name, one line on what it asks for, the scheduler
    its pods need (None: the default scheduler) and the rule that sizes a request."""

    name: str
    summary: str
    default_scheduler: str | None
    rule: _Rule = field(repr=False)

    def grant(self, request: Slice, settings: KubernetesSettings) -> Grant:
        """What this profile grants for ``request`` on nodes ``settings`` describes."""
        _check_request(request)
        granted, resources, notes = self.rule(request, settings)
        return Grant(
            compute_pct=granted.compute_pct,
            gpus=granted.gpus,
            memory_mib=granted.memory_mib,
            resources=resources,
            profile=self.name,
            asked=request,
            note="; ".join(notes),
        )


@dataclass(frozen=True)
class FleetProfile:
    """A profile with the fleet's settings: what :func:`profile_named` returns."""

    profile: Profile
    settings: KubernetesSettings

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def scheduler_name(self) -> str | None:
        """The pods' scheduler: the setting's, else the profile's (None: the default)."""
        return self.settings.scheduler_name or self.profile.default_scheduler

    def grant(self, compute_pct: float, gpus: int, memory_mib: int) -> Grant:
        """The grant for a request of ``compute_pct`` percent (100 for whole GPUs),
        ``gpus`` whole GPUs (0: a share of one) and ``memory_mib`` MiB per device;
        :class:`ProfileError` when the profile cannot express it."""
        return self.profile.grant(Slice(compute_pct, gpus, memory_mib), self.settings)


def _check_request(request: Slice) -> None:
    if not 0 < request.compute_pct <= 100:
        raise ProfileError("gpu", f"a share must be in (0, 100] percent, got {request.compute_pct}")
    if not 0 <= request.gpus <= MAX_GPUS:
        raise ProfileError("gpu", f"whole GPUs must be from 0 to {MAX_GPUS}, got {request.gpus}")
    if request.gpus and request.compute_pct != 100:
        raise ProfileError("gpu", "whole GPUs take all their compute (100%)")
    if not 0 < request.memory_mib <= MAX_MEMORY_MIB:
        raise ProfileError("gpumem", f"must be from 1 to {MAX_MEMORY_MIB} MiB")


def _ceil_to(value: float | Decimal, step: int) -> int:
    """``value`` rounded up to a multiple of ``step`` (exact for two-decimal percents)."""
    steps = (Decimal(str(value)) / step).to_integral_value(rounding=ROUND_CEILING)
    return int(steps) * step


def _whole_percent(request: Slice, what: str, notes: list[str]) -> int:
    """The share as a whole percent, rounded up (a note when it was not one)."""
    pct = _ceil_to(request.compute_pct, 1)
    if pct != request.compute_pct:
        notes.append(f"compute {request.compute_pct:g}% → {pct}% ({what} takes whole percents)")
    return pct


def _within_card(request: Slice, settings: KubernetesSettings, profile: str) -> None:
    card = settings.gpu_memory_mib
    if request.memory_mib > card:
        raise ProfileError(
            "gpumem",
            f"{_mib_words(request.memory_mib)} is more than one card holds under the "
            f"{profile} profile ({_mib_words(card)}, kubernetes.gpu_memory_mib)",
        )


def _qgpu(request: Slice, settings: KubernetesSettings) -> tuple[Slice, dict[str, str], list[str]]:
    # Tencent TKE qGPU: compute at least 5 (5 % of a card) in steps of 5, up to 100; whole
    # cards as 100·N; memory at least 1 GiB in steps of 1 GiB (TKE's qGPU documentation,
    # "Shared Granularity" and "Complete Card Allocation").
    _within_card(request, settings, "qgpu")
    if request.gpus:
        notes = ["whole cards come with all their memory"]
        granted = Slice(100.0, request.gpus, settings.gpu_memory_mib)
        return granted, {QGPU_CORE: str(100 * request.gpus)}, notes
    notes = []
    core = max(QGPU_CORE_STEP_PCT, _ceil_to(request.compute_pct, QGPU_CORE_STEP_PCT))
    if core != request.compute_pct:
        notes.append(f"compute {request.compute_pct:g}% → {core}% (qGPU steps of 5%)")
    gib = max(1, _ceil_to(request.memory_mib, MIB_PER_GIB) // MIB_PER_GIB)
    if gib * MIB_PER_GIB > settings.gpu_memory_mib:
        raise ProfileError(
            "gpumem",
            f"{_mib_words(request.memory_mib)} rounds up to {gib}GiB (qGPU gives whole GiB), "
            f"more than one card holds ({_mib_words(settings.gpu_memory_mib)}, "
            "kubernetes.gpu_memory_mib)",
        )
    if gib * MIB_PER_GIB != request.memory_mib:
        notes.append(f"memory {_mib_words(request.memory_mib)} → {gib}GiB (qGPU gives whole GiB)")
    granted = Slice(float(core), 0, gib * MIB_PER_GIB)
    return granted, {QGPU_CORE: str(core), QGPU_MEMORY: str(gib)}, notes


def _hami(request: Slice, settings: KubernetesSettings) -> tuple[Slice, dict[str, str], list[str]]:
    # HAMi: nvidia.com/gpucores is a whole percent 1..100 of each GPU; nvidia.com/gpumem
    # is per GPU in what HAMi's docs call MB, but its device plugin counts NVML's bytes /
    # 1024 / 1024 and HAMi-core reads the limit it passes on (CUDA_DEVICE_MEMORY_LIMIT_<i>
    # = "<n>m") as n·2^20 bytes: MiB.  The task priority is a resource limit
    # (nvidia.com/priority, HAMi's `resourcePriority`, docs/config.md) that HAMi's webhook
    # turns into CUDA_TASK_PRIORITY (pkg/device/nvidia/device.go, MutateAdmission); 0 is
    # high, 1 low: a low task yields to high ones and may use compute left idle.  Whole
    # cards ask for nvidia.com/gpumem-percentage 100 (HAMi's exclusive card): an absolute
    # gpumem of kubernetes.gpu_memory_mib (81920 for "80GiB") is more than an H100 80GB
    # registers (81559 MiB), and HAMi would never find room for it.
    notes: list[str] = []
    count = max(1, request.gpus)
    pct = 100 if request.gpus else _whole_percent(request, "HAMi", notes)
    memory_mib = _whole_card_memory(request, settings, notes)
    memory = (HAMI_MEMORY_PCT, WHOLE_CARD_PCT) if request.gpus else (HAMI_MEMORY, str(memory_mib))
    resources = {
        HAMI_GPU: str(count),
        HAMI_CORES: str(pct),
        memory[0]: memory[1],
        HAMI_PRIORITY: HAMI_LOW_PRIORITY,
    }
    return Slice(float(pct), request.gpus, memory_mib), resources, notes


def _volcano(
    request: Slice, settings: KubernetesSettings
) -> tuple[Slice, dict[str, str], list[str]]:
    # Volcano vGPU (volcano-vgpu-device-plugin, built on HAMi-core): vgpu-cores is a whole
    # percent of each vGPU's card; vgpu-memory is per vGPU in what its docs call MB, and
    # like HAMi's it is MiB (NVML bytes / 1024 / 1024, enforced by HAMi-core in MiB).
    # Whole cards ask for vgpu-memory-percentage 100 (Volcano's deviceshare reads it
    # beside vgpu-memory), for the reason HAMi's do (see _hami).
    notes: list[str] = []
    count = max(1, request.gpus)
    pct = 100 if request.gpus else _whole_percent(request, "Volcano vGPU", notes)
    memory_mib = _whole_card_memory(request, settings, notes)
    memory = (
        (VOLCANO_MEMORY_PCT, WHOLE_CARD_PCT) if request.gpus else (VOLCANO_MEMORY, str(memory_mib))
    )
    resources = {
        VOLCANO_NUMBER: str(count),
        VOLCANO_CORES: str(pct),
        memory[0]: memory[1],
    }
    return Slice(float(pct), request.gpus, memory_mib), resources, notes


def _koordinator(
    request: Slice, settings: KubernetesSettings
) -> tuple[Slice, dict[str, str], list[str]]:
    # Koordinator's deviceshare: gpu-core and gpu-memory-ratio are percents of a card;
    # past 100 they must be multiples of 100 (whole cards).  The ratio is rounded up so the
    # grant holds the request on a card of kubernetes.gpu_memory_mib.
    _within_card(request, settings, "koordinator")
    card = settings.gpu_memory_mib
    if request.gpus:
        whole = str(100 * request.gpus)
        notes = ["whole cards come with all their memory"]
        granted = Slice(100.0, request.gpus, card)
        return granted, {KOORD_CORE: whole, KOORD_MEMORY_RATIO: whole}, notes
    notes = []
    pct = _whole_percent(request, "Koordinator", notes)
    ratio = _ceil_to(Decimal(request.memory_mib * 100) / card, 1)
    memory_mib = ratio * card // 100
    if memory_mib != request.memory_mib:
        notes.append(
            f"memory {_mib_words(request.memory_mib)} → {ratio}% of a card of "
            f"{_mib_words(card)} ({_mib_words(memory_mib)})"
        )
    resources = {KOORD_CORE: str(pct), KOORD_MEMORY_RATIO: str(ratio)}
    return Slice(float(pct), 0, memory_mib), resources, notes


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile: ``slices`` of a GPU's 7 compute slices and the memory of its name
    (``10gb``) in decimal gigabytes, in MiB (9536 for 10 GB: less than the instance has
    on an A100 or H100, so a grant never promises more than the instance holds)."""

    name: str
    slices: int
    memory_mib: int

    @property
    def compute_pct(self) -> float:
        return round(self.slices * 100 / MIG_SLICES, 2)

    @classmethod
    def parse(cls, name: str) -> MigProfile:
        """``3g.40gb`` → 3 slices, 38146 MiB (the policy checked the form)."""
        slices, memory = name.removesuffix("gb").split("g.")
        return cls(name, int(slices), int(memory) * 10**9 // 2**20)


def _mig(request: Slice, settings: KubernetesSettings) -> tuple[Slice, dict[str, str], list[str]]:
    # NVIDIA's device plugin with the mixed MIG strategy: one nvidia.com/mig-<g>g.<mem>gb.
    if request.gpus:
        raise ProfileError(
            "gpu",
            f"{request.gpus} whole GPU(s) cannot be given as a MIG instance; ask for a share "
            "(gpu=90% gets the largest instance, 7g) or run whole GPUs on nodes of the "
            "whole profile",
        )
    profiles = sorted(
        (MigProfile.parse(name) for name in settings.mig_profiles),
        key=lambda p: (p.slices, p.memory_mib),
    )
    fast_enough = [p for p in profiles if p.compute_pct >= request.compute_pct]
    if not fast_enough:
        top = profiles[-1]
        raise ProfileError(
            "gpu",
            f"{request.compute_pct:g}% is more than the largest MIG instance of the nodes "
            f"gives ({top.name}: {top.compute_pct:g}%, kubernetes.mig_profiles)",
        )
    fits = [p for p in fast_enough if p.memory_mib >= request.memory_mib]
    if not fits:
        top = max(fast_enough, key=lambda p: p.memory_mib)
        raise ProfileError(
            "gpumem",
            f"{_mib_words(request.memory_mib)} is more than any MIG instance of the nodes "
            f"holds ({top.name}: {_mib_words(top.memory_mib)}, kubernetes.mig_profiles)",
        )
    pick = fits[0]
    notes = [
        f"{request.compute_pct:g}% and {_mib_words(request.memory_mib)} → MIG {pick.name} "
        f"({pick.compute_pct:g}%, {_mib_words(pick.memory_mib)})"
    ]
    granted = Slice(pick.compute_pct, 0, pick.memory_mib)
    return granted, {MIG_RESOURCE_PREFIX + pick.name: "1"}, notes


def _whole(request: Slice, settings: KubernetesSettings) -> tuple[Slice, dict[str, str], list[str]]:
    _within_card(request, settings, "whole")
    count = max(1, request.gpus)
    notes = [] if request.gpus else [f"a {request.compute_pct:g}% share → one whole card"]
    notes.append("whole cards come with all their memory")
    granted = Slice(100.0, count, settings.gpu_memory_mib)
    return granted, {NVIDIA_GPU: str(count)}, notes


def _direct(
    request: Slice, settings: KubernetesSettings
) -> tuple[Slice, dict[str, str], list[str]]:
    # ebbtide's own extended resources, advertised by the node agent: the node's spare
    # (capacity less online use and the forecast reserve, summed over its cards), so the
    # pod asks what the planner packed, and the kube-scheduler's fit agrees with its:
    # a share its compute and memory; N whole GPUs the compute the planner makes sure each
    # card has free (MIN_WHOLE_GPU_HEADROOM_PCT) and the memory the job was packed at
    # (never more than a card), N times.  A card's nominal 100 % and
    # kubernetes.gpu_memory_mib are more than any card beside online work advertises (an
    # H100 80GB reports 81559 MiB): asked for, the pod would never be scheduled.  The
    # container still gets the whole cards, through the NVIDIA runtime.
    notes: list[str] = []
    if not request.gpus:
        pct = _whole_percent(request, "ebbtide.io/gpu-core", notes)
        resources = {EBBTIDE_GPU_CORE: str(pct), EBBTIDE_GPU_MEMORY: str(request.memory_mib)}
        return Slice(float(pct), 0, request.memory_mib), resources, notes
    memory_mib = _whole_card_memory(request, settings, notes)
    packed_mib = min(request.memory_mib, settings.gpu_memory_mib)
    resources = {
        EBBTIDE_GPU_CORE: str(int(MIN_WHOLE_GPU_HEADROOM_PCT) * request.gpus),
        EBBTIDE_GPU_MEMORY: str(packed_mib * request.gpus),
    }
    return Slice(100.0, request.gpus, memory_mib), resources, notes


def _whole_card_memory(request: Slice, settings: KubernetesSettings, notes: list[str]) -> int:
    """The memory per device to ask for: whole GPUs come with all of each card's (where a
    layer would otherwise limit a whole card to the job's default request)."""
    if not request.gpus:
        return request.memory_mib
    if request.memory_mib != settings.gpu_memory_mib:
        notes.append("whole cards come with all their memory")
    return settings.gpu_memory_mib


def _profiles(*profiles: Profile) -> dict[str, Profile]:
    return {p.name: p for p in profiles}


#: Every profile, by name.
PROFILES: Final[Mapping[str, Profile]] = _profiles(
    Profile("qgpu", "Tencent qGPU: qgpu-core (5% steps), qgpu-memory (GiB)", None, _qgpu),
    Profile(
        "hami",
        "HAMi: nvidia.com/gpu, gpucores (%), gpumem (MiB) or gpumem-percentage",
        "hami-scheduler",
        _hami,
    ),
    Profile("volcano", "Volcano vGPU: vgpu-number, vgpu-cores, vgpu-memory", "volcano", _volcano),
    Profile(
        "koordinator",
        "Koordinator: gpu-core (%), gpu-memory-ratio (% of a card)",
        "koord-scheduler",
        _koordinator,
    ),
    Profile("mig", "NVIDIA MIG: the smallest nvidia.com/mig-<g>g.<mem>gb that fits", None, _mig),
    Profile("whole", "whole cards: nvidia.com/gpu (a share gets one card)", None, _whole),
    Profile("direct", "ebbtide.io/gpu-core (%), gpu-memory (MiB), NVIDIA runtime", None, _direct),
)
#: The profiles' names, as the policy spells them.
PROFILE_NAMES: Final = get_args(ProfileName)


def profile_named(name: str, settings: KubernetesSettings | None = None) -> FleetProfile:
    """The profile called ``name`` on nodes ``settings`` describes (None: the defaults);
    a :class:`~ebbtide.errors.ConfigError` listing the choices for an unknown name."""
    profile = PROFILES.get(name)
    if profile is None:
        choices = ", ".join(PROFILES)
        raise ConfigError(f"profile: unknown profile {name!r}; choose one of {choices}")
    return FleetProfile(profile, settings if settings is not None else KubernetesSettings())


def grant_for(request: SliceRequest, settings: KubernetesSettings) -> Grant:
    """What the fleet's profile (``settings.profile``) grants for ``request``."""
    fleet = profile_named(settings.profile, settings)
    return fleet.grant(request.compute_pct, request.gpus, request.memory_mib)
