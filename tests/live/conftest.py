from __future__ import annotations

import pytest
from django.db import connection

from tests.live.server import AsgiServer


@pytest.fixture
def asgi_server(transactional_db):
    """daphne serving portal.asgi on the test database; the test's writes must be committed
    (transactional_db), since the server reads them over its own connections."""
    if connection.vendor != "postgresql":
        pytest.skip("the ASGI server subprocess shares the test database: PostgreSQL only")
    server = AsgiServer(LIVE_RECHECK_SECONDS="1")
    server.start()
    yield server
    server.stop()
