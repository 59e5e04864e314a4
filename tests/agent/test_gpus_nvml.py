"""The NVML backend against pynvml's documented behaviour, faked at the pynvml boundary.

The fakes return what pynvml returns (its ctypes structs and friendly objects, str or bytes) and
raise what it raises (``NVMLError(code)``, which pynvml maps to ``NVMLError_<Name>``), and check the
arguments the real library would refuse, so the backend is tested on the exact calls it makes.
"""

from __future__ import annotations

import ctypes
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from gpubook_agent.gpus import (
    BackendUnavailable,
    GpuBackend,
    GpuProcess,
    PowerLimitError,
    PowerLimits,
    open_backend,
)
from gpubook_agent.gpus.simulated import mig_minors_text
from gpubook_agent.power import PowerCap

MIB = 1024 * 1024
UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    uuid: str | bytes
    minor: int
    name: str | bytes = "NVIDIA A100-SXM4-80GB"
    total: int = 81920 * MIB
    used: int = 1024 * MIB
    utilization: int = 42
    temperature: int = 51
    slowdown: int = 88
    power_mw: int = 123_456
    energy_mj: int = 987_654_321  # since the driver loaded
    ecc: int = 0
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    failing: dict[str, int] = field(default_factory=dict)  # pynvml function name -> NVML error code
    # MIG: (current, pending) or None for a card without MIG (NOT_SUPPORTED); the MIG devices by index, with
    # holes where no compute instance is; the GPU instances by id: (profile id, placement start, size).
    mig_mode: tuple[int, int] | None = None
    max_mig_devices: int = 7
    mig_devices: dict[int, FakeMig] = field(default_factory=dict)
    gpu_instances: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    # GPM (Hopper and newer): each GPU instance's busy time so far, in ms of the card's GPM clock.
    gpm: bool = False
    gpm_busy_ms: dict[int, float] = field(default_factory=dict)
    # Power management limits in mW, as NVML keeps them (an A100-SXM4's): the range a limit may be set in, the
    # default after a driver load, the one in force; and every limit set, in order.
    power_min_mw: int = 100_000
    power_max_mw: int = 400_000
    power_default_mw: int = 400_000
    power_limit_mw: int = 400_000
    power_limits_set: list[int] = field(default_factory=list)


@dataclass
class FakeMig(FakeGpu):
    """A MIG device handle: NVML answers memory and processes on it, and NOT_SUPPORTED for what only the card has."""

    minor: int = -1
    gpu_instance: int = 0
    compute_instance: int = 0
    gi_slices: int = 3
    ci_slices: int = 3
    memory_mb: int = 40192

    def __post_init__(self) -> None:
        unsupported = (
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetTemperatureThreshold",
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTotalEnergyConsumption",
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetMinorNumber",
            "nvmlDeviceGetPowerManagementLimitConstraints",
            "nvmlDeviceGetPowerManagementDefaultLimit",
            "nvmlDeviceGetPowerManagementLimit",
            "nvmlDeviceSetPowerManagementLimit",
        )
        self.failing = {name: pynvml.NVML_ERROR_NOT_SUPPORTED for name in unsupported} | self.failing


@dataclass
class FakeGpuInstance:
    gpu: FakeGpu
    gpu_instance_id: int


# An A100-SXM4-80GB's GPU-instance profiles: (profile enum, profile id, name, compute slices, memory MB, placements).
A100_PROFILES = [
    (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, "MIG 1g.10gb", 1, 9856, [(i, 1) for i in range(7)]),
    (pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, "MIG 2g.20gb", 2, 19968, [(0, 2), (2, 2), (4, 2)]),
    (pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, "MIG 3g.40gb", 3, 40192, [(0, 4), (4, 4)]),
    (pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, "MIG 4g.40gb", 4, 40192, [(0, 4)]),
    (pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, "MIG 7g.80gb", 7, 80384, [(0, 8)]),
]


