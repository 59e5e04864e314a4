"""Launching an environment from a booking's page (issue 22), in Chromium: the holder picks one and launches it,
the node (played by the test, with its agent's token) reports it running, and the page shows it without a reload
(static/js/launches.js fetches the page every 5 seconds while a launch is open): its state, its output, the SSH
tunnel to its Unix socket (issue 36) and its token; then she stops it and the node reports it stopped. Someone else
gets no page; an admin sees the launch (one on a loopback port, here) but never its token."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import requests
from django.utils import timezone
from playwright.sync_api import expect

from environments.models import Environment, Launch
from gpubook_agent import protocol
from nodes.services import node_rotate_credentials
from tests.browser.accessibility import assert_accessible
from tests.browser.helpers import Problems, give_session, open_page, save_screenshot
from tests.factories import book

pytestmark = pytest.mark.django_db(transaction=True)

NOTEBOOK = ["jupyter", "lab", "--no-browser", "--ServerApp.sock={socket}"]
SOCKET = "/run/gpubook-launches/gpubook-{reservation}-1/socket"  # where the node's agent makes it (issue 36)
PORT = 8123  # a launch of an environment that serves on {port} instead
TOKEN = "q3Vd8Zk1_xN0bLr7TfWc2HsYp9GmEa4J"  # made up, as secrets.token_urlsafe(24) gives one
# The notebook prints its URL with the token; the agent sends its output with the token masked (launches.py).
TAIL = (
    "[I 09:00:02.114 ServerApp] jupyterlab | extension was successfully loaded.\n"
    "[I 09:00:02.131 ServerApp] Jupyter Server 2.14 is running at:\n"
    "[I 09:00:02.131 ServerApp] http+unix://%2Frun%2Fgpubook-launches%2Fgpubook-1-1%2Fsocket/lab?token=<token>\n"
    "[I 09:00:02.131 ServerApp] Use Control-C to stop this server and shut down all kernels."
)
# The page refreshes its launches every 5 seconds: wait for two rounds, and a little more.
REFRESHED = 12_000


@pytest.fixture
def notebook(transactional_db) -> Environment:
    """An environment as an admin lists it: a Jupyter container that listens on {socket} (its token comes in
    JUPYTER_TOKEN)."""
    return Environment.objects.create(
        name="Jupyter, PyTorch 2.5",
        image="registry.example.org/lab/jupyter:2.5",
        command=NOTEBOOK,
        memory_max_gb=16,
        description="JupyterLab with PyTorch 2.5 and CUDA 12.4.",
    )


def running_booking(user, gpus):
    """``user``'s booking of ``gpus`` that began 30 minutes ago and runs two more hours."""
    now = timezone.now()
    return book(user, gpus, now - timedelta(minutes=30), now + timedelta(hours=2), purpose="notebooks", direct=True)


