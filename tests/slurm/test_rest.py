"""slurmrestd's REST API (slurm/rest.py), against a real HTTP server on this machine that answers with the files in
tests/slurm/fixtures/rest/ and records every request it gets: paths, methods, headers and JSON bodies.

Those answers were WRITTEN FROM SLURM'S DOCUMENTATION AND SOURCE (SchedMD/slurm: doc/html/rest_api.shtml and
src/plugins/data_parser/v0.0.43/), NOT RECORDED from a live slurmrestd: Debian 12 ships Slurm 22.05, whose
slurmrestd cannot write reservations. Their README.md says where each comes from.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from slurm.controller import Capabilities
from slurm.rest import DATA_PARSER, SlurmRest
from slurm.scontrol import (
    Scontrol,
    SlurmError,
    SlurmInUse,
    SlurmReservation,
    SlurmUnreachable,
    node_from,
    parse_records,
    reservation_from,
)
from slurm.services import controller_from_settings

FIXTURES = Path(__file__).parent / "fixtures"
BASE = f"/slurm/{DATA_PARSER}"
# A made-up JWT: what `scontrol token` gives looks like this.
TOKEN = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjE5MjU1NDI4MDAsInN1biI6ImdwdWJvb2sifQ.c2lnbmF0dXJl"
START, END = datetime(2031, 1, 7, 9, tzinfo=UTC), datetime(2031, 1, 7, 13, tzinfo=UTC)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = "application/json"
    location: str = ""
    hang: bool = False  # wait until the test ends before answering


class FakeSlurmrestd:
    """An HTTP server on 127.0.0.1 (port 0): answers each (method, path) as told, 404 otherwise."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], Answer] = {}
        self.requests: list[Seen] = []
        self.released = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {name.lower(): value for name, value in self.headers.items()}
                fake.requests.append(Seen(self.command, self.path, headers, body))
                answer = fake.answers.get((self.command, self.path), Answer(404, b"Unable to find path", "text/plain"))
                if answer.hang:
                    fake.released.wait(30)
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(answer.body)))
                if answer.location:
                    self.send_header("Location", answer.location)
                self.end_headers()
                self.wfile.write(answer.body)

            do_GET = do_POST = do_DELETE = answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client that gave up (the timeout test) leaves a broken pipe: not news

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, method: str, path: str, fixture: str = "", *, status: int = 200, **details: object) -> None:
        body = (FIXTURES / "rest" / fixture).read_bytes() if fixture else details.pop("body", b"")
        self.answers[(method, path)] = Answer(status, body, **details)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.fixture
def slurmrestd() -> Iterator[FakeSlurmrestd]:
    server = FakeSlurmrestd()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def rest(slurmrestd) -> SlurmRest:
    return SlurmRest(slurmrestd.url, user="gpubook", token=TOKEN, timeout=10)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ours(**changes: object) -> SlurmReservation:
    values: dict[str, object] = {
        "name": "gpubook-7",
        "users": ("alice",),
        "start": START,
        "end": END,
        "nodes": "gpu01",
        "flags": ("MAGNETIC",),
        "tres": "gres/gpu=2",
    }
    return SlurmReservation(**{**values, **changes})


def scontrol_records(name: str, key: str) -> dict[str, dict[str, str]]:
    return {record[key]: record for record in parse_records((FIXTURES / "scontrol" / name).read_text())}


def assert_signed_in(seen: Seen) -> None:
    assert seen.headers["x-slurm-user-name"] == "gpubook"
    assert seen.headers["x-slurm-user-token"] == TOKEN
    assert seen.headers["accept"] == "application/json"


# Reading


def test_the_release_is_read_from_the_answers_meta(rest, slurmrestd):
    slurmrestd.answer("GET", f"{BASE}/ping/", "ping.json")
    capabilities = rest.capabilities()
    assert capabilities == Capabilities(version=(25, 5, 3), api="rest")
    assert capabilities.gpu_reservations and capabilities.version_text == "25.05.3"
    [seen] = slurmrestd.requests
    assert (seen.method, seen.path, seen.body) == ("GET", f"{BASE}/ping/", b"")
    assert_signed_in(seen)


def test_a_controller_that_does_not_answer_slurmrestds_ping_is_unreachable(rest, slurmrestd):
    slurmrestd.answer("GET", f"{BASE}/ping/", "ping_controller_down.json")
    with pytest.raises(SlurmUnreachable, match=r"cannot reach the Slurm controller \(slurm-ctl\)"):
        rest.capabilities()


