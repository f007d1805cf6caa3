"""The policy file (``ebbtide.yaml``): typed, versioned and strict.

(Longer than our modules should be: it is the policy file's whole schema, one model per
section, with the checks across sections and the loader that reports every error with its
file, line and field path; a user looking up a key finds every key here.)

- ``defaults``: safety margins, the eviction deadline, timeouts, anti-thrash settings;
- ``queues``: priority, preemptibility, deadlines, shares, limits, protections, aliases;
- ``windows``: when offline work may run (see :mod:`ebbtide.config.windows`);
- ``devices``: named pools of devices that windows can be limited to;
- ``admins``: users who may act on anyone's jobs (root always may); the only place admins
  are defined: a caller's environment never makes anyone one;
- ``allow_root_jobs``: whether a node agent running as root starts jobs owned by root
  (default no: a root job on a fleet is a root shell on a GPU host);
- ``kubernetes``: optional; offline attempts run as pods, sized by the fleet's resource
  profile (see :mod:`ebbtide.kube.profiles`).
- ``retention``: how long finished jobs stay in the store (default: for ever).

Unknown keys are errors; every error names the file, the line and column and the field
path, and all errors are reported at once: the checks across sections run on the parts
that are valid even when others are not.  ``ebb policy schema`` prints the JSON Schema.
Every number is finite and bounded; timeouts have floors the node agent's timing needs
(it ticks every 50 ms and heartbeats every 0.5 s).  Reading the YAML itself (duplicate
keys, nesting, aliases) is :mod:`ebbtide.config.loader`'s.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from ebbtide.config.base import Strict
from ebbtide.config.loader import read_config, read_yaml
from ebbtide.config.types import NOT_BOOL, Duration, SizeMiB, between
from ebbtide.config.windows import BlackoutWindow, CronWindow, LullWindow, Window
from ebbtide.errors import ConfigError
from ebbtide.queue.purge import DEFAULT_BATCH_JOBS, MAX_BATCH_JOBS, MIN_PURGE_AGE_S
from ebbtide.queue.spec import MAX_DEADLINE_S, MAX_PATH_BYTES, MIN_DEADLINE_S, check_image
from ebbtide.scheduling.forecast import Forecaster
from ebbtide.scheduling.snapshot import (
    MAX_PAUSE_S,
    MAX_SUSPEND_S,
    MIN_PAUSE_S,
    PAUSE_DRAIN_S,
    RESTORE_HYSTERESIS_MIB,
    SUSPEND_HOST_MEMORY_PCT,
    THAW_HYSTERESIS_PCT,
    Margins,
    PauseRules,
    PlanRules,
    QueueLimits,
    backoff_s,
)
from ebbtide.units import MAX_DURATION_S, shown

API_VERSION: Final = "ebbtide/v1"
_QUEUE_NAME = r"^[A-Za-z0-9_\-]{1,64}$"

#: Shortest heartbeat timeout, in seconds: four of the node agent's 0.5 s heartbeats (it
#: writes one to the store at least every quarter of the timeout, and fences its
#: attempts at half of it).
MIN_HEARTBEAT_TIMEOUT_S = 2.0
#: Shortest dispatch timeout, in seconds: the agent picks a start up within a 50 ms tick
#: or its next 0.5 s reconcile, then starts the attempt's shim and the job.
MIN_DISPATCH_TIMEOUT_S = 2.0
#: Longest heartbeat or dispatch timeout, in seconds: past an hour, a dead node's jobs wait
#: that long before anyone notices.
MAX_TIMEOUT_S = 3600.0
#: Longest cooldown, backoff, recovery, warm-up or protected runtime, in seconds (a day).
MAX_WAIT_S = 86400.0
#: Longest online history the forecast rests on, in seconds (a week).
MAX_HISTORY_S = 7 * 86400.0
#: Most attempts (``max_running``) or evictions (``max_preemptions``) a limit may name.
MAX_COUNT = 1_000_000

#: Longest time a grace margin may keep back, in seconds.
MAX_GRACE_MARGIN_S = 60.0

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MIG_PROFILE = re.compile(r"([1-7])g\.([1-9][0-9]{0,3})gb")


def _dns_label(value: str) -> str:
    """A Kubernetes name of one DNS label (a namespace): at most 63 characters."""
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a DNS label: at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return value


def _dns_subdomain(value: str) -> str:
    """A Kubernetes object name (DNS subdomain): labels joined by '.', at most 253."""
    if len(value) > 253 or not all(_DNS_LABEL.fullmatch(part) for part in value.split(".")):
        raise ValueError(
            f"{value!r} is not a Kubernetes name: at most 253 lowercase letters, digits, "
            "'-' and '.', starting and ending with a letter or digit"
        )
    return value


def _absolute_path(value: str) -> str:
    if not value.startswith("/") or "\0" in value or len(value.encode()) > MAX_PATH_BYTES:
        raise ValueError(f"expected an absolute path like /var/lib/ebbtide, got {value!r}")
    if ".." in value.split("/"):
        raise ValueError(f"{value!r} holds a '..' part; give the path without it")
    return value.rstrip("/") or "/"


def _mig_profile(value: str) -> str:
    if not _MIG_PROFILE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a MIG profile name; expected <slices>g.<memory>gb with 1 to 7 "
            "compute slices, like 1g.10gb or 3g.40gb"
        )
    return value


def _image(value: str) -> str:
    return check_image(value)


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
KubeName = Annotated[str, AfterValidator(_dns_subdomain)]
AbsolutePath = Annotated[str, AfterValidator(_absolute_path)]
MigProfile = Annotated[str, AfterValidator(_mig_profile)]
Image = Annotated[str, AfterValidator(_image)]

#: The resource profiles a platform team picks for its GPU nodes (what each one means:
#: :mod:`ebbtide.kube.profiles`).
ProfileName = Literal["qgpu", "hami", "volcano", "koordinator", "mig", "whole", "direct"]
#: The MIG profiles of an 80 GB A100 or H100, smallest first.
DEFAULT_MIG_PROFILES: Final = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")

#: The effects a taint may have (a toleration with none tolerates every effect).
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
#: A label key: an optional DNS-subdomain prefix and '/', then a name of at most 63
#: alphanumerics, '-', '_' and '.' (``nvidia.com/gpu``).
_LABEL_KEY = re.compile(
    r"(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


class Toleration(Strict):
    """One Kubernetes toleration, as the pod spec spells it: attempt pods carry the
    ``kubernetes.tolerations`` (or their queue's) so they may land on tainted GPU nodes.
    Checked as the API server checks it, so a pod is never refused for one."""

    #: the taint key tolerated; None (with ``operator: Exists``): every taint
    key: str | None = None
    #: ``Equal`` (the taint's value must be ``value``) or ``Exists`` (any value)
    operator: Literal["Equal", "Exists"] = "Equal"
    #: the value an ``Equal`` toleration matches (None: the empty value)
    value: str | None = None
    #: the taint effect tolerated; None: every effect
    effect: TaintEffect | None = None
    #: under ``NoExecute``, how long the pod stays once the taint appears, in seconds
    #: (None: for ever)
    tolerationSeconds: Annotated[int, Field(ge=0, le=2**31 - 1), NOT_BOOL] | None = None

    @field_validator("key")
    @classmethod
    def _label_key(cls, key: str | None) -> str | None:
        if key is not None and (len(key) > 316 or not _LABEL_KEY.fullmatch(key)):
            raise ValueError(
                f"{key!r} is not a taint key: an optional DNS prefix and '/', then at most 63 "
                "letters, digits, '-', '_' and '.' (like nvidia.com/gpu)"
            )
        return key

    @field_validator("value")
    @classmethod
    def _label_value(cls, value: str | None) -> str | None:
        if value is not None and not _LABEL_VALUE.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a taint value: at most 63 letters, digits, '-', '_' and "
                "'.', starting and ending with a letter or digit"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("an Exists toleration takes no value; drop value or use Equal")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without a key must have operator Exists")
        if self.tolerationSeconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies to the NoExecute effect only")
        return self

    def manifest(self) -> dict[str, Any]:
        """As a pod spec's ``tolerations`` entry (unset fields left out)."""
        return self.model_dump(exclude_none=True)


#: What attempt pods tolerate unless the policy says otherwise: the taint GPU node pools
#: carry so that only pods that use a GPU land there (GKE adds ``nvidia.com/gpu=present``
#: by itself; the GPU operator's and EKS's guides use the same key).
DEFAULT_TOLERATIONS: Final = (
    Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
)

Deadline = Annotated[Duration, between(MIN_DEADLINE_S, MAX_DEADLINE_S)]
#: How long GPU work in flight may take to drain after a pause, in seconds.
PauseDrain = Annotated[Duration, between(0, 10)]
Wait = Annotated[Duration, between(0, MAX_WAIT_S)]
Percent = Annotated[float, Field(ge=0, le=100), NOT_BOOL]
Fraction = Annotated[float, Field(gt=0, le=1), NOT_BOOL]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT), NOT_BOOL]


