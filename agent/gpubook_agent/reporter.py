"""Reports to the portal over HTTP(S) with the node's token: heartbeat, events, telemetry.

The portal may be down for a while: events wait in a bounded buffer and go out in order when
it is back; heartbeats and telemetry are only ever the latest state, so a missed one is
simply skipped. Nothing the enforcer does waits on this thread.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from gpubook_agent import protocol
from gpubook_agent.config import AgentConfig
from gpubook_agent.snapshot import MAX_SNAPSHOT_BYTES

log = logging.getLogger(__name__)

EVENT_BUFFER = 10_000
MAX_PULL_INTERVAL = 600.0  # seconds between pulls that keep failing (or bring nothing this node can verify)


class PortalUnreachable(Exception):
    """Try again later: the portal is down, slow, overloaded, or does not know our token (yet)."""


class ReportRejected(Exception):
    """The portal read the report and refused its content (400, 413, 422): sending it again
    would fail again and hold up every later event, so it is logged and dropped."""


REJECTED_STATUSES = frozenset({400, 413, 422})


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered, never followed. urllib would send the request again, Authorization header
    (the node token) included, wherever ``Location`` points: another host, or plain http. The portal never
    redirects its agent endpoints, so a redirect means PORTAL_URL is wrong (http:// of an https portal, an
    old address) or someone in the path wants the token; either way an error that names the Location is
    what an admin needs. Stripping the header instead would only turn it into a 401 from the other end,
    and a POST that urllib follows arrives as a GET without its body anyway."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


def redirect_refusal(error: urllib.error.HTTPError) -> str:
    """What to say about a 3xx answer the client did not follow."""
    location = str(error.headers.get("Location", ""))[:200] if error.headers else ""
    return f"HTTP {error.code} redirect to {location!r}, not followed (the node token goes only to PORTAL_URL)"


class PortalClient:
    """POSTs JSON to the portal's agent endpoints. Every request goes through ``open``, which never
    follows a redirect."""

    def __init__(self, config: AgentConfig, timeout: float = 5.0) -> None:
        self.portal_url = config.portal_url.rstrip("/")
        self.base = self.portal_url + protocol.AGENT_API_PATH  # the agent's endpoints are below it
        self.token = config.agent_token
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=config.ca_file or None)
        self.opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self.context), _RefuseRedirects)

    def open(self, request: urllib.request.Request) -> Any:
        """``urlopen`` with this client's timeout and TLS context, redirects refused (HTTPError 3xx)."""
        return self.opener.open(request, timeout=self.timeout)

    def request(self, endpoint: str, body: Mapping[str, object]) -> urllib.request.Request:
        """The POST of ``body`` to ``endpoint`` with the node's token, for ``open``."""
        # The scheme is checked when the config loads (http or https only).
        return urllib.request.Request(  # noqa: S310
            self.portal_url + protocol.agent_path(endpoint),
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )

    def post(self, endpoint: str, body: Mapping[str, object]) -> object:
        """The portal's answer, parsed (whatever JSON it is: the caller checks its shape)."""
        request = self.request(endpoint, body)
        try:
            with self.open(request) as response:
                answer: object = json.loads(response.read() or b"{}")
                return answer
        except urllib.error.HTTPError as error:
            if 300 <= error.code < 400:
                message = f"{endpoint}: {redirect_refusal(error)}: set PORTAL_URL to the address the portal answers at"
                raise PortalUnreachable(message) from error
            detail = error.read()[:500].decode(errors="replace")
            failure = ReportRejected if error.code in REJECTED_STATUSES else PortalUnreachable
            raise failure(f"{endpoint}: HTTP {error.code}: {detail}") from error
        except (TimeoutError, urllib.error.URLError, OSError, ValueError) as error:
            raise PortalUnreachable(f"{endpoint}: {error}") from error

    def fetch(self, endpoint: str, *, limit: int) -> bytes:
        """GET ``endpoint`` with the node's token: its body, of which at most ``limit`` + 1 bytes are read
        (the caller refuses a body past ``limit`` without the rest ever being read)."""
        request = urllib.request.Request(  # noqa: S310 - the scheme is checked when the config loads
            self.portal_url + protocol.agent_path(endpoint),
            method="GET",
            headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
        )
        try:
            with self.open(request) as response:
                return bytes(response.read(limit + 1))
        except urllib.error.HTTPError as error:
            if 300 <= error.code < 400:
                raise PortalUnreachable(f"{endpoint}: {redirect_refusal(error)}") from error
            detail = error.read()[:500].decode(errors="replace")
            failure = ReportRejected if error.code in REJECTED_STATUSES else PortalUnreachable
            raise failure(f"{endpoint}: HTTP {error.code}: {detail}") from error
        except http.client.HTTPException as error:  # a body cut short, a malformed answer
            raise PortalUnreachable(f"{endpoint}: {type(error).__name__}: {error}") from error
        except (TimeoutError, urllib.error.URLError, OSError, ValueError) as error:
            raise PortalUnreachable(f"{endpoint}: {error}") from error


