from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def outage_lines_captured(caplog):
    """These tests read the portal's log lines through caplog. A test run before them in the same process may have
    raised the root logger's level (the agent's own tests start agents in-process), which would hide the WARNING
    lines they look for: the loggers that write them are set to INFO here, for the test's length."""
    for name in ("kernel.outages", "live.outages", "django.request"):
        caplog.set_level(logging.INFO, logger=name)