class Defaults(Strict):
    #: compute kept free on every device, in percent
    margin_compute_pct: Percent = 5.0
    #: memory kept free on every device, in MiB (``"2GiB"`` accepted)
    margin_memory_mib: Annotated[SizeMiB, Field(ge=0)] = 2048
    #: eviction deadline of a job that gives none, in seconds (``"30s"`` accepted)
    deadline_s: Deadline = 30.0
    #: a node whose heartbeat is older than this is gone, in seconds
    heartbeat_timeout_s: Annotated[Duration, between(MIN_HEARTBEAT_TIMEOUT_S, MAX_TIMEOUT_S)] = 10.0
    #: a dispatched attempt not started within this is requeued, in seconds
    dispatch_timeout_s: Annotated[Duration, between(MIN_DISPATCH_TIMEOUT_S, MAX_TIMEOUT_S)] = 30.0
    #: after an eviction on a device, nothing new is dispatched there for this long
    eviction_cooldown_s: Wait = 30.0
    #: a job evicted k ≥ 2 times waits backoff_base_s × 2^(k-2) before it runs again ...
    backoff_base_s: Wait = 30.0
    #: ... but never longer than this
    backoff_max_s: Wait = 1800.0
    #: a job whose attempts were lost this many times (its node went silent, the start
    #: never happened) is held with the reason instead of requeued again; qrls forgives
    max_losses: Count = 10
    #: a job whose attempts are lost twice within this many seconds from a node that
    #: stays up (the attempt simply vanished: not the node going silent, its agent
    #: restarting, a device fault) is held with the reason at once: a loop, not bad
    #: luck; 0: only max_losses holds
    loss_window_s: Wait = 60.0
    #: admission keeps back this quantile of each device's recent online compute rises
    #: over deadline-long windows (memory keeps back the largest rise, and the way back
    #: up to the recent peak): see :mod:`ebbtide.scheduling.forecast`
    forecast_compute_quantile: Fraction = 0.9
    #: how much online history the forecast rests on, in seconds
    forecast_history_s: Annotated[Duration, between(1, MAX_HISTORY_S)] = 3600.0
    #: until this much history is seen, the forecast keeps back the cold reserve below
    forecast_warmup_s: Wait = 600.0
    #: the cold reserve: compute (percent) and memory kept back while warming up
    forecast_cold_compute_pct: Percent = 30.0
    forecast_cold_memory_mib: Annotated[SizeMiB, Field(ge=0)] = 8192
    #: a device taken out of service by a fault (an XID, a GPU off the bus) returns after
    #: its health checks pass for this long, in seconds (``ebb node undrain``: at once)
    device_recovery_s: Wait = 600.0
    #: kept back on devices measured by a planning-only source (DCGM through
    #: Prometheus, seconds old), on top of the forecast: compute in percent ...
    planning_margin_compute_pct: Percent = 15.0
    #: ... and memory in MiB
    planning_margin_memory_mib: Annotated[SizeMiB, Field(ge=0)] = 8192
    #: graduated response: an online compute spike pauses offline jobs (frozen in place,
    #: keeping their GPU memory) rather than evicting them, while memory fits; False:
    #: every shortfall evicts
    pause: bool = True
    #: compute counts as free this long after a pause (GPU work in flight drains), in s
    pause_drain_s: PauseDrain = PAUSE_DRAIN_S
    #: a job paused this long is evicted so that it can run elsewhere, in seconds, unless
    #: its compute fits here again within the margin (then it is thawed in place)
    max_pause_s: Annotated[Duration, between(1, MAX_WAIT_S)] = MAX_PAUSE_S
    #: a paused job is thawed only when its compute fits with this much to spare, in %
    pause_thaw_hysteresis_pct: Percent = THAW_HYSTERESIS_PCT
    #: a paused job stays paused at least this long (a flapping signal does not flap it)
    pause_min_s: Wait = MIN_PAUSE_S
    #: suspend to host: online memory shortage moves a pausable job's CUDA state to host
    #: memory (NVIDIA's cuda-checkpoint) and stops it, rather than evicting it.  auto: on
    #: nodes with a working cuda-checkpoint, when the move fits the job's deadline and
    #: the host's budget (``suspend_host_memory_pct``); needs ``pause``.  never: memory
    #: shortage evicts.  Default never: the move's time and its effect on the online
    #: tenants have not yet been measured on a real GPU
    suspend_to_host: Literal["auto", "never"] = "never"
    #: a job suspended this long is evicted so that it can run elsewhere, in seconds
    max_suspend_s: Annotated[Duration, between(1, MAX_WAIT_S)] = MAX_SUSPEND_S
    #: a suspended job is restored only when its memory fits with this much to spare, in
    #: MiB (``"4GiB"`` accepted); its compute needs ``pause_thaw_hysteresis_pct`` spare
    suspend_restore_hysteresis_mib: Annotated[SizeMiB, Field(ge=0)] = int(RESTORE_HYSTERESIS_MIB)
    #: the jobs suspended on a node hold at most this share of its physical memory
    #: together, in percent (and a job is suspended only while the host has its memory
    #: available, with a reserve to spare)
    suspend_host_memory_pct: Percent = SUSPEND_HOST_MEMORY_PCT

    def pause_rules(self) -> PauseRules:
        """When a compute spike pauses rather than evicts, when memory shortage suspends
        to host, and when a pause or a suspension ends."""
        return PauseRules(
            enabled=self.pause,
            drain_s=self.pause_drain_s,
            max_pause_s=self.max_pause_s,
            thaw_hysteresis_pct=self.pause_thaw_hysteresis_pct,
            min_pause_s=self.pause_min_s,
            suspend=self.suspend_to_host == "auto",
            max_suspend_s=self.max_suspend_s,
            restore_hysteresis_mib=float(self.suspend_restore_hysteresis_mib),
            host_memory_pct=self.suspend_host_memory_pct,
        )

    def forecaster(self) -> Forecaster:
        """A fresh forecaster for one device, as these defaults configure it."""
        return Forecaster(
            (self.deadline_s,),
            history_s=self.forecast_history_s,
            compute_quantile=self.forecast_compute_quantile,
            warmup_s=self.forecast_warmup_s,
            cold_reserve=(self.forecast_cold_compute_pct, float(self.forecast_cold_memory_mib)),
        )

    @property
    def margins(self) -> Margins:
        return Margins(
            compute_pct=self.margin_compute_pct, memory_mib=float(self.margin_memory_mib)
        )

    @property
    def planning_margins(self) -> Margins:
        """What a planning-only source's devices keep back on top of the forecast."""
        return Margins(
            compute_pct=self.planning_margin_compute_pct,
            memory_mib=float(self.planning_margin_memory_mib),
        )

    def backoff_s(self, evictions: int) -> float:
        """How long a job evicted ``evictions`` times waits before it may run again."""
        return backoff_s(evictions, self.backoff_base_s, self.backoff_max_s)