class Reporter:
    """Buffers events and sends heartbeats and telemetry on their own schedule."""

    def __init__(self, config: AgentConfig, client: PortalClient | None = None) -> None:
        self.config = config
        self.client = client or PortalClient(config)
        self._events: deque[dict[str, object]] = deque(maxlen=EVENT_BUFFER)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._heartbeat_now = threading.Event()
        self._thread: threading.Thread | None = None
        # main.py sets these to build the bodies (protocol.heartbeat, a list of protocol.GpuReading).
        self.heartbeat: Callable[[], Mapping[str, object]] = dict
        self.telemetry: Callable[[], list[protocol.GpuReading]] = list
        self._portal_down_since: float | None = None
        # The pull (docs/agent.md): main.py sets these to the enforcer's.
        self.seen_version: Callable[[], int] = lambda: 0
        self.offer: Callable[[Any], str] | None = None
        self._behind: tuple[int, float] | None = None  # the portal's version, and when a reply first showed it
        self._pull_interval = config.pull_after_seconds  # doubles while pulls fail, up to MAX_PULL_INTERVAL
        self._next_pull = 0.0  # monotonic: no pull before this

    def event(self, kind: str, **fields: object) -> None:
        """Record one event (any thread); it is sent as soon as the reporter thread gets to it."""
        if len(self._events) == self._events.maxlen:
            log.warning("event buffer full (%d): the oldest event is dropped", self._events.maxlen)
        record = protocol.event(kind, fields)  # within what the portal accepts
        log.info("event %s", record)
        with self._lock:
            self._events.append(record)
        self._wake.set()

    def heartbeat_soon(self) -> None:
        """Send a heartbeat now rather than at its time (any thread): a launch changed, and people watch it."""
        self._heartbeat_now.set()
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
                self._send(protocol.TELEMETRY, lambda: protocol.telemetry(self.telemetry()))
            if now >= next_heartbeat or self._heartbeat_now.is_set():
                self._heartbeat_now.clear()
                next_heartbeat = now + self.config.heartbeat_seconds
                # A body the callable built with protocol.heartbeat has its own sent_at, of the same moment.
                self._send(
                    protocol.HEARTBEAT,
                    lambda: {"sent_at": protocol.timestamp(), **self.heartbeat()},
                    on_reply=self.heartbeat_reply,
                )
            pull_at = self.pull_due()
            if pull_at is not None and time.monotonic() >= pull_at:
                try:
                    self.pull(now=time.monotonic())
                except Exception:  # the reporter thread carries on whatever a pull trips over
                    log.exception("pulling the snapshot failed")
                    self._pulled(time.monotonic(), succeeded=False)
                pull_at = self.pull_due()
            wake_at = min(next_heartbeat, next_telemetry, math.inf if pull_at is None else pull_at)
            self._wake.wait(max(0.05, wake_at - time.monotonic()))

    # -- the pull: the safety net under the push --------------------------------------------------

    def heartbeat_reply(self, reply: object) -> None:
        if isinstance(reply, dict):
            self.note_portal_version(reply.get("lease_version"), now=time.monotonic())

    def note_portal_version(self, version: object, *, now: float) -> None:
        """The ``lease_version`` of a heartbeat reply: the newest snapshot the portal has issued to this
        node (pushed or pulled). When it is ahead of what this node has seen, a push is on its way, or
        was lost: a pull falls due PULL_AFTER_SECONDS after the first reply that showed it ahead."""
        if not isinstance(version, int) or isinstance(version, bool):
            return
        seen = self.seen_version()
        if self._behind is not None and seen >= self._behind[0]:
            self._behind = None  # the push came
        if self._behind is None and version > seen:
            self._behind = (version, now)

    def pull_due(self) -> float | None:
        """When the next pull is due (monotonic), or None while the node is not behind."""
        if self._behind is None or self.offer is None:
            return None
        return max(self._behind[1] + self.config.pull_after_seconds, self._next_pull)

    def pull(self, *, now: float) -> str | None:
        """Fetch this node's signed snapshot from the portal and offer it exactly as a push is offered
        (same size, nesting, signature and freshness checks): the offer's outcome, or None when no pull
        was needed or none could be fetched.

        Pulls are rate-limited here: never two within PULL_AFTER_SECONDS, and while they fail (the
        portal unreachable, a snapshot this node cannot verify) the wait doubles up to
        MAX_PULL_INTERVAL. A pull makes the portal issue a new version, which is the one this node
        then has: the next heartbeat reply shows it level, so a pull never calls for another."""
        if self._behind is None or self.offer is None:
            return None
        target, since = self._behind
        seen = self.seen_version()
        if seen >= target:
            self._behind = None
            return None
        log.warning(
            "the portal issued lease version %d and this node has seen only %d (%.0f s): pulling the snapshot",
            target,
            seen,
            now - since,
        )
        try:
            body = self.client.fetch(protocol.SNAPSHOT, limit=MAX_SNAPSHOT_BYTES)
        except (PortalUnreachable, ReportRejected) as error:
            self._pulled(now, succeeded=False)
            log.warning("cannot pull the snapshot (next try in %.0f s): %s", self._pull_interval, error)
            return None
        outcome = self.offer(body)
        succeeded = self.seen_version() >= target
        self._pulled(now, succeeded=succeeded)
        if succeeded:
            self._behind = None
        else:
            log.warning("the pulled snapshot was %s (next pull in %.0f s)", outcome, self._pull_interval)
        return outcome

    def _pulled(self, now: float, *, succeeded: bool) -> None:
        if succeeded:
            self._pull_interval = self.config.pull_after_seconds
        else:
            self._pull_interval = min(self._pull_interval * 2, max(MAX_PULL_INTERVAL, self.config.pull_after_seconds))
        self._next_pull = now + self._pull_interval

    def _send_events(self) -> None:
        while True:
            with self._lock:
                batch = [self._events.popleft() for _ in range(min(protocol.EVENTS_PER_POST, len(self._events)))]
            if not batch:
                return
            if not self._send(protocol.EVENTS, protocol.events(batch)):
                self._put_back(batch)
                return

    def _put_back(self, batch: list[dict[str, object]]) -> None:
        """Return an unsent batch to the front, in order. If events recorded meanwhile filled the buffer, the
        oldest drop first, as with ``event``: a bare ``extendleft`` on a full deque would drop the newest."""
        with self._lock:
            capacity = self._events.maxlen
            overflow = 0 if capacity is None else max(0, len(batch) + len(self._events) - capacity)
            if overflow:
                log.warning("event buffer full: dropping the %d oldest event(s)", overflow)
            self._events.extendleft(reversed(batch[overflow:]))

    def _send(
        self,
        endpoint: str,
        body: Mapping[str, object] | Callable[[], Mapping[str, object]],
        on_reply: Callable[[object], None] | None = None,
    ) -> bool:
        """POST one report (``body`` may be a callable, to build it only when it is due); the portal's
        answer goes to ``on_reply``."""
        try:
            reply = self.client.post(endpoint, body() if callable(body) else body)
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
        if on_reply is not None:
            try:
                on_reply(reply)
            except Exception:
                log.exception("handling the portal's answer to a %s report failed", endpoint)
        return True
