"""A Kubernetes API emulator and a test kubelet, for testing Kubernetes code with the official
client over real HTTP, with no cluster.

Usage (the ``kube`` fixture of ``tests/k8s/conftest.py`` yields a started :class:`KubeHarness`;
elsewhere use :func:`kube_harness`)::

    def test_runs(kube):
        core = kube.core()
        core.create_namespaced_pod("default", pod_body)
        pod = kube.wait_for_pod("p", lambda p: p.status.phase == "Succeeded")
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Self, TypeVar

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from tests.k8s.emulator import KubeEmulator
from tests.k8s.kubelet import Kubelet

__all__ = ["KubeEmulator", "KubeHarness", "Kubelet", "kube_harness"]

T = TypeVar("T")


class KubeHarness:
    """An emulator, a kubelet for ``nodes``, and API clients that are closed with it.

    ``bookmark_interval_s``: watch bookmark period (seconds); ``min_grace_s``: least time from
    SIGTERM to SIGKILL (seconds; 1 in a real kubelet); ``kubelet_options`` go to
    :class:`Kubelet`.
    """

    def __init__(
        self,
        *,
        nodes: Iterable[str] = ("gpu-0",),
        bookmark_interval_s: float = 0.2,
        min_grace_s: float = 1.0,
        **kubelet_options: Any,
    ) -> None:
        self.emulator = KubeEmulator(bookmark_interval_s=bookmark_interval_s)
        self.kubelet = Kubelet(self.emulator, nodes, min_grace_s=min_grace_s, **kubelet_options)
        self._clients: list[kubernetes.client.ApiClient] = []
        self._core: kubernetes.client.CoreV1Api | None = None

    def start(self) -> Self:
        self.emulator.start()
        try:
            self.kubelet.start()
        except BaseException:
            self.emulator.stop()
            raise
        return self

    def close(self) -> None:
        """Stop the kubelet (killing what it runs), close the clients, stop the emulator;
        raise if the kubelet's thread hit an error."""
        try:
            self.kubelet.stop()
        finally:
            for client in self._clients:
                client.close()
            self._clients.clear()
            self._core = None
            self.emulator.stop()
        if self.kubelet.errors:
            raise AssertionError("the test kubelet failed:\n" + "\n".join(self.kubelet.errors))

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new ``ApiClient`` for the emulator, closed by :meth:`close`."""
        client = self.emulator.api_client()
        self._clients.append(client)
        return client

    def core(self) -> kubernetes.client.CoreV1Api:
        """A ``CoreV1Api`` on one shared client."""
        if self._core is None:
            self._core = kubernetes.client.CoreV1Api(self.api_client())
        return self._core

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
        kubelet: bool = True,
    ) -> None:
        """Add node ``name``; served by the kubelet unless ``kubelet`` is False."""
        if kubelet:
            self.kubelet.add_node(name, labels=labels, allocatable=allocatable)
        else:
            self.emulator.add_node(name, labels=labels, allocatable=allocatable)

    def wait_until(
        self, probe: Callable[[], T], *, timeout_s: float = 5.0, interval_s: float = 0.02
    ) -> T:
        """Poll ``probe()`` until it returns something truthy; AssertionError after
        ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = probe()
            if result:
                return result
            if time.monotonic() >= deadline:
                raise AssertionError(f"not true within {timeout_s} s: {probe}")
            time.sleep(interval_s)

    def read_pod(self, name: str, namespace: str = "default") -> kubernetes.client.V1Pod | None:
        """The pod through the API, or None if it does not exist."""
        try:
            return self.core().read_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def wait_for_pod(
        self,
        name: str,
        predicate: Callable[[kubernetes.client.V1Pod], bool],
        *,
        namespace: str = "default",
        timeout_s: float = 5.0,
    ) -> kubernetes.client.V1Pod:
        """Poll the pod through the API until ``predicate(pod)`` holds; returns the pod."""

        def probe() -> kubernetes.client.V1Pod | None:
            pod = self.read_pod(name, namespace)
            return pod if pod is not None and predicate(pod) else None

        return self.wait_until(probe, timeout_s=timeout_s)

    def wait_pod_gone(
        self, name: str, *, namespace: str = "default", timeout_s: float = 5.0
    ) -> None:
        """Poll until the pod no longer exists."""
        self.wait_until(lambda: self.read_pod(name, namespace) is None, timeout_s=timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextlib.contextmanager
def kube_harness(**options: Any) -> Iterator[KubeHarness]:
    """A started :class:`KubeHarness` (options as its constructor's), closed on exit."""
    with KubeHarness(**options) as harness:
        yield harness