def _user_name(name: str) -> str:
    if not name or len(name) > 256 or not name.isprintable() or " " in name:
        raise ValueError(f"{name!r} is not a user name (1-256 printable characters, no spaces)")
    return name


#: A user's name as a policy lists it: what ``ebb token create`` and the API take (a
#: trial's trap: ``admins: ["bad user"]`` passed ``ebb policy check``, and no token could
#: be made for that name)
UserName = Annotated[str, AfterValidator(_user_name)]


class QueueConfig(Strict):
    #: who may submit to the queue (admins always may); unset: everyone
    users: list[UserName] | None = None
    #: default priority of the queue's jobs (``-p`` overrides it)
    priority: Annotated[int, Field(ge=-1024, le=1023), NOT_BOOL] = 0
    #: False: evicted for online pressure only when memory is short (never for compute)
    preemptible: bool = True
    #: default eviction deadline of the queue's jobs, in seconds
    deadline_s: Deadline | None = None
    #: the longest eviction deadline a job of the queue may ask for, in seconds
    max_deadline_s: Deadline | None = None
    #: fraction of the fleet's compute the queue's slices may hold together
    max_fleet_share: Fraction | None = None
    #: fraction of the fleet's compute one user's slices in the queue may hold
    max_user_share: Fraction | None = None
    #: attempts of the queue that may hold slices at once
    max_running: Count | None = None
    #: an attempt is not evicted in its first N seconds unless memory is short online
    min_runtime_s: Wait = 0.0
    #: after this many evictions a job is held (qrls to try again)
    max_preemptions: Count | None = None
    #: an online compute spike may pause the queue's jobs rather than evict them (a job's
    #: ``--no-pause`` or ``--pause`` overrides it)
    pause: bool = True
    #: after a pause, the queue's jobs' compute counts as free this long later (their
    #: GPU work in flight drains), in seconds; default ``defaults.pause_drain_s``
    pause_drain_s: PauseDrain | None = None
    #: under ``kubernetes:``, the image of the queue's jobs that name none (overrides
    #: ``kubernetes.image``)
    image: Image | None = None
    #: under ``kubernetes:``, the PersistentVolumeClaim mounted for the queue's
    #: checkpoints (overrides ``kubernetes.checkpoint_claim``)
    checkpoint_claim: KubeName | None = None
    #: under ``kubernetes:``, the tolerations of the queue's pods (replace
    #: ``kubernetes.tolerations``; ``[]``: none)
    tolerations: list[Toleration] | None = None
    #: other names a job may give for the queue (a Slurm ``--partition``, a PBS ``-q``
    #: from scripts written for another site): it is recorded under this queue's name
    aliases: list[Annotated[str, Field(pattern=_QUEUE_NAME)]] = Field(default_factory=list)

    @property
    def limits(self) -> QueueLimits:
        return QueueLimits(
            preemptible=self.preemptible,
            min_runtime_s=self.min_runtime_s,
            max_fleet_share=self.max_fleet_share,
            max_user_share=self.max_user_share,
            max_running=self.max_running,
            pause_drain_s=self.pause_drain_s,
        )


