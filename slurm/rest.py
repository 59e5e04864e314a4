"""Talking to a Slurm cluster's controller through slurmrestd's REST API (issue 23): the same reads and writes as
slurm/scontrol.py, for clusters that offer slurmrestd rather than a shell on the controller.

One data_parser version is pinned, DATA_PARSER: v0.0.43, the first whose reservations can be written (POST and
DELETE), offered by slurmrestd 25.05, 25.11 and 26.05 (deprecated in 26.05, to be removed in 27.05; Slurm's
CHANGELOG/slurm-25.05.md and RELEASE_NOTES.md). The endpoints, as Slurm's doc/html/rest_api.shtml lists them:

- ``GET  /slurm/v0.0.43/ping/``: the controllers' pings; every answer's ``meta.slurm`` names slurmrestd's release.
- ``GET  /slurm/v0.0.43/nodes/``, ``GET /slurm/v0.0.43/reservations/``.
- ``POST /slurm/v0.0.43/reservation``: one reservation description; slurmrestd creates it, or updates it when a
  reservation of that name exists (src/slurmrestd/plugins/openapi/slurmctld/reservations.c).
- ``DELETE /slurm/v0.0.43/reservation/{reservation_name}``.

Requests carry ``X-SLURM-USER-NAME`` and ``X-SLURM-USER-TOKEN`` (a JWT, ``scontrol token``); bodies are built as
JSON, never as text. A failure comes back as ``{"errors": [{"description", "error_number", "error", "source"}]}``
with an HTTP status (500, 422; 502 or 504 when slurmrestd could not reach slurmctld), or 401 with a plain-text body
when the credentials are refused. Every failure here raises SlurmError (SlurmUnreachable where nothing was
decided), with Slurm's own words where it gave some and never the token. The token goes to the configured URL only:
environment proxies are not used and redirects are not followed.

Only reservations named with RESERVATION_PREFIX are the portal's: nothing here changes another.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from email.message import Message
from typing import Any, NoReturn

from slurm.controller import Capabilities, parse_version
from slurm.scontrol import (
    IN_USE_WORDS,
    JOB_ID_RE,
    TIMEOUT_SECONDS,
    TRES_RE,
    SlurmError,
    SlurmInUse,
    SlurmNode,
    SlurmReservation,
    SlurmUnreachable,
    check_reservation,
    is_ours,
    node_from,
)

DATA_PARSER = "v0.0.43"
# HTTP statuses with which slurmrestd says it could not reach slurmctld (src/slurmrestd/operations.c).
UNREACHABLE_STATUSES = frozenset({502, 503, 504})
# What a header value may hold: visible ASCII, no space (a user name, a JWT).
HEADER_VALUE_RE = re.compile(r"\A[\x21-\x7e]+\Z")
MESSAGE_LIMIT = 500


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """slurmrestd never redirects: one that does is not slurmrestd, and the token would go along."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


