"""MIG layouts as agents report them: which cards are in MIG mode, and their slices as GPU rows.

Each heartbeat carries the node's MIG-capable cards (gpubook_agent.protocol.MigCard). A card is in
MIG mode for booking only while its current and pending modes are both on (a pending change means a
reset is coming). A slice the portal has not seen becomes a row under its card, not bookable until an
admin confirms the layout (``mig_layout_confirm``, an action in admin): a slice is isolation a person
relies on, and its layout is the admin's to accept, not the node's to decide. A slice that is no longer
reported is marked gone (``gone_at``) and taken out of booking; its row stays for the bookings that
name it, which alerts flag and whose holders it tells (``mig_slices_gone``). A slice whose profile or
placement changed waits for confirmation again.

The numbers slices count by are the admin's too. A slice counts in limits, fair share and energy as its
compute slices over its card's (``card_share``), so a report that changed them would re-count every booking
of the card, past and future. The card's MIG mode, compute slices and memory slices, and each slice's
compute slices, therefore change only when an admin confirms: what the agent reports otherwise is kept
beside them (``reported_*``) and waits. A card-level change (MIG on or off, other compute or memory slices)
takes the card and its slices out of booking at once, until the confirmation, and is announced
(``mig_layout_changed``: alerts opens one alert per change, resolved by the confirmation). Out of booking
is the safe side: a card whose layout is unknown is neither booked as one GPU nor as slices that may not
exist (docs/agent.md, "MIG slices").

Rows change only when the layout does: a heartbeat that repeats the layout writes nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from audit.services import audit_record
from gpubook_agent.gpus.simulated import COMPUTE_SLICES, PLACEMENT_SLOTS, parse_simulated_mig, simulated_mig_uuid
from nodes.models import Gpu, Node
from nodes.signals import mig_layout_changed, mig_layout_confirmed, mig_slices_gone

# What places a slice on its card: written as reported (a change waits for the admin, not bookable). Its compute
# slices, what it counts for, wait in ``reported_compute_slices`` instead.
PLACE_FIELDS = ("profile", "placement_start", "placement_size")


@dataclass(frozen=True)
class CardLayout:
    """What a card's slices count by: its MIG mode and, in MIG mode, its compute and memory slices (7 and 8 on
    A100/H100). ``memory_slices`` None: not recorded (a card confirmed before the portal kept it)."""

    mig_mode: bool
    compute_slices: int
    memory_slices: int | None

    @classmethod
    def confirmed(cls, card: Gpu) -> CardLayout:
        return cls(card.mig_mode, card.compute_slices, card.memory_slices)

    @classmethod
    def waiting(cls, card: Gpu) -> CardLayout | None:
        """What the card's agent reported that waits for an admin, or None."""
        if card.mig_change_at is None:
            return None
        return cls(bool(card.reported_mig_mode), card.reported_compute_slices or 0, card.reported_memory_slices)

    @classmethod
    def reported(cls, reported: dict[str, Any]) -> CardLayout:
        return cls(
            reported["mode_current"] and reported["mode_pending"],
            reported["compute_slices"],
            reported["placement_slots"],
        )

    def differs_from(self, confirmed: CardLayout) -> bool:
        """Whether this reported layout changes what the ``confirmed`` one counts by. Out of MIG mode both, the
        numbers count for nothing new (a card's gone slices keep counting by the confirmed ones); an unrecorded
        memory count is no difference (memory slices count in no arithmetic: the first report records it)."""
        if self.mig_mode != confirmed.mig_mode:
            return True
        if not self.mig_mode:
            return False
        memory_changed = confirmed.memory_slices is not None and self.memory_slices != confirmed.memory_slices
        return self.compute_slices != confirmed.compute_slices or memory_changed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        if not self.mig_mode:
            return "MIG off"
        memory = "?" if self.memory_slices is None else self.memory_slices
        return f"MIG on, {self.compute_slices} compute and {memory} memory slices"


def mig_layout_record(*, node: Node, cards: Iterable[dict[str, Any]], known: dict[str, Gpu], now: datetime) -> bool:
    """Store the reported layouts of ``node``'s cards; ``known`` is the node's GPU rows by UUID (cards
    and slices). Cards and slices of other nodes are never touched. Returns whether anything changed."""
    changed = False
    with transaction.atomic():
        for reported in cards:
            card = known.get(reported["uuid"])
            if card is None or card.parent_id is not None:
                continue  # not a card of this node: ignored, as every other unknown UUID
            changed |= _record_card(node, card, reported, known, now)
    return changed