class DevicesConfig(Strict):
    #: named pools: lists of ``node/index`` patterns (``gpu-a-*/0``, ``node3/*``)
    pools: dict[str, list[str]] = Field(default_factory=dict)

    def in_pool(self, pool: str, node: str, index: int) -> bool:
        key = f"{node}/{index}"
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in self.pools.get(pool, []))


class KubernetesSettings(Strict):
    """The ``kubernetes:`` section: offline attempts run as pods on the GPU nodes."""

    #: how the nodes share a GPU, and so the resources a pod asks for: qgpu, hami,
    #: volcano, koordinator, mig, whole (one card per job) or direct (ebbtide's own)
    profile: ProfileName = "whole"
    #: the namespace the attempts' pods are created in
    namespace: DnsLabel = "ebbtide-jobs"
    #: the image of jobs that name none and whose queue names none
    image: Image | None = None
    #: the PriorityClass of the pods (low, so an online pod preempts them); None: none
    priority_class: KubeName | None = "ebbtide-offline"
    #: the RuntimeClass that hands the card to a pod under the ``direct`` profile
    runtime_class: KubeName = "nvidia"
    #: the scheduler that binds the pods; None: the profile's (volcano: ``volcano``,
    #: hami: ``hami-scheduler``, koordinator: ``koord-scheduler``, else the default)
    scheduler_name: KubeName | None = None
    #: a PersistentVolumeClaim mounted at ``checkpoint_mount`` in every pod
    checkpoint_claim: KubeName | None = None
    #: where the checkpoint claim is mounted in the pod
    checkpoint_mount: AbsolutePath = "/var/lib/ebbtide/checkpoints"
    #: the node agent's home on the host, mounted into every pod at the same path so the
    #: status file and the attempt directories resolve in the pod and in the agent
    state_dir: AbsolutePath = "/var/lib/ebbtide"
    #: memory of one card, in MiB (``"80GiB"`` accepted): what ``whole`` grants and what
    #: ``koordinator``'s memory ratio and ``qgpu``'s limit are reckoned against
    gpu_memory_mib: Annotated[SizeMiB, Field(gt=0)] = 81920
    #: the MIG profiles the nodes' GPUs are partitioned into (``mig``)
    mig_profiles: Annotated[list[MigProfile], Field(min_length=1)] = Field(
        default_factory=lambda: list(DEFAULT_MIG_PROFILES)
    )
    #: kept back from the grace period for detection and API latency, in seconds
    grace_margin_s: Annotated[Duration, between(0, MAX_GRACE_MARGIN_S)] = 1.0
    #: how long a pod may stay Pending (an image that will not pull, no room to
    #: schedule) before its attempt is given up, in seconds
    start_timeout_s: Annotated[Duration, between(MIN_DISPATCH_TIMEOUT_S, MAX_WAIT_S)] = 300.0
    #: the uid and gid attempt pods run as (``securityContext``); the agent hands them
    #: the attempt's and the checkpoint directories (None: the image's user, which must
    #: be able to write directories the agent, root, made)
    run_as_user: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    run_as_group: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    #: the tolerations every attempt pod carries (Kubernetes toleration objects), so it
    #: may land on GPU nodes with taints; default: ``nvidia.com/gpu`` Exists NoSchedule;
    #: ``[]``: none (a queue's ``tolerations`` replace these)
    tolerations: list[Toleration] = Field(default_factory=lambda: list(DEFAULT_TOLERATIONS))

    @field_validator("mig_profiles")
    @classmethod
    def _distinct(cls, profiles: list[str]) -> list[str]:
        seen = set()
        for name in profiles:
            if name in seen:
                raise ValueError(f"{name!r} is listed twice")
            seen.add(name)
        return profiles


