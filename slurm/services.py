"""Slurm clusters' writes: importing the nodes, and a reconcile pass with its lock (issue 23)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from kernel.locks import advisory_xact_lock
from nodes.models import Gpu, Node, validate_node_name
from slurm import signals
from slurm.controller import Capabilities, Controller
from slurm.models import SlurmCluster
from slurm.naming import slurm_gpu_model, slurm_gpu_uuid
from slurm.reconcile import Pass, reconcile
from slurm.rest import SlurmRest
from slurm.scontrol import Scontrol, SlurmError, SlurmNode, SlurmUnreachable


def controller_from_settings() -> Controller:
    """slurmrestd where SLURM_RESTD_URL names one (v0.0.43: Slurm 25.05 on), else scontrol (SLURM_SCONTROL)."""
    if settings.SLURM_RESTD_URL:
        token = settings.SLURM_RESTD_TOKEN
        if settings.SLURM_RESTD_TOKEN_FILE:  # read at every pass: a renewed token needs no restart
            try:
                token = Path(settings.SLURM_RESTD_TOKEN_FILE).read_text().strip()
            except OSError as error:
                raise SlurmUnreachable(f"SLURM_RESTD_TOKEN_FILE could not be read: {error.strerror}") from None
        return SlurmRest(settings.SLURM_RESTD_URL, user=settings.SLURM_RESTD_USER, token=token)
    return Scontrol(shlex.split(settings.SLURM_SCONTROL))


@dataclass
class Imported:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def slurm_nodes_import(*, controller: Controller) -> Imported:
    """The cluster's GPU nodes as the portal's Slurm-managed nodes: new ones made, known ones brought up to date
    (their GPUs by count and type, their state: drained or down shows as maintenance). A node the portal's agent
    manages under the same name is left alone and named."""
    done = Imported()
    whole = not controller.capabilities().gpu_reservations
    for slurm_node in controller.nodes():
        if not slurm_node.gpu_count:
            continue
        try:  # reservations name the node as Slurm does, so the portal's node must have that very name
            validate_node_name(slurm_node.name)
        except ValidationError as refused:
            done.skipped[slurm_node.name] = f"not a node name the portal takes: {refused.messages[0]}"
            continue
        existing = Node.objects.filter(name=slurm_node.name).first()
        if existing is not None and existing.manager != Node.Manager.SLURM:
            done.skipped[slurm_node.name] = "a node of that name is managed by the portal's agent"
            continue
        _import_one(slurm_node, existing, whole=whole)
        (done.updated if existing else done.created).append(slurm_node.name)
    return done


@transaction.atomic
def _import_one(slurm_node: SlurmNode, node: Node | None, *, whole: bool) -> None:
    if node is None:
        node = Node(name=slurm_node.name, manager=Node.Manager.SLURM)
    status: str = Node.Status.MAINTENANCE if slurm_node.offline else Node.Status.ACTIVE
    if node.status == Node.Status.DISABLED:
        status = node.status  # an admin took it out of the portal: Slurm's word does not put it back
    wanted = {
        "hostname": slurm_node.hostname,
        "status": status,
        "books_whole": whole,
        "manager_state": slurm_node.described[: Node._meta.get_field("manager_state").max_length],
        "manager_down": slurm_node.down,
    }
    changed = [field for field, value in wanted.items() if getattr(node, field) != value]
    if node.pk is None or changed:  # saved only when it changed: calendars and status pages follow (post_save)
        for field, value in wanted.items():
            setattr(node, field, value)
        node.save()
    model = slurm_gpu_model(slurm_node.gpu_type)
    cards = {card.index: card for card in Gpu.objects.filter(node=node, parent=None)}
    for index in range(slurm_node.gpu_count):
        card = cards.get(index)
        if card is None:
            Gpu.objects.create(
                uuid=slurm_gpu_uuid(slurm_node.name, index), node=node, index=index, model=model, memory_mib=0
            )
        elif card.uuid == slurm_gpu_uuid(slurm_node.name, index):
            Gpu.objects.filter(pk=card.pk).update(model=model, bookable=True)
        # else: a card our agent reports there too (its real UUID, set by an admin): it stays as the agent says.
    Gpu.objects.filter(node=node, parent=None, index__gte=slurm_node.gpu_count).update(bookable=False)


def slurm_reconcile(*, now: datetime) -> Pass | None:
    """One reconcile pass, one at a time across workers (a second waits for the first, then finds little to do);
    None when no node is Slurm's. A controller that cannot be asked (out of reach, or failing before the pass could
    read what it holds) raises SlurmUnreachable, after it was recorded (``SlurmCluster.unreachable_since``) and
    announced (``controller_unreachable``: alerts opens one after SLURM_UNREACHABLE_ALERT_MINUTES)."""
    if not Node.objects.filter(manager=Node.Manager.SLURM).exists():
        return None
    try:
        controller = controller_from_settings()
        capabilities = controller.capabilities()
        with transaction.atomic():
            advisory_xact_lock("slurm-reconcile")
            done = reconcile(controller=controller, capabilities=capabilities, now=now)
            _cluster_reached(capabilities, now)
            return done
    except SlurmUnreachable as error:
        _cluster_unreachable(str(error), now)
        raise
    except SlurmError as error:  # before the pass read anything (a refusal during it is recorded, not raised)
        _cluster_unreachable(str(error), now)
        raise SlurmUnreachable(str(error)) from None


def _cluster_reached(capabilities: Capabilities, now: datetime) -> None:
    cluster, _ = SlurmCluster.objects.select_for_update().get_or_create(pk=1)
    cluster.api, cluster.version = capabilities.api, capabilities.version_text
    cluster.gpu_reservations, cluster.reached_at = capabilities.gpu_reservations, now
    cluster.unreachable_since, cluster.problem = None, ""
    cluster.save()
    # An upgraded cluster books single GPUs from now on (or, downgraded, whole nodes again).
    for node in Node.objects.filter(manager=Node.Manager.SLURM).exclude(books_whole=not capabilities.gpu_reservations):
        node.books_whole = not capabilities.gpu_reservations
        node.save(update_fields=["books_whole"])
    signals.controller_reached.send(sender=SlurmCluster, now=now)


@transaction.atomic
def _cluster_unreachable(problem: str, now: datetime) -> None:
    cluster, _ = SlurmCluster.objects.select_for_update().get_or_create(pk=1)
    cluster.unreachable_since = cluster.unreachable_since or now
    cluster.problem = problem
    cluster.save(update_fields=["unreachable_since", "problem"])
    signals.controller_unreachable.send(sender=SlurmCluster, since=cluster.unreachable_since, problem=problem, now=now)