class FakeNvml:
    """The pynvml functions the backend calls, over GPUs listed in enumeration order."""

    def __init__(self, gpus: list[FakeGpu], driver: str | bytes = "550.54.15") -> None:
        self.gpus = gpus
        self.driver = driver
        self.init_calls = 0
        self.shutdown_calls = 0
        self.init_error: int | None = None
        self.failing: dict[str, int] = {}  # for the functions that take no handle
        self.mig_lookups: list[int] = []  # the MIG device indices that found a device
        self.gpm_clock_ms = 0.0
        # Live GPM samples by address: their buffer, and once taken (card, GPU instance, clock, busy time).
        self.gpm_samples: dict[int, tuple[Any, tuple[FakeGpu, int, float, float] | None]] = {}

    @property
    def running(self) -> bool:
        return self.init_calls > self.shutdown_calls

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    def _check(self, function: str, gpu: FakeGpu | None = None) -> None:
        if not self.running:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        code = (gpu.failing if gpu is not None else self.failing).get(function)
        if code is not None:
            raise nvml_error(code)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise nvml_error(self.init_error)
        self.init_calls += 1

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._check("nvmlDeviceGetHandleByIndex", self.gpus[index])
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str | bytes:
        self._check("nvmlDeviceGetUUID", gpu)
        return gpu.uuid

    def nvmlDeviceGetMinorNumber(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetMinorNumber", gpu)
        return gpu.minor

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str | bytes:
        self._check("nvmlDeviceGetName", gpu)
        return gpu.name

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, version: Any = None) -> pynvml.c_nvmlMemory_t:
        self._check("nvmlDeviceGetMemoryInfo", gpu)
        return pynvml.c_nvmlMemory_t(total=gpu.total, free=gpu.total - gpu.used, used=gpu.used)

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> pynvml.c_nvmlUtilization_t:
        self._check("nvmlDeviceGetUtilizationRates", gpu)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.utilization, memory=gpu.utilization // 2)

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature", gpu)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetTemperatureThreshold(self, gpu: FakeGpu, threshold: int) -> int:
        self._check("nvmlDeviceGetTemperatureThreshold", gpu)
        if threshold != pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.slowdown

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetPowerUsage", gpu)
        return gpu.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetTotalEnergyConsumption", gpu)
        return gpu.energy_mj

    # -- power limits, as NVML documents them: milliwatts; setting one needs root and a value in the range -----

    def nvmlDeviceGetPowerManagementLimitConstraints(self, gpu: FakeGpu) -> list[int]:
        self._check("nvmlDeviceGetPowerManagementLimitConstraints", gpu)
        return [gpu.power_min_mw, gpu.power_max_mw]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetPowerManagementDefaultLimit", gpu)
        return gpu.power_default_mw

    def nvmlDeviceGetPowerManagementLimit(self, gpu: FakeGpu) -> int:
        self._check("nvmlDeviceGetPowerManagementLimit", gpu)
        return gpu.power_limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, gpu: FakeGpu, limit: int) -> None:
        self._check("nvmlDeviceSetPowerManagementLimit", gpu)
        ctypes.c_uint(limit)  # what pynvml passes: a float raises TypeError there, as it would in the real call
        if not gpu.power_min_mw <= limit <= gpu.power_max_mw:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.power_limit_mw = limit
        gpu.power_limits_set.append(limit)

    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, error_type: int, counter_type: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors", gpu)
        if (error_type, counter_type) != (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.ecc

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[pynvml.nvmlFriendlyObject]:
        self._check("nvmlDeviceGetComputeRunningProcesses", gpu)
        return [_process(pid, used) for pid, used in gpu.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, gpu: FakeGpu) -> list[pynvml.nvmlFriendlyObject]:
        self._check("nvmlDeviceGetGraphicsRunningProcesses", gpu)
        return [_process(pid, used) for pid, used in gpu.graphics]

    # -- MIG, as NVML documents it --------------------------------------------------------------------------

    def _mig_capable(self, function: str, gpu: FakeGpu) -> None:
        self._check(function, gpu)
        if gpu.mig_mode is None or isinstance(gpu, FakeMig):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> list[int]:
        self._mig_capable("nvmlDeviceGetMigMode", gpu)
        assert gpu.mig_mode is not None
        return list(gpu.mig_mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu) -> int:
        self._mig_capable("nvmlDeviceGetMaxMigDeviceCount", gpu)
        return gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, index: int) -> FakeMig:
        self._mig_capable("nvmlDeviceGetMigDeviceHandleByIndex", gpu)
        if not 0 <= index < gpu.max_mig_devices:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.mig_mode is None or gpu.mig_mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE or index not in gpu.mig_devices:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        self.mig_lookups.append(index)
        return gpu.mig_devices[index]

    def nvmlDeviceGetGpuInstanceId(self, mig: FakeGpu) -> int:
        self._check("nvmlDeviceGetGpuInstanceId", mig)
        if not isinstance(mig, FakeMig):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, mig: FakeGpu) -> int:
        self._check("nvmlDeviceGetComputeInstanceId", mig)
        if not isinstance(mig, FakeMig):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.compute_instance

    def nvmlDeviceGetAttributes(self, mig: FakeGpu) -> pynvml.c_nvmlDeviceAttributes:
        self._check("nvmlDeviceGetAttributes", mig)
        if not isinstance(mig, FakeMig):  # "This API currently only supports MIG device handles."
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlDeviceAttributes(
            gpuInstanceSliceCount=mig.gi_slices, computeInstanceSliceCount=mig.ci_slices, memorySizeMB=mig.memory_mb
        )

    def nvmlDeviceGetGpuInstanceById(self, gpu: FakeGpu, gpu_instance_id: int) -> FakeGpuInstance:
        self._mig_capable("nvmlDeviceGetGpuInstanceById", gpu)
        if gpu_instance_id not in gpu.gpu_instances:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeGpuInstance(gpu, gpu_instance_id)

    def nvmlGpuInstanceGetInfo(self, instance: FakeGpuInstance) -> pynvml.c_nvmlGpuInstanceInfo_t:
        self._check("nvmlGpuInstanceGetInfo", instance.gpu)
        profile_id, start, size = instance.gpu.gpu_instances[instance.gpu_instance_id]
        return pynvml.c_nvmlGpuInstanceInfo_t(
            id=instance.gpu_instance_id,
            profileId=profile_id,
            placement=pynvml.c_nvmlGpuInstancePlacement_t(start=start, size=size),
        )

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, gpu: FakeGpu, profile: int, version: int = 2
    ) -> pynvml.c_nvmlGpuInstanceProfileInfo_v2_t:
        self._mig_capable("nvmlDeviceGetGpuInstanceProfileInfo", gpu)
        for number, profile_id, name, slices, memory, _ in A100_PROFILES:
            if number == profile:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()  # as pynvml makes it: the version set
                info.id, info.sliceCount, info.memorySizeMB, info.name = profile_id, slices, memory, name.encode()
                return info
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # a profile this card does not have

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, gpu: FakeGpu, profile_id: int, placements: Any, count_ref: Any
    ) -> int:
        self._mig_capable("nvmlDeviceGetGpuInstancePossiblePlacements", gpu)
        allowed = next(found for _, pid, _, _, _, found in A100_PROFILES if pid == profile_id)
        count = count_ref._obj  # what ctypes.byref wraps
        if count.value < len(allowed):
            raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, (start, size) in enumerate(allowed):
            placements[i].start, placements[i].size = start, size
        count.value = len(allowed)
        return pynvml.NVML_SUCCESS

    # -- GPM, as NVML documents it: samples are allocated, taken and freed by the caller ----------------

    def nvmlGpmQueryDeviceSupport(self, gpu: FakeGpu) -> pynvml.c_nvmlGpmSupport_t:
        self._check("nvmlGpmQueryDeviceSupport", gpu)
        return pynvml.c_nvmlGpmSupport_t(version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(gpu.gpm))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._check("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(16)
        sample = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        self.gpm_samples[ctypes.addressof(buffer)] = (buffer, None)
        return sample

    def _gpm_address(self, sample: Any) -> int:
        address = ctypes.cast(sample, ctypes.c_void_p).value
        if address not in self.gpm_samples:  # freed twice, or never allocated
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return address

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._check("nvmlGpmSampleFree")
        del self.gpm_samples[self._gpm_address(sample)]

    def nvmlGpmMigSampleGet(self, gpu: FakeGpu, gpu_instance_id: int, sample: Any) -> Any:
        self._check("nvmlGpmMigSampleGet", gpu)
        if not gpu.gpm or isinstance(gpu, FakeMig):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu_instance_id not in gpu.gpu_instances:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        address = self._gpm_address(sample)
        taken = (gpu, gpu_instance_id, self.gpm_clock_ms, gpu.gpm_busy_ms.get(gpu_instance_id, 0.0))
        self.gpm_samples[address] = (self.gpm_samples[address][0], taken)
        return sample

    def nvmlGpmMetricsGet(self, request: pynvml.c_nvmlGpmMetricsGet_t) -> pynvml.c_nvmlGpmMetricsGet_t:
        self._check("nvmlGpmMetricsGet")
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self.gpm_samples[self._gpm_address(request.sample1)][1]
        second = self.gpm_samples[self._gpm_address(request.sample2)][1]
        if first is None or second is None or first[:2] != second[:2] or second[2] <= first[2]:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for index in range(request.numMetrics):
            metric = request.metrics[index]
            if metric.metricId == pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL:
                metric.value = 100.0 * (second[3] - first[3]) / (second[2] - first[2])
                metric.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request


def _process(pid: int, used_mib: int | None) -> pynvml.nvmlFriendlyObject:
    """What pynvml returns per process; it turns NVML's "not available" into None."""
    used = None if used_mib is None else used_mib * MIB
    return pynvml.nvmlFriendlyObject({"pid": pid, "usedGpuMemory": used, "gpuInstanceId": 0, "computeInstanceId": 0})


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """Two GPUs whose enumeration order is not their minor order; B lacks power and ECC."""
    fake = FakeNvml(
        [
            FakeGpu(
                uuid=UUID_B,
                minor=3,
                name=b"NVIDIA GeForce RTX 3090",
                total=24576 * MIB,
                used=0,
                utilization=0,
                failing={
                    "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED,
                    "nvmlDeviceGetTotalEccErrors": pynvml.NVML_ERROR_NOT_SUPPORTED,
                },
            ),
            FakeGpu(
                uuid=UUID_A,
                minor=1,
                used=3072 * MIB,
                ecc=2,
                compute=[(4242, 2048), (4243, None)],
                graphics=[(4242, 2048), (4244, 512)],
            ),
        ]
    )
    fake.install(monkeypatch)
    return fake


def _by_uuid(backend: GpuBackend) -> dict[str, Any]:
    return {sample.uuid: sample for sample in backend.sample()}


def test_the_fake_raises_what_pynvml_raises():
    error = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert isinstance(error, pynvml.NVMLError_NotSupported)
    assert isinstance(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), pynvml.NVMLError_LibraryNotFound)
    assert isinstance(pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED), pynvml.NVMLError_DriverNotLoaded)


