"""The GPUs of this node, behind one small interface: NVML on real servers, simulated elsewhere.

The rest of the agent sees only ``GpuBackend``: which GPUs exist (by UUID, the identity the
portal books), which device file grants access to each, the MIG slices of cards in MIG mode and
the files that open each slice (mig.py), a telemetry sample, and each card's power limits (the idle
power cap, power.py, reads and sets them). GPUs are never
identified by enumeration order, which changes with ``CUDA_VISIBLE_DEVICES``, reboots and
hardware swaps; the device file comes from the minor number the driver reports.

Backends are imported only when opened, so ``pynvml`` is loaded by the NVML backend alone.
"""

from __future__ import annotations

from typing import Any, Protocol

from gpubook_agent.gpus.base import (
    BackendUnavailable,
    GpuBackend,
    GpuInfo,
    GpuProcess,
    GpuSample,
    PowerLimitError,
    PowerLimits,
)
from gpubook_agent.gpus.mig import CAPS_DIR, MIG_MINORS_FILE, MigCardInfo, MigSliceInfo
from gpubook_agent.protocol import BACKENDS

__all__ = [
    "BackendSettings",
    "BackendUnavailable",
    "GpuBackend",
    "GpuInfo",
    "GpuProcess",
    "GpuSample",
    "MigCardInfo",
    "MigSliceInfo",
    "PowerLimitError",
    "PowerLimits",
    "open_backend",
    "open_configured_backend",
]


class BackendSettings(Protocol):
    """What opening the configured backend reads from the agent's config (an AgentConfig, config.py, which
    imports this package for the simulated cards' defaults: named by shape here, not imported)."""

    @property
    def backend(self) -> str: ...
    @property
    def device_dir(self) -> str: ...
    @property
    def node_name(self) -> str: ...
    @property
    def simulated_gpus(self) -> int: ...
    @property
    def simulated_model(self) -> str: ...
    @property
    def simulated_memory_mib(self) -> int: ...
    @property
    def simulated_power_w(self) -> float: ...
    @property
    def simulated_mig(self) -> str: ...
    @property
    def mig_caps_dir(self) -> str: ...
    @property
    def mig_minors_file(self) -> str: ...


def open_configured_backend(config: BackendSettings) -> GpuBackend:
    """The backend an AgentConfig names (gpubook_agent/config.py), opened."""
    return open_backend(
        config.backend,
        device_dir=config.device_dir,
        node_name=config.node_name,
        simulated_gpus=config.simulated_gpus,
        simulated={
            "model": config.simulated_model,
            "memory_mib": config.simulated_memory_mib,
            "power_w": config.simulated_power_w,
            "mig_layout": config.simulated_mig,
        },
        caps_dir=config.mig_caps_dir,
        mig_minors_file=config.mig_minors_file,
    )


def open_backend(
    kind: str,
    *,
    device_dir: str,
    node_name: str,
    simulated_gpus: int = 4,
    simulated: dict[str, Any] | None = None,
    caps_dir: str | None = None,
    mig_minors_file: str | None = None,
) -> GpuBackend:
    """Open the backend the agent's config names; BackendUnavailable when it cannot run here. ``simulated``:
    the simulated cards' ``model``, ``memory_mib``, ``power_w`` and ``mig_layout`` (SIMULATED_MIG; each
    optional). ``caps_dir`` and ``mig_minors_file``: where MIG capability files and their minors are (the
    driver's places for NVML; stand-ins under ``device_dir`` for the simulated backend, when not given)."""
    if kind == "nvml":
        from gpubook_agent.gpus.nvml import NvmlBackend

        return NvmlBackend(
            device_dir=device_dir, caps_dir=caps_dir or CAPS_DIR, mig_minors_file=mig_minors_file or MIG_MINORS_FILE
        )
    if kind == "simulated":
        from gpubook_agent.gpus.simulated import SimulatedBackend

        return SimulatedBackend(
            device_dir=device_dir,
            node_name=node_name,
            count=simulated_gpus,
            caps_dir=caps_dir,
            mig_minors_file=mig_minors_file,
            **(simulated or {}),
        )
    raise ValueError(f"GPU backend must be one of {', '.join(BACKENDS)}, not {kind!r}")