#: Shortest time between two automatic purges, in seconds.
MIN_PURGE_EVERY_S = 60.0


class RetentionSettings(Strict):
    """The ``retention:`` section: how long finished jobs stay in the store.

    The leading scheduler removes the jobs that finished (succeeded, failed, cancelled)
    more than ``finished_jobs`` ago, with their attempts and events, at most every
    ``every``, ``batch`` jobs per transaction (see :mod:`ebbtide.queue.purge` for what
    is never removed).  Without ``finished_jobs`` nothing is: ebbtide has no separate
    accounting database, so its store is the only record of what ran."""

    #: finished jobs go this long after they finished, in seconds (``"90d"``); None
    #: (the default): they are kept for ever
    finished_jobs: Annotated[Duration, between(MIN_PURGE_AGE_S, MAX_DURATION_S)] | None = None
    #: jobs removed per transaction; the scheduler waits for one batch at most
    batch: Annotated[int, Field(ge=1, le=MAX_BATCH_JOBS), NOT_BOOL] = DEFAULT_BATCH_JOBS
    #: how often the leading scheduler purges, in seconds
    every: Annotated[Duration, between(MIN_PURGE_EVERY_S, MAX_WAIT_S)] = 3600.0


class Policy(Strict):
    apiVersion: Literal["ebbtide/v1"] = "ebbtide/v1"
    defaults: Defaults = Field(default_factory=Defaults)
    queues: dict[Annotated[str, Field(pattern=_QUEUE_NAME)], QueueConfig] = Field(
        default_factory=lambda: {"default": QueueConfig()}
    )
    windows: list[Window] = Field(default_factory=list)
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    admins: list[UserName] = Field(default_factory=list)
    allow_root_jobs: bool = False
    #: present: offline attempts run as Kubernetes pods (see :class:`KubernetesSettings`)
    kubernetes: KubernetesSettings | None = None
    #: how long finished jobs stay in the store (see :class:`RetentionSettings`)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)

    @field_validator("queues")
    @classmethod
    def _default_queue(cls, queues: dict[str, QueueConfig]) -> dict[str, QueueConfig]:
        # jobs that name no queue go to "default": it always exists
        return queues if "default" in queues else {"default": QueueConfig(), **queues}

    def plan_rules(self) -> PlanRules:
        """What the scheduler's passes take from this policy (margins, pause rules, queue
        limits, backoff): the live loop's and the simulator's, alike."""
        d = self.defaults
        return PlanRules(
            margins=d.margins,
            pause=d.pause_rules(),
            queues={name: q.limits for name, q in self.queues.items()},
            backoff_base_s=d.backoff_base_s,
            backoff_max_s=d.backoff_max_s,
        )

    def deadline_for(self, queue: str) -> float:
        q = self.queues.get(queue)
        return (q.deadline_s if q and q.deadline_s else None) or self.defaults.deadline_s

    def image_for(self, queue: str, image: str | None = None) -> str | None:
        """The image a job of ``queue`` runs in: its own (``image``), else the queue's,
        else the ``kubernetes`` section's; None when none is named anywhere."""
        q = self.queues.get(queue)
        section = self.kubernetes.image if self.kubernetes else None
        return image or (q.image if q else None) or section

    def checkpoint_claim_for(self, queue: str) -> str | None:
        """The PersistentVolumeClaim mounted for ``queue``'s checkpoints, if any."""
        q = self.queues.get(queue)
        section = self.kubernetes.checkpoint_claim if self.kubernetes else None
        return (q.checkpoint_claim if q else None) or section

    def tolerations_for(self, queue: str) -> list[Toleration]:
        """The tolerations of ``queue``'s pods: the queue's own, else the ``kubernetes``
        section's (none without one)."""
        q = self.queues.get(queue)
        if q is not None and q.tolerations is not None:
            return q.tolerations
        return self.kubernetes.tolerations if self.kubernetes else []

    def queue_named(self, name: str) -> str:
        """The queue ``name`` names: itself, or the queue it is an alias of (``aliases``);
        a :class:`ConfigError` listing the queues and their aliases if none."""
        if name in self.queues:
            return name
        for queue, q in self.queues.items():
            if name in q.aliases:
                return queue
        raise ConfigError(f"queue: unknown queue {name!r}; known queues: {self.known_queues()}")

    def check_queue(self, queue: str) -> None:
        """A :class:`ConfigError` unless ``queue`` names a queue (or an alias of one)."""
        self.queue_named(queue)

    def known_queues(self) -> str:
        """The queues in words, with their aliases: ``batch (aliases: gpu, workq), default``."""
        return ", ".join(
            f"{name} (aliases: {', '.join(q.aliases)})" if q.aliases else name
            for name, q in sorted(self.queues.items())
        )

    @property
    def cron_windows(self) -> list[CronWindow]:
        return [w for w in self.windows if isinstance(w, CronWindow)]

    @property
    def lull_windows(self) -> list[LullWindow]:
        return [w for w in self.windows if isinstance(w, LullWindow)]

    @property
    def blackouts(self) -> list[BlackoutWindow]:
        return [w for w in self.windows if isinstance(w, BlackoutWindow)]

    def unwindowed_queues(self) -> list[str]:
        """The queues no cron or lull window admits, where there are such windows: their
        jobs never run (a window admits every queue unless its ``queues:`` says)."""
        windows: list[CronWindow | LullWindow] = [*self.cron_windows, *self.lull_windows]
        if not windows:
            return []
        return [
            q for q in self.queues if not any(w.queues is None or q in w.queues for w in windows)
        ]

    def summary(self) -> str:
        kinds = {k: sum(w.kind == k for w in self.windows) for k in ("cron", "lull", "blackout")}
        aliases = sum(len(q.aliases) for q in self.queues.values())
        return (
            f"{len(self.queues)} queue(s)"
            + (f" ({aliases} alias(es))" if aliases else "")
            + f", {kinds['cron']} cron window(s), "
            f"{kinds['lull']} lull window(s), {kinds['blackout']} blackout(s), "
            f"{len(self.devices.pools)} device pool(s)"
            + (f", kubernetes ({self.kubernetes.profile})" if self.kubernetes else "")
        )


