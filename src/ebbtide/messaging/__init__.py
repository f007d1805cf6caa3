"""dramatiq carries commands to node agents (one queue per node) and events back."""

from ebbtide.messaging.bus import Bus

__all__ = ["Bus"]
