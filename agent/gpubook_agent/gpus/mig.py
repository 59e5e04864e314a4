"""MIG (Multi-Instance GPU): what a card in MIG mode is made of, and which files open each of its slices.

A MIG slice is a compute instance inside a GPU instance of one card. A CUDA program on a slice opens the
card's device file (``/dev/nvidia<minor>``) and two capability files: the GPU instance's and the compute
instance's access files, ``/dev/nvidia-caps/nvidia-cap<N>``. The driver numbers those files in
``/proc/driver/nvidia-caps/mig-minors``, one line per capability the driver could ever create
(``gpu<card minor>/gi<GI id>/access <N>``, ``gpu<card minor>/gi<GI id>/ci<CI id>/access <N>``, and
``config 1`` and ``monitor 2``, which open no GPU). Both backends read the layout into the dataclasses
here; the enforcer decides from them which files carry whose ACL (``files_of``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpubook_agent import protocol

MIG_MINORS_FILE = "/proc/driver/nvidia-caps/mig-minors"
CAPS_DIR = "/dev/nvidia-caps"
CAP_FILE_RE = re.compile(r"\Anvidia-cap(\d+)\Z")
# The two access capabilities per slice; "config" and "monitor" are node-wide and open no GPU.
GI_ACCESS_RE = re.compile(r"\Agpu(\d+)/gi(\d+)/access\Z")
CI_ACCESS_RE = re.compile(r"\Agpu(\d+)/gi(\d+)/ci(\d+)/access\Z")
MAX_MINORS_BYTES = 4 * 1024 * 1024  # the real file is ~100 kB (32 cards × 15 GPU instances × 9 lines)


class MigMinorsError(ValueError):
    """The mig-minors file cannot be read or is not in the driver's format; the message says which."""


@dataclass(frozen=True)
class MigSliceInfo:
    """One slice as the backend found it: its identity, its place on the card, and its capability files."""

    uuid: str  # "MIG-…"
    card: str  # the card's "GPU-…" UUID
    profile: str
    gpu_instance_id: int
    compute_instance_id: int
    placement_start: int
    placement_size: int
    compute_slices: int
    memory_mib: int | None
    # The GPU-instance and the compute-instance access files, in that order; fewer when mig-minors does not
    # name them (then the slice cannot be opened to anyone, and the enforcer says so).
    capability_files: tuple[str, ...]

    def as_dict(self) -> protocol.MigSlice:
        return protocol.mig_slice(
            uuid=self.uuid,
            profile=self.profile,
            gpu_instance_id=self.gpu_instance_id,
            compute_instance_id=self.compute_instance_id,
            placement_start=self.placement_start,
            placement_size=self.placement_size,
            compute_slices=self.compute_slices,
            memory_mib=self.memory_mib,
        )


@dataclass(frozen=True)
class MigCardInfo:
    """A card that supports MIG, read at one moment: its modes and the slices it has (none while MIG is off)."""

    uuid: str
    minor: int
    mode_current: bool
    mode_pending: bool
    placement_slots: int
    compute_slices: int
    slices: tuple[MigSliceInfo, ...]
    # Every GPU- and compute-instance access file mig-minors names for this card, whether a slice uses it now
    # or not: the minors of destroyed instances are handed to new ones, so an ACL left on any of them could
    # open a future slice. The enforcer keeps them all free of entries nobody's lease backs.
    capability_files: tuple[str, ...] = ()

    @property
    def slices_open(self) -> bool:
        """Whether a slice lease may open this card's device file: MIG on now and staying on. With MIG off the
        device file is the whole card; with a change pending it becomes the whole card at the next reset."""
        return self.mode_current and self.mode_pending

    def as_dict(self) -> protocol.MigCard:
        return protocol.mig_card(
            uuid=self.uuid,
            mode_current=self.mode_current,
            mode_pending=self.mode_pending,
            placement_slots=self.placement_slots,
            compute_slices=self.compute_slices,
            slices=[item.as_dict() for item in self.slices],
        )