def _record_card(node: Node, card: Gpu, reported: dict[str, Any], known: dict[str, Gpu], now: datetime) -> bool:
    changed = _record_card_layout(card, CardLayout.reported(reported), now)
    slices = {gpu.uuid: gpu for gpu in known.values() if gpu.parent_id == card.pk}
    for piece in reported["slices"]:
        row = slices.get(piece["uuid"])
        if row is None:
            if piece["uuid"] in known or Gpu.objects.filter(uuid=piece["uuid"]).exists():
                continue  # a UUID the portal knows elsewhere: a node reports only its own
            Gpu.objects.create(
                node=node,
                parent=card,
                index=card.index,
                uuid=piece["uuid"],
                model=card.model,
                memory_mib=piece["memory_mib"] or 0,
                bookable=False,  # until an admin confirms the layout
                compute_slices=piece["compute_slices"],  # new: no booking counts by it yet
                **{field: piece[field] for field in PLACE_FIELDS},
            )
            changed = True
            continue
        writes = _slice_writes(row, piece)
        if writes:
            Gpu.objects.filter(pk=row.pk).update(**writes)
            changed = True
    still_there = {piece["uuid"] for piece in reported["slices"]}
    gone = [row.pk for uuid, row in slices.items() if row.gone_at is None and uuid not in still_there]
    if gone:
        # A gone slice's bookings keep counting by its confirmed compute slices; a change it reported is moot.
        Gpu.objects.filter(pk__in=gone).update(gone_at=now, bookable=False, reported_compute_slices=None)
        mig_slices_gone.send(sender=Gpu, node=node, gpu_ids=gone, now=now)
        changed = True
    return changed


def _slice_writes(row: Gpu, piece: dict[str, Any]) -> dict[str, Any]:
    """What a reported slice changes on its row: nothing if it is as stored; else it is back or moved or
    resized, and either way its layout is new and waits for an admin (not bookable), its compute slices in
    ``reported_compute_slices`` until then (None: the confirmed ones again)."""
    place = {field: piece[field] for field in PLACE_FIELDS}
    compute = piece["compute_slices"]
    waiting = None if compute == row.compute_slices else compute
    if (
        row.gone_at is None
        and row.reported_compute_slices == waiting
        and all(getattr(row, field) == value for field, value in place.items())
    ):
        return {}
    return {"gone_at": None, "bookable": False, "reported_compute_slices": waiting, **place}


def _card_writes(card: Gpu, layout: CardLayout, now: datetime) -> dict[str, Any]:
    """What a reported card layout changes on the card's row: nothing when it repeats what is confirmed or
    already waiting; the new waiting layout (and since when, for the first) when it differs; the memory
    slices alone when they were not recorded yet and nothing else differs."""
    reported = {
        "reported_mig_mode": layout.mig_mode,
        "reported_compute_slices": layout.compute_slices,
        "reported_memory_slices": layout.memory_slices,
    }
    waiting = CardLayout.waiting(card)
    if waiting is not None:
        return {} if waiting == layout else reported
    if layout.differs_from(CardLayout.confirmed(card)):
        return {**reported, "mig_change_at": now}
    if layout.mig_mode and card.memory_slices is None:
        return {"memory_slices": layout.memory_slices}
    return {}


def _record_card_layout(card: Gpu, layout: CardLayout, now: datetime) -> bool:
    if not _card_writes(card, layout, now):
        return False  # as read with the report: a repeated layout writes nothing and locks nothing
    # Decide again on the row as it is now, locked: an admin's confirmation may have committed since the
    # report's read, and must not meet a half-recorded change.
    card = Gpu.objects.select_for_update().get(pk=card.pk)
    writes = _card_writes(card, layout, now)
    if not writes:
        return False
    Gpu.objects.filter(pk=card.pk).update(**writes)
    if "reported_mig_mode" in writes:
        if "mig_change_at" in writes:  # the first report of a change: its slices leave booking at once
            Gpu.objects.filter(parent=card, bookable=True).update(bookable=False)
        mig_layout_changed.send(sender=Gpu, card=card, confirmed=CardLayout.confirmed(card), reported=layout, now=now)
    return True


def mig_layout_fingerprint(card: Gpu) -> str:
    """What an admin looks at before confirming ``card``'s layout, in a few characters: its confirmed and
    waiting layouts and its present slices as reported. The confirmation page carries it, so that a layout
    that changed after the admin looked is not confirmed unseen."""
    present = card.slices.filter(gone_at__isnull=True).order_by("placement_start", "pk")
    seen = {
        "confirmed": CardLayout.confirmed(card).as_dict(),
        "waiting": layout.as_dict() if (layout := CardLayout.waiting(card)) else None,
        "slices": [
            [
                piece.uuid,
                *(getattr(piece, field) for field in PLACE_FIELDS),
                piece.compute_slices,
                piece.reported_compute_slices,
            ]
            for piece in present
        ],
    }
    return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:16]


