"""The four reads every booking makes, written in SQL: the user's lock, the cards' lock, the limits that
apply, and whether the slot is free.

Why by hand, here and nowhere else: every booking, extension and offer runs these four, and composing and
compiling them with the ORM cost about 3.5 ms of CPU each time on the development machine (the slot check
alone 1.7 ms, written out 0.13), more than PostgreSQL spent on the whole booking. Written out, a booking
costs its client about half the CPU, and the booking service makes nearly twice as many bookings a second
at 16 clients (bench/booking.py; docs/operations.md, issue 20's seventh step). Everything else a booking
does stays in the ORM.

One rule, two spellings: the slot check asks what ``selectors.maintenance_overlapping`` and
``selectors.allocations_overlapping`` list (the refusal is explained from those; the second is the
exclusion constraint's rule, asked first), and tests/reservations/test_booking_sql.py holds each pair to the
same answers, MIG slices included.

Both backends: SQLite runs the same statements without FOR UPDATE (its transaction is the lock: BEGIN
IMMEDIATE), lists are spelt out as ``IN (%s, ...)``, and values are adapted and read back as the ORM would
(datetimes as UTC, SQLite's 0 and 1 as booleans).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Model
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from nodes.models import Gpu, Node
from reservations.models import Limit


class SlotState(NamedTuple):
    under_maintenance: bool
    taken: bool
    any_reserved_capacity: bool  # anywhere on the site: whether reservations/reserved.py has work to do


def lock_user(user_id: int) -> bool:
    """Lock the user's row; whether the account is active, as the locked row says (PostgreSQL reads the row's
    latest version once the lock is granted)."""
    row = _fetch_one(f"SELECT is_active FROM accounts_user WHERE id = %s{_for_update()}", [user_id])  # noqa: S608
    return bool(row and row[0])


def lock_cards(gpu_ids: Sequence[int], *, load: bool = False) -> list[Gpu]:
    """Lock the physical cards of these GPUs in id order (a slice's card, not the slice: a booking of a card and
    one of a slice of it queue up behind one lock); with ``load``, return the cards with their nodes (the node
    rows are not locked), else nothing."""
    if not gpu_ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_lock_cards_sql(len(gpu_ids), load, connection.vendor, _for_update(of="g")), list(gpu_ids))
        rows = cursor.fetchall()
    if not load:
        return []
    split, card_from, node_from = len(Gpu._meta.concrete_fields), _Reader(Gpu), _Reader(Node)
    nodes: dict[int, Node] = {}
    cards = []
    for row in rows:
        card = card_from(row[:split])
        if card.node_id not in nodes:
            nodes[card.node_id] = node_from(row[split:])
        card.node = nodes[card.node_id]
        cards.append(card)
    return cards


def limit_rows(user: Any) -> list[Limit]:
    """The Limit rows that apply to ``user``: the site's, their groups', their own
    (reservations/limits.py resolves them)."""
    return list(
        Limit.objects.raw(
            "SELECT * FROM reservations_limit WHERE scope = %s"
            " OR (scope = %s AND group_id IN (SELECT group_id FROM accounts_user_groups WHERE user_id = %s))"
            " OR (scope = %s AND user_id = %s)",
            [Limit.Scope.SITE, Limit.Scope.GROUP, user.pk, Limit.Scope.USER, user.pk],
        )
    )


def slot_state(
    *, node: Node, gpus: Sequence[Gpu], start: datetime, end: datetime, exclude_reservation_id: int | None = None
) -> SlotState:
    """In one query: is [start, end) under maintenance for these units (``selectors.maintenance_overlapping``),
    taken on a part of a card they occupy (``selectors.allocations_overlapping``, leaving out one reservation's
    own allocations), and is there reserved capacity anywhere?"""
    if timezone.is_naive(start) or timezone.is_naive(end):  # (the ORM would read a naive one in TIME_ZONE, SQL in UTC)
        raise ValueError("slot_state takes aware datetimes")
    units = sorted({gpu.pk for gpu in gpus} | {gpu.card_id for gpu in gpus})
    places = [value for gpu in gpus for value in (gpu.card_id, gpu.placement[1], gpu.placement[0])]
    start_value, end_value = (connection.ops.adapt_datetimefield_value(moment) for moment in (start, end))
    excluded = [] if exclude_reservation_id is None else [exclude_reservation_id]
    row = _fetch_one(
        _slot_state_sql(len(units), len(gpus), bool(excluded)),
        [node.pk, end_value, start_value, *units, *places, end_value, start_value, *excluded],
    )
    assert row is not None  # a SELECT without FROM has its one row
    return SlotState(*(bool(value) for value in row))


# --- the statements, built once per shape ----------------------------------------------------
# (From constants and counts only: every value travels as a parameter. Hence the noqa: S608 below.)


def _for_update(of: str = "") -> str:
    if not connection.features.has_select_for_update:
        return ""
    if connection.get_autocommit():  # as the ORM's select_for_update: a lock outside a transaction is let go at once
        raise TransactionManagementError("A row lock needs a transaction: call this inside transaction.atomic().")
    return f" FOR UPDATE OF {of}" if of and connection.features.has_select_for_update_of else " FOR UPDATE"


def _placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


@cache
def _lock_cards_sql(count: int, load: bool, vendor: str, for_update: str) -> str:  # (the vendor keys the cache)
    columns = ["g.id"]
    if load:  # (quoted: "index" is a keyword of SQLite's)
        columns = [
            f"{table}.{connection.ops.quote_name(str(field.column))}"
            for table, model in (("g", Gpu), ("n", Node))
            for field in model._meta.concrete_fields
        ]
    return (
        f"SELECT {', '.join(columns)} FROM nodes_gpu g JOIN nodes_node n ON n.id = g.node_id"  # noqa: S608
        f" WHERE g.id IN (SELECT COALESCE(parent_id, id) FROM nodes_gpu WHERE id IN ({_placeholders(count)}))"
        f" ORDER BY g.id{for_update}"
    )


@cache
def _slot_state_sql(units: int, gpus: int, excluding: bool) -> str:
    # A unit occupies [low, high) of its card's memory slices, a whole card all of them (Gpu.placement).
    same_place = " OR ".join(["(card_id = %s AND placement_start < %s AND placement_end > %s)"] * gpus)
    return (
        "SELECT EXISTS (SELECT 1 FROM reservations_maintenancewindow"  # noqa: S608
        ' WHERE node_id = %s AND start < %s AND "end" > %s'
        f" AND (gpu_id IS NULL OR gpu_id IN ({_placeholders(units)}))),"
        f" EXISTS (SELECT 1 FROM reservations_allocation WHERE ({same_place})"
        ' AND active AND start < %s AND "end" > %s' + (" AND reservation_id <> %s" if excluding else "") + "),"
        " EXISTS (SELECT 1 FROM reservations_reservedcapacity)"
    )


def _fetch_one(sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


class _Reader:
    """Makes ``model`` instances from its concrete columns as the database sent them, converted as the ORM
    converts what it reads (on SQLite: text to datetimes, 0 and 1 to booleans). Made per query: the
    converters belong to this thread's connection."""

    def __init__(self, model: type[Model]) -> None:
        self.model = model
        self.attnames, columns = _columns(model)
        self.converters = [
            (position, column, convert)
            for position, column in enumerate(columns)
            for convert in [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)]
        ]

    def __call__(self, values: Sequence[Any]) -> Any:
        converted = list(values)
        for position, column, convert in self.converters:
            converted[position] = convert(converted[position], column, connection)
        return self.model.from_db(connection.alias, self.attnames, converted)


@cache
def _columns(model: type[Model]) -> tuple[list[str], list[Any]]:
    """``model``'s concrete fields' attribute names, and their columns as the ORM's expressions."""
    fields = model._meta.concrete_fields
    return [field.attname for field in fields], [field.get_col(model._meta.db_table) for field in fields]