def test_gpus_are_mapped_by_uuid_and_minor_not_enumeration_order(nvml, tmp_path):
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    try:
        assert isinstance(backend, GpuBackend)
        assert backend.name == "nvml"
        gpus = {gpu.uuid: gpu for gpu in backend.gpus()}
        assert (gpus[UUID_A].index, gpus[UUID_A].minor) == (1, 1)
        assert (gpus[UUID_B].index, gpus[UUID_B].minor) == (0, 3)
        assert backend.device_path(UUID_A) == f"{tmp_path}/nvidia1"
        assert backend.device_path(UUID_B) == f"{tmp_path}/nvidia3"
        assert gpus[UUID_A].name == "NVIDIA A100-SXM4-80GB"
        assert gpus[UUID_B].name == "NVIDIA GeForce RTX 3090"  # bytes from older pynvml releases
        assert gpus[UUID_A].memory_total_mib == 81920
        assert [gpu.uuid for gpu in backend.gpus()] == [UUID_A, UUID_B]  # stable: by minor
        assert backend.driver_version == "550.54.15"
    finally:
        backend.close()


def test_an_unknown_uuid_has_no_device_path(nvml, tmp_path):
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    with pytest.raises(KeyError):
        backend.device_path("GPU-ffffffff-0000-0000-0000-000000000000")
    backend.close()


