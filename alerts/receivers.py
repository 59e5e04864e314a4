"""What alerts does when nodes report (nodes/signals.py), accounts change (accounts/signals.py) and a Slurm
cluster's controller stops or starts answering (slurm/signals.py).

The node receivers run in the report's own phase (``.in_transaction``): the alerts they open or resolve
are written with the report, as when ingest called them directly.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q
from django.dispatch import receiver
from django.utils import timezone

from accounts.signals import unix_username_changed, user_deactivated
from alerts.conditions import (
    alerts_check_jobs_if_due,
    alerts_evaluate_reports,
    alerts_from_events,
    alerts_gpu_returned,
    alerts_node_online,
    alerts_nodes_offline,
    alerts_slurm_reached,
    alerts_slurm_refused,
    alerts_slurm_settled,
    alerts_slurm_unreachable,
)
from alerts.models import Alert
from alerts.records import alerts_resolve
from alerts.slices import alerts_mig_layout_changed, alerts_mig_layout_confirmed, alerts_slices_gone
from nodes.ingest import TelemetryReport
from nodes.mig import CardLayout
from nodes.models import Gpu, Node, NodeEvent
from nodes.signals import (
    gpu_returned,
    mig_layout_changed,
    mig_layout_confirmed,
    mig_slices_gone,
    node_back_online,
    node_events_recorded,
    node_reported,
    nodes_went_offline,
    telemetry_received,
)
from slurm.signals import controller_reached, controller_unreachable, reservation_refused, reservation_settled


def _refusals_of(user_id: int, *usernames: str | None) -> Any:
    names = [name for name in usernames if name]
    return Alert.objects.filter(Q(user_id=user_id) | Q(username__in=names), kind=Alert.Kind.ACCOUNT_REFUSED)


@receiver(unix_username_changed)
def account_refusals_fixed(sender: type, user_id: int, before: str | None, **kwargs: Any) -> None:
    """The binding a node refused was changed: the nodes are told the new one, and judge it afresh
    (a refusal of the new name opens a new alert)."""
    alerts_resolve(
        _refusals_of(user_id, before), now=timezone.now(), resolution="the person's unix username was changed"
    )


@receiver(user_deactivated)
def account_refusals_moot(sender: type, user_id: int, **kwargs: Any) -> None:
    alerts_resolve(_refusals_of(user_id), now=timezone.now(), resolution="the account was deactivated")


@receiver(node_reported.in_transaction)
def check_jobs_on_heartbeat(sender: type, now: datetime, **kwargs: Any) -> None:
    """Heartbeats arrive every few seconds whether beat lives or not: the moment to see it is late."""
    alerts_check_jobs_if_due(now=now)


@receiver(telemetry_received.in_transaction)
def readings_reported(sender: type, reports: list[TelemetryReport], **kwargs: Any) -> None:
    alerts_evaluate_reports(reports)


@receiver(node_events_recorded.in_transaction)
def events_reported(sender: type, node: Node, acting: list[NodeEvent], now: datetime, **kwargs: Any) -> None:
    alerts_from_events(node=node, events=acting, now=now)


@receiver(nodes_went_offline.in_transaction)
def nodes_silent(sender: type, node_ids: list[int], now: datetime, **kwargs: Any) -> None:
    alerts_nodes_offline(node_ids=node_ids, now=now)


@receiver(node_back_online.in_transaction)
def node_back(sender: type, node: Node, now: datetime, **kwargs: Any) -> None:
    alerts_node_online(node=node, now=now)


@receiver(gpu_returned.in_transaction)
def gpu_back_in_service(sender: type, gpu: Gpu, actor: Any, **kwargs: Any) -> None:
    alerts_gpu_returned(gpu=gpu, actor=actor)


@receiver(mig_slices_gone.in_transaction)
def booked_slices_gone(sender: type, node: Node, gpu_ids: list[int], now: datetime, **kwargs: Any) -> None:
    alerts_slices_gone(node=node, gpu_ids=gpu_ids, now=now)


@receiver(mig_layout_changed.in_transaction)
def card_layout_changed(
    sender: type, card: Gpu, confirmed: CardLayout, reported: CardLayout, now: datetime, **kwargs: Any
) -> None:
    alerts_mig_layout_changed(card=card, confirmed=confirmed, reported=reported, now=now)


@receiver(mig_layout_confirmed.in_transaction)
def card_layout_confirmed(sender: type, card: Gpu, actor: Any, **kwargs: Any) -> None:
    alerts_mig_layout_confirmed(card=card, actor=actor)


@receiver(controller_unreachable.in_transaction)
def slurm_unreachable(sender: type, since: datetime, problem: str, now: datetime, **kwargs: Any) -> None:
    alerts_slurm_unreachable(since=since, problem=problem, now=now)


@receiver(controller_reached.in_transaction)
def slurm_reached(sender: type, now: datetime, **kwargs: Any) -> None:
    alerts_slurm_reached(now=now)


@receiver(reservation_refused.in_transaction)
def slurm_refused(sender: type, reservation_id: int, problem: str, now: datetime, **kwargs: Any) -> None:
    alerts_slurm_refused(reservation_id=reservation_id, problem=problem, now=now)


@receiver(reservation_settled.in_transaction)
def slurm_settled(sender: type, reservation_id: int, now: datetime, **kwargs: Any) -> None:
    alerts_slurm_settled(reservation_id=reservation_id, now=now)
