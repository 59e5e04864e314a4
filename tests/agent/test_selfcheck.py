"""``gpubook-agent --check`` against real things: config files, stand-in device files with real modes,
real ACLs, a real HTTPS server in the portal's place (a throwaway CA as CA_FILE), the test Redis,
closed ports, and the real command in its own process for the exit status and the output.
"""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603, S607

from __future__ import annotations

import grp
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from gpubook_agent import acl, protocol, selfcheck
from gpubook_agent.gpus.simulated import simulated_uuid
from gpubook_agent.main import main as agent_main
from gpubook_agent.selfcheck import FAIL, MODPROBE_OPTIONS, OK, WARN, Check, check_root, run_checks
from gpubook_agent.signing import signed
from nodes.models import AgentState
from nodes.services import node_register
from tests.agent.harness import REPO, HeaderRecorder, RecordingPortal, Redirector, free_port, local_ca

GPUS = 2


class Portal:
    """The portal's heartbeat endpoint: answers ``status``, with a ``portal_time`` ``offset`` seconds off;
    over HTTPS with a certificate of ``local_ca()`` unless ``tls=False``."""

    def __init__(self, *, status: int = 200, offset: float = 0.0, tls: bool = True) -> None:
        self.status, self.offset = status, offset
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        portal = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                portal.requests.append((self.path, self.headers.get("Authorization", ""), body))
                if portal.status == 200:
                    portal_time = datetime.now(UTC) + timedelta(seconds=portal.offset)
                    answer = {"portal_time": portal_time.isoformat(), "lease_version": 0, "ignored_gpus": []}
                else:
                    answer = {"detail": "Unknown node token: register the node or issue new credentials."}
                self.send_response(portal.status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(answer).encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        if tls:
            self.url = local_ca().serve_tls(self.server)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Node:
    """A simulated node's files: device files (root-owned, 0600, like a locked-down driver), a state
    directory and a config file (0600) pointing at the given portal and broker."""

    def __init__(self, root: Path, *, portal_url: str, broker_url: str = "", **settings_: Any) -> None:
        self.root = root
        self.device_dir = root / "dev"
        self.state_dir = root / "state"
        self.device_dir.mkdir(mode=0o755)
        for minor in range(GPUS):
            path = self.device(minor)
            path.touch()
            os.chown(path, 0, 0)
            path.chmod(0o600)
        self.config = root / "agent.conf"
        self.values = {
            "NODE_NAME": "gpu-check",
            "BROKER_URL": broker_url or settings.CELERY_BROKER_URL,
            "PORTAL_URL": portal_url,
            "AGENT_TOKEN": "gpn_check-token",
            "LEASE_SECRET": "s3cret",
            "STATE_DIR": str(self.state_dir),
            "DEVICE_DIR": str(self.device_dir),
            "BACKEND": "simulated",
            "SIMULATED_GPUS": str(GPUS),
            "CA_FILE": local_ca().ca_file,
            **{key.upper(): str(value) for key, value in settings_.items()},
        }
        self.write()

    def write(self) -> None:
        self.config.write_text("".join(f"{key}={value}\n" for key, value in self.values.items() if value))
        self.config.chmod(0o600)

    def device(self, minor: int) -> Path:
        return self.device_dir / f"nvidia{minor}"

    def check(self) -> dict[str, Check]:
        return {check.name: check for check in run_checks(str(self.config), environ={})}

    def command(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpubook_agent.main", "--config", str(self.config), "--check", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: root-owned device files and ACLs, as on a node")


@pytest.fixture
def workdir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="gpbt-check-", dir="/tmp"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def portal() -> Iterator[Portal]:
    answering = Portal()
    yield answering
    answering.stop()


@pytest.fixture
def node(workdir: Path, portal: Portal) -> Node:
    return Node(workdir, portal_url=portal.url)


def statuses(checks: dict[str, Check]) -> dict[str, str]:
    return {name: check.status for name, check in checks.items()}


def test_a_healthy_node_passes_every_check(workdir):
    recorder = RecordingPortal(tls=True)  # answers {} with a Date header only: the clock is read from that
    try:
        checks = Node(workdir, portal_url=recorder.url).check()
    finally:
        recorder.stop()

    assert statuses(checks) == {
        "config": OK,
        "root": OK,
        "gpus": OK,
        "device files": OK,
        "acls": OK,
        "state": OK,
        "portal": OK,
        "clock": OK,
        "broker": OK,
        "launch": OK,
    }
    assert "Date header" in checks["clock"].message
    assert len(checks["gpus"].details) == GPUS
    assert "-rw------- root root" in checks["device files"].details[0]
    (heartbeat,) = recorder.received["heartbeat"]
    assert heartbeat["backend"] == "simulated" and heartbeat["applied_version"] == 0
    assert sorted(os.listdir(workdir / "dev")) == ["nvidia0", "nvidia1"]  # the ACL test file is gone


def test_the_command_prints_one_line_per_check_and_exits_0_when_nothing_failed(node, portal):
    result = node.command()

    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if not line.startswith(" ")]
    assert [line.split()[0] for line in lines[:-1]] == ["OK"] * 10
    assert lines[1].startswith("OK    root: running as root")
    assert lines[-1] == "No failures (0 warning(s)): the agent can run here."
    path, authorization, _ = portal.requests[0]
    assert (path, authorization) == ("/api/v1/agent/heartbeat/", "Bearer gpn_check-token")


