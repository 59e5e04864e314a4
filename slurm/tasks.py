"""Celery tasks of the Slurm link."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from nodes.models import Node
from slurm.scontrol import SlurmError
from slurm.services import controller_from_settings, slurm_nodes_import, slurm_reconcile
from slurm.usage import sacct_from_settings, slurm_jobs_read

log = logging.getLogger(__name__)


@shared_task(name="slurm.reconcile", ignore_result=True)
def reconcile() -> dict[str, int] | None:
    """Beat, every minute, and after each change of a booking on a Slurm node: idempotent. An unreachable
    controller is logged and changes nothing; the next pass catches up."""
    try:
        done = slurm_reconcile(now=timezone.now())
    except SlurmError as error:
        log.warning("the Slurm controller could not be reached: %s; the next pass catches up", error)
        return None
    if done is None:
        return None
    return {
        "created": len(done.created),
        "updated": len(done.updated),
        "deleted": len(done.deleted),
        "refused": len(done.refused),
    }


@shared_task(name="slurm.sync_nodes", ignore_result=True)
def sync_nodes() -> dict[str, int] | None:
    """Beat, every five minutes, once a cluster is connected (a Slurm-managed node exists): the cluster's GPU nodes
    brought up to date, new ones added, drained or down ones shown in maintenance. Idempotent."""
    if not Node.objects.filter(manager=Node.Manager.SLURM).exists():
        return None
    try:
        done = slurm_nodes_import(controller=controller_from_settings())
    except SlurmError as error:
        log.warning("the Slurm controller could not be reached for the node sync: %s", error)
        return None
    return {"created": len(done.created), "updated": len(done.updated), "skipped": len(done.skipped)}


@shared_task(name="slurm.read_jobs", ignore_result=True)
def read_jobs() -> int | None:
    """Beat, every ten minutes, once a cluster is connected: the jobs of the portal's reservations read from its
    accounting, and their bookings' usage counted again (accounting/slurm_usage.py). Idempotent; the number of
    bookings counted, or None (no cluster, accounting off, or sacct failed: logged)."""
    if not Node.objects.filter(manager=Node.Manager.SLURM).exists():
        return None
    try:
        done = slurm_jobs_read(sacct=sacct_from_settings(), now=timezone.now())
    except SlurmError as error:
        log.warning("could not read the Slurm cluster's jobs: %s", error)
        return None
    return None if done is None else len(done)