def report(server, node, launch: Launch, state: str, **fields) -> None:
    """Play the node's agent: a heartbeat, sent with its token, that tells the portal how ``launch`` stands."""
    status: protocol.LaunchStatus = {
        "reservation": launch.reservation_id,
        "number": launch.number,
        "state": state,
        "exit_code": None,
        "message": "",
        "port": None,
        "token": "",
        "tail": "",
        **fields,
    }
    body = protocol.heartbeat(
        backend="simulated", driver_version=None, applied_version=0, acls={}, launches=[status], sent_at=timezone.now()
    )
    token = node_rotate_credentials(node=node).agent_token
    response = requests.post(
        f"{server.url}/api/v1/agent/heartbeat/", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    response.raise_for_status()


def test_the_holder_launches_a_notebook_sees_it_run_and_stops_it(
    browser, page, live_server, alice, node, gpus, notebook, screenshot
):
    booking = running_booking(alice, gpus[:1])
    problems = Problems(page)
    open_page(page, live_server, alice, f"/reservations/{booking.pk}/")
    part = page.locator("#environments")
    expect(part.get_by_role("heading", level=2)).to_have_text("Environments")

    part.get_by_label("Environment").select_option(label=notebook.name)
    part.get_by_role("button", name="Launch").click()

    page.wait_for_url(f"{live_server.url}/reservations/{booking.pk}/#environments")
    expect(page.locator(".messages")).to_contain_text(f"{notebook.name} will start on {node.name} now.")
    launch = Launch.objects.get(reservation=booking)
    article = page.locator(f"#launch-{launch.number}")
    state = article.locator(".launch-state")
    expect(article.get_by_role("heading", level=3)).to_contain_text(notebook.name)
    expect(state).to_have_text("Waiting to start")
    expect(state).to_have_class(re.compile(r"\bstate-requested\b"))
    expect(article).to_contain_text("Asked for; the node starts it within seconds.")
    expect(article.locator(".launch-tail")).to_have_text("(nothing yet)")
    expect(page.locator("#launch-list")).to_have_attribute("data-refresh", "5")

    # The node starts it and says so in its next heartbeat; the page shows it without a reload.
    page.evaluate("window.notReloaded = true")  # gone if the page were loaded again
    path = SOCKET.format(reservation=booking.pk)
    report(live_server, node, launch, "running", socket=path, token=TOKEN, tail=TAIL)
    expect(state).to_have_text("Running", timeout=REFRESHED)
    expect(state).to_have_class(re.compile(r"\bstate-running\b"))
    expect(article.locator("details.launch-output")).to_have_attribute("open", "")
    expect(article.locator(".launch-tail")).to_have_text(TAIL)
    tunnel = f"ssh -N -L 8888:{path} alice@{node.hostname}"
    expect(article.locator("pre.access-lines")).to_have_text(tunnel)
    expect(article).to_contain_text("It listens on a Unix socket on the node that only your account can reach.")
    expect(article.get_by_role("link", name="http://127.0.0.1:8888/")).to_be_visible()
    expect(article.locator(".launch-token")).to_have_text(TOKEN)
    assert page.evaluate("window.notReloaded") is True
    article.scroll_into_view_if_needed()
    screenshot("running")

    # On a phone: one column, the long tunnel command and output lines stay inside the screen.
    phone = browser.new_page(viewport={"width": 390, "height": 844}, timezone_id="Europe/Berlin")
    open_page(phone, live_server, alice, f"/reservations/{booking.pk}/")
    on_phone = phone.locator(f"#launch-{launch.number}")
    expect(on_phone.locator(".launch-token")).to_have_text(TOKEN)
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    for shown in (on_phone.locator("pre.access-lines"), on_phone.locator(".launch-tail")):
        assert shown.evaluate("pre => pre.scrollWidth <= pre.clientWidth"), "wraps, no scrolling sideways"
    save_screenshot(phone, "test_the_holder_launches_a_notebook_sees_it_run_and_stops_it-phone")
    phone.close()
    # WCAG AA (axe-core) on a fresh page, in the dark scheme; the admin's page below is checked in the light one.
    dark = browser.new_page(viewport={"width": 1400, "height": 900}, color_scheme="dark")
    open_page(dark, live_server, alice, f"/reservations/{booking.pk}/")
    expect(dark.locator(f"#launch-{launch.number} .launch-state")).to_have_text("Running")
    assert_accessible(dark)
    save_screenshot(dark, "test_the_holder_launches_a_notebook_sees_it_run_and_stops_it-dark")
    dark.close()

    # She stops it: the node is asked to, and the page says it is on its way.
    article.get_by_role("button", name=f"Stop {notebook.name}").click()
    expect(page.locator(".messages")).to_contain_text(f"{notebook.name} is being stopped, with everything it started.")
    expect(article).to_contain_text("Stopping.")
    expect(state).to_have_text("Running")  # until the node says otherwise
    expect(article.get_by_role("button", name=re.compile("^Stop "))).to_have_count(0)
    launch.refresh_from_db()
    assert launch.stop_requested_at is not None

    # The node stops it and says so; the page shows it ended, and stops refreshing.
    page.evaluate("window.notReloaded = true")
    ended = f"{TAIL}\n[C 09:14:51.503 ServerApp] received signal 15, stopping\n[I 09:14:51.507 ServerApp] Shutting down"
    report(live_server, node, launch, "stopped", socket=path, token=TOKEN, tail=ended, exit_code=-15,
           message="stopped from the portal")  # fmt: skip
    expect(state).to_have_text("Stopped", timeout=REFRESHED)
    expect(state).to_have_class(re.compile(r"\bstate-stopped\b"))
    expect(article).to_contain_text("(exit code -15)")
    expect(article).to_contain_text("Stopped from the portal.")
    expect(article.locator(".launch-tail")).to_have_text(ended)
    expect(article).not_to_contain_text("Stopping.")
    expect(article.locator("pre.access-lines")).to_have_count(0)  # nothing listens any more
    expect(page.locator("#launch-list")).not_to_have_attribute("data-refresh", "5")
    assert page.evaluate("window.notReloaded") is True
    screenshot("stopped")
    assert problems.take() == []


def test_only_the_holder_and_the_admins_see_the_launch_and_only_she_its_token(
    browser, live_server, alice, bob, carol, node, gpus, notebook
):
    booking = running_booking(alice, gpus[:1])
    launch = Launch.objects.create(
        reservation=booking, number=1, environment=notebook, requested_by=alice, requested_at=timezone.now()
    )
    report(live_server, node, launch, "running", port=PORT, token=TOKEN, tail=TAIL)
    path = f"/reservations/{booking.pk}/"

    # Another researcher: the booking is not theirs, there is no page.
    other = browser.new_page()
    give_session(other.context, live_server, bob)
    assert other.goto(f"{live_server.url}{path}").status == 404
    other.close()

    # An admin: the launch and how it runs, but not the notebook's token (nor a form to launch as alice).
    admin = browser.new_page()
    open_page(admin, live_server, carol, path)
    article = admin.locator(f"#launch-{launch.number}")
    expect(article.locator(".launch-state")).to_have_text("Running")
    expect(article.locator(".launch-tail")).to_contain_text("Jupyter Server 2.14 is running")
    expect(article.locator("pre.access-lines")).to_have_text(f"ssh -N -L {PORT}:127.0.0.1:{PORT} alice@{node.hostname}")
    expect(article.locator(".launch-token")).to_have_count(0)
    expect(article).not_to_contain_text("give the token")
    expect(article.get_by_role("button", name=f"Stop {notebook.name}")).to_be_visible()  # admins may stop it
    expect(admin.locator("#environments form.launch-form")).to_have_count(0)
    assert TOKEN not in admin.content()
    assert_accessible(admin)  # the running launch in the light scheme
    admin.close()