def test_nodes_are_read_as_scontrol_reads_them(rest, slurmrestd):
    slurmrestd.answer("GET", f"{BASE}/nodes/", "nodes.json")
    nodes = {node.name: node for node in rest.nodes()}
    assert [(seen.method, seen.path) for seen in slurmrestd.requests] == [("GET", f"{BASE}/nodes/")]
    assert_signed_in(slurmrestd.requests[0])

    assert (nodes["gpu01"].gpu_type, nodes["gpu01"].gpu_count, nodes["gpu01"].state) == ("a100", 4, "MIXED+RESERVED")
    assert not nodes["gpu01"].offline
    assert (nodes["gpu02"].gpu_type, nodes["gpu02"].gpu_count) == ("h100", 4)  # listed once per socket
    assert nodes["gpu02"].state == "IDLE+DRAIN" and nodes["gpu02"].offline and nodes["gpu02"].reason == "fan failure"
    assert nodes["cpu01"].gpu_count == 0 and nodes["cpu01"].gpu_type == ""

    # The same nodes as scontrol prints them (tests/slurm/fixtures/scontrol/): the same SlurmNode, but for the
    # reason, which scontrol follows with who set it and when.
    printed = scontrol_records("show_node_25.05.txt", "NodeName")
    assert nodes["gpu01"] == node_from(printed["gpu01"])
    assert nodes["gpu03"] == node_from(printed["gpu03"])
    assert node_from(printed["gpu02"]).reason == "fan failure [root@2031-01-06T18:05:00]"


def test_reservations_are_read_with_their_times_in_utc(rest, slurmrestd):
    slurmrestd.answer("GET", f"{BASE}/reservations/", "reservations.json")
    reservations = {item.name: item for item in rest.reservations()}
    assert [(seen.method, seen.path) for seen in slurmrestd.requests] == [("GET", f"{BASE}/reservations/")]

    gpus = reservations["gpubook-7"]
    assert gpus.users == ("alice",) and gpus.nodes == "gpu01" and gpus.flags == ("SPEC_NODES", "MAGNETIC")
    assert (gpus.start, gpus.end, gpus.tres) == (START, END, "gres/gpu=2,cpu=2")
    assert gpus.is_ours and not reservations["maint-2031"].is_ours

    # What scontrol prints of them reads the same.
    printed = scontrol_records("show_reservation_25.05.txt", "ReservationName")
    assert gpus == reservation_from(printed["gpubook-7"])
    assert reservations["maint-2031"] == reservation_from(printed["maint-2031"])


# Writing


@pytest.mark.parametrize(
    ("tres", "sent"),
    [
        ("gres/gpu=2", [{"type": "gres", "name": "gpu", "count": 2}]),
        ("gres/gpu:a100=2", [{"type": "gres", "name": "gpu:a100", "count": 2}]),
        ("gres/gpu=2,cpu=4", [{"type": "gres", "name": "gpu", "count": 2}, {"type": "cpu", "count": 4}]),
        ("", None),  # a whole node, as on Slurm 22.05
    ],
)
def test_create_posts_one_json_description(rest, slurmrestd, tres, sent):
    slurmrestd.answer("POST", f"{BASE}/reservation", "reservation_posted.json")
    rest.create(ours(tres=tres))
    [seen] = slurmrestd.requests
    assert (seen.method, seen.path, seen.headers["content-type"]) == ("POST", f"{BASE}/reservation", "application/json")
    assert_signed_in(seen)
    expected = {
        "name": "gpubook-7",
        "users": ["alice"],
        "start_time": {"set": True, "infinite": False, "number": 1925542800},  # 2031-01-07T09:00:00Z
        "end_time": {"set": True, "infinite": False, "number": 1925557200},
        "node_list": ["gpu01"],
        "flags": ["MAGNETIC"],
    }
    if sent is not None:
        expected["tres"] = sent
    assert seen.json() == expected


def test_update_posts_the_times_and_users_only(rest, slurmrestd):
    slurmrestd.answer("POST", f"{BASE}/reservation", "reservation_posted.json")
    rest.update(ours(users=("alice", "bob"), end=datetime(2031, 1, 7, 15, tzinfo=UTC)))
    [seen] = slurmrestd.requests
    assert (seen.method, seen.path) == ("POST", f"{BASE}/reservation")
    assert_signed_in(seen)
    assert seen.json() == {
        "name": "gpubook-7",
        "users": ["alice", "bob"],
        "start_time": {"set": True, "infinite": False, "number": 1925542800},
        "end_time": {"set": True, "infinite": False, "number": 1925564400},
    }