def test_a_sample_reads_every_supported_field(nvml, tmp_path):
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    sample = _by_uuid(backend)[UUID_A]
    backend.close()
    assert sample.utilization_pct == 42
    assert (sample.memory_used_mib, sample.memory_total_mib) == (3072, 81920)
    assert (sample.temperature_c, sample.slowdown_temperature_c) == (51, 88)
    assert sample.power_w == pytest.approx(123.456)
    assert sample.ecc_errors_uncorrected == 2
    assert (sample.energy_mj, sample.energy_estimated) == (987_654_321, False)  # the card's own counter
    assert sample.missing == ()


def test_unsupported_fields_are_none_and_named_missing_and_the_rest_still_read(nvml, tmp_path):
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    sample = _by_uuid(backend)[UUID_B]
    backend.close()
    assert sample.power_w is None
    assert sample.ecc_errors_uncorrected is None
    assert set(sample.missing) == {"power_w", "ecc_errors_uncorrected"}
    assert sample.utilization_pct == 0
    assert (sample.memory_used_mib, sample.memory_total_mib) == (0, 24576)
    assert (sample.temperature_c, sample.slowdown_temperature_c) == (51, 88)
    assert sample.processes == ()


def test_a_card_without_an_energy_counter_reports_its_power_added_up_marked_estimated(nvml, tmp_path):
    """Cards before Volta have no total-energy counter (NOT_SUPPORTED): the agent adds up their power readings
    instead (gpus/energy.py), from 0 at its first reading, and says the figure is estimated, not missing."""
    nvml.gpus[1].failing["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    first = _by_uuid(backend)[UUID_A]
    time.sleep(0.05)
    second = _by_uuid(backend)[UUID_A]
    # A card with neither a counter nor power readings (B here, whose power is NOT_SUPPORTED) has no energy.
    nvml.gpus[0].failing["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    neither = _by_uuid(backend)[UUID_B]
    backend.close()

    assert (first.energy_mj, first.energy_estimated) == (0, True)
    assert second.energy_estimated and 123.456 * 0.05 * 1000 <= second.energy_mj < 123.456 * 5 * 1000
    assert "energy_mj" not in first.missing + second.missing
    assert (neither.energy_mj, neither.energy_estimated) == (None, False)
    assert "energy_mj" in neither.missing


def test_any_nvml_error_only_costs_its_own_field(nvml, tmp_path):
    gpu = nvml.gpus[1]
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    gpu.failing = {
        "nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_UNKNOWN,
        "nvmlDeviceGetTemperature": pynvml.NVML_ERROR_GPU_IS_LOST,
    }
    sample = _by_uuid(backend)[UUID_A]
    backend.close()
    assert (sample.memory_used_mib, sample.memory_total_mib, sample.temperature_c) == (None, None, None)
    assert set(sample.missing) == {"memory_used_mib", "memory_total_mib", "temperature_c"}
    assert sample.utilization_pct == 42
    assert sample.power_w == pytest.approx(123.456)
    assert len(sample.processes) == 3


def test_processes_are_the_union_of_compute_and_graphics_by_pid(nvml, tmp_path):
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    sample = _by_uuid(backend)[UUID_A]
    backend.close()
    assert sample.processes == (
        GpuProcess(pid=4242, used_memory_mib=2048),
        GpuProcess(pid=4243, used_memory_mib=None),  # usedGpuMemory not available
        GpuProcess(pid=4244, used_memory_mib=512),
    )


def test_an_unreadable_process_list_keeps_the_other_and_says_processes_are_missing(nvml, tmp_path):
    nvml.gpus[1].failing = {"nvmlDeviceGetGraphicsRunningProcesses": pynvml.NVML_ERROR_NOT_SUPPORTED}
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    sample = _by_uuid(backend)[UUID_A]
    backend.close()
    assert [process.pid for process in sample.processes] == [4242, 4243]
    assert sample.missing == ("processes",)


def test_nvml_starts_once_and_shuts_down_once(nvml, tmp_path):
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    for _ in range(5):
        assert len(backend.sample()) == 2
    backend.gpus()
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 0)
    backend.close()
    backend.close()
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_no_library_or_no_driver_says_what_failed_and_points_to_simulated(nvml, tmp_path, code, text):
    nvml.init_error = code
    with pytest.raises(BackendUnavailable) as raised:
        open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    assert text in str(raised.value)
    assert "simulated" in str(raised.value)


def test_a_failure_while_listing_gpus_shuts_nvml_down(nvml, tmp_path):
    nvml.failing = {"nvmlDeviceGetCount": pynvml.NVML_ERROR_UNKNOWN}
    with pytest.raises(BackendUnavailable, match="simulated"):
        open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)


