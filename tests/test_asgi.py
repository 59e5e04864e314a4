"""portal/asgi.py: requests through the ASGI application (as daphne and uvicorn serve them) run the whole
middleware chain and the view, now in one trip to a thread."""

from __future__ import annotations

import subprocess
import sys

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


def test_loading_the_application_leaves_what_it_loaded_out_of_garbage_collection():
    """kernel/runtime.py: the server's modules are frozen out of the collector's full passes (each walked them
    all, and stopped the process for 100 ms and more under load); cycles made later are still collected."""
    script = (
        "import gc, sys\n"
        "assert gc.get_freeze_count() == 0\n"
        "import portal.asgi\n"
        "frozen = gc.get_freeze_count()\n"
        "class Cycle: pass\n"
        "a, b = Cycle(), Cycle(); a.other, b.other = b, a; del a, b\n"
        "print(frozen, gc.collect())\n"
    )
    done = subprocess.run(  # noqa: S603 - a fresh interpreter: this one may have loaded the application already
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    frozen, collected = (int(value) for value in done.stdout.split()[-2:])
    assert frozen > 10_000  # Django and the portal's apps, at least
    assert collected >= 2
