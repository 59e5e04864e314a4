"""Reads for calendar feeds: whose feed a URL is, a user's feed URLs, and a feed's bookings."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import CharField, Count, Max, OuterRef, Subquery
from django.db.models.functions import Cast, Coalesce
from django.urls import reverse

from audit.models import AuditEntry
from feeds.tokens import FeedToken, feed_token, feed_token_valid
from nodes.models import Node
from reservations.models import Allocation, Reservation


@dataclass(frozen=True)
class FeedLink:
    """One feed a user may subscribe to: their own bookings (``node`` None) or a node's."""

    node: str | None
    title: str
    path: str  # absolute path; pages and the API make it a full URL


def feed_generation(user: Any) -> int:
    return get_user_model().objects.filter(pk=user.pk).values_list("feed_key__generation", flat=True).first() or 0


def feed_links(*, user: Any) -> list[FeedLink]:
    """The user's feed URLs: their own bookings first, then one per node by name. Two queries."""
    generation = feed_generation(user)

    def path(node_id: int | None) -> str:
        return reverse("feed", kwargs={"token": feed_token(user_id=user.pk, node_id=node_id, generation=generation)})

    links = [FeedLink(node=None, title="My bookings", path=path(None))]
    for pk, name in Node.objects.order_by("name").values_list("pk", "name"):
        links.append(FeedLink(node=name, title=f"All bookings on {name}", path=path(pk)))
    return links


def feed_subject(token: FeedToken) -> tuple[Any, Node | None] | None:
    """The active user and node (None for their own feed) that a token stands for, or None when
    the token is not valid now (unknown or inactive user, rotated, forged, no such node)."""
    user = (
        get_user_model()
        .objects.filter(pk=token.user_id, is_active=True)
        .annotate(feed_generation=Coalesce("feed_key__generation", 0))
        .first()
    )
    if user is None or not feed_token_valid(token, generation=user.feed_generation):
        return None
    if token.node_id is None:
        return user, None
    node = Node.objects.filter(pk=token.node_id).first()
    return (user, node) if node is not None else None


@dataclass(frozen=True)
class FeedBooking:
    id: int
    owner_id: int
    owner: str
    node: str
    hostname: str
    start: datetime
    end: datetime
    status: str
    purpose: str
    created_at: datetime
    changed_at: datetime  # the last audited change (or its creation)
    changes: int  # audited changes after the booking was made: the event's SEQUENCE
    released: bool
    gpus: list[tuple[int, str, str, int]]  # (index, uuid, model, memory MiB), by index


def feed_bookings(*, user: Any, node: Node | None, start: datetime, end: datetime) -> list[FeedBooking]:
    """Bookings of any status overlapping [start, end): the user's own (``node`` None) or all on
    ``node``. Two queries whatever their number: the bookings with their audit counts, their GPUs."""
    reservations = Reservation.objects.filter(start__lt=end, end__gt=start)
    reservations = reservations.filter(user=user) if node is None else reservations.filter(node=node)
    audit = AuditEntry.objects.filter(
        target_type=Reservation._meta.label_lower, target_id=Cast(OuterRef("pk"), CharField())
    ).order_by()
    rows = (
        reservations.annotate(
            audited=Subquery(audit.values("target_id").annotate(n=Count("id")).values("n")[:1]),
            audited_last=Subquery(audit.values("target_id").annotate(last=Max("created_at")).values("last")[:1]),
        )
        .order_by("start", "id")
        .values_list(
            "id",
            "user_id",
            "user__username",
            "node__name",
            "node__hostname",
            "start",
            "end",
            "status",
            "purpose",
            "created_at",
            "released_at",
            "audited",
            "audited_last",
        )
    )
    gpus: dict[int, list[tuple[int, str, str, int]]] = {}
    for rid, index, uuid, model, memory in (
        Allocation.objects.filter(reservation__in=reservations.values("pk"))
        .order_by("reservation_id", "gpu__index")
        .values_list("reservation_id", "gpu__index", "gpu__uuid", "gpu__model", "gpu__memory_mib")
    ):
        gpus.setdefault(rid, []).append((index, uuid, model, memory))
    return [
        FeedBooking(
            id=rid,
            owner_id=owner_id,
            owner=owner,
            node=node_name,
            hostname=hostname,
            start=b_start,
            end=b_end,
            status=status,
            purpose=purpose,
            created_at=created_at,
            changed_at=max(created_at, audited_last) if audited_last else created_at,
            changes=max((audited or 1) - 1, 0),
            released=released_at is not None,
            gpus=gpus.get(rid, []),
        )
        for (
            rid,
            owner_id,
            owner,
            node_name,
            hostname,
            b_start,
            b_end,
            status,
            purpose,
            created_at,
            released_at,
            audited,
            audited_last,
        ) in rows
    ]