def test_a_gpu_nvml_cannot_identify_is_skipped(nvml, tmp_path):
    nvml.gpus[0].failing = {"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_GPU_IS_LOST}
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    assert [gpu.uuid for gpu in backend.gpus()] == [UUID_A]
    assert [sample.uuid for sample in backend.sample()] == [UUID_A]
    backend.close()


def test_driver_version_is_text_or_none(nvml, tmp_path):
    nvml.driver = b"535.161.08"
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    assert backend.driver_version == "535.161.08"
    backend.close()
    nvml.failing = {"nvmlSystemGetDriverVersion": pynvml.NVML_ERROR_UNKNOWN}
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    assert backend.driver_version is None
    backend.close()


def test_a_sample_is_json_ready(nvml, tmp_path):
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    data = [sample.as_dict() for sample in backend.sample()]
    backend.close()
    assert json.loads(json.dumps(data)) == data
    assert data[0]["processes"][0] == {"pid": 4242, "used_memory_mib": 2048}
    assert data[1]["missing"] == ["power_w", "ecc_errors_uncorrected"]


# -- power limits (the idle power cap: gpubook_agent/power.py) -------------------------------------------------


def test_power_limits_are_read_in_watts_from_nvmls_milliwatts(nvml, tmp_path):
    nvml.gpus[1].power_limit_mw = 160_000
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    limits = backend.power_limits(UUID_A)
    sample = _by_uuid(backend)[UUID_A]
    backend.close()

    assert limits == PowerLimits(min_w=100.0, max_w=400.0, default_w=400.0, current_w=160.0)
    assert sample.power_limit_w == 160.0
    assert "power_limit_w" not in sample.missing


def test_a_power_limit_is_set_in_whole_milliwatts(nvml, tmp_path):
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    backend.set_power_limit(UUID_A, 160.0)
    backend.set_power_limit(UUID_A, 123.4567)
    backend.close()

    assert nvml.gpus[1].power_limits_set == [160_000, 123_457]  # pynvml passes a c_uint: a float would raise


@pytest.mark.parametrize(
    ("code", "why"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "the card does not support power limits (NOT_SUPPORTED)"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "changing a power limit needs root (NO_PERMISSION)"),
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, "outside the card's range (INVALID_ARGUMENT)"),
        (pynvml.NVML_ERROR_GPU_IS_LOST, "NVMLError_GpuIsLost"),
    ],
)
def test_a_refused_power_limit_is_a_power_limit_error_that_says_why(nvml, tmp_path, code, why):
    nvml.gpus[1].failing["nvmlDeviceSetPowerManagementLimit"] = code
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    try:
        with pytest.raises(PowerLimitError, match=re.escape(f"NVML refused the power limit 160 W: {why}")):
            backend.set_power_limit(UUID_A, 160.0)
    finally:
        backend.close()
    assert nvml.gpus[1].power_limit_mw == 400_000


def test_a_card_without_power_management_has_no_limits_and_reports_its_limit_missing(nvml, tmp_path):
    gpu = nvml.gpus[0]  # B
    for name in ("nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceGetPowerManagementLimit"):
        gpu.failing[name] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    try:
        with pytest.raises(PowerLimitError, match=re.escape("does not support power limits (NOT_SUPPORTED)")):
            backend.power_limits(UUID_B)
        sample = _by_uuid(backend)[UUID_B]
    finally:
        backend.close()

    assert sample.power_limit_w is None
    assert "power_limit_w" in sample.missing


