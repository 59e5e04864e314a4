"""The production web server's worker: uvicorn under gunicorn, several processes on one port.

gunicorn starts ``WEB_PROCESSES`` of these (portal/gunicorn_conf.py) and restarts any that dies; each is an
ASGI server of its own (HTTP and the websockets), with its own database pool and channel-layer connection,
so the Redis pub/sub channel layer fans every broadcast out to all of them and the rate limits are counted
in Redis for all of them (docs/operations.md, "Scaling out"). ``scripts/run`` keeps one daphne process
(portal/serve.py).

Three things differ from uvicorn's defaults, on purpose:
- No proxy headers: the portal reads the client's address itself, ``NUM_PROXIES`` entries from the right of
  X-Forwarded-For (portal/settings.py); uvicorn rewriting it from the header first would let a client name
  its own address to the lockouts and rate limits.
- The access log goes through the portal's logging (settings.LOGGING), like daphne's in portal/serve.py: the
  RedactSecrets filter takes calendar feed secrets out of the paths, and LOG_FORMAT=json applies.
- No websocket compression (permessage-deflate): see CONFIG_KWARGS.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from uvicorn_worker import UvicornWorker


class PortalUvicornWorker(UvicornWorker):
    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {
        "loop": "auto",
        "http": "auto",
        "proxy_headers": False,
        "server_header": False,
        "lifespan": "off",  # the portal has no startup or shutdown work; saying so spares a log line per process
        # No permessage-deflate: every live update would be compressed once per open page (the same text 500
        # times), which took a ninth of a web process's CPU under bench/live.py; the updates are small JSON.
        "ws_per_message_deflate": False,
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # UvicornWorker hands uvicorn's loggers to gunicorn's handlers; the portal's own (the root logger's,
        # configured from settings.LOGGING when the application loads) write them instead.
        for name in ("uvicorn.access", "uvicorn.error"):
            logger = logging.getLogger(name)
            logger.handlers = []
            logger.propagate = True
            logger.setLevel(logging.INFO)
