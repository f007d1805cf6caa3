"""Device faults from NVML: XID events, watched in a thread of their own, and the driver's
recovery action.

:class:`XidWatcher` registers each GPU that reports ``nvmlEventTypeXidCriticalError``
with one NVML event set and waits on it (``nvmlEventSetWait_v2``, at most
:data:`EVENT_WAIT_MS` at a time, so that ``close`` returns within about that long).  An
event names its GPU by a ``c_nvmlDevice_t``, a fresh ctypes pointer that is never ``==``
to the handle the GPU was opened with; :class:`HandleIndex` tells which device it is by
the address the pointer holds (no NVML call: it works for a GPU that is lost), else by
the device's UUID, else by its NVML index.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ebbtide.workers.headroom.base import RecoveryAction
from ebbtide.workers.headroom.xid import recovery_action

log = logging.getLogger("ebbtide.headroom.nvml")

#: How long one wait for an XID event lasts, in milliseconds (``close`` waits about this long).
EVENT_WAIT_MS = 500
#: What NVML reports as gpuInstanceId outside MIG, or for a fault of the whole GPU.
NO_INSTANCE_ID = 0xFFFFFFFF
#: How long ``close`` waits for the watcher thread, in seconds, beyond one event wait.
_JOIN_GRACE_S = 5.0

#: (NVML index of the GPU, GPU-instance id or ``None`` for the whole GPU)
Where = tuple[int, int | None]


def read_recovery_action(nvml: Any, handle: Any) -> RecoveryAction:
    """The driver's recovery action for the GPU ``handle`` names (``UNKNOWN`` where the
    driver does not report one, or cannot be asked)."""
    try:
        [value] = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    except nvml.NVMLError:
        return RecoveryAction.UNKNOWN
    if value.nvmlReturn != nvml.NVML_SUCCESS:
        return RecoveryAction.UNKNOWN
    return recovery_action(int(value.value.uiVal))


def handle_address(handle: Any) -> int | None:
    """The address an NVML handle (a ctypes pointer) holds; ``None`` for anything else."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


class HandleIndex:
    """Which device an NVML handle names, without comparing ctypes pointers."""

    def __init__(self) -> None:
        self._by_address: dict[int, Where] = {}
        self._by_uuid: dict[str, Where] = {}
        self._gpus: set[int] = set()

    def add(self, handle: Any, uuid: str | None, where: Where) -> None:
        address = handle_address(handle)
        if address is not None:
            self._by_address[address] = where
        if uuid:
            self._by_uuid[uuid] = where
        if where[1] is None:
            self._gpus.add(where[0])

    def find(self, nvml: Any, handle: Any) -> Where | None:
        """Where ``handle`` points: by address, else by UUID, else by NVML index."""
        address = handle_address(handle)
        if address is not None and address in self._by_address:
            return self._by_address[address]
        with contextlib.suppress(nvml.NVMLError):
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            if uuid in self._by_uuid:
                return self._by_uuid[uuid]
        with contextlib.suppress(nvml.NVMLError):
            index = int(nvml.nvmlDeviceGetIndex(handle))
            if index in self._gpus:
                return (index, None)
        return None


class XidWatcher:
    """Waits for XID events on ``gpus`` ((NVML index, handle) each) in a daemon thread and
    calls ``on_xid(gpu, gpu_instance, xid)`` for each (``gpu_instance`` is ``None`` for a
    fault of the whole GPU).  A GPU that does not report XID events is skipped (logged);
    with none left, no thread is started and :attr:`active` is False."""

    def __init__(
        self,
        nvml: Any,
        gpus: Sequence[tuple[int, Any]],
        handles: HandleIndex,
        on_xid: Callable[[int, int | None, int], None],
        *,
        wait_ms: int = EVENT_WAIT_MS,
    ) -> None:
        self._nvml = nvml
        self._handles = handles
        self._on_xid = on_xid
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        try:
            self._set: Any = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("nvml: no XID events on this node (cannot create an event set: %s)", exc)
            self._set = None
            return
        registered = [gpu for gpu, handle in gpus if self._register(gpu, handle)]
        if not registered:
            nvml.nvmlEventSetFree(self._set)
            self._set = None
            return
        self._thread = threading.Thread(target=self._run, name="ebbtide-xid-watcher", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        """Whether the watcher thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def _register(self, gpu: int, handle: Any) -> bool:
        nvml = self._nvml
        xid = nvml.nvmlEventTypeXidCriticalError
        try:
            if not nvml.nvmlDeviceGetSupportedEventTypes(handle) & xid:
                raise nvml.NVMLError_NotSupported()
            nvml.nvmlDeviceRegisterEvents(handle, xid, self._set)
        except nvml.NVMLError as exc:
            log.warning(
                "nvml: GPU %d reports no XID events (%s): its faults are seen only when "
                "NVML can no longer read it",
                gpu,
                exc,
            )
            return False
        return True

    def _run(self) -> None:
        nvml = self._nvml
        failing: str | None = None  # the wait's last error, logged once until it clears
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._set, self._wait_ms)
            except nvml.NVMLError_Timeout:
                failing = None
                continue
            except Exception as exc:
                if self._stop.is_set():
                    break
                if repr(exc) != failing:
                    failing = repr(exc)
                    log.warning("nvml: waiting for XID events failed: %s; retrying", exc)
                self._stop.wait(self._wait_ms / 1000)
                continue
            failing = None
            try:
                self._handle(data)
            except Exception:
                log.exception("nvml: could not handle an XID event")

    def _handle(self, data: Any) -> None:
        if not int(data.eventType) & self._nvml.nvmlEventTypeXidCriticalError:
            return
        xid = int(data.eventData)
        where = self._handles.find(self._nvml, data.device)
        if where is None:
            log.warning("nvml: XID %d on a device ebbtide does not watch; ignored", xid)
            return
        gpu, gpu_instance = where
        if gpu_instance is None and int(data.gpuInstanceId) != NO_INSTANCE_ID:
            gpu_instance = int(data.gpuInstanceId)
        self._on_xid(gpu, gpu_instance, xid)

    def close(self) -> None:
        """Stop the thread (wait for it) and free the event set; once."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._wait_ms / 1000 + _JOIN_GRACE_S)
            if self._thread.is_alive():
                log.error("nvml: the XID watcher did not stop; its event set is not freed")
                return
        if self._set is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlEventSetFree(self._set)
            self._set = None
