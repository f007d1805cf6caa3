"""Headroom sources: what the online tenants use on each device, sampled.

``nvml`` (real GPUs, per process, via ``pynvml`` from nvidia-ml-py), ``prometheus:URL``
(DCGM exporter figures, for planning only), ``trace:PATH`` (replay of a CSV), ``static``
(a fixed online usage).  All implement :class:`HeadroomSource`; they also report device
faults (XIDs) and answer health checks.
"""

from ebbtide.workers.headroom.base import DeviceInfo, DeviceSample, HeadroomSource

__all__ = ["DeviceInfo", "DeviceSample", "HeadroomSource"]
