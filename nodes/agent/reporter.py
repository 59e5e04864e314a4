"""Reports to the portal over HTTP(S) with the node's token: heartbeat, events, telemetry.

The portal may be down for a while: events wait in a bounded buffer and go out in order when
it is back; heartbeats and telemetry are only ever the latest state, so a missed one is
simply skipped. Nothing the enforcer does waits on this thread.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from nodes.agent.config import AgentConfig

log = logging.getLogger(__name__)

EVENT_BUFFER = 10_000
EVENTS_PER_POST = 500
MAX_PIDS = 1000  # the portal's limits for one event (nodes/agent_serializers.py)
TEXT_LIMITS = {"user": 32, "message": 2000, "process": 64}


class PortalUnreachable(Exception):
    """Try again later: the portal is down, slow, overloaded, or does not know our token (yet)."""


class ReportRejected(Exception):
    """The portal read the report and refused its content (400, 413, 422): sending it again
    would fail again and hold up every later event, so it is logged and dropped."""


REJECTED_STATUSES = frozenset({400, 413, 422})


class PortalClient:
    """POSTs JSON to the portal's agent endpoints."""

    def __init__(self, config: AgentConfig, timeout: float = 5.0) -> None:
        self.base = config.portal_url.rstrip("/") + "/api/v1/agent/"
        self.token = config.agent_token
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=config.ca_file or None)

    def request(self, endpoint: str, body: dict[str, Any]) -> urllib.request.Request:
        """The POST of ``body`` to ``endpoint`` with the node's token, for ``urlopen`` with this client's
        timeout and context."""
        # The scheme is checked when the config loads (http or https only).
        return urllib.request.Request(  # noqa: S310
            self.base + endpoint + "/",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )

    def post(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        request = self.request(endpoint, body)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as response:  # noqa: S310
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            detail = error.read()[:500].decode(errors="replace")
            failure = ReportRejected if error.code in REJECTED_STATUSES else PortalUnreachable
            raise failure(f"{endpoint}: HTTP {error.code}: {detail}") from error
        except (TimeoutError, urllib.error.URLError, OSError, ValueError) as error:
            raise PortalUnreachable(f"{endpoint}: {error}") from error


class Reporter:
    """Buffers events and sends heartbeats and telemetry on their own schedule."""

    def __init__(self, config: AgentConfig, client: PortalClient | None = None) -> None:
        self.config = config
        self.client = client or PortalClient(config)
        self._events: deque[dict[str, Any]] = deque(maxlen=EVENT_BUFFER)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.heartbeat: Callable[[], dict[str, Any]] = dict
        self.telemetry: Callable[[], list[dict[str, Any]]] = list
        self._portal_down_since: float | None = None

    def event(self, kind: str, **fields: Any) -> None:
        """Record one event (any thread); it is sent as soon as the reporter thread gets to it."""
        if len(self._events) == self._events.maxlen:
            log.warning("event buffer full (%d): the oldest event is dropped", self._events.maxlen)
        record = {
            "kind": kind,
            "at": datetime.now(UTC).isoformat(),
            **{k: v for k, v in fields.items() if v is not None},
        }
        # Within what the portal accepts, so one event never gets its whole batch refused.
        if isinstance(record.get("pids"), list) and len(record["pids"]) > MAX_PIDS:
            record["pids"] = record["pids"][:MAX_PIDS]
        for key, limit in TEXT_LIMITS.items():
            if isinstance(record.get(key), str) and len(record[key]) > limit:
                record[key] = record[key][: limit - 1] + "…"
        log.info("event %s", record)
        with self._lock:
            self._events.append(record)
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agent-reporter", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop, after one last try to deliver the events still buffered."""
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout)
        self._send_events()

    def _run(self) -> None:
        next_heartbeat = next_telemetry = time.monotonic()
        while not self._stop.is_set():
            self._wake.clear()
            now = time.monotonic()
            self._send_events()
            if now >= next_telemetry:
                next_telemetry = now + self.config.telemetry_seconds
                self._send("telemetry", lambda: {"sent_at": _now(), "gpus": self.telemetry()})
            if now >= next_heartbeat:
                next_heartbeat = now + self.config.heartbeat_seconds
                self._send("heartbeat", lambda: {"sent_at": _now(), **self.heartbeat()})
            self._wake.wait(max(0.05, min(next_heartbeat, next_telemetry) - time.monotonic()))

    def _send_events(self) -> None:
        while True:
            with self._lock:
                batch = [self._events.popleft() for _ in range(min(EVENTS_PER_POST, len(self._events)))]
            if not batch:
                return
            if not self._send("events", {"events": batch}):
                self._put_back(batch)
                return

    def _put_back(self, batch: list[dict[str, Any]]) -> None:
        """Return an unsent batch to the front, in order. If events recorded meanwhile filled the buffer, the
        oldest drop first, as with ``event``: a bare ``extendleft`` on a full deque would drop the newest."""
        with self._lock:
            capacity = self._events.maxlen
            overflow = 0 if capacity is None else max(0, len(batch) + len(self._events) - capacity)
            if overflow:
                log.warning("event buffer full: dropping the %d oldest event(s)", overflow)
            self._events.extendleft(reversed(batch[overflow:]))

    def _send(self, endpoint: str, body: dict[str, Any] | Callable[[], dict[str, Any]]) -> bool:
        """POST one report (``body`` may be a callable, to build it only when it is due)."""
        try:
            self.client.post(endpoint, body() if callable(body) else body)
        except ReportRejected as error:
            log.error("the portal refused a %s report; dropping it: %s", endpoint, error)
            return True
        except PortalUnreachable as error:
            if self._portal_down_since is None:
                self._portal_down_since = time.monotonic()
                log.warning("cannot report to the portal (will keep trying): %s", error)
            return False
        except Exception:
            log.exception("building the %s report failed", endpoint)
            return False
        if self._portal_down_since is not None:
            log.warning("portal reachable again after %.0f s", time.monotonic() - self._portal_down_since)
            self._portal_down_since = None
        return True


def _now() -> str:
    return datetime.now(UTC).isoformat()