def test_delete_sends_delete_to_the_reservations_own_path(rest, slurmrestd):
    slurmrestd.answer("DELETE", f"{BASE}/reservation/gpubook-7", "reservation_deleted.json")
    rest.delete("gpubook-7")
    [seen] = slurmrestd.requests
    assert (seen.method, seen.path, seen.body) == ("DELETE", f"{BASE}/reservation/gpubook-7", b"")
    assert_signed_in(seen)


def test_a_delete_jobs_hold_up_is_in_use_and_their_waiting_jobs_can_be_moved_out(rest, slurmrestd):
    slurmrestd.answer("DELETE", f"{BASE}/reservation/gpubook-7", "error_in_use.json", status=500)
    with pytest.raises(SlurmInUse, match="Requested reservation is in use"):
        rest.delete("gpubook-7")
    slurmrestd.answer("GET", f"{BASE}/jobs/", "jobs.json")
    slurmrestd.answer("POST", f"{BASE}/job/41", "job_updated.json")

    assert rest.release_jobs("gpubook-7") == ["41"]  # not the running one, nor another reservation's

    posted = slurmrestd.requests[-1]
    assert (posted.method, posted.path, posted.json()) == ("POST", f"{BASE}/job/41", {"reservation": ""})
    assert_signed_in(posted)
    with pytest.raises(SlurmError, match="not a reservation of the portal's"):
        rest.release_jobs("maint")


@pytest.mark.parametrize(
    "change",
    [
        {"users": ("a b",)},
        {"users": ("alice,root",)},
        {"name": "maint-1"},
        {"nodes": "gpu01 Users=root"},
        {"flags": ("MAGNETIC,IGNORE_JOBS",)},
        {"tres": "gres/gpu=2 Users=root"},
        {"tres": "gres/gpu=two"},
    ],
)
def test_bad_values_are_refused_before_anything_is_sent(rest, slurmrestd, change):
    with pytest.raises(SlurmError, match="refused to send Slurm"):
        rest.create(ours(**change))
    if "tres" not in change:  # an update sends no TRES
        with pytest.raises(SlurmError, match="refused to send Slurm"):
            rest.update(ours(**change))
    assert slurmrestd.requests == []


@pytest.mark.parametrize("name", ["maint-2031", "gpubook-7/../../reservations", "GPUBOOK-7", ""])
def test_delete_refuses_a_reservation_that_is_not_the_portals(rest, slurmrestd, name):
    with pytest.raises(SlurmError, match="never deleted"):
        rest.delete(name)
    assert slurmrestd.requests == []


# Failures


def test_an_errors_body_raises_slurms_own_words(rest, slurmrestd):
    slurmrestd.answer("POST", f"{BASE}/reservation", "error_overlap.json", status=500)
    with pytest.raises(SlurmError) as refused:
        rest.create(ours())
    assert (
        str(refused.value)
        == "Error creating reservation gpubook-7: Requested reservation overlaps with another reservation"
    )
    assert not isinstance(refused.value, SlurmUnreachable)  # Slurm decided: a refusal, recorded as one


def test_slurmrestd_that_cannot_reach_the_controller_is_unreachable(rest, slurmrestd):
    slurmrestd.answer("GET", f"{BASE}/reservations/", "error_controller_down.json", status=502)
    with pytest.raises(SlurmUnreachable) as unreachable:
        rest.reservations()
    assert str(unreachable.value) == (
        "Unable to query reservations: Unable to contact slurm controller (connect failure)"
    )


def test_refused_credentials_raise_without_the_token(rest, slurmrestd):
    # slurmrestd's own words for a token it does not take: 401 and a plain-text body (src/slurmrestd/operations.c).
    slurmrestd.answer("GET", f"{BASE}/nodes/", status=401, body=b"Authentication failure", content_type="text/plain")
    with pytest.raises(SlurmError) as refused:
        rest.nodes()
    message = str(refused.value)
    assert "HTTP 401" in message and "'gpubook'" in message and "token" in message
    assert TOKEN not in message and TOKEN not in repr(refused.value)
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