class SlurmRest:
    """slurmrestd at ``url`` (``http://slurm-ctl:6820``, or ``https://...`` behind a reverse proxy, under a path
    if need be), as ``user`` with the JWT ``token``."""

    def __init__(self, url: str, *, user: str, token: str, timeout: float = TIMEOUT_SECONDS) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            # Not the URL itself in the words: it could hold a password, and they reach alerts and logs.
            raise SlurmUnreachable("slurmrestd's URL (SLURM_RESTD_URL) must be http:// or https:// and name a host")
        if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
            raise SlurmUnreachable("slurmrestd's URL takes no user, password, query or fragment: the token says who")
        if not HEADER_VALUE_RE.match(user):
            raise SlurmUnreachable(f"{user!r} cannot be slurmrestd's user name (X-SLURM-USER-NAME)")
        if not HEADER_VALUE_RE.match(token):
            raise SlurmUnreachable("slurmrestd's token is empty or holds spaces or control characters")
        self.url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self.user = user
        self._token = token
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects())

    def __repr__(self) -> str:
        return f"SlurmRest({self.url!r}, user={self.user!r})"

    def capabilities(self) -> Capabilities:
        """The release in the answer's ``meta.slurm``: slurmrestd's own. The controller runs the same or a newer
        one (Slurm upgrades slurmctld before its clients: doc/html/upgrades.shtml)."""
        answer = self.request("GET", "/ping/")
        slurm = _dict(_dict(answer.get("meta")).get("slurm"))
        version = _dict(slurm.get("version"))
        found = None
        if version.get("major") is not None and version.get("minor") is not None:
            found = parse_version(f"{version['major']}.{version['minor']}.{version.get('micro') or 0}")
        if found is None:
            found = parse_version(str(slurm.get("release") or ""))
        if found is None:
            self._fail(f"slurmrestd at {self.url} names no Slurm release in its answer (meta.slurm.version)")
        pings = [ping for ping in _list(answer.get("pings")) if isinstance(ping, dict)]
        if pings and not any(ping.get("responding") is True or ping.get("pinged") == "UP" for ping in pings):
            hosts = ", ".join(str(ping.get("hostname") or "?") for ping in pings)
            self._fail(f"slurmrestd at {self.url} cannot reach the Slurm controller ({hosts})", unreachable=True)
        return Capabilities(version=found, api="rest")

    def nodes(self) -> list[SlurmNode]:
        return [_node(item) for item in _list(self.request("GET", "/nodes/").get("nodes")) if isinstance(item, dict)]

    def reservations(self) -> list[SlurmReservation]:
        answer = self.request("GET", "/reservations/")
        return [_reservation(item) for item in _list(answer.get("reservations")) if isinstance(item, dict)]

    def create(self, reservation: SlurmReservation) -> None:
        """slurmrestd updates a reservation of the same name if there is one: with our prefix, ours anyway."""
        check_reservation(reservation)
        body: dict[str, Any] = {
            "name": reservation.name,
            "users": list(reservation.users),
            "start_time": _time(reservation.start),
            "end_time": _time(reservation.end),
            "node_list": reservation.nodes.split(","),
        }
        if reservation.flags:
            body["flags"] = list(reservation.flags)
        if reservation.tres:
            body["tres"] = tres_list(reservation.tres)
        self.request("POST", "/reservation", body)

    def update(self, reservation: SlurmReservation) -> None:
        # As Scontrol.update: times and users; flags are set once at creation. A reservation gone meanwhile is not
        # made again by this (slurmrestd would try to create it, and refuses one without nodes).
        check_reservation(reservation)
        body = {"name": reservation.name, "users": list(reservation.users), "end_time": _time(reservation.end)}
        if reservation.start > datetime.now(UTC):  # a started reservation's start cannot move
            body["start_time"] = _time(reservation.start)
        self.request("POST", "/reservation", body)

    def delete(self, name: str) -> None:
        if not is_ours(name):
            raise SlurmError(f"{name!r} is not a reservation of the portal's: never deleted")
        self.request("DELETE", f"/reservation/{urllib.parse.quote(name, safe='')}")

    def release_jobs(self, name: str) -> list[str]:
        """As Scontrol.release_jobs: ``GET /jobs/``, then ``POST /job/{job_id}`` with ``{"reservation": ""}``
        (v0.0.43's JOB_DESC_MSG) for each job pending in it."""
        if not is_ours(name):
            raise SlurmError(f"{name!r} is not a reservation of the portal's: its jobs are not moved")
        waiting = [
            str(job["job_id"])
            for job in _list(self.request("GET", "/jobs/").get("jobs"))
            if isinstance(job, dict)
            and job.get("reservation") == name
            and "PENDING" in _words(job.get("job_state"))
            and JOB_ID_RE.match(str(job.get("job_id", "")))
        ]
        for job_id in waiting:
            self.request("POST", f"/job/{job_id}", {"reservation": ""})
        return waiting

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``path`` under ``/slurm/<DATA_PARSER>``; the answer's JSON, whose ``errors`` are raised."""
        target = f"{self.url}/slurm/{DATA_PARSER}{path}"
        headers = {"Accept": "application/json", "X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self._token}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(target, data, headers, method=method)  # noqa: S310 - http(s): see __init__
        what = f"{method} {path}"
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                status, text = response.status, response.read()
        except urllib.error.HTTPError as refusal:
            status = refusal.code
            try:
                text = refusal.read()
            except (OSError, http.client.HTTPException):
                text = b""
            refusal.close()
        except urllib.error.URLError as problem:
            self._unreachable(what, problem.reason)
        except (OSError, http.client.HTTPException) as problem:
            self._unreachable(what, problem)
        return self._answer(what, status, text)

    def _answer(self, what: str, status: int, text: bytes) -> dict[str, Any]:
        try:
            answer = json.loads(text) if text.strip() else {}
        except ValueError:  # UnicodeDecodeError too
            answer = None
        errors = _list(answer.get("errors")) if isinstance(answer, dict) else []
        words = "; ".join(filter(None, (_error_words(error) for error in errors)))
        if status == 401:
            self._fail(
                f"slurmrestd at {self.url} refused the credentials of user {self.user!r} (HTTP 401): "
                "has the token expired (scontrol token lifespan=...)?",
                unreachable=True,
            )
        if status in UNREACHABLE_STATUSES:
            reached = f"slurmrestd at {self.url} cannot reach the Slurm controller (HTTP {status})"
            self._fail(words or reached, unreachable=True)
        if 300 <= status < 400:
            self._fail(f"slurmrestd at {self.url} answered {what} with HTTP {status}: not followed", unreachable=True)
        if words and any(phrase in words for phrase in IN_USE_WORDS):
            self._fail(words, in_use=True)
        if words:
            self._fail(words)
        if status >= 400:
            self._fail(f"slurmrestd at {self.url} answered {what} with HTTP {status}")
        if not isinstance(answer, dict):
            self._fail(f"slurmrestd at {self.url} answered {what} with something that is not a JSON object")
        return answer

    def _unreachable(self, what: str, reason: object) -> NoReturn:
        if isinstance(reason, TimeoutError):
            self._fail(f"slurmrestd at {self.url} did not answer {what} within {self.timeout:g} s", unreachable=True)
        why = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
        self._fail(
            f"slurmrestd at {self.url} could not be reached ({what}): {why or type(reason).__name__}", unreachable=True
        )

    def _fail(self, message: str, *, unreachable: bool = False, in_use: bool = False) -> NoReturn:
        """SlurmUnreachable where slurmrestd or the controller could not be asked; the token never shows."""
        message = message.replace(self._token, "[token]")[:MESSAGE_LIMIT]
        if unreachable:
            raise SlurmUnreachable(message) from None
        if in_use:
            raise SlurmInUse(message) from None
        raise SlurmError(message) from None


def tres_list(tres: str) -> list[dict[str, Any]]:
    """``gres/gpu:a100=2,cpu=4`` as the reservation description's ``tres``: ``[{"type": "gres", "name":
    "gpu:a100", "count": 2}, {"type": "cpu", "count": 4}]``."""
    items = []
    for part in tres.split(","):
        found = TRES_RE.match(part)
        if found is None:
            raise SlurmError(f"refused to send Slurm a reservation with TRES {tres!r}")
        kind, name, count = found.groups()
        item: dict[str, Any] = {"type": kind, "count": int(count)}
        if name:
            item["name"] = name
        items.append(item)
    return items


def _time(moment: datetime) -> dict[str, Any]:
    """A time as v0.0.43's ``uint64_no_val_struct``: UNIX seconds, so no time zone is guessed."""
    return {"set": True, "infinite": False, "number": int(moment.timestamp())}


def _when(value: object, what: str) -> datetime:
    """``{"set": true, "infinite": false, "number": 1925112000}`` (or a plain number) as a time in UTC."""
    if isinstance(value, dict):
        if value.get("infinite") is True:
            return datetime.max.replace(tzinfo=UTC)
        value = value.get("number") if value.get("set") is True else None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SlurmError(f"slurmrestd gave no {what}")
    return datetime.fromtimestamp(value, UTC)


def _node(item: dict[str, Any]) -> SlurmNode:
    """As scontrol's record would read (slurm.scontrol.node_from): ``state`` is the list ``["IDLE", "DRAIN"]``
    that scontrol writes ``IDLE+DRAIN``, with the same words."""
    name = str(item.get("name") or "")
    if not name:
        raise SlurmError("slurmrestd listed a node without a name")
    state = item.get("state")
    state = "+".join(str(part) for part in state) if isinstance(state, list) else str(state or "")
    record = {
        "NodeName": name,
        "NodeHostName": str(item.get("hostname") or name),
        "Gres": str(item.get("gres") or ""),
        "State": state or "UNKNOWN",
        "Reason": str(item.get("reason") or ""),
    }
    return node_from(record)


def _reservation(item: dict[str, Any]) -> SlurmReservation:
    name = str(item.get("name") or "")
    if not name:
        raise SlurmError("slurmrestd listed a reservation without a name")
    return SlurmReservation(
        name=name,
        users=_words(item.get("users")),
        start=_when(item.get("start_time"), f"start time for reservation {name}"),
        end=_when(item.get("end_time"), f"end time for reservation {name}"),
        nodes=",".join(_words(item.get("node_list"))),
        flags=_words(item.get("flags")),
        tres=item["tres"] if isinstance(item.get("tres"), str) else "",
    )


def _words(value: object) -> tuple[str, ...]:
    """v0.0.43 writes a reservation's users and nodes as one comma-separated text, its flags as a list."""
    if isinstance(value, list):
        return tuple(str(word) for word in value if word)
    if isinstance(value, str):
        return tuple(word for word in value.split(",") if word and word != "(null)")
    return ()


def _error_words(error: object) -> str:
    """``{"description": "Error creating reservation  gpubook-7", "error": "Requested reservation overlaps with
    another reservation", ...}`` as one line: Slurm's description, then its error's words when they add to it."""
    if not isinstance(error, dict):
        return ""
    description = " ".join(str(error.get("description") or "").split())
    short = str(error.get("error") or "").strip()
    if short and short != "No error" and short.lower() not in description.lower():
        return f"{description}: {short}" if description else short
    return description


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
