"""A booking's own page, /reservations/<id>/: what it shows, to whom, and the actions on it."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse

from accounting.models import Tariff
from accounting.rollup import rollup
from nodes.ingest import telemetry_record
from notifications.services import outbox_drain
from reservations.models import Reservation
from reservations.services import (
    reservation_approve,
    reservation_cancel,
    reservation_create,
    reservation_extend,
)
from tests.api_helpers import client_for
from tests.conftest import at
from tests.factories import carve_mig, node_with_gpus
from tests.mailserver import html_of, text_of

pytestmark = pytest.mark.usefixtures("clock")
Status = Reservation.Status


def page(reservation: Reservation | int) -> str:
    return reverse("reservation-detail", kwargs={"pk": getattr(reservation, "pk", reservation)})


def act(reservation: Reservation, action: str) -> str:
    return reverse("reservation-action", kwargs={"pk": reservation.pk, "action": action})


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def shown(user, reservation: Reservation) -> str:
    response = logged_in(user).get(page(reservation))
    assert response.status_code == 200
    return response.content.decode()


def section(html: str, name: str) -> str:
    """The HTML of one section of the page (id="name"), up to the next section."""
    start = html.index(f'id="{name}"')
    end = html.find("<section", start)
    return html[start : end if end != -1 else len(html)]


def forms_in(html: str) -> set[str]:
    """Which action endpoints the page's forms post to."""
    return {action for action in ("cancel", "release", "extend", "approve", "reject") if f"/{action}/" in html}


@pytest.fixture
def approval_node(db):
    return node_with_gpus(2, name="gpu-h100", requires_approval=True)


# --- what the holder sees -------------------------------------------------------------------


def test_the_holder_sees_what_when_and_how_to_use_it(alice, gpus):
    alice.timezone = "Europe/Berlin"
    alice.first_name, alice.last_name = "Alice", "Liddell"
    alice.save()
    booking = reservation_create(user=alice, gpus=gpus[1:3], start=at(1), end=at(3), purpose="fine-tuning")

    html = shown(alice, booking)

    summary = section(html, "summary")
    assert f"#{booking.pk}" in summary
    assert "Alice Liddell (alice)" in summary
    assert "gpu-a100" in summary and gpus[1].node.hostname in summary
    assert "GPU 1 · A100-SXM4 80 GB" in summary and "GPU 2 · A100-SXM4 80 GB" in summary
    assert gpus[1].uuid in summary
    # 10:00-12:00 UTC read in Berlin.
    assert "Mon 7 Jan 2030, 11:00" in summary and "Mon 7 Jan 2030, 13:00" in summary
    assert "fine-tuning" in summary
    assert "Europe/Berlin" in html

    access = section(html, "access")
    assert f"ssh alice@{gpus[1].node.hostname}" in access
    assert f"export CUDA_VISIBLE_DEVICES={gpus[1].uuid},{gpus[2].uuid}" in access
    assert "CUDA_VISIBLE_DEVICES=1,2" in access  # the index form, for nvidia-smi's numbering


def test_the_ssh_line_names_the_holders_unix_account_when_an_admin_reads_it(alice, carol, gpus):
    alice.unix_username = "al123"
    alice.save()
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))

    access = section(shown(carol, booking), "access")

    assert f"ssh al123@{gpus[0].node.hostname}" in access
    assert "carol@" not in access


def test_a_holder_without_a_unix_username_is_told_why_no_gpu_opens(alice, gpus):
    alice.unix_username_requested = "alice"
    alice.save()
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    alice.unix_username = ""
    alice.save()

    access = section(shown(alice, booking), "access")

    assert "no unix username yet" in access
    assert "ssh " not in access


def test_a_pending_booking_says_it_waits_and_opens_nothing(alice, approval_node):
    booking = reservation_create(user=alice, gpus=list(approval_node.gpus.all()), start=at(1), end=at(3))

    html = shown(alice, booking)

    assert "tentative: pending approval" in html
    assert "No GPU opens until an admin approves it" in section(html, "access")
    assert "export CUDA_VISIBLE_DEVICES" not in html