def cross_check(
    policy: Policy, index: Sequence[int] | None = None, skip: frozenset[str] = frozenset()
) -> list[tuple[tuple[str | int, ...], str]]:
    """Problems pydantic cannot see field by field: names and references.  ``index``:
    each window's place in the file (when some were left out, see :func:`_salvaged`);
    ``skip``: the checks whose facts are not all known (``pools``: the device pools;
    ``queues``: every queue's name and aliases)."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    seen: dict[str, int] = {}
    for at, w in enumerate(policy.windows):
        i = index[at] if index is not None else at
        if w.name in seen:
            problems.append(
                (
                    ("windows", i, "name"),
                    f"window name {w.name!r} is already used by window {seen[w.name]}",
                )
            )
        seen.setdefault(w.name, i)
        if w.pool is not None and w.pool not in policy.devices.pools and "pools" not in skip:
            known = ", ".join(sorted(policy.devices.pools)) or "none defined"
            problems.append(
                (("windows", i, "pool"), f"unknown device pool {w.pool!r} (pools: {known})")
            )
        for j, q in enumerate(getattr(w, "queues", None) or []):
            if q not in policy.queues:
                alias_of = [n for n, c in policy.queues.items() if q in c.aliases]
                if not alias_of and "queues" in skip:
                    continue  # perhaps an alias of a queue that could not be read
                problems.append(
                    (
                        ("windows", i, "queues", j),
                        f"{q!r} is an alias of queue {alias_of[0]!r}; name the queue here"
                        if alias_of
                        else f"unknown queue {q!r}; known queues: "
                        + ", ".join(sorted(policy.queues)),
                    )
                )
    if "queues" not in skip:  # a clash with an alias that cannot be read is not known
        problems.extend(_alias_problems(policy))
    for name, q in policy.queues.items():
        if q.deadline_s and q.max_deadline_s and q.deadline_s > q.max_deadline_s:
            problems.append(
                (("queues", name, "deadline_s"), "is longer than the queue's max_deadline_s")
            )
    k8s = policy.kubernetes
    if k8s is not None and k8s.checkpoint_mount == k8s.state_dir:
        problems.append(
            (
                ("kubernetes", "checkpoint_mount"),
                "is the same path as state_dir; mount the checkpoint claim somewhere else",
            )
        )
    return problems


def _alias_problems(policy: Policy) -> list[tuple[tuple[str | int, ...], str]]:
    """Every queue name and alias names one queue only: an alias that is a queue's name,
    or another queue's alias (or its own twice), is an error at the alias."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    owner: dict[str, str] = {}
    for name, q in policy.queues.items():
        for j, alias in enumerate(q.aliases):
            where: tuple[str | int, ...] = ("queues", name, "aliases", j)
            if alias in policy.queues:
                what = "the queue's own name" if alias == name else f"the name of queue {alias!r}"
                problems.append((where, f"alias {alias!r} is {what}; a name names one queue"))
            elif alias in owner:
                other = "this queue" if owner[alias] == name else f"queue {owner[alias]!r}"
                problems.append((where, f"alias {alias!r} is already an alias of {other}"))
            else:
                owner[alias] = name
    return problems


