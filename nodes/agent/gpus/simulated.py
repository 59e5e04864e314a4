"""The simulated backend: GPUs for the demo and the tests, on a machine that has none.

Each simulated GPU has a stand-in device file, a regular empty file ``<device_dir>/nvidia<minor>``,
which the agent guards with real POSIX ACLs exactly like a real one. Its processes are the real
processes that hold that file open, so "running a job" on a simulated GPU is opening its file
(``sleep 600 < <device_dir>/nvidia0``), and the agent sees, reports and ends such jobs as on a
real node. The telemetry numbers are made up from those processes.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterable

from nodes.agent import procfs
from nodes.agent.gpus import BackendUnavailable, GpuInfo, GpuProcess, GpuSample

MODEL = "Simulated GPU"
MEMORY_TOTAL_MIB = 24576
PROCESS_MIB = 1024  # what each process holding the device file "uses"
BASE_MIB = 4  # what an idle real GPU reports in use
IDLE_C, FULL_C, SLOWDOWN_C = 30, 75, 90
IDLE_W, FULL_W = 60.0, 300.0

# Fixed forever: the portal's demo data and every agent must derive the same UUIDs.
UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "gpubook:simulated-gpu")


def simulated_uuid(node_name: str, index: int) -> str:
    """The UUID of simulated GPU ``index`` on ``node_name``; the portal's demo data calls this too,
    so the GPUs it books are the ones the simulated agent guards."""
    return f"GPU-{uuid.uuid5(UUID_NAMESPACE, f'{node_name}/{index}')}"


def busy_utilization(processes: int, index: int, tick: int) -> int:
    """0 when idle, else 60-100 %: more processes, busier, with a little deterministic wobble."""
    if processes == 0:
        return 0
    wobble = (tick * 7 + index * 13) % 21
    return min(100, 60 + 10 * processes + wobble)


class SimulatedBackend:
    name = "simulated"

    def __init__(self, *, device_dir: str, node_name: str, count: int) -> None:
        if count < 1:
            raise ValueError(f"a simulated node needs at least one GPU, not {count}")
        self.driver_version: str | None = "simulated"
        self.device_dir = device_dir
        self._gpus = [
            GpuInfo(uuid=simulated_uuid(node_name, i), index=i, minor=i, name=MODEL, memory_total_mib=MEMORY_TOTAL_MIB)
            for i in range(count)
        ]
        self._paths = {gpu.uuid: os.path.join(device_dir, f"nvidia{gpu.minor}") for gpu in self._gpus}
        _create_device_files(device_dir, self._paths.values())
        self._ticks = itertools.count()

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def device_path(self, uuid: str) -> str:
        return self._paths[uuid]  # KeyError for a GPU this node does not have

    def sample(self) -> list[GpuSample]:
        """One /proc scan for all GPUs: sampling stays cheap however many there are."""
        tick = next(self._ticks)
        holders = procfs.fd_holders(self._paths.values())
        return [self._sample_one(gpu, sorted(holders.get(self._paths[gpu.uuid], ())), tick) for gpu in self._gpus]

    def _sample_one(self, gpu: GpuInfo, pids: list[int], tick: int) -> GpuSample:
        utilization = busy_utilization(len(pids), gpu.index, tick)
        return GpuSample(
            uuid=gpu.uuid,
            utilization_pct=utilization,
            memory_used_mib=min(MEMORY_TOTAL_MIB, BASE_MIB + PROCESS_MIB * len(pids)),
            memory_total_mib=MEMORY_TOTAL_MIB,
            temperature_c=IDLE_C + (FULL_C - IDLE_C) * utilization // 100,
            slowdown_temperature_c=SLOWDOWN_C,
            power_w=round(IDLE_W + (FULL_W - IDLE_W) * utilization / 100, 1),
            ecc_errors_uncorrected=0,
            processes=tuple(GpuProcess(pid=pid, used_memory_mib=PROCESS_MIB) for pid in pids),
            missing=(),
        )

    def close(self) -> None:
        """Nothing to release; the device files stay, with whatever ACLs they carry."""


def _create_device_files(device_dir: str, paths: Iterable[str]) -> None:
    """Create the missing stand-in files, 0660 so that only the ACLs the agent grants open them to users;
    existing ones are left as they are (they may carry ACLs already)."""
    try:
        if not os.path.isdir(device_dir):
            os.makedirs(device_dir, mode=0o755, exist_ok=True)
            # makedirs' mode is filtered by the umask; users must reach the files their ACLs grant.
            os.chmod(device_dir, 0o755)  # noqa: S103
        for path in paths:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o660)  # never follows a symlink
            except FileExistsError:
                continue
            os.close(fd)
            os.chmod(path, 0o660)
    except OSError as error:
        raise BackendUnavailable(f"cannot create the simulated GPU device files in {device_dir}: {error}") from error