def test_the_history_lists_the_audit_trail_oldest_first_with_who_and_why(alice, carol, approval_node):
    booking = reservation_create(user=alice, gpus=list(approval_node.gpus.all()), start=at(1), end=at(3))
    reservation_approve(reservation=booking, actor=carol, reason="go ahead")
    reservation_cancel(reservation=booking, actor=alice, reason="plans changed")

    history = section(shown(alice, booking), "history")

    booked = history.index("Booked, waiting for approval")
    approved = history.index("Approved")
    cancelled = history.index("Cancelled")
    assert booked < approved < cancelled
    assert "by alice" in history[booked:approved]
    assert "by carol" in history[approved:cancelled] and "go ahead" in history[approved:cancelled]
    assert "plans changed" in history[cancelled:]


def test_the_history_shows_an_extension_and_its_request(alice, carol, approval_node, clock):
    booking = reservation_create(
        user=alice, gpus=list(approval_node.gpus.all()), start=at(1), end=at(3), actor=carol
    )  # booked by an admin: approved at once
    clock.move_to(at(2))
    reservation_extend(reservation=booking, actor=alice, end=at(4))
    waiting = booking.extensions.get()

    html = shown(alice, booking)

    assert "Extension until Mon 7 Jan 2030, 13:00 waits for approval" in section(html, "status")
    assert page(waiting) in section(html, "status")
    history = section(html, "history")
    assert "Extension requested" in history and f"#{waiting.pk}" in history
    assert "booked by carol" not in history and "by carol" in history  # the booking itself was carol's doing

    reservation_approve(reservation=waiting, actor=carol)
    history = section(shown(alice, booking), "history")
    assert "Extended" in history and "end Mon 7 Jan 2030, 12:00 → Mon 7 Jan 2030, 13:00" in history


# --- usage ----------------------------------------------------------------------------------


def test_usage_so_far_comes_from_the_rolled_up_hours(alice, node, gpus, clock):
    booking = reservation_create(user=alice, gpus=gpus[:2], start=at(1), end=at(3))
    assert "No usage yet: the booking has not started" in section(shown(alice, booking), "usage")

    clock.move_to(at(1, 0) + timedelta(minutes=30))
    assert "No usage yet." in section(shown(alice, booking), "usage")

    # GPU 0 busy for 12 minutes at 300 W, GPU 1 idle at 60 W; each minute has a reading with the energy counter.
    for minute in range(12):
        samples = [
            {"uuid": gpus[0].uuid, "utilization_pct": 90, "memory_used_mib": 40960, "processes": []},
            {"uuid": gpus[1].uuid, "utilization_pct": 0, "memory_used_mib": 0, "processes": []},
        ]
        samples[0]["energy_mj"], samples[1]["energy_mj"] = 18_000_000 * minute, 3_600_000 * minute
        telemetry_record(node=node, samples=samples, now=at(1) + timedelta(minutes=minute))
    rollup(since=at(1), until=at(1) + timedelta(minutes=30))

    usage = section(shown(alice, booking), "usage")
    # 2 GPUs x 30 minutes booked so far = 1 GPU-hour; 12 used minutes = 0.2 GPU-hours.
    assert "<strong>0.20</strong> of 1.00 GPU-hours booked so far" in usage
    assert "<strong>20 %</strong>" in usage
    assert "45 %" in usage  # mean utilisation over both GPUs' readings
    assert "40.0 GB" in usage
    # 11 minutes between the 12 readings: 11 x (18 + 3.6) kJ = 0.066 kWh, of which GPU 1's 0.011 kWh idle.
    assert "<strong>0.066 kWh</strong>, of which 0.011 kWh in idle minutes</dd>" in usage  # no tariff: no cost
    assert "estimated" not in usage
    Tariff.objects.create(name="day", price_per_kwh=Decimal("0.30"), co2_g_per_kwh=Decimal("400"))
    priced = section(shown(alice, booking), "usage")
    assert "in idle minutes; 0.02 EUR; 0.03 kg CO₂e</dd>" in priced  # 0.066 kWh x 0.30, x 400 g
    assert "No usage yet" not in usage


