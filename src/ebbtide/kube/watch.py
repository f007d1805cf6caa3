"""A node agent's view of its attempt pods: one list, then a watch that keeps it current.

The watcher lists the pods it is given a label selector for, then watches from the list's
``resourceVersion`` with bookmarks (so a quiet watch still moves its resourceVersion on,
and a reconnect does not start from an old one).  A watch that ends — the server's
timeout, a dropped connection — resumes from the last resourceVersion seen; an expired
one (HTTP 410 Gone) leads to a fresh list.  A list replaces the view: a pod missing from
it was deleted while nobody watched, and its last state seen is kept.

Nothing an attempt's outcome rests on is lost across a reconnect or a relist: a pod's
terminal state is in the list if the pod still exists, and the executor deletes an
attempt's pod only once it has read that state.  A pod deleted by someone else while the
watch was down is seen as gone, with the last state the watcher saw.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("ebbtide.kube.watch")

#: How long one watch request may last before it is renewed, in seconds.
WATCH_TIMEOUT_S = 60
#: The longest a list may take, in seconds.
LIST_TIMEOUT_S = 30
#: How long to wait before retrying after an error talking to the API server, in seconds.
RETRY_S = 1.0
#: How many deleted pods' last states are kept for their executor to read.
GONE_KEPT = 10_000


@dataclass(frozen=True)
class Seen:
    """A pod as last seen: its JSON, and whether it has since gone from the API."""

    pod: dict[str, Any]
    gone: bool = False


class PodWatcher:
    """Keeps ``pods`` (name → :class:`Seen`) current for one namespace and label selector.

    ``core`` is a ``kubernetes.client.CoreV1Api``.  :meth:`start` runs the watch in a
    daemon thread; :meth:`sync` does one list (tests and the first look use it).
    """

    def __init__(
        self,
        core: Any,
        namespace: str,
        label_selector: str,
        *,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        retry_s: float = RETRY_S,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.core = core
        self.namespace = namespace
        self.label_selector = label_selector
        self.watch_timeout_s = watch_timeout_s
        self.retry_s = retry_s
        self.on_change = on_change
        self._lock = threading.Lock()
        self._pods: dict[str, Seen] = {}
        self._resource_version: str | None = None
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None
        #: how many lists and watch requests this watcher made (for tests and logs)
        self.lists = 0
        self.watches = 0
        #: set after the first list
        self.ready = threading.Event()

    # -- reading ------------------------------------------------------------------------

    def get(self, name: str) -> Seen | None:
        """The pod named ``name`` as last seen (None: never seen)."""
        with self._lock:
            return self._pods.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return [n for n, s in self._pods.items() if not s.gone]

    def note(self, pod: dict[str, Any]) -> None:
        """Record a pod this agent just created or read (the watch may be behind)."""
        name = pod["metadata"]["name"]
        with self._lock:
            seen = self._pods.get(name)
            if seen is None or _newer(pod, seen.pod):
                self._pods[name] = Seen(pod)

    def forget(self, name: str) -> None:
        with self._lock:
            self._pods.pop(name, None)

    @property
    def resource_version(self) -> str | None:
        return self._resource_version

    # -- running ------------------------------------------------------------------------

    def start(self) -> None:
        """Watch in a thread of its own (again after :meth:`stop`: from the last
        resourceVersion seen, or a fresh list if that has expired)."""
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(self.watch_timeout_s + 10)  # it finishes its request first
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pod-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def sync(self) -> None:
        """List the pods and make that the view (pods not listed are gone)."""
        listing = self.core.list_namespaced_pod(
            self.namespace, label_selector=self.label_selector, _request_timeout=LIST_TIMEOUT_S
        )
        pods = [self.core.api_client.sanitize_for_serialization(p) for p in listing.items]
        listed = {p["metadata"]["name"]: p for p in pods}
        version = listing.metadata.resource_version
        with self._lock:
            for name, seen in list(self._pods.items()):
                # a pod missing from the list was deleted meanwhile, unless it is newer
                # than the list (created, or noted by its creator, after the list was made)
                if name not in listed and not seen.gone and not _after(seen.pod, version):
                    self._pods[name] = Seen(seen.pod, gone=True)
            for name, pod in listed.items():
                known = self._pods.get(name)
                if known is None or _newer(pod, known.pod):
                    self._pods[name] = Seen(pod)
            self._trim()
            self._resource_version = listing.metadata.resource_version
        self.lists += 1
        self.ready.set()
        self._changed()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._resource_version is None:
                    self.sync()
                self._watch_once()
            except ApiException as exc:
                if exc.status == 410:
                    log.info("pod watch expired (410 Gone): listing again")
                    self._resource_version = None
                    continue
                log.warning("pod watch failed (%s %s); retrying", exc.status, exc.reason)
                self._stop.wait(self.retry_s)
            except Exception as exc:  # the API server unreachable, a dropped stream
                if self._stop.is_set():
                    return
                log.warning("pod watch failed (%s); retrying", exc)
                self._stop.wait(self.retry_s)

    def _watch_once(self) -> None:
        self._watch = w = watch.Watch()
        self.watches += 1
        try:
            for event in w.stream(
                self.core.list_namespaced_pod,
                self.namespace,
                label_selector=self.label_selector,
                resource_version=self._resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_s,
                _request_timeout=self.watch_timeout_s + 10,
            ):
                self._apply(event["type"], event["raw_object"])
                if self._stop.is_set():
                    break
        finally:
            self._watch = None

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if version:
                self._resource_version = version
            return
        name = obj["metadata"]["name"]
        with self._lock:
            if kind == "DELETED":
                self._pods[name] = Seen(obj, gone=True)
                self._trim()
            elif kind in ("ADDED", "MODIFIED"):
                seen = self._pods.get(name)
                if seen is None or seen.gone or _newer(obj, seen.pod):
                    self._pods[name] = Seen(obj)
        if version:
            self._resource_version = version
        self._changed()

    def _trim(self) -> None:
        gone = [n for n, s in self._pods.items() if s.gone]
        for name in gone[: max(0, len(gone) - GONE_KEPT)]:
            del self._pods[name]

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


def _newer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether pod JSON ``a`` is at least as recent as ``b`` (resourceVersions compare as
    integers on every API server in use, though the API calls them opaque)."""
    try:
        return int(a["metadata"]["resourceVersion"]) >= int(b["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return True


def _after(pod: dict[str, Any], version: str | None) -> bool:
    """Whether pod JSON ``pod`` is more recent than resourceVersion ``version``."""
    try:
        return int(pod["metadata"]["resourceVersion"]) > int(version or 0)
    except (KeyError, TypeError, ValueError):
        return False


def wait_until(predicate: Callable[[], bool], timeout_s: float, step_s: float = 0.01) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; whether it held."""
    give_up = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= give_up:
            return False
        time.sleep(step_s)