def load_policy(path: Path | None) -> Policy:
    """The policy in ``path``, or the built-in defaults when ``path`` is None."""
    if path is None:
        return Policy()
    return parse_policy(read_config(path, "policy file"), str(path))


def parse_published(text: str, source: str) -> Policy:
    """The policy a scheduler published to the store (``Store.publish_policy``): its
    file's ``text``, ``""`` for the built-in defaults; ``source`` (where the scheduler read
    it) names it in errors.  Raises :class:`ConfigError` as :func:`parse_policy` does."""
    return parse_policy(text, f"{source} (as the scheduler published it)") if text else Policy()


def parse_policy(text: str, filename: str = "<policy>") -> Policy:
    """The policy in ``text`` (the file ``filename``).  Raises :class:`ConfigError` with
    every error found in one pass, each as ``file:line:col: path: message``: keys given
    twice beside what validation finds (the last one counts while validating), and the
    checks across fields once every field is valid."""
    document = read_yaml(text, filename)
    data = document.data
    if data is None:
        # an empty file is a mistake (a truncated copy, the wrong path), not a wish for
        # the defaults: those need no file at all
        raise ConfigError(
            f"{filename}:1:1: the policy file is empty (or holds only comments); give at "
            "least one key (queues:, defaults:, windows:, ...), or no policy file for the "
            "defaults"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"{filename}:1:1: the policy must be a mapping of keys to values")
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = _yaml_loc(err["loc"])
            if document.unbuilt_at(loc):
                continue  # YAML could not read the value: that is the error to show
            problems.append((loc, _said(err, loc)))
        # the checks across sections still run, on the parts that are valid by themselves
        found = {tuple(map(str, loc)) for loc, _ in problems}
        problems += [p for p in _salvaged(data) if tuple(map(str, p[0])) not in found]
        raise ConfigError(document.report(problems)) from None
    problems = cross_check(policy)
    if problems or document.failed:
        raise ConfigError(document.report(problems))
    return policy


#: pydantic's errors whose message does not say what was given ("Input should be greater
#: than or equal to 1"): the value is added to them
_GIVEN_ADDED = ("greater_than", "less_than", "float_", "int_", "bool_", "literal_", "enum")


