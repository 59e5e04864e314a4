"""Bookings on Slurm-managed nodes become Slurm advance reservations (issue 23), against a real one-node cluster
(tests/slurm/cluster.py): imported nodes, a reservation per approved booking that its holder's jobs run in and
another person's do not, removed on cancel, moved on extend; an operator's reservation is never touched; one Slurm
refuses is recorded with Slurm's words; a controller out of reach changes nothing and the next pass catches up."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from alerts.models import Alert
from alerts.selectors import alert_summary
from nodes.models import Node
from reservations.services import reservation_cancel, reservation_create, reservation_extend, reservation_release
from slurm.models import SlurmCluster, SlurmReservation
from slurm.naming import reservation_name
from slurm.scontrol import Scontrol, SlurmError, SlurmUnreachable
from slurm.services import slurm_nodes_import, slurm_reconcile
from slurm.tasks import sync_nodes
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(slurm_cluster, settings):
    settings.SLURM_SCONTROL = slurm_cluster.scontrol_setting
    yield slurm_cluster
    for line in slurm_cluster.scontrol("show", "reservation", "-o", check=False).splitlines():
        if line.startswith("ReservationName="):
            slurm_cluster.scontrol("delete", line.split()[0], check=False)


@pytest.fixture
def scontrol(cluster) -> Scontrol:
    return Scontrol(cluster.scontrol_setting.split())


@pytest.fixture
def slurm_node(cluster, scontrol) -> Node:
    slurm_nodes_import(controller=scontrol)
    return Node.objects.get(name=cluster.node.lower())


def grid_now() -> datetime:
    now = timezone.now()
    return now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)


def ours(cluster) -> dict[str, str]:
    lines = cluster.scontrol("show", "reservation", "-o", check=False).splitlines()
    return {line.split()[0].split("=", 1)[1]: line for line in lines if line.startswith("ReservationName=gpubook-")}


def test_the_clusters_gpu_nodes_are_imported_as_slurm_managed_nodes(cluster, scontrol):
    done = slurm_nodes_import(controller=scontrol)

    node = Node.objects.get(name=cluster.node.lower())
    assert done.created == [cluster.node]
    assert node.manager == Node.Manager.SLURM and node.status == Node.Status.ACTIVE
    assert [(gpu.index, gpu.model) for gpu in node.gpus.order_by("index")] == [
        (i, "Slurm GPU (a100)") for i in range(4)
    ]
    again = slurm_nodes_import(controller=scontrol)
    assert again.updated == [cluster.node] and node.gpus.count() == 4  # idempotent


def test_an_approved_booking_becomes_a_reservation_its_holders_jobs_run_in_and_nobody_elses(
    cluster, slurm_node, slurm_accounts
):
    holder, other = (UserFactory(username=name) for name in slurm_accounts)
    start = grid_now()
    booking = reservation_create(
        user=holder, gpus=list(slurm_node.gpus.all()), start=start, end=start + timedelta(hours=2)
    )

    done = slurm_reconcile(now=timezone.now())

    name = reservation_name(booking.pk)
    assert done is not None and done.created == [name]
    line = ours(cluster)[name]
    assert f"Users={holder.unix_username}" in line and "MAGNETIC" in line and f"Nodes={cluster.node}" in line
    assert f"EndTime={booking.end.astimezone(UTC):%Y-%m-%dT%H:%M:%S}" in line
    assert SlurmReservation.objects.get(reservation=booking).state == SlurmReservation.State.SYNCED

    inside = cluster.srun(holder.unix_username, f"--reservation={name}", "-t", "1", "id", "-un")
    assert inside.returncode == 0 and inside.stdout.strip() == holder.unix_username, inside.stderr
    plain = cluster.srun(holder.unix_username, "-t", "1", "id", "-un")  # MAGNETIC: no need to name it
    assert plain.returncode == 0, plain.stderr
    refused = cluster.srun(other.unix_username, f"--reservation={name}", "-t", "1", "id", "-un")
    assert refused.returncode != 0 and "Access denied to requested reservation" in refused.stderr
    blocked = cluster.srun(other.unix_username, "--immediate=2", "-t", "1", "id", "-un")
    assert blocked.returncode != 0  # the node is the holder's until the reservation ends

    assert slurm_reconcile(now=timezone.now()).created == []  # level: nothing more to do

    reservation_release(reservation=booking, actor=holder)  # done early: the node is free for others at once
    assert slurm_reconcile(now=timezone.now()).deleted == [name] and ours(cluster) == {}
    freed = cluster.srun(other.unix_username, "--immediate=5", "-t", "1", "id", "-un")
    assert freed.returncode == 0 and freed.stdout.strip() == other.unix_username, freed.stderr


def test_cancel_removes_it_and_extend_moves_its_end(cluster, slurm_node, slurm_accounts):
    holder = UserFactory(username=slurm_accounts[0])
    start = grid_now() + timedelta(hours=3)
    gpus = list(slurm_node.gpus.all())
    later = reservation_create(user=holder, gpus=gpus, start=start, end=start + timedelta(hours=1))
    slurm_reconcile(now=timezone.now())
    assert f"StartTime={start.astimezone(UTC):%Y-%m-%dT%H:%M:%S}" in ours(cluster)[reservation_name(later.pk)]

    reservation_extend(reservation=later, actor=holder, end=start + timedelta(hours=2))
    done = slurm_reconcile(now=timezone.now())
    assert done.updated == [reservation_name(later.pk)]
    assert (
        f"EndTime={(start + timedelta(hours=2)).astimezone(UTC):%Y-%m-%dT%H:%M:%S}"
        in ours(cluster)[reservation_name(later.pk)]
    )

    # A job queued for the slot (held, so that it never runs here) would make Slurm refuse the delete ("Requested
    # reservation is in use"): it is moved out of the reservation first, and stays queued as the holder's own.
    queued = cluster.sbatch(holder.unix_username, "--hold", f"--reservation={reservation_name(later.pk)}", "-t", "1",
                            "--wrap", "true")  # fmt: skip
    try:
        reservation_cancel(reservation=later, actor=holder)
        done = slurm_reconcile(now=timezone.now())
        assert done.deleted == [reservation_name(later.pk)] and ours(cluster) == {}
        job = cluster.scontrol("show", "job", "-o", queued)
        assert "JobState=PENDING" in job and f"Reservation={reservation_name(later.pk)}" not in job
    finally:
        cluster.scancel(queued)
    assert SlurmReservation.objects.get(reservation=later).state == SlurmReservation.State.REMOVED


def test_an_operators_reservation_is_left_alone_and_one_slurm_refuses_is_recorded_in_its_words(
    cluster, slurm_node, slurm_accounts
):
    holder = UserFactory(username=slurm_accounts[0])
    start = grid_now() + timedelta(hours=5)
    cluster.scontrol(
        "create", "reservation", "ReservationName=maint", "Users=root", "Nodes=ALL",
        f"StartTime={start.astimezone(UTC):%Y-%m-%dT%H:%M:%S}", "Duration=120",
    )  # fmt: skip
    clash = reservation_create(
        user=holder, gpus=list(slurm_node.gpus.all()), start=start, end=start + timedelta(hours=1)
    )

    done = slurm_reconcile(now=timezone.now())

    name = reservation_name(clash.pk)
    assert name in done.refused and ours(cluster) == {}
    problem = SlurmReservation.objects.get(reservation=clash)
    assert problem.state == SlurmReservation.State.REFUSED and problem.problem  # Slurm's own words
    assert "ReservationName=maint" in cluster.scontrol("show", "reservation", "maint")  # untouched
    with pytest.raises(SlurmError, match="never deleted"):
        Scontrol(cluster.scontrol_setting.split()).delete("maint")
    # The admins hear of it: an alert naming the booking, the holder and Slurm's words, until it is moot.
    alert = Alert.objects.get(kind=Alert.Kind.SLURM_REFUSED, resolved_at=None)
    assert (alert.reservation_id, alert.user, alert.node_id) == (clash.pk, holder, slurm_node.pk)
    assert alert_summary(alert) == f"booking #{clash.pk} has no reservation in Slurm: {problem.problem}"
    slurm_reconcile(now=timezone.now())  # refused again, in the same words: still the one alert
    assert Alert.objects.filter(kind=Alert.Kind.SLURM_REFUSED).count() == 1

    reservation_cancel(reservation=clash, actor=holder)
    slurm_reconcile(now=timezone.now())
    alert.refresh_from_db()
    assert alert.resolved_at is not None and "no longer needs one" in alert.resolution
    assert SlurmReservation.objects.get(reservation=clash).state == SlurmReservation.State.REMOVED


def test_a_controller_out_of_reach_changes_nothing_and_the_next_pass_catches_up(
    cluster, slurm_node, slurm_accounts, settings
):
    settings.SLURM_UNREACHABLE_ALERT_MINUTES = 10
    holder = UserFactory(username=slurm_accounts[0])
    start = grid_now() + timedelta(hours=8)
    first = timezone.now()
    cluster.stop_controller()
    try:
        booking = reservation_create(
            user=holder, gpus=list(slurm_node.gpus.all()), start=start, end=start + timedelta(hours=1)
        )  # the booking commits whatever Slurm's state
        with pytest.raises(SlurmUnreachable):
            slurm_reconcile(now=first)
        assert not SlurmReservation.objects.filter(reservation=booking).exists()
        assert SlurmCluster.objects.get().unreachable_since == first
        assert not Alert.objects.filter(kind=Alert.Kind.SLURM_UNREACHABLE).exists()  # not yet: 10 minutes

        with pytest.raises(SlurmUnreachable):
            slurm_reconcile(now=first + timedelta(minutes=11))
        alert = Alert.objects.get(kind=Alert.Kind.SLURM_UNREACHABLE, resolved_at=None)
        summary = alert_summary(alert)
        assert summary.startswith("no answer for 11 min: ") and "Unable to contact slurm controller" in summary
    finally:
        cluster.start_controller()

    done = slurm_reconcile(now=first + timedelta(minutes=12))
    alert.refresh_from_db()
    assert alert.resolution == "the Slurm controller answered again"
    row = SlurmCluster.objects.get()
    assert row.unreachable_since is None and row.version == "22.05.8" and not row.gpu_reservations
    name = reservation_name(booking.pk)
    # Created, or updated: a controller killed with -9 may come back with a reservation of that name it had not
    # forgotten yet (on SQLite the test databases reuse booking ids); either way it now holds this booking.
    assert name in done.created + done.updated
    assert f"StartTime={start.astimezone(UTC):%Y-%m-%dT%H:%M:%S}" in ours(cluster)[name]


def test_the_booking_page_says_how_to_use_the_reservation_and_when_slurm_refused_it(
    cluster, slurm_node, slurm_accounts, client
):
    holder = UserFactory(username=slurm_accounts[0])
    start = grid_now() + timedelta(hours=12)
    booking = reservation_create(
        user=holder, gpus=list(slurm_node.gpus.all()), start=start, end=start + timedelta(hours=1)
    )
    client.force_login(holder)
    page = f"/reservations/{booking.pk}/"

    assert "is being made in Slurm" in client.get(page).content.decode()
    slurm_reconcile(now=timezone.now())
    html = client.get(page).content.decode()
    assert f"Slurm holds the advance reservation <code>{reservation_name(booking.pk)}</code>" in html
    assert f"sbatch --reservation={reservation_name(booking.pk)} job.sh" in html

    SlurmReservation.objects.filter(reservation=booking).update(state="refused", problem="Requested nodes are busy")
    assert "Slurm refused this booking" in client.get(page).content.decode()


def test_the_import_command_names_what_it_did_and_an_unreachable_controller_is_an_error(cluster, settings):
    out = StringIO()
    call_command("slurm_import", stdout=out)
    assert out.getvalue() == f"created {cluster.node}\n"

    settings.SLURM_SCONTROL = "/nonexistent/scontrol"
    with pytest.raises(CommandError, match="Slurm: /nonexistent/scontrol is not installed here"):
        call_command("slurm_import")


def test_the_periodic_sync_runs_once_a_cluster_is_connected(cluster, scontrol, db):
    assert sync_nodes() is None  # no Slurm-managed node yet: nothing asked of any controller
    slurm_nodes_import(controller=scontrol)

    assert sync_nodes() == {"created": 0, "updated": 1, "skipped": 0}  # (drained ones: tests/slurm/test_scontrol.py)
