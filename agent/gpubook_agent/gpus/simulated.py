"""The simulated backend: GPUs for the demo and the tests, on a machine that has none.

Each simulated GPU has a stand-in device file, a regular empty file ``<device_dir>/nvidia<minor>``,
which the agent guards with real POSIX ACLs exactly like a real one. Its processes are the real
processes that hold that file open, so "running a job" on a simulated GPU is opening its file
(``sleep 600 < <device_dir>/nvidia0``), and the agent sees, reports and ends such jobs as on a
real node. The telemetry numbers are made up from those processes, on the scale of the card the config
names (``SIMULATED_MODEL``, ``SIMULATED_MEMORY_MIB``, ``SIMULATED_POWER_W``; ``demo_agents`` writes them from
the portal's GPU rows), so a simulated A100 reads "x / 80.0 GB" like the inventory says.

Cards can be in MIG mode too (``SIMULATED_MIG=0:3g.40gb,2g.20gb,2g.20gb``: card index, then its slices'
profiles; several cards separated by ``;``). The layout is checked and placed by A100 rules
(``plan_card``), each slice gets a deterministic ``MIG-…`` UUID, stand-in capability files
``<caps_dir>/nvidia-cap<N>`` (root-only, like the device files) and a stand-in mig-minors file in the
driver's format, so a job on a slice is a process that opens the card's file and the slice's two
capability files, as CUDA does.

Each card has a power limit, ``SIMULATED_POWER_W`` until the agent sets another (``set_power_limit``, within a
quarter of it and all of it, as real cards allow), kept in memory as the driver keeps it; a card's simulated
power never exceeds its limit, so the idle power cap (power.py) shows in its readings.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpubook_agent import procfs
from gpubook_agent.gpus import mig
from gpubook_agent.gpus.base import BackendUnavailable, GpuInfo, GpuProcess, GpuSample, PowerLimitError, PowerLimits
from gpubook_agent.gpus.energy import PowerIntegral
from gpubook_agent.gpus.mig import MigCardInfo, MigSliceInfo

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
# The range a card's power limit may be set in, as a share of its default limit: real cards go down to about a
# quarter of it (an A100-SXM4: 100 of 400 W; an H100-SXM5: 200 of 700 W), and these none above it.
MIN_POWER_LIMIT_SHARE = 0.25

# The demo's stand-in device files live under <root>/<node>/dev: outside the checkout, whose parent folders
# may be private, so that the demo users' own jobs reach the files their ACLs open (demo_agents, demo_jobs).
DEMO_DEVICE_ROOT = "/var/tmp/gpubook-demo"  # noqa: S108 - made and checked by demo_agents (owner, mode, no link)

# Fixed forever: the portal's demo data and every agent must derive the same UUIDs.
UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "gpubook:simulated-gpu")


def simulated_uuid(node_name: str, index: int) -> str:
    """The UUID of simulated GPU ``index`` on ``node_name``; the portal's demo data calls this too,
    so the GPUs it books are the ones the simulated agent guards."""
    return f"GPU-{uuid.uuid5(UUID_NAMESPACE, f'{node_name}/{index}')}"


def simulated_mig_uuid(node_name: str, card_index: int, placement_start: int, profile: str) -> str:
    """The UUID of the slice of ``profile`` placed at ``placement_start`` on simulated card ``card_index``: the
    same slice keeps its UUID across restarts, and the portal's demo data can derive it too."""
    return f"MIG-{uuid.uuid5(UUID_NAMESPACE, f'{node_name}/{card_index}/mig/{placement_start}/{profile}')}"


# -- MIG layouts, by A100 rules ---------------------------------------------------------------------------

PLACEMENT_SLOTS = 8  # memory slices of a card
COMPUTE_SLICES = 7  # compute slices of a card
# Per profile "<N>g": the memory slices its GPU instance takes and the starts its placement may have.
MIG_GEOMETRY: dict[int, tuple[int, tuple[int, ...]]] = {
    1: (1, (0, 1, 2, 3, 4, 5, 6)),
    2: (2, (0, 2, 4)),
    3: (4, (0, 4)),
    4: (4, (0,)),
    7: (8, (0,)),
}
PROFILE_RE = re.compile(r"\A([0-9]+)g\.([0-9]+)gb\Z")
MAX_SIMULATED_CARDS = 32  # what mig-minors numbers (gpu0 to gpu31)
# The driver's numbering in mig-minors: per card 15 GPU instances, each with its access and 8 compute instances.
GPU_INSTANCES, COMPUTE_INSTANCES, FIRST_MINOR = 15, 8, 3


@dataclass(frozen=True)
class PlannedSlice:
    """One slice of a simulated card's layout: its profile and where it sits (memory slices)."""

    profile: str
    compute_slices: int
    placement_start: int
    placement_size: int
    gpu_instance_id: int