def test_a_token_said_back_by_the_server_is_not_repeated(rest, slurmrestd):
    said = {"errors": [{"description": f"bad token {TOKEN}", "error_number": 1, "error": "x", "source": "auth"}]}
    slurmrestd.answer("GET", f"{BASE}/nodes/", status=500, body=json.dumps(said).encode())
    with pytest.raises(SlurmError) as refused:
        rest.nodes()
    assert TOKEN not in str(refused.value) and "[token]" in str(refused.value)


def test_a_refused_connection_is_unreachable():
    port = closed_port()
    rest = SlurmRest(f"http://127.0.0.1:{port}", user="gpubook", token=TOKEN, timeout=5)
    with pytest.raises(SlurmUnreachable, match=rf"127\.0\.0\.1:{port} could not be reached .*: Connection refused"):
        rest.reservations()


def test_a_slurmrestd_that_does_not_answer_in_time_is_unreachable(slurmrestd):
    slurmrestd.answer("GET", f"{BASE}/nodes/", "nodes.json", hang=True)
    rest = SlurmRest(slurmrestd.url, user="gpubook", token=TOKEN, timeout=0.2)
    with pytest.raises(SlurmUnreachable, match=r"did not answer GET /nodes/ within 0\.2 s"):
        rest.nodes()


@pytest.mark.parametrize("body", [b"<html>Bad Gateway</html>", b'{"nodes": [', b"[]"])
def test_an_answer_that_is_not_a_json_object_is_an_error(rest, slurmrestd, body):
    slurmrestd.answer("GET", f"{BASE}/nodes/", body=body, content_type="text/html")
    with pytest.raises(SlurmError, match="not a JSON object"):
        rest.nodes()


def test_a_redirect_is_not_followed(rest, slurmrestd):
    elsewhere = f"{slurmrestd.url}/elsewhere"
    slurmrestd.answer("GET", f"{BASE}/nodes/", status=302, location=elsewhere, body=b"")
    slurmrestd.answer("GET", "/elsewhere", "nodes.json")
    with pytest.raises(SlurmUnreachable, match="HTTP 302: not followed"):
        rest.nodes()
    assert [seen.path for seen in slurmrestd.requests] == [f"{BASE}/nodes/"]


def test_proxies_from_the_environment_are_not_used(slurmrestd, monkeypatch):
    # The token goes to slurmrestd and nowhere else: a proxy named in the environment (a dead one here) is not asked.
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{closed_port()}")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    slurmrestd.answer("GET", f"{BASE}/ping/", "ping.json")
    rest = SlurmRest(slurmrestd.url, user="gpubook", token=TOKEN, timeout=10)
    assert rest.capabilities().version == (25, 5, 3)


# Configuration


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/slurm/slurm.conf",
        "ftp://slurm-ctl/",
        "slurm-ctl:6820",
        "http://",
        "http://gpubook:secret@slurm-ctl:6820",
        "http://slurm-ctl:6820/?data_parser=v0.0.40",
    ],
)
def test_only_a_plain_http_or_https_url_is_taken(url):
    with pytest.raises(SlurmError, match="URL"):
        SlurmRest(url, user="gpubook", token=TOKEN)


@pytest.mark.parametrize(("user", "token"), [("gpubook", ""), ("gpubook", f"{TOKEN}\r\nX-Other: 1"), ("a b", TOKEN)])
def test_a_user_or_token_that_cannot_be_a_header_is_refused_without_showing_it(user, token):
    with pytest.raises(SlurmError) as refused:
        SlurmRest("http://slurm-ctl:6820", user=user, token=token)
    assert TOKEN not in str(refused.value)


def test_slurmrestd_under_a_path_is_asked_there(slurmrestd):
    slurmrestd.answer("GET", f"/rest{BASE}/ping/", "ping.json")
    rest = SlurmRest(f"{slurmrestd.url}/rest/", user="gpubook", token=TOKEN)
    assert rest.capabilities().version == (25, 5, 3)
    assert TOKEN not in repr(rest)


def test_the_portal_talks_to_slurmrestd_once_its_url_is_set(slurmrestd, settings):
    settings.SLURM_RESTD_URL, settings.SLURM_RESTD_USER, settings.SLURM_RESTD_TOKEN = slurmrestd.url, "gpubook", TOKEN
    slurmrestd.answer("GET", f"{BASE}/ping/", "ping.json")
    controller = controller_from_settings()
    assert isinstance(controller, SlurmRest) and controller.capabilities().api == "rest"
    assert_signed_in(slurmrestd.requests[0])
    settings.SLURM_RESTD_URL = ""
    assert isinstance(controller_from_settings(), Scontrol)
