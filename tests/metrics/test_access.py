"""Who may read /metrics (metrics/access.py): the bearer token, or an address in the allow-list."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.test import Client

from tests.metrics.conftest import TOKEN

pytestmark = pytest.mark.django_db


def get(address: str = "127.0.0.1", token: str | None = None, method: str = "get"):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    client = Client(HTTP_HOST="127.0.0.1", REMOTE_ADDR=address, **headers)
    return getattr(client, method)("/metrics")


@pytest.fixture
def token_only(settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = TOKEN, []


@pytest.fixture
def allow_list(settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = "", ["10.0.5.7", "192.168.10.0/24", "fd00::/8"]


def test_with_nothing_configured_it_is_closed_to_everyone_even_localhost(settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = "", []
    for address in ("127.0.0.1", "::1", "10.0.5.7"):
        response = get(address, token="anything")
        assert response.status_code == 403
        assert response["Content-Type"] == "text/plain; charset=utf-8"
        assert "set METRICS_TOKEN" in response.content.decode()
        assert "METRICS_ALLOWED_IPS" in response.content.decode()


def test_the_right_token_opens_it_and_no_token_or_a_wrong_one_does_not(token_only):
    response = get(token=TOKEN)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert b"# TYPE gpubook_node_up gauge" in response.content

    missing = get()
    assert missing.status_code == 403
    assert b"Authorization: Bearer <METRICS_TOKEN>" in missing.content
    for wrong in ("wrong", TOKEN[:-1], TOKEN + "x", f"{TOKEN} {TOKEN}", "é"):
        response = get(token=wrong)
        assert response.status_code == 403, wrong
        assert b"does not match" in response.content
    basic = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Basic {TOKEN}").get("/metrics")
    assert basic.status_code == 403


def test_the_allow_list_matches_addresses_and_networks_by_remote_addr(allow_list):
    for address in ("10.0.5.7", "192.168.10.200", "fd00::1234", "::ffff:10.0.5.7"):
        assert get(address).status_code == 200, address
    for address in ("10.0.5.8", "192.168.11.1", "127.0.0.1", "::1", "fe80::1"):
        response = get(address)
        assert response.status_code == 403, address
        assert f"this request came from {address}".encode() in response.content


def test_forwarded_for_headers_are_not_believed(allow_list):
    client = Client(HTTP_HOST="127.0.0.1", REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="10.0.5.7")
    assert client.get("/metrics").status_code == 403


def test_with_both_set_either_the_token_or_the_address_is_enough(allow_list, settings):
    settings.METRICS_TOKEN = TOKEN
    assert get("10.0.5.7").status_code == 200
    assert get("203.0.113.9", token=TOKEN).status_code == 200
    response = get("203.0.113.9", token="wrong")
    assert response.status_code == 403
    assert b"does not match" in response.content and b"METRICS_ALLOWED_IPS" in response.content


def test_a_bad_allow_list_entry_is_a_system_check_error_and_never_a_500(settings):
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = "short", ["10.0.5.7", "10.0.0.0/33", "gpu-host"]
    assert get("10.0.5.7").status_code == 200
    assert get("10.0.5.8").status_code == 403
    ids = sorted(message.id for message in run_checks() if message.id.startswith("metrics."))
    assert ids == ["metrics.E001", "metrics.E001", "metrics.W001"]


def test_only_reads_are_answered_and_never_cached(token_only):
    assert get(token=TOKEN, method="post").status_code == 405
    assert get(token=TOKEN, method="head").status_code == 200
    assert "no-store" in get(token=TOKEN)["Cache-Control"]


def test_a_failing_database_makes_a_503_not_a_500(token_only, monkeypatch):
    from django.db import OperationalError

    def broken(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr("metrics.collector.fleet_status", broken)
    response = get(token=TOKEN)
    assert response.status_code == 503
    assert b"could not be read" in response.content
