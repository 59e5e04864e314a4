"""The simulated backend: GPUs for the demo and the tests, on a machine that has none.

Each simulated GPU has a stand-in device file, a regular empty file ``<device_dir>/nvidia<minor>``,
which the agent guards with real POSIX ACLs exactly like a real one. Its processes are the real
processes that hold that file open, so "running a job" on a simulated GPU is opening its file
(``sleep 600 < <device_dir>/nvidia0``), and the agent sees, reports and ends such jobs as on a
real node. The telemetry numbers are made up from those processes, on the scale of the card the config
names (``SIMULATED_MODEL``, ``SIMULATED_MEMORY_MIB``, ``SIMULATED_POWER_W``; ``demo_agents`` writes them from
the portal's GPU rows), so a simulated A100 reads "x / 80.0 GB" like the inventory says.
"""

from __future__ import annotations

import itertools
import os
import stat
import uuid
from collections.abc import Iterable

from gpubook_agent import procfs
from gpubook_agent.gpus.base import BackendUnavailable, GpuInfo, GpuProcess, GpuSample

# What a card is when the config does not say (every card of a node is the same model).
MODEL = "Simulated GPU"
MEMORY_TOTAL_MIB = 24576
POWER_LIMIT_W = 300.0
# The bounds the config accepts: beyond any card made, yet small enough for the portal's fields.
MAX_MEMORY_MIB = 4 * 1024 * 1024
MAX_POWER_W = 5000.0
MAX_MODEL_CHARS = 100  # Gpu.model in the portal

BASE_MIB = 4  # what an idle real GPU reports in use
PROCESS_SHARE = 0.4  # of the card's memory that each process holding the device file "uses"
IDLE_C, FULL_C, SLOWDOWN_C = 30, 75, 90
# Power as a share of the card's limit: real cards idle at 10-20 % of it (an A100-SXM4 at ~60 of 400 W)
# and run near, not at, the limit under a full load.
IDLE_POWER_SHARE, FULL_POWER_SHARE = 0.15, 0.9

# The demo's stand-in device files live under <root>/<node>/dev: outside the checkout, whose parent folders
# may be private, so that the demo users' own jobs reach the files their ACLs open (demo_agents, demo_jobs).
DEMO_DEVICE_ROOT = "/var/tmp/gpubook-demo"  # noqa: S108 - made and checked by demo_agents (owner, mode, no link)

# Fixed forever: the portal's demo data and every agent must derive the same UUIDs.
UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "gpubook:simulated-gpu")


def simulated_uuid(node_name: str, index: int) -> str:
    """The UUID of simulated GPU ``index`` on ``node_name``; the portal's demo data calls this too,
    so the GPUs it books are the ones the simulated agent guards."""
    return f"GPU-{uuid.uuid5(UUID_NAMESPACE, f'{node_name}/{index}')}"


def demo_device_dir(root: str, node_name: str) -> str:
    """Where the demo puts ``node_name``'s stand-in device files under ``root``."""
    return os.path.join(root, node_name, "dev")


def closed_to_others(path: str) -> tuple[str, OSError | None, int] | None:
    """The first folder from ``path`` up to / that other users cannot pass through (its stat error, or its
    mode), or None when all let them: the demo users' jobs must reach their stand-in files."""
    folder = path
    while True:
        try:
            mode = os.stat(folder).st_mode
        except OSError as error:
            return folder, error, 0
        if not mode & stat.S_IXOTH:
            return folder, None, mode
        if folder == os.path.dirname(folder):
            return None
        folder = os.path.dirname(folder)


def busy_utilization(processes: int, index: int, tick: int) -> int:
    """0 when idle, else 60-100 %: more processes, busier, with a little deterministic wobble."""
    if processes == 0:
        return 0
    wobble = (tick * 7 + index * 13) % 21
    return min(100, 60 + 10 * processes + wobble)


def process_mib(memory_total_mib: int, processes: int) -> int:
    """What each of ``processes`` holders "uses": a share of the card, all of them fitting on it."""
    if processes == 0:
        return 0
    return min(int(memory_total_mib * PROCESS_SHARE), (memory_total_mib - BASE_MIB) // processes)


class SimulatedBackend:
    name = "simulated"

    def __init__(
        self,
        *,
        device_dir: str,
        node_name: str,
        count: int,
        model: str = MODEL,
        memory_mib: int = MEMORY_TOTAL_MIB,
        power_w: float = POWER_LIMIT_W,
    ) -> None:
        if count < 1:
            raise ValueError(f"a simulated node needs at least one GPU, not {count}")
        if not BASE_MIB < memory_mib <= MAX_MEMORY_MIB:
            raise ValueError(f"a simulated GPU's memory must be {BASE_MIB + 1}-{MAX_MEMORY_MIB} MiB, not {memory_mib}")
        if not 0 < power_w <= MAX_POWER_W:
            raise ValueError(f"a simulated GPU's power limit must be 0-{MAX_POWER_W:.0f} W, not {power_w}")
        self.driver_version: str | None = "simulated"
        self.device_dir = device_dir
        self.memory_mib = memory_mib
        self.idle_w = power_w * IDLE_POWER_SHARE
        self.full_w = power_w * FULL_POWER_SHARE
        self._gpus = [
            GpuInfo(uuid=simulated_uuid(node_name, i), index=i, minor=i, name=model, memory_total_mib=memory_mib)
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
        each = process_mib(self.memory_mib, len(pids))
        return GpuSample(
            uuid=gpu.uuid,
            utilization_pct=utilization,
            memory_used_mib=BASE_MIB + each * len(pids),
            memory_total_mib=self.memory_mib,
            temperature_c=IDLE_C + (FULL_C - IDLE_C) * utilization // 100,
            slowdown_temperature_c=SLOWDOWN_C,
            power_w=round(self.idle_w + (self.full_w - self.idle_w) * utilization / 100, 1),
            ecc_errors_uncorrected=0,
            processes=tuple(GpuProcess(pid=pid, used_memory_mib=each) for pid in pids),
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
