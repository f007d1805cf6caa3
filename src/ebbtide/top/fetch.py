"""Reading what ``ebb top`` shows, through the SDK client, so that it works on the store
and through ``ebb server`` alike; :mod:`ebbtide.top.snapshot` turns it into a snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ebbtide.errors import UserError
from ebbtide.top.snapshot import (
    ACTIVE_STATE_NAMES,
    SNAPSHOT_EVICTIONS,
    FleetSnapshot,
    build_snapshot,
)


def fetch_snapshot(
    client: Any,
    *,
    evictions: int = SNAPSHOT_EVICTIONS,
    now: Callable[[], float] = time.time,
) -> FleetSnapshot:
    """Read the fleet through ``client`` (a :class:`~ebbtide.client.Client` or a
    :class:`~ebbtide.api.remote.RemoteClient`): nodes, active jobs, queue counts and
    the latest evictions.  Store and server errors propagate, as the client raises them;
    a server too old to list evictions leaves a note instead."""
    taken_at = now()
    nodes = client.nodes()
    jobs = client.list(state=list(ACTIVE_STATE_NAMES))
    stats = client.queue_stats()
    notes = []
    try:
        recent = client.recent_evictions(evictions)
    except UserError as exc:  # e.g. 404 from an ebb server older than this client
        recent = []
        notes.append(f"evictions cannot be read here: {exc}")
    return build_snapshot(nodes, jobs, stats, recent, taken_at=taken_at, notes=notes)
