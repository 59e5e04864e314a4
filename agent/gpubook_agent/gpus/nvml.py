"""The NVML backend: real NVIDIA GPUs through ``pynvml`` (package nvidia-ml-py).

NVML starts once per backend and the device handles are found once, keyed by UUID; the device
file of each GPU comes from its minor number, never from its enumeration index. Telemetry reads
each measurement on its own, so a card that does not support one (power, ECC...) still reports
the rest, and the missing ones are named.

Cards in MIG mode also list their slices (``mig_cards``), enumerated as NVML documents it: the MIG
device handles under each card by index up to ``nvmlDeviceGetMaxMigDeviceCount`` (an index without a
compute instance answers NOT_FOUND: the index space has holes), each with its GPU- and compute-instance
ids, its GPU instance's placement and profile, and the capability files mig-minors numbers for them. The
layout is read again on every call: instances are created and destroyed while the agent runs, and NVML
hands a destroyed instance's handle to new ones. Telemetry samples each slice on its own handle too, and
its utilisation, which NVML gives no MIG device, from GPM where the card has it (gpm.py).

Power limits (the idle power cap, power.py) are NVML's power management limits, in milliwatts: the range
(``nvmlDeviceGetPowerManagementLimitConstraints``), the default (``...DefaultLimit``), the one in force
(``...Limit``), and ``nvmlDeviceSetPowerManagementLimit``, which needs root and lasts until the driver unloads.

This module and gpm.py are the only ones in the agent that import pynvml.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pynvml

from gpubook_agent.gpus import mig
from gpubook_agent.gpus.base import BackendUnavailable, GpuInfo, GpuProcess, GpuSample, PowerLimitError, PowerLimits
from gpubook_agent.gpus.energy import PowerIntegral
from gpubook_agent.gpus.gpm import GpmMeter
from gpubook_agent.gpus.mig import MigCardInfo, MigSliceInfo

log = logging.getLogger(__name__)

T = TypeVar("T")

MIB = 1024 * 1024
# pynvml >= 11 turns "not available" into None; older releases pass the raw marker through.
NOT_AVAILABLE = 2**64 - 1
# Unversioned process listings raise NVMLLibraryMismatchError (not an NVMLError) on an old driver.
NVML_ERRORS: tuple[type[Exception], ...] = (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError)
SIMULATED_HINT = "On a machine without NVIDIA GPUs, set BACKEND=simulated in the agent config (GPUBOOK_BACKEND)."
# What every MIG card made so far has (A100, H100, H200), for a card whose profiles NVML does not give.
PLACEMENT_SLOTS, COMPUTE_SLICES = 8, 7
MAX_PLACEMENTS = 32  # far above the possible placements of any one profile (7 for 1g on an A100)


@dataclass(frozen=True)
class GpuInstanceProfile:
    """What NVML says about one GPU-instance profile of a card (nvmlDeviceGetGpuInstanceProfileInfo)."""

    profile_id: int
    name: str  # "3g.40gb"
    compute_slices: int
    memory_mib: int


def _text(value: str | bytes) -> str:
    """pynvml returns str in recent releases and bytes in some older ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _power_error(error: Exception) -> str:
    """What a power-limit call's failure means, for the node's event."""
    if isinstance(error, pynvml.NVMLError_NotSupported):
        return "the card does not support power limits (NOT_SUPPORTED)"
    if isinstance(error, pynvml.NVMLError_NoPermission):
        return "changing a power limit needs root (NO_PERMISSION)"
    if isinstance(error, pynvml.NVMLError_InvalidArgument):
        return "outside the card's range (INVALID_ARGUMENT)"
    return f"{type(error).__name__}: {error}"


def _mib(num_bytes: int | None) -> int | None:
    if num_bytes is None or num_bytes == NOT_AVAILABLE:
        return None
    return int(num_bytes) // MIB


