from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from accounts.services import api_token_create


def client_for(user) -> APIClient:
    """An API client that authenticates with a real personal token, as a script would."""
    client = APIClient()
    if user is not None:
        _, token = api_token_create(user=user, name="tests")
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def api():
    return client_for
