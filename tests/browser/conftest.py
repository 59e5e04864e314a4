"""Browser tests: Debian's Chromium driven by Playwright against the real server (live_server).

They run in a pytest process of their own (scripts/test does it): Playwright's sync API runs an
event loop, so Django needs DJANGO_ALLOW_ASYNC_UNSAFE there, and it must not share a process with
asyncio-based tests. Every test here is marked ``browser``. Screenshots go to
``var/screenshots/`` (or $SCREENSHOT_DIR) for people to look at. The fixtures are here; the
helpers they and the tests share are in helpers.py.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from alerts.models import Alert
from alerts.records import Subject, alert_open
from nodes.models import Gpu
from nodes.services import gpu_drain
from reservations.models import MaintenanceWindow, ReservedCapacity
from reservations.services import reservation_cancel, reservation_create
from tests.browser.helpers import CHROMIUM_ARGS, chromium_path, save_screenshot, tomorrow_at, watch_csp
from tests.factories import book, node_with_gpus
from tests.live.server import heartbeat, post_agent, telemetry
from waitlist.services import Want, entry_join


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict) -> dict:
    executable = chromium_path()
    if executable is None:
        pytest.skip("chromium is not installed (apt-get install chromium; scripts/services does it)")
    return {**browser_type_launch_args, "executable_path": executable, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict) -> dict:
    return {**browser_context_args, "viewport": {"width": 1400, "height": 900}, "timezone_id": "Europe/Berlin"}


@pytest.fixture(autouse=True)
def no_csp_violation(browser, monkeypatch):
    """No browser test sees the Content-Security-Policy (kernel/csp.py) refuse anything: every browser context or page
    a test opens (pytest-playwright's ``page`` included) is watched, and a violation anywhere fails the test. A test
    that causes violations on purpose takes this fixture (the list of what was refused) and empties it."""
    violations: list[str] = []
    new_context, new_page = browser.new_context, browser.new_page

    def watched(make):
        def make_watched(**kwargs):
            made = make(**kwargs)
            watch_csp(made, violations.append)
            return made

        return make_watched

    monkeypatch.setattr(browser, "new_context", watched(new_context))
    monkeypatch.setattr(browser, "new_page", watched(new_page))
    yield violations
    assert not violations, "the Content-Security-Policy refused:\n" + "\n".join(violations)


@pytest.fixture
def screenshot(page, request):
    """``screenshot("step")`` saves the test's page as var/screenshots/<test>-<step>.png."""
    return lambda step: save_screenshot(page, f"{request.node.originalname}-{step}")


@pytest.fixture
def lab_in_every_state(asgi_server, live_lab):
    """GPUs free, in use, drained (on a node that reports, and on one that is offline), under maintenance, an
    open alert and, tomorrow, someone else's booking, a pending one, a slot offered from the waitlist and one waited
    for, maintenance and reserved capacity: every state the lists and pages draw."""
    now = timezone.now()
    researcher, admin, gpus = live_lab["researcher"], live_lab["admin"], live_lab["gpus"]
    running = book(researcher, [gpus[0]], now - timedelta(minutes=30), now + timedelta(hours=2), direct=True)
    book(researcher, [gpus[1]], tomorrow_at(6), tomorrow_at(8), purpose="thesis", direct=True)
    book(researcher, [gpus[1]], tomorrow_at(9), tomorrow_at(11), purpose="ablation", pending=True, direct=True)
    book(admin, [gpus[1]], tomorrow_at(12), tomorrow_at(15), purpose="benchmarks", direct=True)
    freed = reservation_create(user=admin, gpus=[gpus[0]], start=tomorrow_at(8), end=tomorrow_at(10))
    for gpu, start in ((gpus[0], 8), (gpus[1], 12)):  # the first is offered once freed, the second waits
        want = Want(
            gpus=[gpu],
            earliest_start=tomorrow_at(start),
            latest_end=tomorrow_at(start + 2),
            duration=timedelta(hours=2),
            auto_book=False,
        )
        entry_join(user=researcher, want=want)
    reservation_cancel(reservation=freed, actor=admin)
    hour = timedelta(hours=1)
    MaintenanceWindow.objects.create(
        node=live_lab["node"], gpu=gpus[1], start=tomorrow_at(16), end=tomorrow_at(18), reason="driver update"
    )
    vision = Group.objects.create(name="vision")
    window = ReservedCapacity.objects.create(
        group=vision, node=live_lab["node"], start=tomorrow_at(13), end=tomorrow_at(17), label="paper deadline"
    )
    window.gpus.set([gpus[0]])

    post_agent(asgi_server, live_lab, "heartbeat", heartbeat()).raise_for_status()
    post_agent(asgi_server, live_lab, "telemetry", telemetry(utilization=35)).raise_for_status()
    spare = Gpu.objects.create(node=live_lab["node"], index=2, uuid="GPU-live-2", model="NVIDIA A100", memory_mib=81920)
    gpu_drain(gpu=spare, reason="ECC errors")  # on a node that reports: shown as drained
    serviced = Gpu.objects.create(
        node=live_lab["node"], index=3, uuid="GPU-live-3", model="NVIDIA A100", memory_mib=81920
    )
    MaintenanceWindow.objects.create(
        node=live_lab["node"], gpu=serviced, start=now - timedelta(hours=1), end=now + timedelta(hours=1), reason="fans"
    )
    silent = node_with_gpus(3, name="silent-h100")  # never reported: offline
    drained, kept, _ = silent.gpus.order_by("index")
    gpu_drain(gpu=drained, reason="fan failure")
    MaintenanceWindow.objects.create(node=silent, gpu=kept, start=now - hour, end=now + hour, reason="new PSU")
    alert_open(subject=Subject(Alert.Kind.TEMPERATURE, live_lab["node"].pk, gpus[0].pk), now=now, details={})
    return {**live_lab, "running": running}
