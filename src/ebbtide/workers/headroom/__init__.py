"""Headroom sources: what the online tenants use on each device, sampled.

``nvml`` (real GPUs, via ``pynvml`` from nvidia-ml-py), ``trace:PATH`` (replay of a CSV),
``static`` (a fixed online usage).  All implement :class:`HeadroomSource`.
"""

from ebbtide.workers.headroom.base import DeviceInfo, DeviceSample, HeadroomSource

__all__ = ["DeviceInfo", "DeviceSample", "HeadroomSource"]