def test_a_slice_counts_its_share_and_says_when_its_card_cannot_measure_it(alice, node, gpus, clock):
    slices = carve_mig(gpus[0])  # slices[0] is a 3g of a 7-slice card
    booking = reservation_create(user=alice, gpus=[slices[0]], start=at(1), end=at(3))
    clock.move_to(at(1) + timedelta(minutes=42))
    for minute in range(42):  # an A100 has no GPM: memory and processes, no utilisation
        sample = {"uuid": slices[0].uuid, "utilization_pct": None, "memory_used_mib": 2048, "processes": []}
        telemetry_record(
            node=node, samples=[sample | {"missing": ["utilization_pct"]}], now=at(1) + timedelta(minutes=minute)
        )
    rollup(since=at(1), until=at(1) + timedelta(minutes=42))

    usage = section(shown(alice, booking), "usage")
    assert "<strong>0.00</strong> of 0.30 GPU-hours booked so far" in usage  # 42 min x 3/7
    assert "not measured" in usage
    assert "0.30 GPU-hours: this MIG slice's card reports no utilisation per slice" in usage
    assert "<strong>0 %</strong>" not in usage  # no efficiency from time nobody could judge


# --- who sees it ----------------------------------------------------------------------------


def test_another_researcher_gets_the_same_404_as_for_a_booking_that_does_not_exist(alice, bob, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3), purpose="secret project")

    other = logged_in(bob).get(page(booking))
    missing = logged_in(bob).get(page(booking.pk + 1000))

    assert other.status_code == missing.status_code == 404
    assert b"secret project" not in other.content and b"alice" not in other.content
    # Byte for byte, but for the address asked for (Django's 404 page names it).
    assert other.content.replace(page(booking).encode(), b"") == missing.content.replace(
        page(booking.pk + 1000).encode(), b""
    )


def test_admins_see_anyones_booking(alice, carol, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3), purpose="secret project")
    html = shown(carol, booking)
    assert "secret project" in html
    assert "alice's booking on gpu-a100" in html