class NvmlBackend:
    name = "nvml"

    def __init__(
        self, *, device_dir: str, caps_dir: str = mig.CAPS_DIR, mig_minors_file: str = mig.MIG_MINORS_FILE
    ) -> None:
        self.device_dir = device_dir
        self.caps_dir = caps_dir
        self.mig_minors_file = mig_minors_file
        self._minors: dict[str, int] | None = None
        self._profiles: dict[str, tuple[int, int, dict[int, GpuInstanceProfile]]] = {}
        # The last layout read and its slices' handles: mig_cards() runs on the enforcer's thread, sample() on
        # the reporter's; each replaces or reads both together.
        self._layout_lock = threading.Lock()
        self._layout: list[MigCardInfo] = []
        self._slice_handles: dict[str, Any] = {}
        self._gpm = GpmMeter()
        self._power_integral = PowerIntegral()  # for cards without an energy counter
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
            self._paths = {gpu.uuid: os.path.join(self.device_dir, f"nvidia{gpu.minor}") for gpu in self._gpus}
            self.mig_cards()
        except BaseException:
            self.close()
            raise

    # -- static facts -------------------------------------------------------------------------

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def device_path(self, uuid: str) -> str:
        return self._paths[uuid]  # KeyError for a GPU this node does not have

    def device_files(self, uuid: str) -> tuple[str, ...]:
        with self._layout_lock:
            cards = list(self._layout)
        return mig.files_of(uuid, device_paths=self._paths, cards=cards)

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

    # -- MIG -------------------------------------------------------------------------------------------------

    def mig_cards(self) -> list[MigCardInfo]:
        """Read now; cards whose MIG state NVML cannot give are left out, and logged once each."""
        minors = self._mig_minors()
        cards: list[MigCardInfo] = []
        handles: dict[str, Any] = {}
        for gpu in self._gpus:
            try:
                card = self._mig_card(gpu, minors, handles)
            except Exception:  # a binding or driver this agent does not know: whole GPUs are still enforced
                if (gpu.uuid, "MIG") not in self._warned:
                    self._warned.add((gpu.uuid, "MIG"))
                    log.exception("GPU %s: reading its MIG state failed; taken as a card without MIG", gpu.uuid)
                continue
            if card is not None:
                cards.append(card)
        with self._layout_lock:
            self._layout, self._slice_handles = cards, handles
        return list(cards)

    def _mig_minors(self) -> dict[str, int]:
        """The capability minors, read once: the driver fixes them for every capability it could ever create.
        Missing (no MIG-capable driver, or /proc not mounted) reads as none, and is tried again next time."""
        if self._minors is not None:
            return self._minors
        try:
            self._minors = mig.read_mig_minors(self.mig_minors_file)
        except FileNotFoundError:
            return {}
        except (OSError, mig.MigMinorsError) as error:
            self._note_failure("node", "mig-minors", error)
            return {}
        return self._minors

    def _mig_card(self, gpu: GpuInfo, minors: dict[str, int], handles: dict[str, Any]) -> MigCardInfo | None:
        """The card's MIG state, or None for a card without MIG (NVML answers NOT_SUPPORTED)."""
        handle = self._handles[gpu.uuid]
        try:
            current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError as error:
            self._note_failure(gpu.uuid, "MIG mode", error)
            return None
        mode_current = int(current) == pynvml.NVML_DEVICE_MIG_ENABLE
        slots, compute, profiles = self._card_profiles(gpu.uuid, handle)
        slices = self._mig_slices(gpu, handle, minors, profiles, handles) if mode_current else ()
        return MigCardInfo(
            uuid=gpu.uuid,
            minor=gpu.minor,
            mode_current=mode_current,
            mode_pending=int(pending) == pynvml.NVML_DEVICE_MIG_ENABLE,
            placement_slots=slots,
            compute_slices=compute,
            slices=slices,
            capability_files=mig.card_capability_files(minors, self.caps_dir, gpu.minor),
        )

    def _card_profiles(self, uuid: str, handle: Any) -> tuple[int, int, dict[int, GpuInstanceProfile]]:
        """The card's memory and compute slices and its GPU-instance profiles by id, read once per card (a
        card's profiles never change). The card's size is its largest profile's: compute slices from its
        profile, memory slices from where its one possible placement ends."""
        known = self._profiles.get(uuid)
        if known is not None:
            return known
        profiles: dict[int, GpuInstanceProfile] = {}
        for number in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, number)
            except pynvml.NVMLError:  # a profile this card does not have (NOT_SUPPORTED, INVALID_ARGUMENT)
                continue
            profiles[int(info.id)] = GpuInstanceProfile(
                profile_id=int(info.id),
                name=_text(info.name).removeprefix("MIG").strip(),
                compute_slices=int(info.sliceCount),
                memory_mib=int(info.memorySizeMB),
            )
        if not profiles:  # not cached: NVML may answer once MIG is on
            return PLACEMENT_SLOTS, COMPUTE_SLICES, {}
        largest = max(profiles.values(), key=lambda profile: profile.compute_slices)
        slots = self._placement_end(uuid, handle, largest.profile_id) or PLACEMENT_SLOTS
        known = (slots, largest.compute_slices, profiles)
        self._profiles[uuid] = known
        return known

    def _placement_end(self, uuid: str, handle: Any, profile_id: int) -> int | None:
        placements = (pynvml.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
        count = ctypes.c_uint(MAX_PLACEMENTS)
        try:
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, placements, ctypes.byref(count))
        except pynvml.NVMLError as error:
            self._note_failure(uuid, "MIG placements", error)
            return None
        ends = [int(placements[i].start) + int(placements[i].size) for i in range(min(count.value, MAX_PLACEMENTS))]
        return max(ends, default=None)

    def _mig_slices(
        self,
        gpu: GpuInfo,
        handle: Any,
        minors: dict[str, int],
        profiles: dict[int, GpuInstanceProfile],
        handles: dict[str, Any],
    ) -> tuple[MigSliceInfo, ...]:
        try:
            count = int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))
        except pynvml.NVMLError as error:
            self._note_failure(gpu.uuid, "MIG device count", error)
            return ()
        found: list[MigSliceInfo] = []
        for index in range(count):
            try:
                mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except pynvml.NVMLError_NotFound:
                continue  # no compute instance at this index: indices stay put when others are destroyed
            except pynvml.NVMLError as error:
                self._note_failure(gpu.uuid, f"MIG device {index}", error)
                continue
            found_slice = self._mig_slice(gpu, handle, mig_handle, index, minors, profiles)
            if found_slice is not None and found_slice.uuid not in handles:
                found.append(found_slice)
                handles[found_slice.uuid] = mig_handle
        found.sort(key=lambda item: (item.placement_start, item.gpu_instance_id, item.compute_instance_id))
        return tuple(found)

    def _mig_slice(
        self,
        gpu: GpuInfo,
        handle: Any,
        mig_handle: Any,
        index: int,
        minors: dict[str, int],
        profiles: dict[int, GpuInstanceProfile],
    ) -> MigSliceInfo | None:
        """One MIG device; None (logged once) when NVML cannot say who it is or where it sits: a slice that
        cannot be placed on its card cannot be booked without double-booking its memory."""
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(mig_handle))
            gpu_instance_id = int(pynvml.nvmlDeviceGetGpuInstanceId(mig_handle))
            compute_instance_id = int(pynvml.nvmlDeviceGetComputeInstanceId(mig_handle))
            gpu_instance = pynvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            info = pynvml.nvmlGpuInstanceGetInfo(gpu_instance)
        except pynvml.NVMLError as error:
            self._note_failure(gpu.uuid, f"MIG device {index}", error)
            return None
        profile = profiles.get(int(info.profileId))
        try:
            attributes = pynvml.nvmlDeviceGetAttributes(mig_handle)
            gi_slices: int | None = int(attributes.gpuInstanceSliceCount)
            ci_slices: int | None = int(attributes.computeInstanceSliceCount)
            memory: int | None = int(attributes.memorySizeMB)
        except pynvml.NVMLError as error:
            self._note_failure(uuid, "MIG attributes", error)
            gi_slices = ci_slices = profile.compute_slices if profile else None
            memory = profile.memory_mib if profile else None
        compute_slices = ci_slices or gi_slices
        if not compute_slices:  # neither its attributes nor its profile: its share of the card is unknown
            self._note_failure(uuid, "MIG slice size", pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
            return None
        if profile is not None:
            name = profile.name
        elif gi_slices and memory:
            name = f"{gi_slices}g.{round(memory / 1024)}gb"  # how nvidia-smi names profiles
        else:
            name = "unknown"
        if ci_slices and gi_slices and ci_slices < gi_slices:
            name = f"{ci_slices}c.{name}"  # a compute instance on part of its GPU instance, as nvidia-smi says
        return MigSliceInfo(
            uuid=uuid,
            card=gpu.uuid,
            profile=name,
            gpu_instance_id=gpu_instance_id,
            compute_instance_id=compute_instance_id,
            placement_start=int(info.placement.start),
            placement_size=int(info.placement.size),
            compute_slices=compute_slices,
            memory_mib=memory,
            capability_files=mig.slice_capability_files(
                minors,
                self.caps_dir,
                card_minor=gpu.minor,
                gpu_instance_id=gpu_instance_id,
                compute_instance_id=compute_instance_id,
            ),
        )

    # -- telemetry ----------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        """Every card, then every slice on its own handle: NVML gives a MIG device its own memory and processes
        (temperature, power and ECC only for the card: those read NOT_SUPPORTED, named missing), and its
        utilisation from GPM where the card has it."""
        with self._layout_lock:
            slices = [(item, self._slice_handles[item.uuid]) for card in self._layout for item in card.slices]
        samples = [self._sample_one(gpu.uuid, self._handles[gpu.uuid]) for gpu in self._gpus]
        self._gpm.keep_only({item.uuid for item, _ in slices})
        samples.extend(self._slice_utilization(item, self._sample_one(item.uuid, handle)) for item, handle in slices)
        return samples

    # -- power limits -------------------------------------------------------------------------------------

    def power_limits(self, uuid: str) -> PowerLimits:
        handle = self._handles[uuid]  # KeyError for a card this node does not have
        try:
            low, high = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            default = pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)
            current = pynvml.nvmlDeviceGetPowerManagementLimit(handle)
        except NVML_ERRORS as error:
            raise PowerLimitError(f"NVML cannot read the card's power limits: {_power_error(error)}") from error
        return PowerLimits(
            min_w=int(low) / 1000, max_w=int(high) / 1000, default_w=int(default) / 1000, current_w=int(current) / 1000
        )

    def set_power_limit(self, uuid: str, watts: float) -> None:
        handle = self._handles[uuid]
        try:
            pynvml.nvmlDeviceSetPowerManagementLimit(handle, round(watts * 1000))
        except NVML_ERRORS as error:
            raise PowerLimitError(f"NVML refused the power limit {watts:.0f} W: {_power_error(error)}") from error

    def _slice_utilization(self, item: MigSliceInfo, sample: GpuSample) -> GpuSample:
        """The slice's sample with its GPU instance's GPM utilisation, where NVML gave none and the card has GPM."""
        card_handle = self._handles[item.card]
        if sample.utilization_pct is not None or not self._gpm.supported(item.card, card_handle):
            return sample
        try:
            value = self._gpm.utilization(item.uuid, card_handle, item.gpu_instance_id)
        except NVML_ERRORS as error:
            self._note_failure(item.uuid, "GPM utilisation", error)
            return sample
        if value is None:  # the slice's first tick: nothing to compare with yet
            return sample
        missing = tuple(field for field in sample.missing if field != "utilization_pct")
        return replace(sample, utilization_pct=round(value), missing=missing)

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
        power_limit = read(lambda: pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0, "power_limit_w")
        energy = read(lambda: int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)), "energy_mj")
        estimated = False
        if energy is None and power is not None:  # no counter on this card (before Volta): its power added up
            energy, estimated = self._power_integral.add(uuid, power), True
            missing.remove("energy_mj")
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
            energy_mj=energy,
            energy_estimated=estimated,
            power_limit_w=power_limit,
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
        self._gpm.close()
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            log.warning("NVML shutdown failed: %s", error)
