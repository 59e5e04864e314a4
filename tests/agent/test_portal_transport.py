"""How the agent talks to the portal: HTTPS unless ALLOW_INSECURE_PORTAL says otherwise, and its token
never follows a redirect. Real HTTP(S) servers on 127.0.0.1 (a throwaway CA for TLS), the real client,
and the real agent process where the behaviour is at its start.
"""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S310

from __future__ import annotations

import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings

from gpubook_agent.config import config_from_values
from gpubook_agent.reporter import PortalClient, PortalUnreachable
from gpubook_agent.selfcheck import OK, WARN, run_checks
from tests.agent.harness import AgentRun, HeaderRecorder, RecordingPortal, Redirector, local_ca, wait_for

TOKEN = "gpn_the-node-token"
REDIRECTS = [301, 302, 303, 307, 308]


@pytest.fixture
def elsewhere() -> Iterator[HeaderRecorder]:
    recorder = HeaderRecorder()
    yield recorder
    recorder.stop()


@pytest.fixture
def redirector(elsewhere: HeaderRecorder) -> Iterator[Redirector]:
    """The "portal": every request redirected to ``elsewhere``."""
    server = Redirector(elsewhere.url + "/api/v1/agent/heartbeat/", tls=True)
    yield server
    server.stop()


def client_for(url: str) -> PortalClient:
    return PortalClient(
        config_from_values(
            {
                "NODE_NAME": "gpu-a100",
                "BROKER_URL": "redis://127.0.0.1:1/0",
                "PORTAL_URL": url,
                "AGENT_TOKEN": TOKEN,
                "LEASE_SECRET": "s3cret",
                "CA_FILE": local_ca().ca_file,
            }
        )
    )


def tokens_seen(recorder: HeaderRecorder) -> list[str]:
    return [headers.get("Authorization", "") for _, _, headers in recorder.requests]


# -- redirects -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_plain_urllib_would_carry_the_token_to_wherever_a_redirect_points(redirector, elsewhere, method):
    """The control: urllib's own redirect handling sends the Authorization header on. This is what the
    client below must not do."""
    context = ssl.create_default_context(cafile=local_ca().ca_file)
    request = urllib.request.Request(
        redirector.url + "/api/v1/agent/heartbeat/",
        data=b"{}" if method == "POST" else None,
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}"},
    )

    with urllib.request.urlopen(request, timeout=5, context=context) as response:
        response.read()

    assert tokens_seen(elsewhere) == [f"Bearer {TOKEN}"]


@pytest.mark.parametrize("status", REDIRECTS)
def test_the_client_refuses_a_redirect_of_a_report_and_names_the_location(redirector, elsewhere, status):
    redirector.status = status
    client = client_for(redirector.url)

    with pytest.raises(PortalUnreachable) as refused:
        client.post("heartbeat", {"sent_at": "2026-12-03T14:00:00+00:00"})

    assert str(refused.value) == (
        f"heartbeat: HTTP {status} redirect to '{elsewhere.url}/api/v1/agent/heartbeat/', not followed "
        "(the node token goes only to PORTAL_URL): set PORTAL_URL to the address the portal answers at"
    )
    assert redirector.answered == 1
    assert elsewhere.requests == []


@pytest.mark.parametrize("status", REDIRECTS)
def test_the_client_refuses_a_redirect_of_a_get_too(redirector, elsewhere, status):
    """Every request of the client goes through ``open`` (a pull of the snapshot is a GET)."""
    redirector.status = status
    client = client_for(redirector.url)
    request = urllib.request.Request(
        client.base + "snapshot/", method="GET", headers={"Authorization": f"Bearer {client.token}"}
    )

    with pytest.raises(urllib.error.HTTPError) as refused:
        client.open(request)

    assert refused.value.code == status
    assert refused.value.headers["Location"] == f"{elsewhere.url}/api/v1/agent/heartbeat/"
    assert elsewhere.requests == []


def test_the_client_still_talks_to_the_portal_itself_over_https():
    portal = RecordingPortal(tls=True)
    try:
        assert client_for(portal.url).post("heartbeat", {"sent_at": "now"}) == {}
    finally:
        portal.stop()

    assert portal.received["heartbeat"] == [{"sent_at": "now"}]


# -- the real agent ----------------------------------------------------------------------------------


@pytest.fixture
def new_agent() -> Iterator[Callable[..., AgentRun]]:
    runs: list[AgentRun] = []

    def make(**options: Any) -> AgentRun:
        run = AgentRun(broker_url=settings.CELERY_BROKER_URL, **options)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.cleanup()


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the agent sets ACLs")


def test_the_agent_refuses_an_http_portal_url_without_the_flag(new_agent):
    needs_root()
    portal = RecordingPortal()
    try:
        agent = new_agent(portal_url=portal.url, allow_insecure_portal="")

        result = agent.run_until_exit()
    finally:
        portal.stop()

    assert result.returncode == 2
    assert result.stderr.startswith(f"gpubook-agent: PORTAL_URL '{portal.url}' is plain http: ")
    assert "set ALLOW_INSECURE_PORTAL=true for a demo or a test network" in result.stderr
    assert portal.received == {"heartbeat": [], "events": [], "telemetry": []}


def test_with_the_flag_the_agent_reports_over_http_and_the_self_check_warns(new_agent):
    needs_root()
    portal = RecordingPortal()
    try:
        agent = new_agent(portal_url=portal.url)  # the harness sets ALLOW_INSECURE_PORTAL=true for http
        assert "ALLOW_INSECURE_PORTAL=true" in agent.config_path.read_text()
        agent.start()
        assert wait_for(lambda: portal.received["heartbeat"], timeout=10)
        checks = {check.name: check for check in run_checks(str(agent.config_path), environ={})}
    finally:
        portal.stop()

    assert checks["config"].status == WARN
    assert "travel in clear (http)" in checks["config"].message
    assert checks["portal"].status == OK


def test_over_https_the_agent_needs_no_flag(new_agent):
    needs_root()
    portal = RecordingPortal(tls=True)
    try:
        agent = new_agent(portal_url=portal.url, ca_file=local_ca().ca_file)
        assert "ALLOW_INSECURE_PORTAL=\n" in agent.config_path.read_text()
        agent.start()

        assert wait_for(lambda: portal.received["heartbeat"] and portal.received["telemetry"], timeout=10)
    finally:
        portal.stop()


def test_the_agent_sends_its_token_nowhere_a_redirect_points(new_agent, redirector, elsewhere):
    needs_root()
    agent = new_agent(portal_url=redirector.url, ca_file=local_ca().ca_file)
    agent.start()

    assert wait_for(lambda: redirector.answered >= 3, timeout=10)  # heartbeat, telemetry, events (and again)
    assert wait_for(lambda: any("not followed" in line for line in agent.log), timeout=5)
    line = next(line for line in agent.log if "not followed" in line)
    assert "cannot report to the portal (will keep trying)" in line
    assert f"redirect to '{elsewhere.url}/api/v1/agent/heartbeat/', not followed" in line
    assert elsewhere.requests == []
    assert agent.process is not None and agent.process.poll() is None  # it keeps enforcing meanwhile
