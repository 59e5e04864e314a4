"""A GPU's energy where NVML keeps no counter of its own: its power readings added up over time.

NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded; Volta and
newer) is the measurement; where a card lacks it, ``PowerIntegral`` gives the trapezoid between successive
power readings instead, and the sample says the figure is estimated. Either way the portal receives a counter
that only grows until it starts again from zero (a driver reload, or here an agent restart), and it reads a
fall as such a reset. The simulated backend keeps its cards' counters with the same class.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class PowerIntegral:
    """Per GPU UUID, the energy in mJ its power readings add up to since its first reading (or its reset)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[str, tuple[float, float]] = {}  # uuid -> (when, watts) of the last reading
        self._total_mj: dict[str, float] = {}

    def add(self, uuid: str, watts: float) -> int:
        """Take a power reading of ``uuid``; returns its counter, in whole mJ. The first reading starts it at 0;
        each next one adds the mean of the two readings times the time between them."""
        now = self._clock()
        total = self._total_mj.get(uuid, 0.0)
        last = self._last.get(uuid)
        if last is not None:
            when, watts_then = last
            total += (watts_then + watts) / 2 * max(now - when, 0.0) * 1000
        self._last[uuid], self._total_mj[uuid] = (now, watts), total
        return int(total)

    def reset(self, uuid: str) -> None:
        """Start ``uuid``'s counter again from zero at its next reading, as a driver reload does to NVML's."""
        self._last.pop(uuid, None)
        self._total_mj.pop(uuid, None)