def parse_simulated_mig(text: str) -> dict[int, tuple[PlannedSlice, ...]]:
    """``SIMULATED_MIG`` (``0:3g.40gb,2g.20gb,2g.20gb;1:7g.80gb``): per card index, its slices placed on the
    card. ValueError, with a message that says what is wrong, for anything else."""
    layout: dict[int, tuple[PlannedSlice, ...]] = {}
    for part in (piece.strip() for piece in text.split(";")):
        if not part:
            continue
        index_text, sep, profiles_text = part.partition(":")
        index_text = index_text.strip()
        if not sep or not index_text.isascii() or not index_text.isdigit():
            raise ValueError(
                f"{part!r} is not '<card index>:<profile>,<profile>...' (e.g. 0:3g.40gb,2g.20gb,2g.20gb; "
                "several cards separated by ';')"
            )
        index = int(index_text)
        if index >= MAX_SIMULATED_CARDS:
            raise ValueError(f"card index {index} is out of range (0-{MAX_SIMULATED_CARDS - 1})")
        if index in layout:
            raise ValueError(f"card {index} is given twice")
        profiles = [name.strip() for name in profiles_text.split(",") if name.strip()]
        if not profiles:
            raise ValueError(f"card {index} has no slices: give at least one profile, e.g. {index}:7g.80gb")
        layout[index] = plan_card(index, profiles)
    return layout


def plan_card(index: int, profiles: Sequence[str]) -> tuple[PlannedSlice, ...]:
    """Place ``profiles`` on one card, in the order given, each at the first allowed start that is free (going
    back to move an earlier one when a later one would not fit otherwise): the layout ``nvidia-smi mig -cgi``
    could make. ValueError for an unknown profile or a layout no card can hold."""
    sizes = []
    for profile in profiles:
        match = PROFILE_RE.match(profile)
        if not match or int(match.group(1)) not in MIG_GEOMETRY or int(match.group(2)) < 1:
            raise ValueError(
                f"card {index}: unknown MIG profile {profile!r} (A100-style profiles are 1g, 2g, 3g, 4g and 7g "
                "with their memory, e.g. 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"
            )
        sizes.append(int(match.group(1)))
    compute = sum(sizes)
    if compute > COMPUTE_SLICES:
        raise ValueError(
            f"card {index}: {', '.join(profiles)} need {compute} compute slices and a card has {COMPUTE_SLICES}"
        )
    starts = _place(sizes, [], [False] * PLACEMENT_SLOTS)
    if starts is None:
        memory = sum(MIG_GEOMETRY[size][0] for size in sizes)
        raise ValueError(
            f"card {index}: {', '.join(profiles)} do not fit on a card of {PLACEMENT_SLOTS} memory slices "
            f"(they take {memory}; and each placement must start where the profile allows: 1g at 0-6, 2g at 0, 2 "
            "or 4, 3g at 0 or 4, 4g and 7g at 0)"
        )
    return tuple(
        PlannedSlice(
            profile=profile,
            compute_slices=size,
            placement_start=start,
            placement_size=MIG_GEOMETRY[size][0],
            gpu_instance_id=number + 1,
        )
        for number, (profile, size, start) in enumerate(zip(profiles, sizes, starts, strict=True))
    )


def _place(sizes: list[int], placed: list[int], taken: list[bool]) -> list[int] | None:
    """The starts for ``sizes`` (after ``placed``), first fit at each step, going back where one does not fit."""
    if len(placed) == len(sizes):
        return placed
    width, starts = MIG_GEOMETRY[sizes[len(placed)]]
    for start in starts:
        span = range(start, start + width)
        if any(taken[slot] for slot in span):
            continue
        for slot in span:
            taken[slot] = True
        found = _place(sizes, [*placed, start], taken)
        if found is not None:
            return found
        for slot in span:
            taken[slot] = False
    return None


