"""Browser tests: Debian's Chromium driven by Playwright against the real server (live_server).

They run in a pytest process of their own (scripts/test does it): Playwright's sync API runs an
event loop, so Django needs DJANGO_ALLOW_ASYNC_UNSAFE there, and it must not share a process with
asyncio-based tests. Every test here is marked ``browser``. Screenshots go to
``var/screenshots/`` (or $SCREENSHOT_DIR) for people to look at. The fixtures are here; the
helpers they and the tests share are in helpers.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.helpers import CHROMIUM_ARGS, chromium_path, save_screenshot


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


@pytest.fixture
def screenshot(page, request):
    """``screenshot("step")`` saves the test's page as var/screenshots/<test>-<step>.png."""
    return lambda step: save_screenshot(page, f"{request.node.originalname}-{step}")
