"""The NVML backend: real NVIDIA GPUs through ``pynvml`` (package nvidia-ml-py).

NVML starts once per backend and the device handles are found once, keyed by UUID; the device
file of each GPU comes from its minor number, never from its enumeration index. Telemetry reads
each measurement on its own, so a card that does not support one (power, ECC...) still reports
the rest, and the missing ones are named.

Only whole GPUs for now: MIG instances are not listed. A MIG-enabled GPU appears as the whole
GPU with its own device file, and booking grants the whole card.

This is the only module in the agent that imports pynvml.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from gpubook_agent.gpus.base import BackendUnavailable, GpuInfo, GpuProcess, GpuSample

log = logging.getLogger(__name__)

T = TypeVar("T")

MIB = 1024 * 1024
# pynvml >= 11 turns "not available" into None; older releases pass the raw marker through.
NOT_AVAILABLE = 2**64 - 1
# Unversioned process listings raise NVMLLibraryMismatchError (not an NVMLError) on an old driver.
NVML_ERRORS: tuple[type[Exception], ...] = (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError)
SIMULATED_HINT = "On a machine without NVIDIA GPUs, set BACKEND=simulated in the agent config (GPUBOOK_BACKEND)."


def _text(value: str | bytes) -> str:
    """pynvml returns str in recent releases and bytes in some older ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _mib(num_bytes: int | None) -> int | None:
    if num_bytes is None or num_bytes == NOT_AVAILABLE:
        return None
    return int(num_bytes) // MIB


class NvmlBackend:
    name = "nvml"

    def __init__(self, *, device_dir: str) -> None:
        self.device_dir = device_dir
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise BackendUnavailable(
                f"NVML could not start ({type(error).__name__}: {error}); "
                f"is the NVIDIA driver installed and loaded? {SIMULATED_HINT}"
            ) from error
        self._running = True
        self._warned: set[tuple[str, str]] = set()
        try:
            self.driver_version = self._driver_version()
            self._gpus, self._handles = self._enumerate()
            self._minors = {gpu.uuid: gpu.minor for gpu in self._gpus}
        except BaseException:
            self.close()
            raise

    # -- static facts -------------------------------------------------------------------------

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def device_path(self, uuid: str) -> str:
        minor = self._minors[uuid]  # KeyError for a GPU this node does not have
        return os.path.join(self.device_dir, f"nvidia{minor}")

    def _driver_version(self) -> str | None:
        try:
            return _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as error:
            log.warning("NVML does not give the driver version: %s", error)
            return None

    def _enumerate(self) -> tuple[list[GpuInfo], dict[str, Any]]:
        """Every GPU NVML can identify, by UUID, ordered by minor number (the device file order)."""
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as error:
            raise BackendUnavailable(f"NVML started but cannot count the GPUs ({error}). {SIMULATED_HINT}") from error
        gpus: list[GpuInfo] = []
        handles: dict[str, Any] = {}
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                minor = int(pynvml.nvmlDeviceGetMinorNumber(handle))
            except pynvml.NVMLError as error:
                # Without UUID and minor the GPU can be neither booked nor guarded; nvidia-smi skips it too.
                log.warning("GPU at NVML index %d skipped: NVML cannot identify it (%s)", index, error)
                continue
            if uuid in handles:
                log.warning("GPU at NVML index %d skipped: UUID %s listed twice", index, uuid)
                continue
            try:
                name = _text(pynvml.nvmlDeviceGetName(handle))
            except pynvml.NVMLError:
                name = "unknown NVIDIA GPU"
            try:
                memory_total: int | None = _mib(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            except pynvml.NVMLError:
                memory_total = None
            handles[uuid] = handle
            gpus.append(GpuInfo(uuid=uuid, index=index, minor=minor, name=name, memory_total_mib=memory_total))
        if not gpus:
            log.warning("NVML lists no usable GPU on this machine")
        gpus.sort(key=lambda gpu: gpu.minor)
        return gpus, handles

    # -- telemetry ----------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        return [self._sample_one(gpu.uuid, self._handles[gpu.uuid]) for gpu in self._gpus]

    def _sample_one(self, uuid: str, handle: Any) -> GpuSample:
        missing: list[str] = []

        def read(call: Callable[[], T], *fields: str) -> T | None:
            """One NVML call; its failure names its fields missing and never costs the others."""
            try:
                return call()
            except NVML_ERRORS as error:
                missing.extend(fields)
                self._note_failure(uuid, fields[0], error)
                return None

        utilization = read(lambda: int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu), "utilization_pct")
        memory = read(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle), "memory_used_mib", "memory_total_mib")
        temperature = read(
            lambda: int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)), "temperature_c"
        )
        slowdown = read(
            lambda: int(pynvml.nvmlDeviceGetTemperatureThreshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
            "slowdown_temperature_c",
        )
        power = read(lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, "power_w")
        ecc = read(
            lambda: int(
                pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                )
            ),
            "ecc_errors_uncorrected",
        )
        processes = self._processes(uuid, handle, missing)
        return GpuSample(
            uuid=uuid,
            utilization_pct=utilization,
            memory_used_mib=_mib(memory.used) if memory is not None else None,
            memory_total_mib=_mib(memory.total) if memory is not None else None,
            temperature_c=temperature,
            slowdown_temperature_c=slowdown,
            power_w=power,
            ecc_errors_uncorrected=ecc,
            processes=processes,
            missing=tuple(missing),
        )

    def _processes(self, uuid: str, handle: Any, missing: list[str]) -> tuple[GpuProcess, ...]:
        """Compute and graphics processes joined by pid. If either list cannot be read, what was read is
        kept and "processes" is named missing: the list may be incomplete."""
        used_by_pid: dict[int, int | None] = {}
        listings = (
            ("compute processes", pynvml.nvmlDeviceGetComputeRunningProcesses),
            ("graphics processes", pynvml.nvmlDeviceGetGraphicsRunningProcesses),
        )
        for label, listing in listings:
            try:
                running = listing(handle)
            except NVML_ERRORS as error:
                if "processes" not in missing:
                    missing.append("processes")
                self._note_failure(uuid, label, error)
                continue
            for process in running:
                pid = int(process.pid)
                used = _mib(getattr(process, "usedGpuMemory", None))
                known = [value for value in (used_by_pid.get(pid), used) if value is not None]
                used_by_pid[pid] = max(known, default=None)
        return tuple(GpuProcess(pid=pid, used_memory_mib=used) for pid, used in sorted(used_by_pid.items()))

    def _note_failure(self, uuid: str, field: str, error: Exception) -> None:
        """Unsupported fields are normal; other failures (a GPU lost, a driver mismatch) are logged once."""
        if isinstance(error, pynvml.NVMLError_NotSupported) or (uuid, field) in self._warned:
            return
        self._warned.add((uuid, field))
        log.warning("GPU %s: NVML cannot read %s: %s", uuid, field, error)

    def close(self) -> None:
        """Shut NVML down once; closing twice is harmless."""
        if not self._running:
            return
        self._running = False
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            log.warning("NVML shutdown failed: %s", error)