def test_json_output_parses_and_a_failure_makes_the_exit_status_1(node):
    node.values["PORTAL_URL"] = f"https://127.0.0.1:{free_port()}"
    node.write()

    result = node.command("--json")

    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    by_name = {check["name"]: check for check in report["checks"]}
    assert by_name["portal"]["status"] == FAIL
    assert by_name["portal"]["fix"]
    assert by_name["gpus"]["details"] and by_name["broker"]["status"] == OK


def test_warnings_alone_do_not_fail(node, portal):
    portal.offset = 5

    result = node.command()

    assert result.returncode == 0
    assert "WARN  clock:" in result.stdout


def test_json_is_only_for_the_check():
    with pytest.raises(SystemExit) as exit_:
        agent_main(["--json"])
    assert exit_.value.code == 2


def test_device_files_open_to_everyone_fail_with_the_driver_options(node):
    node.device(1).chmod(0o666)

    device_files = node.check()["device files"]

    assert device_files.status == FAIL
    assert device_files.message.startswith(f"everyone can open {node.device(1)} (0666): the ACLs restrict nothing")
    assert str(node.device(0)) not in device_files.message
    assert f"`{MODPROBE_OPTIONS}` in /etc/modprobe.d/nvidia-gpubook.conf" in device_files.fix
    assert MODPROBE_OPTIONS == (
        "options nvidia NVreg_DeviceFileMode=0660 NVreg_DeviceFileUID=0 NVreg_DeviceFileGID=0 NVreg_ModifyDeviceFiles=0"
    )
    assert "reload the driver" in device_files.fix and "reboot" in device_files.fix


def test_device_files_open_to_a_group_of_ordinary_users_fail(node, unix_users):
    alice = unix_users[0]
    os.chown(node.device(0), 0, alice.gid)  # the throwaway users' primary group
    node.device(0).chmod(0o660)

    device_files = node.check()["device files"]

    assert device_files.status == FAIL
    # Members by their primary group, named (at most five, in name order: other test runs, and benches'
    # throwaway users, may be there too and come first).
    group = grp.getgrgid(alice.gid).gr_name
    assert re.search(rf"is open to group {group}, which ordinary users belong to \(\w+", device_files.message)


def test_device_files_owned_by_an_ordinary_user_fail(node, unix_users):
    os.chown(node.device(0), unix_users[0].uid, 0)

    device_files = node.check()["device files"]

    assert device_files.status == FAIL
    assert f"belongs to {unix_users[0].name}" in device_files.message


def test_a_portal_that_does_not_listen_fails_and_the_clock_is_not_compared(node):
    node.values["PORTAL_URL"] = f"https://127.0.0.1:{(port := free_port())}"
    node.write()

    checks = node.check()

    assert checks["portal"].status == FAIL
    assert checks["portal"].message == f"connection refused by 127.0.0.1:{port}: nothing listens there"
    assert checks["portal"].fix == "start the portal, or correct PORTAL_URL"
    assert checks["clock"].status == WARN


