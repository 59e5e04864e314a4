"""The portal's web server: daphne, with its access log written through the portal's logging.

Run it with daphne's own arguments, as the Procfile, the Dockerfile and docker-compose do::

    python -m portal.serve -b 127.0.0.1 -p 8000 portal.asgi:application

Plain ``daphne`` writes its access log straight to stdout, past every logging filter, and a calendar
feed's URL is its secret (``GET /feeds/17.mine.<mac>.ics``). Here each access line goes to the
``daphne.access`` logger instead, so settings.LOGGING applies to it: the RedactSecrets filter
(kernel/logs.py) takes the secret out, and LOG_FORMAT=json makes it one JSON object like every other
line. The line itself is daphne's (client, request line, status, size); it goes to stderr, at INFO.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import daphne.cli
from daphne.access import AccessLogGenerator

access_log = logging.getLogger("daphne.access")


class LoggingAccessLog(AccessLogGenerator):
    """daphne's access log entries, handed to logging rather than written to a stream."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)

    def write_entry(
        self,
        host: str,
        date: datetime,
        request: str,
        status: int | None = None,
        length: int | None = None,
        ident: str | None = None,
        user: str | None = None,
    ) -> None:
        access_log.info(
            '%s %s %s [%s] "%s" %s %s',
            host,
            ident or "-",
            user or "-",
            date.strftime("%d/%b/%Y:%H:%M:%S"),
            request,
            status or "-",
            length or "-",
            extra={"client": host, "request_line": request, "status_code": status, "size": length},
        )


def main() -> None:
    # daphne's command line builds its access log from this module-level name once the application
    # is loaded (and with it settings.LOGGING); everything else is daphne as it is.
    daphne.cli.AccessLogGenerator = LoggingAccessLog
    daphne.cli.CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
