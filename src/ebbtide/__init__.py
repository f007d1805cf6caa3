"""ebbtide: a batch job queue for GPU online/offline colocation.

Offline jobs run in the headroom online inference leaves on each GPU, and give it back
within a hard deadline when the online side needs it, with their progress saved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ebbtide.errors import (
    EbbtideError,
    JobNotFound,
    PermissionDenied,
    ServerUnavailable,
    SpecError,
    StoreUnavailable,
    UserError,
)
from ebbtide.handle import JobFailed, JobHandle
from ebbtide.queue.states import JobState

__version__ = "0.1.0"
__all__ = [
    "Client",
    "EbbtideError",
    "JobFailed",
    "JobHandle",
    "JobNotFound",
    "JobSpec",
    "JobState",
    "PermissionDenied",
    "ServerUnavailable",
    "SpecError",
    "StoreUnavailable",
    "UserError",
    "WaitTimeout",
    "__version__",
]

if TYPE_CHECKING:
    from ebbtide.client import Client
    from ebbtide.client_base import WaitTimeout
    from ebbtide.queue.spec import JobSpec


def __getattr__(name: str) -> Any:
    # the SDK pulls in the store, and JobSpec pydantic: ``import ebbtide.job`` inside a job
    # and ``ebb`` commands that need neither stay light
    if name == "JobSpec":
        from ebbtide.queue.spec import JobSpec

        return JobSpec
    if name == "Client":
        from ebbtide.client import Client

        return Client
    if name == "WaitTimeout":
        from ebbtide.client_base import WaitTimeout

        return WaitTimeout
    raise AttributeError(name)


def __dir__() -> list[str]:
    # the public API only, not the submodules imported so far nor this module's helpers
    return sorted(__all__)
