"""Slurm clusters' writes: importing the nodes, and a reconcile pass with its lock (issue 23)."""

from __future__ import annotations

import shlex
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from kernel.locks import advisory_xact_lock
from nodes.models import Gpu, Node, validate_node_name
from slurm.reconcile import Pass, reconcile
from slurm.scontrol import Scontrol, SlurmNode

UUID_NAMESPACE = uuid.UUID("2f8c0e4a-9b61-4d2e-8a53-1c7d5e6f9a10")  # the portal's own: GPU ids for Slurm's GPUs


def scontrol_from_settings() -> Scontrol:
    return Scontrol(shlex.split(settings.SLURM_SCONTROL))


@dataclass
class Imported:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def slurm_gpu_uuid(node: str, index: int) -> str:
    """Slurm knows a node's GPUs by count, not by UUID: the portal names each by the node and its place."""
    return f"GPU-{uuid.uuid5(UUID_NAMESPACE, f'slurm/{node}/{index}')}"


def slurm_nodes_import(*, scontrol: Scontrol) -> Imported:
    """The cluster's GPU nodes as the portal's Slurm-managed nodes: new ones made, known ones brought up to date
    (their GPUs by count and type, their state: drained or down shows as maintenance). A node the portal's agent
    manages under the same name is left alone and named."""
    done = Imported()
    for slurm_node in scontrol.nodes():
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
        _import_one(slurm_node, existing)
        (done.updated if existing else done.created).append(slurm_node.name)
    return done


@transaction.atomic
def _import_one(slurm_node: SlurmNode, node: Node | None) -> None:
    status = Node.Status.MAINTENANCE if slurm_node.offline else Node.Status.ACTIVE
    if node is None:
        node = Node.objects.create(
            name=slurm_node.name, hostname=slurm_node.hostname, manager=Node.Manager.SLURM, status=status
        )
    else:
        Node.objects.filter(pk=node.pk).update(hostname=slurm_node.hostname, status=status)
    model = f"Slurm GPU ({slurm_node.gpu_type})" if slurm_node.gpu_type else "Slurm GPU"
    for index in range(slurm_node.gpu_count):
        Gpu.objects.update_or_create(
            uuid=slurm_gpu_uuid(slurm_node.name, index),
            defaults={"node": node, "index": index, "model": model, "memory_mib": 0, "bookable": True},
        )
    Gpu.objects.filter(node=node, parent=None, index__gte=slurm_node.gpu_count).update(bookable=False)


def slurm_reconcile(*, now: datetime) -> Pass | None:
    """One reconcile pass, one at a time across workers (a second waits for the first, then finds little to do);
    None when no node is Slurm's."""
    if not Node.objects.filter(manager=Node.Manager.SLURM).exists():
        return None
    with transaction.atomic():
        advisory_xact_lock("slurm-reconcile")
        return reconcile(scontrol=scontrol_from_settings(), now=now)
