"""Browser tests: Debian's Chromium driven by Playwright against the real server (live_server).

They run in a pytest process of their own (scripts/test does it): Playwright's sync API runs an
event loop, so Django needs DJANGO_ALLOW_ASYNC_UNSAFE there, and it must not share a process with
asyncio-based tests. Every test here is marked ``browser``. Screenshots go to
``var/screenshots/`` (or $SCREENSHOT_DIR) for people to look at.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.conf import settings

CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")
# Without these Chromium keeps calling home, and this machine's closed network refuses each call.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


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


def save_screenshot(page, name: str) -> Path:
    """Save the page as var/screenshots/<name>.png (or under $SCREENSHOT_DIR)."""
    directory = Path(os.environ.get("SCREENSHOT_DIR", settings.BASE_DIR / "var" / "screenshots"))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture
def screenshot(page, request):
    """``screenshot("step")`` saves the test's page as var/screenshots/<test>-<step>.png."""
    return lambda step: save_screenshot(page, f"{request.node.originalname}-{step}")


def chromium_path() -> str | None:
    """Debian's Chromium, where it is installed (None when it is not)."""
    return next((path for path in CHROMIUM_CANDIDATES if os.path.exists(path)), shutil.which("chromium"))


def log_in(page, server, username: str, password: str = "correct horse battery staple") -> None:  # noqa: S107 - the factories' test password
    """Log in through the login form; ``server`` is live_server (or anything with .url) or the base URL."""
    base = server if isinstance(server, str) else server.url
    page.goto(f"{base}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/")