def mig_minors_text(cards: int = MAX_SIMULATED_CARDS) -> str:
    """A mig-minors file as the driver writes it: every capability it could create, numbered as it numbers them."""
    lines = ["config 1", "monitor 2"]
    for card in range(cards):
        for gi in range(GPU_INSTANCES):
            base = FIRST_MINOR + (card * GPU_INSTANCES + gi) * (1 + COMPUTE_INSTANCES)
            lines.append(f"{mig.gpu_instance_capability(card, gi)} {base}")
            lines.extend(
                f"{mig.compute_instance_capability(card, gi, ci)} {base + 1 + ci}" for ci in range(COMPUTE_INSTANCES)
            )
    return "\n".join(lines) + "\n"


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
        mig_layout: str = "",
        caps_dir: str | None = None,
        mig_minors_file: str | None = None,
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
        self.power_w = power_w
        self.idle_w = power_w * IDLE_POWER_SHARE
        self.full_w = power_w * FULL_POWER_SHARE
        self._gpus = [
            GpuInfo(uuid=simulated_uuid(node_name, i), index=i, minor=i, name=model, memory_total_mib=memory_mib)
            for i in range(count)
        ]
        self._paths = {gpu.uuid: os.path.join(device_dir, f"nvidia{gpu.minor}") for gpu in self._gpus}
        _create_device_files(device_dir, self._paths.values())
        self._ticks = itertools.count()
        self._energy = PowerIntegral()  # the cards' energy counters: their simulated power over real time
        self._power_limits = {gpu.uuid: power_w for gpu in self._gpus}  # the driver's: from its "load", in memory
        self.node_name = node_name
        self.caps_dir = caps_dir or os.path.join(device_dir, "nvidia-caps")
        self.mig_minors_file = mig_minors_file or os.path.join(device_dir, "mig-minors")
        self._mig_plan = parse_simulated_mig(mig_layout)
        beyond = sorted(index for index in self._mig_plan if index >= count)
        if beyond:
            raise ValueError(f"SIMULATED_MIG names card {beyond[0]}, but the node has {count} (cards 0-{count - 1})")
        # (current, pending) per MIG card: on and staying on, until a test changes it (set_mig_mode).
        self._modes = {index: (True, True) for index in self._mig_plan}
        self._minors: dict[str, int] = {}
        if self._mig_plan:
            self._minors = self._create_mig_files()
        self._layout = self.mig_cards()

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def device_path(self, uuid: str) -> str:
        return self._paths[uuid]  # KeyError for a GPU this node does not have

    # -- MIG ---------------------------------------------------------------------------------------------

    def mig_cards(self) -> list[MigCardInfo]:
        cards = [self._mig_card(index, plan) for index, plan in sorted(self._mig_plan.items())]
        self._layout = cards
        return list(cards)

    def device_files(self, uuid: str) -> tuple[str, ...]:
        return mig.files_of(uuid, device_paths=self._paths, cards=self._layout)

    def set_mig_mode(self, uuid: str, *, current: bool, pending: bool) -> None:
        """Change a MIG card's mode, as ``nvidia-smi -mig`` and a GPU reset would (tests): with MIG off now the
        card lists no slices; their capability files stay, as real ones do."""
        index = next(gpu.index for gpu in self._gpus if gpu.uuid == uuid)
        if index not in self._modes:
            raise ValueError(f"simulated card {index} has no MIG layout (SIMULATED_MIG)")
        self._modes[index] = (current, pending)

    def _mig_card(self, index: int, plan: tuple[PlannedSlice, ...]) -> MigCardInfo:
        gpu = self._gpus[index]
        current, pending = self._modes[index]
        slices = tuple(
            MigSliceInfo(
                uuid=simulated_mig_uuid(self.node_name, index, item.placement_start, item.profile),
                card=gpu.uuid,
                profile=item.profile,
                gpu_instance_id=item.gpu_instance_id,
                compute_instance_id=0,
                placement_start=item.placement_start,
                placement_size=item.placement_size,
                compute_slices=item.compute_slices,
                memory_mib=self.memory_mib * item.placement_size // PLACEMENT_SLOTS,
                capability_files=mig.slice_capability_files(
                    self._minors,
                    self.caps_dir,
                    card_minor=gpu.minor,
                    gpu_instance_id=item.gpu_instance_id,
                    compute_instance_id=0,
                ),
            )
            for item in sorted(plan, key=lambda planned: planned.placement_start)  # as on the card, like NVML's
        )
        return MigCardInfo(
            uuid=gpu.uuid,
            minor=gpu.minor,
            mode_current=current,
            mode_pending=pending,
            placement_slots=PLACEMENT_SLOTS,
            compute_slices=COMPUTE_SLICES,
            slices=slices if current else (),
            capability_files=mig.card_capability_files(self._minors, self.caps_dir, gpu.minor),
        )

    def _create_mig_files(self) -> dict[str, int]:
        """The stand-in mig-minors file (rewritten: it is the "driver"'s) and the slices' capability files (made
        when missing, root-only, as the device files); the minors, read back as the agent reads the real file."""
        try:
            os.makedirs(os.path.dirname(self.mig_minors_file) or ".", exist_ok=True)
            fd = os.open(self.mig_minors_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o444)
            try:
                os.write(fd, mig_minors_text(max(len(self._gpus), 1)).encode())
                os.fchmod(fd, 0o444)  # as /proc shows it: anyone may read which minor is which
            finally:
                os.close(fd)
            minors = mig.read_mig_minors(self.mig_minors_file)
        except (OSError, mig.MigMinorsError) as error:
            raise BackendUnavailable(
                f"cannot write the simulated mig-minors file {self.mig_minors_file}: {error}"
            ) from error
        caps = [
            path
            for index, plan in self._mig_plan.items()
            for item in plan
            for path in mig.slice_capability_files(
                minors,
                self.caps_dir,
                card_minor=self._gpus[index].minor,
                gpu_instance_id=item.gpu_instance_id,
                compute_instance_id=0,
            )
        ]
        _create_device_files(self.caps_dir, caps)
        return minors

    # -- power limits ------------------------------------------------------------------------------------

    def power_limits(self, uuid: str) -> PowerLimits:
        current = self._power_limits[uuid]  # KeyError for a card this node does not have
        return PowerLimits(
            min_w=self.power_w * MIN_POWER_LIMIT_SHARE, max_w=self.power_w, default_w=self.power_w, current_w=current
        )

    def set_power_limit(self, uuid: str, watts: float) -> None:
        if uuid not in self._power_limits:
            raise KeyError(uuid)
        low = self.power_w * MIN_POWER_LIMIT_SHARE
        if not low <= watts <= self.power_w:  # as NVML: INVALID_ARGUMENT outside the card's range
            raise PowerLimitError(
                f"the power limit {watts:.0f} W is outside the card's range ({low:.0f}-{self.power_w:.0f} W)"
            )
        self._power_limits[uuid] = float(watts)

    # -- telemetry ---------------------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        """One /proc scan for all GPUs and slices: sampling stays cheap however many there are."""
        tick = next(self._ticks)
        slices = [item for card in self._layout for item in card.slices]
        holders = procfs.fd_holders([*self._paths.values(), *(f for item in slices for f in item.capability_files)])
        samples = [self._sample_one(gpu, sorted(holders.get(self._paths[gpu.uuid], ())), tick) for gpu in self._gpus]
        for number, item in enumerate(slices):
            pids = sorted({pid for path in item.capability_files for pid in holders.get(path, ())})
            samples.append(self._sample_slice(item, pids, number, tick))
        return samples

    def _sample_slice(self, item: MigSliceInfo, pids: list[int], number: int, tick: int) -> GpuSample:
        """A slice reads like NVML's MIG device: its own utilisation, memory and processes; temperature, power
        and ECC are the card's and NVML gives them only for the card."""
        memory = item.memory_mib or 0
        each = process_mib(memory, len(pids)) if memory > BASE_MIB else 0
        return GpuSample(
            uuid=item.uuid,
            utilization_pct=busy_utilization(len(pids), number, tick),
            memory_used_mib=min(memory, BASE_MIB + each * len(pids)) if memory else None,
            memory_total_mib=item.memory_mib,
            temperature_c=None,
            slowdown_temperature_c=None,
            power_w=None,
            ecc_errors_uncorrected=None,
            processes=tuple(GpuProcess(pid=pid, used_memory_mib=each) for pid in pids),
            missing=(
                "temperature_c",
                "slowdown_temperature_c",
                "power_w",
                "ecc_errors_uncorrected",
                "energy_mj",
                "power_limit_w",
            ),
        )

    def _sample_one(self, gpu: GpuInfo, pids: list[int], tick: int) -> GpuSample:
        utilization = busy_utilization(len(pids), gpu.index, tick)
        each = process_mib(self.memory_mib, len(pids))
        limit = self._power_limits[gpu.uuid]
        # A card draws no more than its limit: the driver lowers its clocks to stay under it.
        power = round(min(self.idle_w + (self.full_w - self.idle_w) * utilization / 100, limit), 1)
        return GpuSample(
            uuid=gpu.uuid,
            utilization_pct=utilization,
            memory_used_mib=BASE_MIB + each * len(pids),
            memory_total_mib=self.memory_mib,
            temperature_c=IDLE_C + (FULL_C - IDLE_C) * utilization // 100,
            slowdown_temperature_c=SLOWDOWN_C,
            power_w=power,
            ecc_errors_uncorrected=0,
            processes=tuple(GpuProcess(pid=pid, used_memory_mib=each) for pid in pids),
            missing=(),
            energy_mj=self._energy.add(gpu.uuid, power),  # the card's own counter, as NVML's: not estimated
            power_limit_w=limit,
        )

    def reset_energy(self, uuid: str) -> None:
        """Start a card's energy counter again from zero, as a driver reload does (tests, the demo)."""
        self._energy.reset(uuid)

    def close(self) -> None:
        """Nothing to release; the device files stay, with whatever ACLs they carry."""


def _create_device_files(device_dir: str, paths: Iterable[str]) -> None:
    """Create the missing stand-in files (device or capability files), 0660 so that only the ACLs the agent
    grants open them to users; existing ones are left as they are (they may carry ACLs already)."""
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
