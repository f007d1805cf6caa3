"""XID errors: what they mean, and which of them take a device out of service.

The driver's recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, R550 and newer)
decides first: ``none`` keeps the device in service, anything else drains it.  Where the
driver does not report one, an XID drains the device unless it is one of the errors an
application causes for itself (the list NVIDIA's Kubernetes device plugin skips by
default: 13, 31, 43, 45, 68, 109).  The meanings are from NVIDIA's XID catalogue.
"""

from __future__ import annotations

from ebbtide.workers.headroom.base import RecoveryAction

#: XIDs an application causes for itself: the device stays in service.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

#: XIDs after which the device is gone until a reset: its slices are killed, not warned.
LOST_XIDS = frozenset({79})

#: A few words on the XIDs seen most in datacenters.
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception (an application error)",
    31: "GPU memory page fault (an application error)",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing (an application error)",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    68: "video processor exception (an application error)",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout (an application error)",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link error",
    140: "unrecovered ECC error",
}

#: ``NVML_GPU_RECOVERY_ACTION_*`` values → :class:`RecoveryAction`.
RECOVERY_ACTIONS: dict[int, RecoveryAction] = {
    0: RecoveryAction.NONE,
    1: RecoveryAction.GPU_RESET,
    2: RecoveryAction.NODE_REBOOT,
    3: RecoveryAction.DRAIN_P2P,
    4: RecoveryAction.DRAIN_AND_RESET,
    5: RecoveryAction.RECOVER_IMEX_DOMAIN,
    6: RecoveryAction.BUS_RESET,
    7: RecoveryAction.SYSTEM_REBOOT,
}


def xid_meaning(xid: int) -> str:
    """``XID 79: GPU has fallen off the bus`` (``XID 999: see NVIDIA's XID catalogue``)."""
    return f"XID {xid}: {XID_MEANINGS.get(xid, 'see NVIDIA’s XID catalogue')}"


def recovery_action(code: int | None) -> RecoveryAction:
    """The driver's recovery-action code as a :class:`RecoveryAction` (unknown codes too)."""
    if code is None:
        return RecoveryAction.UNKNOWN
    return RECOVERY_ACTIONS.get(int(code), RecoveryAction.UNKNOWN)


def disables_device(xid: int | None, action: RecoveryAction | str) -> bool:
    """Whether a fault takes its device out of service (see the module doc)."""
    action = RecoveryAction(action)
    if action == RecoveryAction.NONE:
        return bool(xid is not None and xid in LOST_XIDS)
    if action != RecoveryAction.UNKNOWN:
        return True
    return xid is None or xid not in APPLICATION_XIDS
