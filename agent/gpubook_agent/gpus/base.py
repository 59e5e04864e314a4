"""The interface every GPU backend implements (``GpuBackend``) and what it reads: the GPUs' static facts,
their MIG layout (mig.py) and their telemetry samples. The backends (nvml.py, simulated.py) import this,
and gpus/__init__.py opens them and passes these names on to the rest of the agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gpubook_agent.gpus.mig import MigCardInfo
from gpubook_agent.protocol import GpuReading


@dataclass(frozen=True)
class GpuInfo:
    """Static facts about one GPU, read once when the backend opens."""

    uuid: str
    index: int  # informational only: enumeration order is never used for mapping
    minor: int  # the device file is <device_dir>/nvidia<minor>
    name: str
    memory_total_mib: int | None


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_mib: int | None  # None when the driver does not say


@dataclass(frozen=True)
class GpuSample:
    """One telemetry reading of a card or a MIG slice (``uuid`` "MIG-…"). A measurement the card or driver did
    not give is None and named in ``missing``, so the portal can tell "not supported" from zero."""

    uuid: str
    utilization_pct: int | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: int | None
    slowdown_temperature_c: int | None
    power_w: float | None
    ecc_errors_uncorrected: int | None
    processes: tuple[GpuProcess, ...]
    missing: tuple[str, ...]
    # The card's energy counter (mJ; grows until a reset: gpus/energy.py); ``energy_estimated`` when it is the
    # power readings added up because the card has no counter. None on a MIG slice: NVML counts per card.
    energy_mj: int | None = None
    energy_estimated: bool = False
    # The card's power limit now (W): what the idle power cap (power.py) lowers. None on a MIG slice.
    power_limit_w: float | None = None

    def as_dict(self) -> GpuReading:
        """JSON-ready, as reported to the portal (lists, not tuples)."""
        return {
            "uuid": self.uuid,
            "utilization_pct": self.utilization_pct,
            "memory_used_mib": self.memory_used_mib,
            "memory_total_mib": self.memory_total_mib,
            "temperature_c": self.temperature_c,
            "slowdown_temperature_c": self.slowdown_temperature_c,
            "power_w": self.power_w,
            "ecc_errors_uncorrected": self.ecc_errors_uncorrected,
            "processes": [{"pid": p.pid, "used_memory_mib": p.used_memory_mib} for p in self.processes],
            "missing": list(self.missing),
            "energy_mj": self.energy_mj,
            "energy_estimated": self.energy_estimated,
            "power_limit_w": self.power_limit_w,
        }


@dataclass(frozen=True)
class PowerLimits:
    """A card's power limits, in watts: the range the card accepts for its limit, the limit it starts with (after
    a driver load), and the one in force now."""

    min_w: float
    max_w: float
    default_w: float
    current_w: float


class PowerLimitError(Exception):
    """A card's power limit could not be read or changed (not supported on the card, not root, the GPU lost);
    the message says which, for the node's event."""


class BackendUnavailable(Exception):
    """The backend cannot run on this machine; the message says what failed and what to do."""


@runtime_checkable
class GpuBackend(Protocol):
    name: str  # "nvml" or "simulated"
    driver_version: str | None

    def gpus(self) -> list[GpuInfo]:
        """All GPUs, read once and cached, in a stable order."""
        ...

    def device_path(self, uuid: str) -> str:
        """``<device_dir>/nvidia<minor>`` for this GPU; KeyError for a UUID this node does not have."""
        ...

    def mig_cards(self) -> list[MigCardInfo]:
        """The cards that support MIG, read now: each one's mode (current and pending) and the slices it has,
        with their capability files. Empty on a node without such cards. Slices come and go while the agent
        runs (``nvidia-smi mig -cgi``/``-dgi``), so the caller reads this again rather than keeping it."""
        ...

    def device_files(self, uuid: str) -> tuple[str, ...]:
        """The files that open ``uuid``, a card or a MIG slice, as of the last ``mig_cards()`` (mig.files_of):
        a card's device file (in MIG mode with every slice's capability files); a slice's card's device file
        and its own capability files. KeyError for a UUID this node does not have."""
        ...

    def sample(self) -> list[GpuSample]:
        """One telemetry sample per GPU, in the order of ``gpus()``, then one per MIG slice."""
        ...

    def power_limits(self, uuid: str) -> PowerLimits:
        """A card's power limits, read now; PowerLimitError when the card or driver cannot say (KeyError for a
        UUID that is not one of this node's cards)."""
        ...

    def set_power_limit(self, uuid: str, watts: float) -> None:
        """Set a card's power limit (within its ``power_limits`` range); PowerLimitError when refused."""
        ...

    def close(self) -> None: ...