def test_the_idle_power_cap_sets_milliwatts_and_reports_a_card_that_refuses_without_raising(nvml, tmp_path):
    nvml.gpus[0].failing["nvmlDeviceSetPowerManagementLimit"] = pynvml.NVML_ERROR_NOT_SUPPORTED  # B
    backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    events: list[tuple[str, dict[str, Any]]] = []
    cap = PowerCap(
        backend=backend,
        cards=[gpu.uuid for gpu in backend.gpus()],
        report=lambda kind, **fields: events.append((kind, fields)),
        allowed=True,
    )
    try:
        for _ in range(3):
            cap.converge(40, busy=set())
        cap.converge(40, busy={UUID_A})  # a lease starts on A
    finally:
        backend.close()

    assert nvml.gpus[1].power_limits_set == [160_000, 400_000]
    assert nvml.gpus[0].power_limits_set == []
    assert [(kind, fields["gpu"]) for kind, fields in events] == [
        ("power_capped", UUID_A),
        ("power_failed", UUID_B),  # once, not at every pass
        ("power_restored", UUID_A),
    ]
    assert events[1][1]["message"] == (
        "NVML refused the power limit 160 W: the card does not support power limits (NOT_SUPPORTED)"
    )


def test_without_a_gpu_driver_the_nvml_backend_is_unavailable(tmp_path):
    """No fakes: on a machine without an NVIDIA driver (CI, laptops) this is what a person sees."""
    try:
        backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    except BackendUnavailable as error:
        assert "simulated" in str(error)
    else:
        backend.close()
        pytest.skip("NVML is available on this machine")


# -- MIG ---------------------------------------------------------------------------------------------------

MIG_3G = "MIG-11111111-0000-0000-0000-000000000003"
MIG_1C_A = "MIG-22222222-0000-0000-0000-000000000001"
MIG_1C_B = "MIG-33333333-0000-0000-0000-000000000001"


@pytest.fixture
def mig_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path) -> FakeNvml:
    """An A100 in MIG mode (NVML index 0, minor 2): a 3g.40gb at memory slices 4-7, and a 2g.20gb at 0-1 split
    into two 1-slice compute instances; its MIG devices sit at indices 0, 3 and 5 of 7 (holes between). Beside it
    a card without MIG. The driver's mig-minors file numbers the capability files."""
    card = FakeGpu(
        uuid=UUID_A,
        minor=2,
        mig_mode=(pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE),
        gpu_instances={2: (9, 4, 4), 3: (14, 0, 2)},
        mig_devices={
            0: FakeMig(uuid=MIG_3G, gpu_instance=2, compute_instance=0, total=40192 * MIB, compute=[(5001, 1024)]),
            3: FakeMig(uuid=MIG_1C_A, gpu_instance=3, compute_instance=0, gi_slices=2, ci_slices=1, memory_mb=19968),
            5: FakeMig(uuid=MIG_1C_B, gpu_instance=3, compute_instance=1, gi_slices=2, ci_slices=1, memory_mb=19968),
        },
    )
    fake = FakeNvml([card, FakeGpu(uuid=UUID_B, minor=0)])
    fake.install(monkeypatch)
    (tmp_path / "mig-minors").write_text(mig_minors_text(4))
    return fake


def _open_mig(tmp_path) -> GpuBackend:
    return open_backend(
        "nvml",
        device_dir=str(tmp_path),
        node_name="gpu-a100",
        caps_dir=str(tmp_path / "caps"),
        mig_minors_file=str(tmp_path / "mig-minors"),
    )


def _cap(tmp_path, minor: int) -> str:
    return str(tmp_path / "caps" / f"nvidia-cap{minor}")


def test_mig_devices_are_found_past_the_holes_in_their_index_space(mig_nvml, tmp_path):
    backend = _open_mig(tmp_path)
    try:
        (card,) = backend.mig_cards()
    finally:
        backend.close()

    assert (card.uuid, card.minor, card.mode_current, card.mode_pending) == (UUID_A, 2, True, True)
    assert (card.placement_slots, card.compute_slices) == (8, 7)  # the 7g.80gb profile: 7 slices, placed 0 + 8
    assert [
        (s.uuid, s.profile, s.gpu_instance_id, s.compute_instance_id, s.placement_start, s.placement_size)
        for s in card.slices
    ] == [
        (MIG_1C_A, "1c.2g.20gb", 3, 0, 0, 2),
        (MIG_1C_B, "1c.2g.20gb", 3, 1, 0, 2),
        (MIG_3G, "3g.40gb", 2, 0, 4, 4),
    ]
    assert [(s.compute_slices, s.memory_mib) for s in card.slices] == [(1, 19968), (1, 19968), (3, 40192)]
    assert set(mig_nvml.mig_lookups) == {0, 3, 5}  # NOT_FOUND at the other indices: skipped, not an error


