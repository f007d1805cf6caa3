"""The policy file (``ebbtide.yaml``): typed, versioned and strict.

This release knows the ``defaults`` (safety margins, eviction deadline), the ``queues``
(priority, default deadline) and the ``admins``.  Time windows come later and plug in
beside them.  Unknown keys are errors; every error names the file, the line and the
field path, and all errors are reported at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ebbtide import units
from ebbtide.errors import ConfigError
from ebbtide.scheduling.snapshot import Margins

API_VERSION: Final = "ebbtide/v1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Defaults(_Strict):
    #: compute kept free on every device, in percent
    margin_compute_pct: Annotated[float, Field(ge=0, le=100)] = 5.0
    #: memory kept free on every device, in MiB (``"2GiB"`` accepted)
    margin_memory_mib: Annotated[int, Field(ge=0)] = 2048
    #: eviction deadline of a job that gives none, in seconds (``"30s"`` accepted)
    deadline_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    #: a node whose heartbeat is older than this is gone, in seconds
    heartbeat_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    #: a dispatched attempt not started within this is requeued, in seconds
    dispatch_timeout_s: Annotated[float, Field(gt=0)] = 30.0

    @field_validator("margin_memory_mib", mode="before")
    @classmethod
    def _mem(cls, v: Any) -> Any:
        return units.parse_memory_mib(v) if isinstance(v, str) else v

    @field_validator("deadline_s", "heartbeat_timeout_s", "dispatch_timeout_s", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return units.parse_duration_s(v) if isinstance(v, str) else v

    @property
    def margins(self) -> Margins:
        return Margins(
            compute_pct=self.margin_compute_pct, memory_mib=float(self.margin_memory_mib)
        )


class QueueConfig(_Strict):
    priority: Annotated[int, Field(ge=-1024, le=1023)] = 0
    #: default eviction deadline of the queue's jobs, in seconds
    deadline_s: Annotated[float, Field(gt=0, le=3600)] | None = None

    @field_validator("deadline_s", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> Any:
        return units.parse_duration_s(v) if isinstance(v, str) else v


class Policy(_Strict):
    apiVersion: Literal["ebbtide/v1"] = "ebbtide/v1"
    defaults: Defaults = Field(default_factory=Defaults)
    queues: dict[str, QueueConfig] = Field(default_factory=lambda: {"default": QueueConfig()})
    admins: list[str] = Field(default_factory=list)

    @field_validator("queues")
    @classmethod
    def _default_queue(cls, queues: dict[str, QueueConfig]) -> dict[str, QueueConfig]:
        # jobs that name no queue go to "default": it always exists
        return queues if "default" in queues else {"default": QueueConfig(), **queues}

    def deadline_for(self, queue: str) -> float:
        q = self.queues.get(queue)
        return (q.deadline_s if q and q.deadline_s else None) or self.defaults.deadline_s

    def check_queue(self, queue: str) -> None:
        if queue not in self.queues:
            known = ", ".join(sorted(self.queues))
            raise ConfigError(f"queue: unknown queue {queue!r}; known queues: {known}")


def load_policy(path: Path | None) -> Policy:
    """The policy in ``path``, or the built-in defaults when ``path`` is None."""
    if path is None:
        return Policy()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the policy file: {exc.strerror}") from None
    return parse_policy(text, str(path))


def parse_policy(text: str, filename: str = "<policy>") -> Policy:
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        raise ConfigError(f"{where}: YAML syntax error: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{filename}:1:1: the policy must be a mapping of keys to values")
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = [str(p) for p in err["loc"]]
            line, col = _position(node, loc)
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            lines.append(f"{filename}:{line}:{col}: {'.'.join(loc) or '(top)'}: {msg}")
        raise ConfigError("\n".join(lines)) from None


def _position(node: yaml.Node | None, loc: list[str]) -> tuple[int, int]:
    """Line and column (1-based) of the YAML node at ``loc``, as deep as it goes."""
    best = node
    for key in loc:
        if isinstance(best, yaml.MappingNode):
            nxt = None
            for k, v in best.value:
                if str(k.value) == key:
                    nxt = v if key != loc[-1] else k
                    break
            if nxt is None:
                break
            best = nxt
        elif isinstance(best, yaml.SequenceNode) and key.isdigit() and int(key) < len(best.value):
            best = best.value[int(key)]
        else:
            break
    if best is None:
        return 1, 1
    return best.start_mark.line + 1, best.start_mark.column + 1