def test_a_refused_token_fails_with_what_to_do(node, portal):
    portal.status = 401

    portal_check = node.check()["portal"]

    assert portal_check.status == FAIL
    assert portal_check.message.startswith("the portal refused the node token (HTTP 401: Unknown node token")
    assert portal_check.fix == "register the node again or copy the token from `manage.py register_node`"


def test_a_portal_url_that_is_not_the_portal_fails(node, portal):
    portal.status = 404

    portal_check = node.check()["portal"]

    assert portal_check.status == FAIL
    assert "PORTAL_URL does not point at the portal" in portal_check.message


@pytest.mark.parametrize(
    ("offset", "status", "words"),
    [
        (60, FAIL, "behind the portal's time (more than 30 s)"),
        (-60, FAIL, "ahead of the portal's time (more than 30 s)"),
        (5, WARN, "behind the portal's time (more than 2 s)"),
        (0, OK, "the portal's time"),
    ],
)
def test_clock_skew_against_the_portals_time(node, portal, offset, status, words):
    portal.offset = offset

    clock = node.check()["clock"]

    assert clock.status == status, clock.message
    assert words in clock.message
    seconds = float(re.match(r"this clock is ([0-9.]+) s ", clock.message).group(1))
    assert abs(seconds - abs(offset)) < 0.5
    if status != OK:
        assert clock.fix == "enable NTP (timedatectl set-ntp true): leases start and end by this node's clock"


def test_a_broker_that_is_down_fails(node):
    node.values["BROKER_URL"] = f"redis://127.0.0.1:{(port := free_port())}/0"
    node.write()

    broker = node.check()["broker"]

    assert broker.status == FAIL
    assert broker.message.startswith(f"cannot reach the broker at redis://127.0.0.1:{port}/0: ")
    assert "Connection refused" in broker.message


def test_the_broker_password_is_not_printed(node):
    node.values["BROKER_URL"] = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    node.write()

    assert "hunter2" not in node.check()["broker"].message


def test_nvml_without_a_driver_fails_with_the_install_or_simulated_hint(node):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    node.values["BACKEND"] = "nvml"
    node.write()

    checks = node.check()

    gpus = checks["gpus"]
    assert gpus.status == FAIL
    assert gpus.message.startswith("NVML could not be loaded: NVMLError")
    assert gpus.fix == "install the NVIDIA driver (nvidia-smi must list the GPUs), or set BACKEND=simulated for a trial"
    assert checks["device files"].status == OK  # the files already there are judged all the same
    assert "control files" not in checks


def test_a_missing_setfacl_fails_with_the_package_to_install(node):
    result = node.command("--json", env={"PATH": "/nonexistent"})

    acls = {check["name"]: check for check in json.loads(result.stdout)["checks"]}["acls"]
    assert acls["status"] == FAIL and acls["message"].startswith("setfacl is missing")
    assert acls["fix"] == "apt-get install acl"
    assert result.returncode == 1