def test_capability_files_come_from_mig_minors_by_the_cards_minor_not_its_index(mig_nvml, tmp_path):
    backend = _open_mig(tmp_path)
    try:
        (card,) = backend.mig_cards()
        slices = {s.uuid: s for s in card.slices}
        # gpu2/gi2/access and gpu2/gi2/ci0/access; gpu2/gi3/access and gpu2/gi3/ci1/access
        assert slices[MIG_3G].capability_files == (_cap(tmp_path, 291), _cap(tmp_path, 292))
        assert slices[MIG_1C_B].capability_files == (_cap(tmp_path, 300), _cap(tmp_path, 302))
        assert backend.device_files(MIG_3G) == (f"{tmp_path}/nvidia2", _cap(tmp_path, 291), _cap(tmp_path, 292))
        card_files = backend.device_files(UUID_A)
        assert card_files[0] == f"{tmp_path}/nvidia2" and set(card_files[1:]) == {
            _cap(tmp_path, minor) for minor in (291, 292, 300, 301, 302)
        }
        assert backend.device_files(UUID_B) == (f"{tmp_path}/nvidia0",)
        assert len(card.capability_files) == 15 * 9  # every GPU and compute instance the card could have
        with pytest.raises(KeyError):
            backend.device_files("MIG-ffffffff-0000-0000-0000-000000000000")
    finally:
        backend.close()


def test_a_card_without_mig_is_not_in_the_layout(mig_nvml, tmp_path):
    backend = _open_mig(tmp_path)
    cards = backend.mig_cards()
    backend.close()

    assert [card.uuid for card in cards] == [UUID_A]


def test_a_pending_change_to_mig_off_is_reported_and_the_slices_still_listed(mig_nvml, tmp_path):
    mig_nvml.gpus[0].mig_mode = (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE)
    backend = _open_mig(tmp_path)
    (card,) = backend.mig_cards()
    backend.close()

    assert (card.mode_current, card.mode_pending, card.slices_open) == (True, False, False)
    assert len(card.slices) == 3
    assert card.as_dict()["mode_pending"] is False


def test_a_pending_change_to_mig_on_lists_no_slices_yet(mig_nvml, tmp_path):
    mig_nvml.gpus[0].mig_mode = (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE)
    backend = _open_mig(tmp_path)
    (card,) = backend.mig_cards()
    backend.close()

    assert (card.mode_current, card.mode_pending, card.slices) == (False, True, ())
    assert mig_nvml.mig_lookups == []  # MIG devices are not looked for on a card with MIG off
    assert backend.device_files(UUID_A) == (f"{tmp_path}/nvidia2",)


def test_a_mig_device_nvml_cannot_identify_is_skipped_and_the_others_listed(mig_nvml, tmp_path):
    mig_nvml.gpus[0].mig_devices[5].failing["nvmlDeviceGetGpuInstanceId"] = pynvml.NVML_ERROR_GPU_IS_LOST
    mig_nvml.gpus[0].failing["nvmlDeviceGetMigDeviceHandleByIndex"] = pynvml.NVML_ERROR_NOT_FOUND
    backend = _open_mig(tmp_path)
    (card,) = backend.mig_cards()
    backend.close()

    assert card.slices == ()  # every index answers NOT_FOUND: no slices, and no error

    mig_nvml.gpus[0].failing.clear()
    backend = _open_mig(tmp_path)
    (card,) = backend.mig_cards()
    backend.close()

    assert [s.uuid for s in card.slices] == [MIG_1C_A, MIG_3G]


def test_a_slice_made_or_destroyed_is_seen_on_the_next_read(mig_nvml, tmp_path):
    backend = _open_mig(tmp_path)
    try:
        del mig_nvml.gpus[0].mig_devices[0]  # nvidia-smi mig -dci / -dgi
        (card,) = backend.mig_cards()
        assert MIG_3G not in {s.uuid for s in card.slices}
        assert MIG_3G not in {sample.uuid for sample in backend.sample()}
    finally:
        backend.close()


def test_each_slice_is_sampled_on_its_own_handle(mig_nvml, tmp_path):
    backend = _open_mig(tmp_path)
    samples = _by_uuid(backend)
    backend.close()

    assert list(samples) == [UUID_B, UUID_A, MIG_1C_A, MIG_1C_B, MIG_3G]  # cards by minor, then slices
    sample = samples[MIG_3G]
    assert sample.processes == (GpuProcess(pid=5001, used_memory_mib=1024),)
    assert (sample.memory_used_mib, sample.memory_total_mib) == (1024, 40192)
    # NVML gives these for the card only: NOT_SUPPORTED on a MIG handle, named missing, never logged as errors.
    assert set(sample.missing) == {
        "utilization_pct",
        "temperature_c",
        "slowdown_temperature_c",
        "power_w",
        "ecc_errors_uncorrected",
        "energy_mj",  # NVML counts energy per card
        "power_limit_w",  # and power limits
    }
    assert sample.energy_mj is None


