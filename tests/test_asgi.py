"""portal/asgi.py: requests through the ASGI application (as daphne and uvicorn serve them) run the whole
middleware chain and the view, now in one trip to a thread."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator

from portal.asgi import django_application

pytestmark = pytest.mark.django_db(transaction=True)


def get(path: str, method: str = "GET", body: bytes = b"", headers: list | None = None) -> dict:
    headers = [(b"host", b"127.0.0.1"), *(headers or [])]
    communicator = HttpCommunicator(django_application, method, path, body=body, headers=headers)
    response = async_to_sync(communicator.get_response)(timeout=10)
    response["headers"] = {name.decode().lower(): value.decode() for name, value in response["headers"]}
    return response


def test_a_page_gets_the_middlewares_headers_and_cookies():
    response = get("/accounts/login/")
    assert response["status"] == 200
    assert response["headers"]["x-frame-options"] == "DENY"  # XFrameOptionsMiddleware
    assert response["headers"]["x-content-type-options"] == "nosniff"  # SecurityMiddleware
    assert "csrftoken=" in response["headers"].get("set-cookie", "")  # CsrfViewMiddleware, on the login form


def test_a_post_without_csrf_is_refused_by_the_middleware():
    response = get("/accounts/login/", method="POST", body=b"username=a&password=b")
    assert response["status"] == 403


def test_the_api_answers_json_errors_through_the_same_chain():
    response = get("/api/v1/me/")
    assert response["status"] in (401, 403)
    assert response["headers"]["content-type"].startswith("application/json")
    assert b"error" in response["body"]
