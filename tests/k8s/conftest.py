"""The ``kube`` fixture: a started Kubernetes API emulator with a test kubelet for "gpu-0"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.k8s import KubeHarness, kube_harness


@pytest.fixture
def kube() -> Iterator[KubeHarness]:
    """An emulator on 127.0.0.1 and a kubelet for node "gpu-0"; stopped after the test."""
    with kube_harness() as harness:
        yield harness
