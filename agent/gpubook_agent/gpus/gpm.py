"""A MIG slice's utilisation, from NVML's GPU Performance Monitoring (GPM).

NVML gives no utilisation for a card in MIG mode nor for its MIG devices (``nvmlDeviceGetUtilizationRates``
answers NOT_SUPPORTED on both), so without more a slice would never look busy or idle. Cards with GPM (Hopper
and newer: H100, H200, GH200; ``nvmlGpmQueryDeviceSupport``) can sample each GPU instance
(``nvmlGpmMigSampleGet``); the metric is computed between two samples (``nvmlGpmMetricsGet``), so each
slice's previous sample is kept until the next telemetry tick, and the first tick after a slice appears
reads nothing. ``NVML_GPM_METRIC_GRAPHICS_UTIL`` is the share of time any application was active on the
GPU instance: what ``nvmlDeviceGetUtilizationRates().gpu`` is for a whole card. Slices that share one GPU
instance (compute instances of a ``1c.2g.20gb`` kind) read their instance's figure.

Cards without GPM (A100, A30) keep "utilisation missing" on their slices; the portal then neither raises idle
alerts on them nor counts their bookings as no-shows (docs/agent.md, "MIG").

Only the reporter's thread calls this (through ``NvmlBackend.sample``); nothing here is shared.
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml

log = logging.getLogger(__name__)


class GpmMeter:
    """Each slice's GPM sample from the last tick, and which cards have GPM at all."""

    def __init__(self) -> None:
        self._supported: dict[str, bool] = {}  # card UUID -> has GPM
        self._last: dict[str, Any] = {}  # slice UUID -> its sample from the previous tick

    def supported(self, card_uuid: str, card_handle: Any) -> bool:
        """Asked once per card: GPM support is a property of the chip."""
        known = self._supported.get(card_uuid)
        if known is None:
            try:
                known = bool(pynvml.nvmlGpmQueryDeviceSupport(card_handle).isSupportedDevice)
            except (pynvml.NVMLError, AttributeError):  # an old driver or binding without GPM
                known = False
            self._supported[card_uuid] = known
        return known

    def utilization(self, slice_uuid: str, card_handle: Any, gpu_instance_id: int) -> float | None:
        """Percent of the time since the previous call that the slice's GPU instance was busy; None on the first
        call for a slice and when NVML cannot say. Raises NVMLError when sampling fails (the caller names the
        field missing)."""
        sample = pynvml.nvmlGpmSampleAlloc()
        try:
            pynvml.nvmlGpmMigSampleGet(card_handle, gpu_instance_id, sample)
        except BaseException:
            pynvml.nvmlGpmSampleFree(sample)
            raise
        previous = self._last.pop(slice_uuid, None)
        self._last[slice_uuid] = sample
        if previous is None:
            return None
        try:
            return self._between(previous, sample)
        finally:
            pynvml.nvmlGpmSampleFree(previous)

    @staticmethod
    def _between(first: Any, second: Any) -> float | None:
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
        pynvml.nvmlGpmMetricsGet(request)
        metric = request.metrics[0]
        if metric.nvmlReturn != pynvml.NVML_SUCCESS:
            return None
        return min(100.0, max(0.0, float(metric.value)))

    def keep_only(self, slice_uuids: set[str]) -> None:
        """Free the samples of slices that are gone (destroyed, or a new layout)."""
        for uuid in [uuid for uuid in self._last if uuid not in slice_uuids]:
            self._free(self._last.pop(uuid))

    def close(self) -> None:
        self.keep_only(set())

    @staticmethod
    def _free(sample: Any) -> None:
        try:
            pynvml.nvmlGpmSampleFree(sample)
        except pynvml.NVMLError as error:
            log.warning("NVML could not free a GPM sample: %s", error)