def test_anonymous_visitors_are_sent_to_log_in(client, alice, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    response = client.get(page(booking))
    assert response.status_code == 302
    assert response.url == f"{reverse('login')}?next={page(booking)}"


@pytest.mark.parametrize(
    "path",
    [
        "/reservations/99999999999999999999999999/",  # past a 64-bit id
        "/reservations/9223372036854775808/",
        "/reservations/0/",
        "/reservations/-1/",
        "/reservations/abc/",
        "/reservations/1.5/",
    ],
)
def test_bad_ids_are_404_never_500(alice, path):
    assert logged_in(alice).get(path).status_code == 404


# --- actions --------------------------------------------------------------------------------


def test_an_admin_is_offered_approve_and_reject_on_a_pending_booking(alice, carol, approval_node):
    booking = reservation_create(user=alice, gpus=list(approval_node.gpus.all()), start=at(1), end=at(3))

    # Never extended while it waits: the admin approves the slot they saw (issue 37).
    assert forms_in(section(shown(carol, booking), "actions")) == {"approve", "reject", "cancel"}
    assert forms_in(section(shown(alice, booking), "actions")) == {"cancel"}
    assert "A booking waiting for approval cannot be extended" in section(shown(alice, booking), "actions")


def test_the_actions_follow_the_bookings_state(alice, carol, gpus, clock):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    assert forms_in(section(shown(alice, booking), "actions")) == {"cancel", "extend"}
    assert forms_in(section(shown(carol, booking), "actions")) == {"cancel", "extend"}

    clock.move_to(at(2))  # running: the holder releases it; an admin may still cancel it
    assert forms_in(section(shown(alice, booking), "actions")) == {"release", "extend"}
    assert forms_in(section(shown(carol, booking), "actions")) == {"release", "cancel", "extend"}

    clock.move_to(at(4))  # over
    for viewer in (alice, carol):
        actions = section(shown(viewer, booking), "actions")
        assert forms_in(actions) == set()
        assert "the booking is over" in actions


def test_a_cancelled_booking_offers_nothing_and_has_no_usage_part(alice, carol, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    reservation_cancel(reservation=booking, actor=carol, reason="maintenance moved")
    for viewer in (alice, carol):
        html = shown(viewer, booking)
        assert forms_in(section(html, "actions")) == set()
        assert "Cancelled by carol on Mon 7 Jan 2030, 09:00: “maintenance moved”" in section(html, "status")
        assert "starts" not in section(html, "status")
        assert 'id="usage"' not in html
        assert "never opened: the booking was cancelled" in section(html, "access")


def test_an_action_comes_back_to_the_page_with_its_outcome(alice, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    client = logged_in(alice)

    response = client.post(act(booking, "cancel"), {"next": page(booking)}, follow=True)

    assert response.redirect_chain == [(page(booking), 302)]
    html = response.content.decode()
    assert f"Reservation #{booking.pk} cancelled" in html
    assert "Cancelled by alice" in section(html, "status")
    assert "Cancelled" in section(html, "history")


def test_a_refused_action_comes_back_to_the_page_with_the_reason(alice, gpus, clock):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    clock.move_to(at(2))  # started: the holder can no longer cancel, only release

    response = logged_in(alice).post(act(booking, "cancel"), {"next": page(booking)}, follow=True)

    assert response.redirect_chain == [(page(booking), 302)]
    assert "release it to end it now" in response.content.decode()
    booking.refresh_from_db()
    assert booking.status == Status.APPROVED


def test_approving_from_the_page_shows_who_decided(alice, carol, approval_node):
    booking = reservation_create(user=alice, gpus=list(approval_node.gpus.all()), start=at(1), end=at(3))

    response = logged_in(carol).post(act(booking, "approve"), {"next": page(booking), "reason": "ok"}, follow=True)

    assert response.redirect_chain == [(page(booking), 302)]
    status = section(response.content.decode(), "status")
    assert "Approved by carol on Mon 7 Jan 2030, 09:00: “ok”" in status


def test_approving_an_extension_comes_back_to_the_booking_it_joined(alice, carol, approval_node, clock):
    booking = reservation_create(user=alice, gpus=list(approval_node.gpus.all()), start=at(1), end=at(3), actor=carol)
    reservation_extend(reservation=booking, actor=alice, end=at(5))
    waiting = booking.extensions.get()

    html = shown(carol, waiting)
    assert f'name="next" value="{page(booking)}"' in section(html, "actions")
    response = logged_in(carol).post(act(waiting, "approve"), {"next": page(booking)}, follow=True)

    assert response.redirect_chain == [(page(booking), 302)]
    assert response.status_code == 200
    booking.refresh_from_db()
    assert booking.end == at(5)


def test_next_never_leads_off_the_portal(alice, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    response = logged_in(alice).post(act(booking, "cancel"), {"next": "https://evil.example/"})
    assert response.url == reverse("my-reservations")


# --- where it is linked from ----------------------------------------------------------------


def test_my_reservations_links_each_row_to_its_page(alice, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    html = logged_in(alice).get(reverse("my-reservations")).content.decode()
    assert f'href="{page(booking)}"' in html


def test_the_api_gives_the_pages_absolute_url_to_those_who_may_open_it(alice, bob, carol, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    url = reverse("api:reservation-detail", kwargs={"pk": booking.pk})

    assert client_for(alice).get(url).json()["url"] == f"http://testserver{page(booking)}"
    assert client_for(carol).get(url).json()["url"] == f"http://testserver{page(booking)}"
    assert client_for(bob).get(url).json()["url"] is None  # a busy slot to bob: not his to open


def test_the_calendar_gives_the_pages_path_to_those_who_may_open_it(alice, bob, carol, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    params = {"start": at(0).isoformat(), "end": at(24).isoformat()}

    def url_seen_by(user) -> str | None:
        [event] = [
            e for e in client_for(user).get(reverse("api:calendar"), params).json()["events"] if e["id"].startswith("r")
        ]
        return event["extendedProps"]["url"]

    assert url_seen_by(alice) == url_seen_by(carol) == page(booking)
    assert url_seen_by(bob) is None


def test_booking_mails_link_to_the_page(smtp_server, settings, alice, carol, approval_node):
    booking = reservation_create(user=alice, gpus=list(approval_node.gpus.all()), start=at(1), end=at(3))
    outbox_drain()

    link = settings.PORTAL_URL.rstrip("/") + page(booking)
    mails = {message["To"]: message for message in smtp_server.wait_for(2)}
    for mail in mails.values():  # alice's "waiting for approval" and carol's "approval needed"
        assert f"Page:   {link}" in text_of(mail)
        assert f'href="{link}"' in html_of(mail)