def test_without_profile_information_a_slice_is_named_from_its_attributes(mig_nvml, tmp_path):
    mig_nvml.gpus[0].failing["nvmlDeviceGetGpuInstanceProfileInfo"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = _open_mig(tmp_path)
    (card,) = backend.mig_cards()
    backend.close()

    assert [s.profile for s in card.slices] == ["1c.2g.20gb", "1c.2g.20gb", "3g.39gb"]  # 40192 MiB is 39.25 GiB
    assert (card.placement_slots, card.compute_slices) == (8, 7)  # what every MIG card so far has


def test_without_mig_minors_slices_are_listed_without_capability_files(mig_nvml, tmp_path):
    (tmp_path / "mig-minors").unlink()
    backend = _open_mig(tmp_path)
    (card,) = backend.mig_cards()
    backend.close()

    assert [s.capability_files for s in card.slices] == [(), (), ()]
    assert card.capability_files == ()


def test_a_card_whose_mig_state_cannot_be_read_at_all_is_taken_as_a_card_without_mig(mig_nvml, tmp_path, monkeypatch):
    def broken(device, index):
        raise TypeError("a binding this agent does not know")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex", broken)
    backend = _open_mig(tmp_path)  # whole GPUs are still there to enforce

    assert backend.mig_cards() == []
    assert [gpu.uuid for gpu in backend.gpus()] == [UUID_B, UUID_A]
    backend.close()


# -- a slice's utilisation from GPM ---------------------------------------------------------------------------


def _tick(fake: FakeNvml, busy_ms: dict[int, float], elapsed_ms: float = 1000.0) -> None:
    """Time passes on the card: each GPU instance is busy for the given part of it."""
    fake.gpm_clock_ms += elapsed_ms
    for gpu_instance, busy in busy_ms.items():
        fake.gpus[0].gpm_busy_ms[gpu_instance] = fake.gpus[0].gpm_busy_ms.get(gpu_instance, 0.0) + busy


def test_on_a_card_with_gpm_each_slice_reads_its_gpu_instances_utilisation_from_the_second_tick(mig_nvml, tmp_path):
    mig_nvml.gpus[0].gpm = True  # an H100: GPM samples each GPU instance
    backend = _open_mig(tmp_path)
    try:
        first = _by_uuid(backend)
        assert first[MIG_3G].utilization_pct is None and "utilization_pct" in first[MIG_3G].missing

        _tick(mig_nvml, {2: 620.0, 3: 0.0})
        second = _by_uuid(backend)
        assert second[MIG_3G].utilization_pct == 62
        assert "utilization_pct" not in second[MIG_3G].missing
        # The two compute instances of GPU instance 3 read their instance's figure.
        assert (second[MIG_1C_A].utilization_pct, second[MIG_1C_B].utilization_pct) == (0, 0)
        assert second[UUID_B].utilization_pct == 42  # a card without MIG still reads NVML's utilisation

        _tick(mig_nvml, {2: 100.0, 3: 250.0}, elapsed_ms=500.0)
        third = _by_uuid(backend)
        assert (third[MIG_3G].utilization_pct, third[MIG_1C_A].utilization_pct) == (20, 50)
        assert len(mig_nvml.gpm_samples) == 3  # one kept per slice; the older ones freed
    finally:
        backend.close()
    assert mig_nvml.gpm_samples == {}  # closing frees the rest


def test_a_destroyed_slices_gpm_sample_is_freed(mig_nvml, tmp_path):
    mig_nvml.gpus[0].gpm = True
    backend = _open_mig(tmp_path)
    try:
        backend.sample()
        del mig_nvml.gpus[0].mig_devices[0]  # nvidia-smi mig -dci / -dgi of the 3g.40gb
        backend.mig_cards()
        _tick(mig_nvml, {3: 1000.0})
        samples = _by_uuid(backend)
        assert MIG_3G not in samples and samples[MIG_1C_A].utilization_pct == 100
        assert len(mig_nvml.gpm_samples) == 2
    finally:
        backend.close()


def test_on_a_card_without_gpm_a_slices_utilisation_stays_missing(mig_nvml, tmp_path):
    backend = _open_mig(tmp_path)  # an A100: no GPM
    try:
        backend.sample()
        _tick(mig_nvml, {2: 500.0})
        sample = _by_uuid(backend)[MIG_3G]
    finally:
        backend.close()

    assert sample.utilization_pct is None and "utilization_pct" in sample.missing
    assert mig_nvml.gpm_samples == {}  # nothing was sampled


def test_a_failing_gpm_sample_costs_only_the_utilisation(mig_nvml, tmp_path):
    mig_nvml.gpus[0].gpm = True
    mig_nvml.gpus[0].failing["nvmlGpmMigSampleGet"] = pynvml.NVML_ERROR_GPU_IS_LOST
    backend = _open_mig(tmp_path)
    try:
        sample = _by_uuid(backend)[MIG_3G]
        assert sample.utilization_pct is None and "utilization_pct" in sample.missing
        assert sample.memory_used_mib == 1024 and sample.processes
        assert mig_nvml.gpm_samples == {}  # the failed sample was freed

        del mig_nvml.gpus[0].failing["nvmlGpmMigSampleGet"]
        backend.sample()
        _tick(mig_nvml, {2: 250.0})
        assert _by_uuid(backend)[MIG_3G].utilization_pct == 25
    finally:
        backend.close()
