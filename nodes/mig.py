"""MIG layouts as agents report them: which cards are in MIG mode, and their slices as GPU rows.

Each heartbeat carries the node's MIG-capable cards (gpubook_agent.protocol.MigCard). A card is in
MIG mode for booking only while its current and pending modes are both on (a pending change means a
reset is coming). A slice the portal has not seen becomes a row under its card, not bookable until an
admin confirms the layout (``mig_layout_confirm``, an action in admin): a slice is isolation a person
relies on, and its layout is the admin's to accept, not the node's to decide. A slice that is no longer
reported is marked gone (``gone_at``) and taken out of booking; its row stays for the bookings that
name it, which alerts flag and whose holders it tells (``mig_slices_gone``). A slice whose profile or
placement changed waits for confirmation again.

Rows change only when the layout does: a heartbeat that repeats the layout writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction

from audit.services import audit_record
from gpubook_agent.gpus.simulated import COMPUTE_SLICES, PLACEMENT_SLOTS, parse_simulated_mig, simulated_mig_uuid
from nodes.models import Gpu, Node
from nodes.signals import mig_slices_gone

LAYOUT_FIELDS = ("profile", "compute_slices", "placement_start", "placement_size")


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
    changed = False
    mode = {
        "mig_mode": reported["mode_current"] and reported["mode_pending"],
        "compute_slices": reported["compute_slices"],
    }
    if any(getattr(card, field) != value for field, value in mode.items()):
        Gpu.objects.filter(pk=card.pk).update(**mode)
        changed = True
    slices = {gpu.uuid: gpu for gpu in known.values() if gpu.parent_id == card.pk}
    for piece in reported["slices"]:
        layout = {field: piece[field] for field in LAYOUT_FIELDS}
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
                **layout,
            )
            changed = True
        elif row.gone_at is not None or any(getattr(row, field) != value for field, value in layout.items()):
            # Back, or moved: either way the layout is new and waits for an admin.
            Gpu.objects.filter(pk=row.pk).update(gone_at=None, bookable=False, **layout)
            changed = True
    still_there = {piece["uuid"] for piece in reported["slices"]}
    gone = [row.pk for uuid, row in slices.items() if row.gone_at is None and uuid not in still_there]
    if gone:
        Gpu.objects.filter(pk__in=gone).update(gone_at=now, bookable=False)
        mig_slices_gone.send(sender=Gpu, node=node, gpu_ids=gone, now=now)
        changed = True
    return changed


def mig_layout_confirm(*, card: Gpu, actor: Any) -> list[Gpu]:
    """An admin accepts the layout ``card``'s agent reports: its present slices become bookable.
    Returns them. Refused (ValueError, with words) for a card not in MIG mode or with no slices."""
    if card.parent_id is not None:
        raise ValueError(f"{card} is a slice: confirm the layout on its card.")
    if not card.mig_mode:
        raise ValueError(f"{card} is not in MIG mode (current and pending): there is no layout to confirm.")
    present = list(card.slices.filter(gone_at__isnull=True).order_by("placement_start"))
    if not present:
        raise ValueError(f"{card}'s agent has reported no slices yet.")
    with transaction.atomic():
        Gpu.objects.filter(pk__in=[piece.pk for piece in present], bookable=False).update(bookable=True)
        audit_record(
            actor=actor,
            action="gpu.mig_layout_confirm",
            target=card,
            after={"slices": [f"{piece.profile}@{piece.placement_start} {piece.uuid}" for piece in present]},
        )
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
        Gpu.objects.filter(pk=card.pk).update(mig_mode=True, compute_slices=COMPUTE_SLICES)
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
