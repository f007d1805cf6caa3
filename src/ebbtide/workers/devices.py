"""The ``--devices`` option: which simulated devices a node offers (for ``static``/``trace``).

Accepted forms, comma-separated items, devices numbered 0..n-1 in the order written:

- ``2x80GiB`` — two devices of 80 GiB each;
- ``80GiB`` — one device of 80 GiB;
- ``4`` — four devices of :data:`DEFAULT_DEVICE_MEMORY_MIB`;
- ``1x40GiB,2x80GiB`` — a mix (device 0 has 40 GiB, devices 1 and 2 have 80 GiB).
"""

from __future__ import annotations

import re

from ebbtide.units import parse_memory_mib
from ebbtide.workers.headroom.base import DeviceInfo

#: memory of a device given only by count (``--devices 4``), in MiB (80 GiB, an A100/H100)
DEFAULT_DEVICE_MEMORY_MIB = 80 * 1024

#: the most devices one node may declare; guards against typos like ``8000``
MAX_DEVICES = 1024

DEVICES_FORMS = (
    "a device count (4), a size (80GiB), a count and a size (2x80GiB), "
    "or a comma-separated mix (1x40GiB,2x80GiB)"
)

_COUNT_X_SIZE_RE = re.compile(r"^(\d+)\s*[xX*]\s*(.+)$")


def _parse_item(item: str, text: str) -> tuple[int, int]:
    """One comma-separated item → ``(count, memory_mib)``."""
    if item.isdigit():
        return int(item), DEFAULT_DEVICE_MEMORY_MIB
    m = _COUNT_X_SIZE_RE.match(item)
    count, size = (int(m.group(1)), m.group(2).strip()) if m else (1, item)
    if size.isdigit():
        # a bare number would be bytes in parse_memory_mib: never what anyone meant here
        raise ValueError(
            f"--devices {text!r}: {item!r} needs a unit on the size (e.g. 80GiB); "
            f"expected {DEVICES_FORMS}"
        )
    try:
        memory_mib = parse_memory_mib(size)
    except ValueError:
        raise ValueError(
            f"--devices {text!r}: cannot read {item!r}; expected {DEVICES_FORMS}"
        ) from None
    if memory_mib <= 0:
        raise ValueError(f"--devices {text!r}: {item!r}: device memory must be positive")
    return count, memory_mib


def parse_devices(text: str) -> list[DeviceInfo]:
    """Parse a ``--devices`` value into devices numbered 0..n-1 (see the module doc)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"--devices is empty; expected {DEVICES_FORMS}")
    devices: list[DeviceInfo] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"--devices {text!r} has an empty item; expected {DEVICES_FORMS}")
        count, memory_mib = _parse_item(item, text)
        if count <= 0:
            raise ValueError(f"--devices {text!r}: {item!r}: the count must be at least 1")
        if len(devices) + count > MAX_DEVICES:
            raise ValueError(f"--devices {text!r}: more than {MAX_DEVICES} devices")
        first = len(devices)
        devices.extend(DeviceInfo(index=first + k, memory_mib=memory_mib) for k in range(count))
    return devices