def _said(err: Any, loc: tuple[str | int, ...]) -> str:
    """One validation error in the policy's words: an unknown key with the known one it
    is close to, a bound or a type with the value that missed it."""
    if err["type"] == "extra_forbidden":
        key = str(loc[-1]) if loc else ""
        homes = _key_homes().get(key)
        if homes:  # a key of another section (a trial's trap: "did you mean" the same key)
            return f"unknown key here; {key!r} is a setting of {' and '.join(homes)}"
        close = difflib.get_close_matches(key, _policy_keys(), n=1, cutoff=0.75)
        if not close:
            return "unknown key"
        section, its = _section_of(loc), _key_homes().get(close[0], [])
        elsewhere = f" (a setting of {' and '.join(its)})" if section not in (None, *its) else ""
        return f"unknown key; did you mean {close[0]!r}{elsewhere}?"
    msg = str(err["msg"]).removeprefix("Value error, ")
    given = err.get("input")
    if str(err["type"]).startswith(_GIVEN_ADDED) and isinstance(given, str | int | float):
        msg += f", got {shown(given)}"
    return msg


@functools.cache
def _policy_keys() -> tuple[str, ...]:
    """Every key a policy file may hold, somewhere (for "did you mean")."""
    return tuple(sorted(_key_homes()))


#: where the settings of each part of the schema are written, in a policy file's words
_SECTIONS = {
    "Policy": "the top level",
    "Defaults": "defaults",
    "QueueConfig": "queues.NAME",
    "CronWindow": "a cron window",
    "LullWindow": "a lull window",
    "BlackoutWindow": "a blackout window",
    "DevicesConfig": "devices",
    "KubernetesSettings": "kubernetes",
    "RetentionSettings": "retention",
    "Thresholds": "a lull window's below / close_above",
    "Toleration": "a toleration",
}


def _section_of(loc: tuple[str | int, ...]) -> str | None:
    """The section (as :data:`_SECTIONS` words it) a key at ``loc`` is written in; None
    where that depends on more than the path (a window's kind)."""
    if len(loc) <= 1:
        return _SECTIONS["Policy"]
    top = str(loc[0])
    if top == "queues":
        return _SECTIONS["QueueConfig"] if len(loc) == 3 else None
    return top if len(loc) == 2 and top in _SECTIONS.values() else None


@functools.cache
def _key_homes() -> dict[str, list[str]]:
    """Each key a policy file may hold, and the sections it is written in."""
    schema = Policy.model_json_schema(by_alias=True)
    parts = {"Policy": schema, **schema.get("$defs", {})}
    homes: dict[str, list[str]] = {}
    for name, definition in parts.items():
        for key in definition.get("properties", {}):
            where = _SECTIONS.get(name, name)
            if where not in homes.setdefault(key, []):
                homes[key].append(where)
    return homes


def _salvaged(data: dict[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    """:func:`cross_check` on a policy that failed validation: on the sections, queues
    and windows that are valid by themselves.  A check whose facts are not all known is
    skipped rather than guessed: no unknown pool while ``devices`` is invalid, no unknown
    queue while some queue's aliases cannot be read; of an invalid window only its name
    counts (no two windows share one)."""
    skip: set[str] = set()

    def part(kind: Any, value: Any) -> Any:
        try:
            return TypeAdapter(kind).validate_python(value)
        except ValidationError:
            return None

    devices = part(DevicesConfig, data.get("devices", {}))
    if devices is None:
        skip.add("pools")
    queues: dict[str, QueueConfig] = {}
    raw_queues = data.get("queues", {})
    if not isinstance(raw_queues, dict):
        skip.add("queues")
        raw_queues = {}
    for name, raw in raw_queues.items():
        queue = part(QueueConfig, raw)
        if queue is None:  # its aliases still name it, if they can be read
            raw_aliases = raw.get("aliases", []) if isinstance(raw, dict) else []
            aliases = part(list[Annotated[str, Field(pattern=_QUEUE_NAME)]], raw_aliases)
            if aliases is None:
                skip.add("queues")
            queue = QueueConfig.model_construct(aliases=aliases or [])
        queues[str(name)] = queue
    queues.setdefault("default", QueueConfig())
    windows, index = [], []
    raw_windows = data.get("windows", [])
    for i, raw in enumerate(raw_windows if isinstance(raw_windows, list) else []):
        window = part(Window, raw)
        name = raw.get("name") if isinstance(raw, dict) else None
        if window is None and isinstance(name, str):  # its name still counts as used
            window = CronWindow.model_construct(name=name)
        if window is not None:
            windows.append(window)
            index.append(i)
    policy = Policy.model_construct(
        queues=queues,
        windows=windows,
        devices=devices or DevicesConfig(),
        kubernetes=part(KubernetesSettings | None, data.get("kubernetes")),
    )
    return cross_check(policy, index, frozenset(skip))


def _yaml_loc(loc: tuple[Any, ...]) -> tuple[str | int, ...]:
    """pydantic's error path → the path in the file (drop union tags like ``cron``)."""
    out: list[str | int] = []
    for i, part in enumerate(loc):
        if i > 0 and loc[i - 1] == "windows" and isinstance(part, int):
            out.append(part)
            continue
        if (
            isinstance(part, str)
            and i >= 2
            and loc[i - 2] == "windows"
            and part in ("cron", "lull", "blackout")
        ):
            continue  # the discriminated union's branch name is not in the file
        out.append(part)
    return tuple(out)
