"""The GPUs of this node, behind one small interface: NVML on real servers, simulated elsewhere.

The rest of the agent sees only ``GpuBackend``: which GPUs exist (by UUID, the identity the
portal books), which device file grants access to each, and a telemetry sample. GPUs are never
identified by enumeration order, which changes with ``CUDA_VISIBLE_DEVICES``, reboots and
hardware swaps; the device file comes from the minor number the driver reports.

Backends are imported only when opened, so ``pynvml`` is loaded by the NVML backend alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

BACKENDS = ("nvml", "simulated")


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
    """One telemetry reading. A measurement the card or driver did not give is None and named in ``missing``,
    so the portal can tell "not supported" from zero."""

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

    def as_dict(self) -> dict[str, Any]:
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
        }


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

    def sample(self) -> list[GpuSample]:
        """One telemetry sample per GPU, in the order of ``gpus()``."""
        ...

    def close(self) -> None: ...


def open_configured_backend(config: Any) -> GpuBackend:
    """The backend an AgentConfig names (nodes/agent/config.py), opened."""
    return open_backend(
        config.backend,
        device_dir=config.device_dir,
        node_name=config.node_name,
        simulated_gpus=config.simulated_gpus,
        simulated={
            "model": config.simulated_model,
            "memory_mib": config.simulated_memory_mib,
            "power_w": config.simulated_power_w,
        },
    )


def open_backend(
    kind: str,
    *,
    device_dir: str,
    node_name: str,
    simulated_gpus: int = 4,
    simulated: dict[str, Any] | None = None,
) -> GpuBackend:
    """Open the backend the agent's config names; BackendUnavailable when it cannot run here. ``simulated``:
    the simulated cards' ``model``, ``memory_mib`` and ``power_w`` (each optional)."""
    if kind == "nvml":
        from nodes.agent.gpus.nvml import NvmlBackend

        return NvmlBackend(device_dir=device_dir)
    if kind == "simulated":
        from nodes.agent.gpus.simulated import SimulatedBackend

        return SimulatedBackend(device_dir=device_dir, node_name=node_name, count=simulated_gpus, **(simulated or {}))
    raise ValueError(f"GPU backend must be one of {', '.join(BACKENDS)}, not {kind!r}")
