"""The NVML backend against pynvml's documented behaviour, faked at the pynvml boundary.

The fakes return what pynvml returns (its ctypes structs and friendly objects, str or bytes) and
raise what it raises (``NVMLError(code)``, which pynvml maps to ``NVMLError_<Name>``), and check the
arguments the real library would refuse, so the backend is tested on the exact calls it makes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from gpubook_agent.gpus import BackendUnavailable, GpuBackend, GpuProcess, open_backend

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
    ecc: int = 0
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    failing: dict[str, int] = field(default_factory=dict)  # pynvml function name -> NVML error code


class FakeNvml:
    """The pynvml functions the backend calls, over GPUs listed in enumeration order."""

    def __init__(self, gpus: list[FakeGpu], driver: str | bytes = "550.54.15") -> None:
        self.gpus = gpus
        self.driver = driver
        self.init_calls = 0
        self.shutdown_calls = 0
        self.init_error: int | None = None
        self.failing: dict[str, int] = {}  # for the functions that take no handle

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


def test_without_a_gpu_driver_the_nvml_backend_is_unavailable(tmp_path):
    """No fakes: on a machine without an NVIDIA driver (CI, laptops) this is what a person sees."""
    try:
        backend = open_backend("nvml", device_dir=str(tmp_path), node_name="gpu-a100")
    except BackendUnavailable as error:
        assert "simulated" in str(error)
    else:
        backend.close()
        pytest.skip("NVML is available on this machine")