def mig_layout_confirm(*, card: Gpu, actor: Any, seen: str | None = None) -> list[Gpu]:
    """An admin accepts the layout ``card``'s agent reports. A card-level change waiting (MIG on or off,
    other compute or memory slices) becomes the card's, the compute slices its slices report theirs, and
    in MIG mode its present slices become bookable; returns them (none once MIG is off: the card is one GPU
    again). ``seen``: the ``mig_layout_fingerprint`` the admin looked at; a layout that changed since is
    refused. Refused (ValueError, with words) too for a slice, a card not in MIG mode with nothing waiting,
    and a card in MIG mode with no slices."""
    if card.parent_id is not None:
        raise ValueError(f"{card} is a slice: confirm the layout on its card.")
    with transaction.atomic():
        card = Gpu.objects.select_for_update().select_related("node").get(pk=card.pk)
        # The slices too, before the fingerprint is compared: a heartbeat moving or dropping one (it locks no card
        # when only slices change) then waits for this confirmation, or is seen by it.
        list(Gpu.objects.select_for_update().filter(parent=card).order_by("pk").values_list("pk", flat=True))
        if seen is not None and seen != mig_layout_fingerprint(card):
            raise ValueError(f"{card}: its agent reported another layout since you looked. Look again.")
        before = CardLayout.confirmed(card)
        after = CardLayout.waiting(card) or before
        if not after.mig_mode and card.mig_change_at is None:
            raise ValueError(f"{card} is not in MIG mode (current and pending): there is no layout to confirm.")
        present = list(card.slices.filter(gone_at__isnull=True).order_by("placement_start")) if after.mig_mode else []
        if after.mig_mode and not present:
            raise ValueError(f"{card}'s agent has reported no slices yet.")
        # Out of MIG mode the card keeps its numbers: its gone slices' bookings count by them.
        numbers = (
            {"compute_slices": after.compute_slices, "memory_slices": after.memory_slices} if after.mig_mode else {}
        )
        Gpu.objects.filter(pk=card.pk).update(
            mig_mode=after.mig_mode,
            reported_mig_mode=None,
            reported_compute_slices=None,
            reported_memory_slices=None,
            mig_change_at=None,
            **numbers,
        )
        for piece in present:
            if piece.reported_compute_slices is not None:
                piece.compute_slices, piece.reported_compute_slices = piece.reported_compute_slices, None
                Gpu.objects.filter(pk=piece.pk).update(
                    compute_slices=piece.compute_slices, reported_compute_slices=None
                )
            piece.bookable = True
        Gpu.objects.filter(pk__in=[piece.pk for piece in present], bookable=False, gone_at__isnull=True).update(
            bookable=True
        )
        audit_record(
            actor=actor,
            action="gpu.mig_layout_confirm",
            target=card,
            before={"layout": str(before)},
            after={
                "layout": str(after),
                "slices": [
                    f"{piece.profile}@{piece.placement_start} ({piece.compute_slices} compute) {piece.uuid}"
                    for piece in present
                ],
            },
        )
        mig_layout_confirmed.send(sender=Gpu, card=card, actor=actor)
    return present


def simulated_layout(node: Node) -> str:
    """``node``'s MIG cards as the simulated backend's SIMULATED_MIG says them (``0:2g.20gb,2g.20gb,3g.40gb``):
    each card in MIG mode with its present slices in placement order, which the backend places back where
    they are (and numbers their GPU instances in that order: demo_jobs finds the capability files so). For
    the demo, whose portal writes its simulated agents' configs (nodes demo_agents)."""
    cards = []
    for card in node.gpus.filter(parent=None, mig_mode=True).order_by("index"):
        profiles = (
            card.slices.filter(gone_at__isnull=True).order_by("placement_start").values_list("profile", flat=True)
        )
        if profiles:
            cards.append(f"{card.index}:{','.join(profiles)}")
    return ";".join(cards)


def simulated_mig_cards_make(node: Node, layout: str) -> list[Gpu]:
    """Split ``node``'s cards as the simulated backend does for SIMULATED_MIG ``layout``: each card in MIG
    mode, its slices (the agent's UUIDs and placements) confirmed. For the demo lab and its tests, whose
    simulated agents then report the same layout. Returns the slices."""
    made = []
    for index, planned in parse_simulated_mig(layout).items():
        card = Gpu.objects.get(node=node, index=index, parent=None)
        Gpu.objects.filter(pk=card.pk).update(
            mig_mode=True, compute_slices=COMPUTE_SLICES, memory_slices=PLACEMENT_SLOTS
        )
        for piece in planned:
            row, _ = Gpu.objects.get_or_create(
                uuid=simulated_mig_uuid(node.name, index, piece.placement_start, piece.profile),
                defaults={
                    "node": node,
                    "parent": card,
                    "index": index,
                    "model": card.model,
                    "memory_mib": card.memory_mib * piece.placement_size // PLACEMENT_SLOTS,
                    "profile": piece.profile,
                    "compute_slices": piece.compute_slices,
                    "placement_start": piece.placement_start,
                    "placement_size": piece.placement_size,
                },
            )
            made.append(row)
    return made