def test_a_filesystem_without_acls_fails(node):
    mounted = subprocess.run(
        ["mount", "-t", "ramfs", "-o", "mode=755", "none", str(node.device_dir)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a ramfs here: {mounted.stderr.decode().strip()}")
    try:
        acls = node.check()["acls"]
    finally:
        subprocess.run(["umount", str(node.device_dir)], check=True)

    assert acls.status == FAIL
    assert acls.message.startswith(f"the filesystem of {node.device_dir} does not support POSIX ACLs")
    assert acls.fix.startswith("mount it with acl")


def test_the_heartbeat_reports_what_is_on_disk_and_changes_nothing(node, portal, unix_users):
    alice = unix_users[0]
    node.device(0).chmod(0o660)
    acl.grant(str(node.device(0)), alice.name)
    node.state_dir.mkdir(mode=0o700)
    (node.state_dir / "snapshot.json").write_text(json.dumps({"version": 7}))

    node.check()

    _, _, heartbeat = portal.requests[0]
    assert heartbeat["applied_version"] == 7
    assert heartbeat["acls"] == {simulated_uuid("gpu-check", 0): [alice.name], simulated_uuid("gpu-check", 1): []}
    assert acl.granted_users(str(node.device(0))) == {alice.name}  # the grant is still there


def test_a_bad_config_is_one_failure_that_says_what_is_wrong(node):
    del node.values["LEASE_SECRET"]
    node.write()

    checks = run_checks(str(node.config), environ={})

    assert [(check.name, check.status) for check in checks] == [("config", FAIL)]
    assert "missing setting(s): LEASE_SECRET" in checks[0].message
    assert node.command().returncode == 1


def test_a_config_readable_by_others_warns(node):
    node.config.chmod(0o644)

    config = node.check()["config"]

    assert config.status == WARN
    assert config.fix == f"chmod 600 {node.config}"


def test_a_state_dir_that_is_a_file_fails(node):
    node.values["STATE_DIR"] = str(node.config)
    node.write()

    assert node.check()["state"].status == FAIL


def test_not_running_as_root_is_a_warning():
    assert check_root(1000).status == WARN
    assert check_root(0).status == OK


def test_the_text_output_puts_the_fix_under_the_failure():
    text = selfcheck.render([Check("portal", FAIL, "it is down", fix="start it"), Check("clock", WARN, "late")])

    assert text.splitlines() == [
        "FAIL  portal: it is down",
        "        fix: start it",
        "WARN  clock: late",
        "1 failed, 1 warning(s): fix the failures before starting the agent.",
    ]


@pytest.mark.django_db(transaction=True)
def test_the_real_portal_takes_the_heartbeat_and_refuses_a_wrong_token(workdir, live_server):
    credentials = node_register(name="gpu-check", hostname="check.lab")
    node = Node(workdir, portal_url=live_server.url, agent_token=credentials.agent_token, allow_insecure_portal="true")

    checks = node.check()

    assert (checks["portal"].status, checks["clock"].status) == (OK, OK), checks["portal"].message
    assert "the portal's time" in checks["clock"].message  # its portal_time, not the Date header
    state = AgentState.objects.get(node=credentials.node)
    assert (state.backend, state.applied_version) == ("simulated", 0)

    node.values["AGENT_TOKEN"] = "gpn_not-this-nodes-token"
    node.write()
    refused = node.check()["portal"]
    assert refused.status == FAIL
    assert refused.message == (
        "the portal refused the node token (HTTP 401: Unknown node token: register the node or issue new credentials.)"
    )


# -- HTTPS, and the token never sent elsewhere ----------------------------------------------------


def test_plain_http_without_allow_insecure_portal_fails_as_a_config_error(node):
    node.values["PORTAL_URL"] = "http://127.0.0.1:8000"
    node.write()

    checks = run_checks(str(node.config), environ={})

    assert [(check.name, check.status) for check in checks] == [("config", FAIL)]
    assert "'http://127.0.0.1:8000' is plain http" in checks[0].message
    assert "ALLOW_INSECURE_PORTAL=true" in checks[0].message


def test_allow_insecure_portal_works_over_http_and_warns(workdir):
    plain = Portal(tls=False)
    try:
        node = Node(workdir, portal_url=plain.url, allow_insecure_portal="true")
        checks = node.check()
    finally:
        plain.stop()

    assert checks["portal"].status == OK  # the heartbeat went through, in clear
    assert len(plain.requests) == 1
    config = checks["config"]
    assert config.status == WARN
    assert config.message.endswith(
        "but ALLOW_INSECURE_PORTAL=true lets the node token and every report travel in clear (http)"
    )
    assert config.fix == "serve the portal over https, set PORTAL_URL=https://..., and remove ALLOW_INSECURE_PORTAL"


def test_allow_insecure_portal_left_set_with_an_https_portal_warns_too(workdir, portal):
    checks = Node(workdir, portal_url=portal.url, allow_insecure_portal="true").check()

    assert checks["config"].status == WARN
    assert "ALLOW_INSECURE_PORTAL=true is set but unused (PORTAL_URL is https)" in checks["config"].message
    assert checks["config"].fix == "remove ALLOW_INSECURE_PORTAL"


def test_two_config_warnings_are_both_said_with_both_fixes(workdir):
    plain = Portal(tls=False)
    try:
        node = Node(workdir, portal_url=plain.url, allow_insecure_portal="true")
        node.config.chmod(0o644)
        config = node.check()["config"]
    finally:
        plain.stop()

    assert config.status == WARN
    assert "readable by others (mode 0644)" in config.message and "travel in clear" in config.message
    assert config.fix.startswith(f"chmod 600 {node.config}; serve the portal over https")


def test_a_portal_certificate_from_an_unknown_ca_fails_with_the_ca_file_hint(node):
    del node.values["CA_FILE"]
    node.write()

    portal_check = node.check()["portal"]

    assert portal_check.status == FAIL
    assert portal_check.message.startswith("the portal's TLS certificate is not trusted")
    assert portal_check.fix.startswith("set CA_FILE")


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_fails_naming_the_location_and_the_token_never_arrives_there(workdir, status):
    elsewhere = HeaderRecorder()
    redirector = Redirector(elsewhere.url + "/collect", status=status, tls=True)
    try:
        checks = Node(workdir, portal_url=redirector.url).check()
    finally:
        redirector.stop()
        elsewhere.stop()

    portal_check = checks["portal"]
    assert redirector.answered == 1
    assert portal_check.status == FAIL
    assert f"answered with a HTTP {status} redirect to '{elsewhere.url}/collect', not followed" in portal_check.message
    assert "the node token goes only to PORTAL_URL" in portal_check.message
    assert portal_check.fix.startswith("set PORTAL_URL to the address the portal answers at")
    assert elsewhere.requests == []


# -- the state directory must be the agent's own -------------------------------------------------------


@pytest.mark.parametrize("bits", [0o770, 0o775, 0o777, 0o1777], ids=oct)
def test_a_state_dir_writable_by_others_fails_with_the_fix(node, bits):
    node.state_dir.mkdir()
    node.state_dir.chmod(bits)

    state = node.check()["state"]

    assert state.status == FAIL
    assert state.message.startswith(f"STATE_DIR {node.state_dir} is owned by root (uid 0) with mode {bits:04o}")
    assert state.fix == f"chown root: {node.state_dir}; chmod 700 {node.state_dir}"
    assert node.state_dir.stat().st_mode & 0o7777 == bits  # the check changes nothing


def test_a_state_dir_of_another_account_fails_and_the_command_prints_the_fix(node, unix_users):
    node.state_dir.mkdir(mode=0o700)
    os.chown(node.state_dir, unix_users[0].uid, unix_users[0].gid)

    result = node.command()

    assert result.returncode == 1
    lines = result.stdout.splitlines()
    (line,) = [line for line in lines if line.startswith("FAIL  state:")]
    assert f"is owned by {unix_users[0].name} (uid {unix_users[0].uid}) with mode 0700" in line
    assert lines[lines.index(line) + 1] == f"        fix: chown root: {node.state_dir}; chmod 700 {node.state_dir}"


def test_a_state_dir_of_its_own_passes(node):
    node.state_dir.mkdir(mode=0o700)

    state = node.check()["state"]

    assert state.status == OK
    assert state.message == f"STATE_DIR {node.state_dir} is the agent's own (not writable by others) and writable"


# -- MIG ---------------------------------------------------------------------------------------------------

MIG_LAYOUT = "0:3g.40gb,2g.20gb,2g.20gb"


@pytest.fixture
def mig_node(workdir: Path, portal: Portal) -> Node:
    return Node(workdir, portal_url=portal.url, simulated_mig=MIG_LAYOUT, simulated_memory_mib=81920)


def _capability_files(node: Node) -> list[Path]:
    return sorted((node.device_dir / "nvidia-caps").iterdir())


def test_a_mig_node_reports_each_cards_mode_and_slices_and_passes(mig_node, portal):
    checks = mig_node.check()

    mig = checks["mig"]
    assert mig.status == OK, mig
    assert mig.message == "1 MIG card(s), 3 slice(s); their capability files open to no one but leases"
    assert mig.details[0] == f"{simulated_uuid('gpu-check', 0)}  minor 0: MIG on, 3 slice(s)"
    assert "3g.40gb  GPU instance 1, compute instance 0, memory slices 4-7 -> " in mig.details[3]
    assert list(checks) == [
        "config", "root", "gpus", "device files", "mig", "acls", "state", "portal", "clock", "broker", "launch",
    ]  # fmt: skip
    _, _, heartbeat = portal.requests[0]
    (card,) = heartbeat["mig"]
    assert (card["uuid"], card["mode_current"], card["mode_pending"]) == (simulated_uuid("gpu-check", 0), True, True)
    assert [s["profile"] for s in card["slices"]] == ["2g.20gb", "2g.20gb", "3g.40gb"]
    assert len(heartbeat["acls"]) == GPUS + 3  # the cards and the slices


def test_a_node_without_mig_has_no_mig_check(node):
    assert "mig" not in node.check()


def test_capability_files_open_to_everyone_fail_with_the_fix(mig_node):
    mig_node.check()  # makes the stand-ins
    opened = _capability_files(mig_node)[0]
    opened.chmod(0o664)

    mig = mig_node.check()["mig"]

    assert mig.status == FAIL
    assert f"everyone can open the MIG capability file(s) {opened} (0664)" in mig.message
    assert "chmod 0660 and chown root:root" in mig.fix  # the stand-ins' fix; a real node's says chmod 0400


def test_an_acl_entry_on_a_capability_file_for_a_user_without_a_lease_fails(mig_node, unix_users):
    alice = unix_users[0]
    mig_node.check()
    entry = _capability_files(mig_node)[1]
    acl.grant(str(entry), alice.name)

    mig = mig_node.check()["mig"]

    assert mig.status == FAIL
    assert f"ACL entries for users with no lease on the slice: {alice.name} on {entry}" in mig.message
    assert "start the agent" in mig.fix


def test_an_acl_entry_a_stored_lease_explains_passes(mig_node, unix_users):
    alice = unix_users[0]
    mig_node.check()
    card = simulated_uuid("gpu-check", 0)
    for path in _capability_files(mig_node):
        acl.grant(str(path), alice.name)
    mig_node.state_dir.mkdir(mode=0o700)
    now = datetime.now(UTC)
    body = protocol.snapshot(
        node="gpu-check",
        version=3,
        issued_at=now,
        horizon_end=now + timedelta(hours=24),
        leases=[protocol.lease(reservation=1, user=alice.name, gpus=[card], start=now, end=now + timedelta(hours=1))],
    )
    (mig_node.state_dir / "snapshot.json").write_text(json.dumps(signed(body, "s3cret")))

    assert mig_node.check()["mig"].status == OK


def test_the_launch_check_says_what_environments_run_under_and_warns_of_what_cannot_run(tmp_path):
    both = frozenset({"container", "command"})
    pid1 = tmp_path / "comm"
    pid1.write_text("systemd\n")
    everything = selfcheck.check_launch(both, "auto", lambda name: f"/usr/bin/{name}", str(pid1))
    assert (everything.status, everything.message) == (OK, "commands and containers run under transient systemd units")
    assert everything.details == (
        "prlimit: /usr/bin/prlimit",
        "podman: /usr/bin/podman",
        "newuidmap: /usr/bin/newuidmap",
        "systemd-run: /usr/bin/systemd-run",
    )
    told = selfcheck.check_launch(both, "supervisor", lambda name: f"/usr/bin/{name}", str(pid1))
    assert told.message == "commands and containers run under the agent's own supervisor"

    pid1.write_text("tini\n")
    bare = selfcheck.check_launch(both, "auto", lambda name: None, str(pid1))
    assert bare.status == WARN
    assert bare.message == (
        "commands and containers run under the agent's own supervisor; no podman and newuidmap: container launches "
        "are refused; no prlimit (util-linux): launches with limits are refused"
    )
    assert "LAUNCH_KINDS=command" in bare.fix
    forced = selfcheck.check_launch(frozenset({"command"}), "systemd", lambda name: None, str(pid1))
    assert forced.status == WARN and "no systemd-run for LAUNCH_RUNNER=systemd" in forced.message

    only_prlimit = lambda name: "/usr/bin/prlimit" if name == "prlimit" else None  # noqa: E731
    commands_only = selfcheck.check_launch(frozenset({"command"}), "auto", only_prlimit, str(pid1))
    assert commands_only.status == OK  # no podman is no problem where containers are not allowed
    off = selfcheck.check_launch(frozenset(), "auto", lambda name: None, str(pid1))
    assert (off.status, off.message) == (OK, "environments are off here (LAUNCH_KINDS=none)")
