"""The node agent's forecasters, one per device, fed only what they need.

A :class:`~ebbtide.scheduling.forecast.Forecaster` weighs online usage by time, so
feeding it every 50 ms sample or only the samples where usage changed gives the same
forecast (``tests/unit/test_forecast.py``).  The agent samples 20 times a second and
online usage seldom changes between two samples: a sample that repeats the last fed
figures is held back, and fed (at its own time) only when a later sample differs or
before the forecast is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ebbtide.scheduling.forecast import Forecaster
from ebbtide.workers.headroom.base import DeviceSample


class DeviceForecasts:
    """A forecaster per device index, made by ``make``."""

    def __init__(self, indices: Iterable[int], make: Callable[[], Forecaster]) -> None:
        self._forecasters = {index: make() for index in indices}
        #: per device: the last figures fed (compute %, memory MiB)
        self._fed: dict[int, tuple[float, float]] = {}
        #: per device: the time of the latest sample with those figures, not fed yet
        self._held: dict[int, float] = {}
        #: per device: the time of the latest sample taken in (fed or held)
        self._last_t: dict[int, float] = {}

    def observe(self, samples: Iterable[DeviceSample]) -> None:
        """Take in one sample per device (those that did not answer are left out, and
        those older than one taken in already: a forecaster takes samples in time order)."""
        for s in samples:
            forecaster = self._forecasters.get(s.index)
            if forecaster is None or not s.ok or s.time < self._last_t.get(s.index, s.time):
                continue
            self._last_t[s.index] = s.time
            figures = (s.online_compute_pct, s.online_memory_mib)
            if self._fed.get(s.index) == figures:
                self._held[s.index] = s.time
                continue
            self._feed_held(s.index, forecaster)
            forecaster.observe(s.time, *figures)
            self._fed[s.index] = figures

    def reserve(self, index: int, deadline_s: float) -> tuple[float, float]:
        """:meth:`Forecaster.reserve` of device ``index``, every sample taken in."""
        forecaster = self._forecasters[index]
        self._feed_held(index, forecaster)
        return forecaster.reserve(deadline_s)

    def warmup_left_s(self, index: int, deadline_s: float) -> float:
        """:meth:`Forecaster.warmup_left_s` of device ``index``, every sample taken in."""
        forecaster = self._forecasters[index]
        self._feed_held(index, forecaster)
        return forecaster.warmup_left_s(deadline_s)

    def _feed_held(self, index: int, forecaster: Forecaster) -> None:
        held_at = self._held.pop(index, None)
        if held_at is not None:
            forecaster.observe(held_at, *self._fed[index])
