"""Which files open which bookable unit, a whole card or a MIG slice, as of one reading of the node's layout.

Leases and reports speak of units (UUIDs); the kernel knows files. A card is its device file. A MIG slice
is its two capability files and its card's device file, which every slice of the card shares: the device
file keeps a user's ACL entry while any of their units needs it. ``AccessMap`` answers, for one layout,
what the enforcer asks: the files a grant of each unit puts its holder on, every file a unit involves
(where its leftovers may hide), the units each file serves, and which files the agent keeps at all.

The MIG guard lives here: a slice's grant includes its card's device file only while the card's MIG mode
is on now and stays on after the next reset (``MigCardInfo.slices_open``). With MIG off that file is the
whole card, and a pending change makes it so at the next reset.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpubook_agent.gpus import MigCardInfo, MigSliceInfo
from gpubook_agent.gpus.mig import files_of

CAPABILITY_FILES_PER_SLICE = 2  # the GPU instance's and the compute instance's


@dataclass(frozen=True)
class AccessMap:
    device_files: Mapping[str, str]  # card UUID -> its device file
    cards: Mapping[str, MigCardInfo]  # the cards that support MIG
    slices: Mapping[str, MigSliceInfo]  # the slices the cards have now
    grant_files: Mapping[str, tuple[str, ...]]  # unit -> the files its grant puts a user on (none: cannot open)
    reach: Mapping[str, tuple[str, ...]]  # unit -> every file it involves, whatever the guard says
    units_of_file: Mapping[str, tuple[str, ...]]  # file -> the units it serves, the one it belongs to first
    managed: frozenset[str]  # every file whose ACL the agent keeps: device files and existing capability files

    @classmethod
    def build(cls, device_files: Mapping[str, str], cards: Iterable[MigCardInfo]) -> AccessMap:
        mig_cards = {card.uuid: card for card in cards if card.uuid in device_files}
        slices = {item.uuid: item for card in mig_cards.values() for item in card.slices}
        layout = list(mig_cards.values())
        grant_files: dict[str, tuple[str, ...]] = {}
        reach: dict[str, tuple[str, ...]] = {}
        for uuid in [*device_files, *slices]:
            reach[uuid] = files_of(uuid, device_paths=device_files, cards=layout)
            grant_files[uuid] = files_of(uuid, device_paths=device_files, cards=layout, guarded=True)
        for uuid, item in slices.items():
            if len(item.capability_files) < CAPABILITY_FILES_PER_SLICE:
                grant_files[uuid] = ()  # mig-minors does not name both: nothing would open the slice
        units_of_file: dict[str, list[str]] = {}
        for uuid in slices:  # a capability file belongs to its slice first, then to its card
            for path in slices[uuid].capability_files:
                units_of_file.setdefault(path, []).append(uuid)
        for uuid in device_files:  # a device file belongs to its card first, then to the card's slices
            for path in reach[uuid]:
                units_of_file.setdefault(path, []).append(uuid)
            card = mig_cards.get(uuid)
            for item in card.slices if card else ():
                units_of_file[device_files[uuid]].append(item.uuid)
        managed = set(device_files.values()) | {path for item in slices.values() for path in item.capability_files}
        # Unused capability files too: the driver hands a destroyed instance's minor to the next one created,
        # so an entry left on any of them could open someone's future slice.
        managed |= {path for card in mig_cards.values() for path in card.capability_files if os.path.exists(path)}
        return cls(
            device_files=dict(device_files),
            cards=mig_cards,
            slices=slices,
            grant_files=grant_files,
            reach=reach,
            units_of_file={path: tuple(dict.fromkeys(units)) for path, units in units_of_file.items()},
            managed=frozenset(managed),
        )

    def units(self) -> list[str]:
        """Every unit this node has now: its cards, then the slices of those in MIG mode."""
        return [*self.device_files, *self.slices]

    def lease_units(self, uuid: str) -> tuple[str, ...]:
        """The units a lease naming ``uuid`` opens: a card, with all its slices while it is in MIG mode (the
        same as booking each of them); a slice alone. None for a UUID this layout does not have."""
        if uuid in self.slices:
            return (uuid,)
        if uuid not in self.device_files:
            return ()
        card = self.cards.get(uuid)
        return (uuid, *(item.uuid for item in card.slices)) if card and card.mode_current else (uuid,)

    def card_of(self, uuid: str) -> str:
        """The card a unit is on (a card is on itself)."""
        item = self.slices.get(uuid)
        return item.card if item else uuid

    def owner(self, path: str) -> str | None:
        """The unit a file belongs to, for reports: a device file's card, a capability file's slice (or its
        card, when no slice uses it now)."""
        units = self.units_of_file.get(path)
        if units:
            return units[0]
        for card in self.cards.values():
            if path in card.capability_files:
                return card.uuid
        return None

    def files_wanted(self, wanted: Mapping[str, set[str]]) -> dict[str, set[str]]:
        """The users each managed file must carry for ``wanted`` (unit -> users): the union over the units
        whose grant includes the file."""
        files: dict[str, set[str]] = {path: set() for path in self.managed}
        for uuid, users in wanted.items():
            if users:
                for path in self.grant_files.get(uuid, ()):
                    files.setdefault(path, set()).update(users)
        return files

    def keeps_open(self, path: str, user: str, wanted: Mapping[str, set[str]]) -> bool:
        """Whether ``user`` may keep ``path`` open though no grant puts them on it now: it is the device file of
        a card whose MIG guard closed under their slice (a mode change pending). Jobs already running then stay
        until their lease ends; new opens need the ACL, which is gone."""
        for uuid in self.units_of_file.get(path, ()):
            item = self.slices.get(uuid)
            if item is not None and path == self.device_files.get(item.card) and user in wanted.get(uuid, ()):
                return True
        return False