def read_mig_minors(path: str) -> dict[str, int]:
    """The capabilities of a mig-minors file and their minors (``{"gpu0/gi1/access": 12, ...}``).
    FileNotFoundError when it does not exist (a driver without MIG support, or MIG never used);
    MigMinorsError when it is unreadable, too large or has a line outside the driver's format."""
    with open(path, "rb") as file:
        raw = file.read(MAX_MINORS_BYTES + 1)
    if len(raw) > MAX_MINORS_BYTES:
        raise MigMinorsError(f"{path} is larger than {MAX_MINORS_BYTES} bytes: not a mig-minors file")
    return parse_mig_minors(raw.decode("ascii", errors="replace"), source=path)


def parse_mig_minors(text: str, *, source: str = "mig-minors") -> dict[str, int]:
    minors: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        valid_name = len(fields) == 2 and (
            fields[0] in ("config", "monitor") or GI_ACCESS_RE.match(fields[0]) or CI_ACCESS_RE.match(fields[0])
        )
        if not valid_name or not fields[1].isascii() or not fields[1].isdigit():
            raise MigMinorsError(f"{source}, line {number}: {line[:80]!r} is not '<capability> <minor>'")
        minors[fields[0]] = int(fields[1])
    return minors


def gpu_instance_capability(card_minor: int, gpu_instance_id: int) -> str:
    return f"gpu{card_minor}/gi{gpu_instance_id}/access"


def compute_instance_capability(card_minor: int, gpu_instance_id: int, compute_instance_id: int) -> str:
    return f"gpu{card_minor}/gi{gpu_instance_id}/ci{compute_instance_id}/access"


def capability_path(caps_dir: str, minor: int) -> str:
    return os.path.join(caps_dir, f"nvidia-cap{minor}")


def slice_capability_files(
    minors: Mapping[str, int], caps_dir: str, *, card_minor: int, gpu_instance_id: int, compute_instance_id: int
) -> tuple[str, ...]:
    """The slice's GPU-instance and compute-instance access files, those mig-minors names."""
    names = (
        gpu_instance_capability(card_minor, gpu_instance_id),
        compute_instance_capability(card_minor, gpu_instance_id, compute_instance_id),
    )
    return tuple(capability_path(caps_dir, minors[name]) for name in names if name in minors)


def card_capability_files(minors: Mapping[str, int], caps_dir: str, card_minor: int) -> tuple[str, ...]:
    """Every GPU- and compute-instance access file of the card with this minor, in minor order."""
    found = []
    for name, minor in minors.items():
        match = GI_ACCESS_RE.match(name) or CI_ACCESS_RE.match(name)
        if match and int(match.group(1)) == card_minor:
            found.append(minor)
    return tuple(capability_path(caps_dir, minor) for minor in sorted(found))


def files_of(
    uuid: str, *, device_paths: Mapping[str, str], cards: Iterable[MigCardInfo], guarded: bool = False
) -> tuple[str, ...]:
    """The files that open ``uuid`` to a user. A card: its device file, and in MIG mode every slice's
    capability files too (booking a card in MIG mode books all its slices). A slice: its capability files
    and its card's device file; with ``guarded``, the device file only while the card's MIG mode is on and
    staying on (``slices_open``). KeyError for a UUID neither a card nor a current slice of this node."""
    by_card = {card.uuid: card for card in cards}
    if uuid in device_paths:
        card = by_card.get(uuid)
        files = [device_paths[uuid]]
        if card is not None and card.mode_current:
            files.extend(path for item in card.slices for path in item.capability_files)
        return tuple(dict.fromkeys(files))
    for card in by_card.values():
        for item in card.slices:
            if item.uuid == uuid:
                parent = () if guarded and not card.slices_open else (device_paths[card.uuid],)
                return (*parent, *item.capability_files)
    raise KeyError(uuid)
