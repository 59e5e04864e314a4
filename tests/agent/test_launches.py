"""A lease's environments on the node (gpubook_agent/launches.py), with real processes, real ACLs and throwaway
accounts: a launch starts as the lease's user once the slot has opened its GPUs, ends with the slot (or when the
portal stops listing it) within the grace, is not started again once it exited, and is refused, alone, when this
node may not run it. Containers run in rootless podman with stand-in GPUs that are real character devices: the
container opens its booked one and not another, even as root inside.

The enforcer and the launches are driven in-process with a clock the test sets (no threads but the launch pool),
so "the slot ends" is a step, while the grace and the processes are real.
"""

# Tests run fixed argument lists of tools found on this machine (never a shell).
# ruff: noqa: S603, S607

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpubook_agent import protocol
from gpubook_agent.accounts import AccountCheck
from gpubook_agent.config import AgentConfig
from gpubook_agent.enforcer import Enforcer
from gpubook_agent.gpus import open_backend
from gpubook_agent.launcher import Supervisor
from gpubook_agent.launches import Launches, podman_run_argv
from gpubook_agent.signing import signed
from gpubook_agent.store import SnapshotStore
from tests.agent.harness import Clock, simulated_node_config, wait_for

T0 = datetime(2030, 5, 6, 9, 0, tzinfo=UTC)
T1 = T0 + timedelta(hours=1)
GRACE = 2.0


@dataclass
class LaunchNode:
    config: AgentConfig
    enforcer: Enforcer
    launches: Launches
    clock: Clock
    gpus: list[str]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    version: int = 0

    def offer(self, leases: list[protocol.Lease]) -> None:
        self.version += 1
        body = {
            "node": self.config.node_name,
            "version": self.version,
            "issued_at": self.clock.now.isoformat(),
            "leases": leases,
        }
        assert self.enforcer.offer(signed(body, self.config.lease_secret)) == "applied"

    def at(self, moment: datetime) -> None:
        """The clock reaches ``moment``: the enforcer converges, then the launches take their step."""
        self.clock.now = moment
        self.enforcer.converge(moment)
        self.launches.step(moment)

    def status(self, number: int = 1, reservation: int = 1) -> dict[str, Any] | None:
        found = [s for s in self.launches.statuses() if (s["reservation"], s["number"]) == (reservation, number)]
        return dict(found[0]) if found else None

    def state(self, number: int = 1, reservation: int = 1) -> str | None:
        status = self.status(number, reservation)
        return status["state"] if status else None

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events if kind.startswith("launch_")]

    def event(self, kind: str) -> dict[str, Any]:
        [fields] = [fields for k, fields in self.events if k == kind]
        return fields


def make_node(home: Path, config: AgentConfig | None = None, **extra: str) -> LaunchNode:
    """A node under ``home``; ``config``: the same node again (an agent that restarted)."""
    extra.setdefault("LAUNCH_SOCKET_DIR", str(home / "run"))  # the launches' sockets: root's, under the test's home
    config = config or simulated_node_config(home, grace=GRACE, **extra)
    backend = open_backend("simulated", device_dir=config.device_dir, node_name=config.node_name, simulated_gpus=2)
    clock = Clock(T0 - timedelta(minutes=5))
    events: list[tuple[str, dict[str, Any]]] = []

    def report(kind: str, **fields: Any) -> None:
        events.append((kind, fields))

    accounts = AccountCheck(uid_min=1000)
    enforcer = Enforcer(
        config=config,
        backend=backend,
        store=SnapshotStore(config.state_dir),
        report=report,
        clock=clock,
        accounts=accounts,
    )
    log_dir = home / "state" / "launches"
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    launches = Launches(
        config=config, leases=enforcer, report=report, supervisor=Supervisor(log_dir=str(log_dir), accounts=accounts)
    )
    return LaunchNode(config, enforcer, launches, clock, [gpu.uuid for gpu in backend.gpus()], events)


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpbt-launch-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(home: Path, unix_users) -> Iterator[LaunchNode]:
    made = make_node(home)
    try:
        yield made
    finally:
        made.launches.stop_all("the test ended")


def command(number: int, *argv: str, **limits: Any) -> protocol.LaunchRequest:
    return protocol.launch_request(number=number, kind="command", image="", argv=list(argv), **limits)


def lease(user: str, gpus: list[str], launches: list[protocol.LaunchRequest], reservation: int = 1) -> protocol.Lease:
    return protocol.lease(reservation=reservation, user=user, gpus=gpus, start=T0, end=T1, launches=launches)


def pid_of(node: LaunchNode, number: int = 1, reservation: int = 1) -> int:
    return node.launches.supervisor._launches[protocol.launch_name(reservation, number)].pid


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


SLEEPER = ("/bin/sh", "-c", "id -u; echo ready; exec sleep 600")


def test_a_command_starts_as_the_user_once_the_slot_opens_its_gpus_and_ends_with_the_slot(node, unix_users):
    user = unix_users[0]
    node.offer([lease(user.name, [node.gpus[0]], [command(1, *SLEEPER)])])

    node.at(T0 - timedelta(seconds=1))  # the slot has not started: nothing runs yet
    assert (node.state(), node.status()["message"]) == ("waiting", "waiting for the slot")
    assert node.launches.supervisor._launches == {}

    node.at(T0)
    assert wait_for(lambda: "ready" in (node.status() or {}).get("tail", ""), timeout=10)
    status = node.status()
    assert status["state"] == "running"
    assert status["tail"].splitlines()[0] == str(user.uid)  # as the user, not root
    started = node.event("launch_started")
    assert (started["reservation"], started["launch"], started["user"]) == (1, 1, user.name)
    pid = pid_of(node)
    assert alive(pid)

    node.at(T1)  # the slot ends: the launch is stopped at once (SIGTERM, the grace, SIGKILL)
    assert wait_for(lambda: node.state() == "stopped", timeout=GRACE + 5)
    assert not alive(pid)
    assert node.event("launch_stopped")["message"] == "the slot ended"


def test_a_launch_that_ignores_sigterm_is_killed_after_the_grace(node, unix_users):
    stubborn = ("/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.2; done")
    node.offer([lease(unix_users[0].name, [node.gpus[0]], [command(1, *stubborn)])])
    node.at(T0)
    assert wait_for(lambda: "ready" in (node.status() or {}).get("tail", ""), timeout=10)
    pid = pid_of(node)

    ended_at = time.monotonic()
    node.at(T1)
    gone = wait_for(lambda: not alive(pid), timeout=GRACE + 5)
    assert gone is not None
    assert GRACE - 0.5 <= gone - ended_at <= GRACE + 5  # it had its grace, and not much more
    assert wait_for(lambda: node.state() == "stopped", timeout=5)


def test_stopping_from_the_portal_and_a_lease_that_leaves_the_snapshot_end_what_they_ran(node, unix_users):
    name = unix_users[0].name
    gpu = [node.gpus[0]]
    node.offer(
        [
            lease(name, gpu, [command(1, *SLEEPER), command(2, *SLEEPER)]),
            lease(name, [node.gpus[1]], [command(1, *SLEEPER)], 2),
        ]
    )
    node.at(T0)
    assert wait_for(lambda: node.state(1) == node.state(2) == node.state(1, 2) == "running", timeout=10)

    node.offer([lease(name, gpu, [command(2, *SLEEPER)])])  # launch 1 stopped in the portal; booking 2 cancelled
    node.at(T0 + timedelta(minutes=1))

    assert wait_for(lambda: node.state(1) == node.state(1, 2) == "stopped", timeout=GRACE + 5)
    assert node.state(2) == "running"
    messages = sorted(fields["message"] for kind, fields in node.events if kind == "launch_stopped")
    assert messages == ["stopped from the portal", "the booking ended (released or cancelled)"]


def test_a_launch_that_exited_is_not_started_again(node, unix_users):
    node.offer([lease(unix_users[0].name, [node.gpus[0]], [command(1, "/bin/sh", "-c", "echo bye; exit 3")])])
    node.at(T0)
    assert wait_for(
        lambda: node.launches.step(node.clock.now) or (node.state() == "exited" and "bye" in node.status()["tail"]),
        timeout=10,
    )
    assert node.status()["exit_code"] == 3
    assert "bye" in node.status()["tail"]

    for seconds in range(1, 4):
        node.at(T0 + timedelta(seconds=seconds))
    assert node.kinds() == ["launch_started", "launch_exited"]


def test_what_this_node_may_not_run_is_refused_alone_and_the_lease_still_opens(home, unix_users):
    node = make_node(home, LAUNCH_KINDS="container")
    try:
        user = unix_users[0]
        broken = {"number": 2, "kind": "command", "image": "", "argv": "rm -rf /"}  # a shell line, not a list
        node.offer([lease(user.name, [node.gpus[0]], [command(1, *SLEEPER), broken])])  # type: ignore[list-item]
        node.at(T0)

        assert node.state(1) == node.state(2) == "refused"
        refusals = {fields["launch"]: fields["message"] for kind, fields in node.events if kind == "launch_refused"}
        assert refusals[1] == "this node runs no commands (its LAUNCH_KINDS)"
        assert "a command is a list" in refusals[2]
        assert node.enforcer.acls_in_force()[node.gpus[0]] == [user.name]  # the lease itself is enforced
        assert node.launches.supervisor._launches == {}
    finally:
        node.launches.stop_all("the test ended")


def test_a_lease_for_root_or_a_system_account_launches_nothing_and_says_why(node):
    node.offer([lease("daemon", [node.gpus[0]], [command(1, *SLEEPER)])])
    node.at(T0)
    time.sleep(0.2)
    assert node.state() == "refused"
    assert node.status()["message"].startswith("not an ordinary account here: ")
    assert node.kinds() == ["launch_refused"]
    assert node.launches.supervisor._launches == {}


def test_a_notebook_gets_a_free_loopback_port_and_its_own_token_which_its_output_does_not_show(
    node, unix_users, user_python, home
):
    gate = home / "listen-now"  # the server listens once the test has seen what the node says before that
    server = (
        "import http.server, sys, os, time\n"
        "port, token = int(sys.argv[1]), sys.argv[2]\n"
        "print('starting', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        "same = (os.environ['GPUBOOK_PORT'], os.environ['GPUBOOK_TOKEN'], os.environ['JUPYTER_TOKEN']) == "
        "(str(port), token, token)\n"
        "server = http.server.HTTPServer(('127.0.0.1', port), http.server.SimpleHTTPRequestHandler)\n"
        "print(f'serving at http://127.0.0.1:{port}/?token={token}; environment agrees: {same}', flush=True)\n"
        "server.serve_forever()\n"
    )
    node.offer(
        [lease(unix_users[0].name, [node.gpus[0]], [command(1, user_python, "-I", "-c", server, "{port}", "{token}")])]
    )
    node.at(T0)
    assert wait_for(lambda: "starting" in (node.status() or {}).get("tail", ""), timeout=10)
    node.launches.step(node.clock.now)
    waiting = node.status()  # running, but not listening yet: neither its port nor its token is shown (issue 36)
    assert (waiting["state"], waiting["port"], waiting["token"]) == ("running", None, "")
    assert waiting["message"] == "waiting for it to listen on its port"

    gate.touch()
    assert wait_for(lambda: node.launches.step(node.clock.now) or _serving(node.status()), timeout=10)
    status = node.status()
    port, token = status["port"], status["token"]
    assert status["message"] == ""
    assert isinstance(port, int) and len(token) >= 32
    assert f"http://127.0.0.1:{port}/?token=<token>" in status["tail"]  # the holder's secret stays out of the log
    assert "environment agrees: True" in status["tail"]  # also in variables, which ps does not show to others
    assert token not in status["tail"]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert connection.recv(12).startswith(b"HTTP/1.0 200")


def _serving(status: dict[str, Any] | None) -> bool:
    return bool(status and status["port"] and "serving" in status["tail"])


def test_the_podman_line_passes_only_the_booked_devices_and_no_network_without_a_port():
    argv = podman_run_argv(
        podman="/usr/bin/podman",
        options=("--runtime", "runc"),
        name="gpubook-7-1",
        image="registry.example.org/lab/torch:2.5",
        devices=["/dev/nvidia3", "/dev/nvidiactl"],
        port=None,
        memory_max_bytes=2**30,
        max_processes=100,
        command=["python", "train.py"],
        env_names=["GPUBOOK_TOKEN"],
    )
    assert argv[:5] == ["/usr/bin/podman", "--runtime", "runc", "run", "--rm"]
    assert argv[-3:] == ["registry.example.org/lab/torch:2.5", "python", "train.py"]
    flags = argv[:-3]
    assert flags[flags.index("--network") : flags.index("--network") + 2] == ["--network", "none"]
    devices = [flags[i + 1] for i, arg in enumerate(flags) if arg == "--device"]
    assert devices == ["/dev/nvidia3:/dev/nvidia3:rw", "/dev/nvidiactl:/dev/nvidiactl:rw"]
    assert flags[flags.index("--env") + 1] == "GPUBOOK_TOKEN"  # its value from podman's environment, not argv
    for expected in ("--read-only", "no-new-privileges", "all", "as=1073741824:1073741824", "nproc=100:100"):
        assert expected in flags
    assert "--privileged" not in argv

    with_port = podman_run_argv(
        podman="podman", options=(), name="gpubook-7-2", image="lab/jupyter:1", devices=[], port=8123,
        memory_max_bytes=None, max_processes=None, command=["jupyter", "lab"],
    )  # fmt: skip
    assert "--network" not in with_port
    assert with_port[with_port.index("--publish") + 1] == "127.0.0.1:8123:8123"  # the node's loopback only

    socket_dir = "/run/gpubook-launches/gpubook-7-3"
    with_socket = podman_run_argv(
        podman="podman", options=(), name="gpubook-7-3", image="lab/jupyter:1", devices=[], port=None,
        memory_max_bytes=None, max_processes=None, command=["jupyter", "lab"], socket_dir=socket_dir,
    )  # fmt: skip
    assert with_socket[with_socket.index("--network") + 1] == "none"  # a socket needs no network at all
    assert f"{socket_dir}:{socket_dir}:rw" in with_socket  # at the same path inside: {socket} is one path
    assert "--publish" not in with_socket


# -- containers: rootless podman -----------------------------------------------------------------------

PODMAN_OPTIONS = "--runtime runc --cgroup-manager cgroupfs"  # hybrid cgroups here: crun refuses (TOOLCHAIN.md)
IMAGE = "localhost/gpubook-test-busybox:1"


def _podman_ready() -> str | None:
    """Why rootless podman cannot run here, or None."""
    for tool in ("podman", "runc", "newuidmap", "mknod"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/test-deps installs podman, runc and uidmap)"
    linked = subprocess.run(["ldd", "/bin/busybox"], capture_output=True, text=True, check=False)
    if not os.path.exists("/bin/busybox") or "not a dynamic executable" not in linked.stdout + linked.stderr:
        return "busybox-static is not installed (the image needs a busybox that runs without libraries)"
    return None


@pytest.fixture
def podman_user(unix_users) -> Iterator[Any]:
    """A throwaway account ready for rootless podman: a home, subordinate ids, and a tiny image (busybox) in its
    own storage, imported from a tar made here: no registry is reachable."""
    problem = _podman_ready()
    if problem:
        pytest.skip(problem)
    user = unix_users[2]
    old_home = pwd.getpwnam(user.name).pw_dir
    home = Path(tempfile.mkdtemp(prefix="gpbt-podman-home-", dir="/tmp"))
    os.chown(home, user.uid, user.gid)
    subprocess.run(["usermod", "--home", str(home), user.name], check=True, capture_output=True)
    first = 300000 + (user.uid % 1000) * 65536
    for path in ("/etc/subuid", "/etc/subgid"):
        with open(path, "a") as ids:
            ids.write(f"{user.name}:{first}:65536\n")
    rootfs = home / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
    for applet in ("sh", "cat", "echo", "sleep", "id"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    tar = home / "image.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(home)], check=True)
    run = {"user": user.uid, "group": user.gid, "cwd": str(home), "env": {"HOME": str(home), "PATH": "/usr/bin:/bin"}}
    imported = subprocess.run(
        ["podman", *PODMAN_OPTIONS.split(), "import", str(tar), IMAGE], capture_output=True, text=True, **run
    )
    assert imported.returncode == 0, imported.stderr
    try:
        yield user
    finally:
        subprocess.run(["podman", *PODMAN_OPTIONS.split(), "system", "migrate"], capture_output=True, **run)
        subprocess.run(["pkill", "-KILL", "-u", str(user.uid)], capture_output=True)
        for path in ("/etc/subuid", "/etc/subgid"):
            lines = Path(path).read_text().splitlines(keepends=True)
            Path(path).write_text("".join(line for line in lines if not line.startswith(f"{user.name}:")))
        subprocess.run(["usermod", "--home", old_home, user.name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def test_a_container_opens_its_booked_gpu_and_not_another_even_as_root_inside_and_ends_with_the_slot(home, podman_user):
    device_dir = home / "dev"
    device_dir.mkdir(mode=0o755)
    for index, minor in ((0, 3), (1, 5)):  # real character devices (/dev/null's and /dev/zero's numbers), 0660 root
        path = device_dir / f"nvidia{index}"
        subprocess.run(["mknod", "-m", "660", str(path), "c", "1", str(minor)], check=True)
    other = str(device_dir / "nvidia1")
    # The second card is handed to every container, as the driver's shared files are: only its ACL keeps it shut.
    node = make_node(home, PODMAN_OPTIONS=PODMAN_OPTIONS, CONTAINER_DEVICES=other)
    try:
        booked = node.enforcer.paths[node.gpus[0]]
        probe = (
            f"id -u; for d in {booked} {other}; do if (echo x > $d) 2>/dev/null; then echo opened $d;"
            " else echo refused $d; fi; done; echo done; exec sleep 600"
        )
        request = protocol.launch_request(number=1, kind="container", image=IMAGE, argv=["sh", "-c", probe])
        node.offer([lease(podman_user.name, [node.gpus[0]], [request])])
        node.at(T0)

        assert wait_for(lambda: "done" in (node.status() or {}).get("tail", ""), timeout=60), node.status()
        lines = node.status()["tail"].splitlines()
        assert lines[0] == "0"  # root inside the container (its user outside)
        assert f"opened {booked}" in lines
        assert f"refused {other}" in lines  # no ACL for the user on it: not even the container's root opens it

        ended_at = time.monotonic()
        node.at(T1)
        assert wait_for(lambda: node.state() == "stopped", timeout=GRACE + 15)
        gone = wait_for(lambda: not _container_processes(podman_user.uid), timeout=GRACE + 5)
        assert gone is not None and gone - ended_at <= GRACE + 5
    finally:
        node.launches.stop_all("the test ended")


def _container_processes(uid: int) -> list[str]:
    """The user's processes but podman's pause process (which keeps their namespace, and runs nothing)."""
    found = subprocess.run(["ps", "-o", "comm=", "-u", str(uid)], capture_output=True, text=True).stdout.split()
    return [name for name in found if name not in ("catatonit", "podman")]


def test_a_restarted_agent_ends_what_its_earlier_run_launched_before_starting_anything(home, unix_users):
    first = make_node(home)
    first.offer([lease(unix_users[0].name, [first.gpus[0]], [command(1, *SLEEPER)], reservation=41)])
    first.at(T0)
    assert wait_for(lambda: first.state(1, 41) == "running", timeout=10)
    pid = pid_of(first, 1, 41)
    # The agent dies: nothing ends its launch; a new run of it knows nothing of it but the stored snapshot.
    restarted = make_node(home, first.config)
    restarted.enforcer.restore()

    assert restarted.launches.end_leftovers() == 1

    assert not alive(pid)
    stopped = restarted.event("launch_stopped")
    assert (stopped["reservation"], stopped["launch"], stopped["user"]) == (41, 1, unix_users[0].name)
    assert "left running by an earlier run of the agent" in stopped["message"]


def test_images_are_got_ready_ahead_of_the_slot_and_a_missing_one_is_said(home, podman_user):
    node = make_node(home, PODMAN_OPTIONS=PODMAN_OPTIONS)
    try:
        present = protocol.launch_request(number=1, kind="container", image=IMAGE, argv=["sh"])
        absent = protocol.launch_request(number=2, kind="container", image="localhost/gpubook-absent:1", argv=["sh"])
        plain = command(3, *SLEEPER)
        node.offer([lease(podman_user.name, [node.gpus[0]], [present, absent, plain])])

        node.at(T0 - timedelta(minutes=30))  # within the hour before the slot
        assert wait_for(lambda: _settled(node), timeout=60), node.launches.statuses()

        assert (node.state(1), node.status(1)["message"]) == ("waiting", f"the image {IMAGE} is on the node")
        assert node.state(2) == "waiting"
        assert node.status(2)["message"].startswith("the image localhost/gpubook-absent:1 could not be pulled: ")
        assert (node.state(3), node.status(3)["message"]) == ("waiting", "waiting for the slot")
        assert node.launches.supervisor._launches == {}  # nothing runs before the slot
    finally:
        node.launches.stop_all("the test ended")


def _settled(node: LaunchNode) -> bool:
    messages = [status["message"] for status in node.launches.statuses()]
    return len(messages) == 3 and not any("ready ahead" in m or m.startswith("pulling") for m in messages)


def test_a_forged_launch_marker_gets_nobody_elses_processes_ended(home, unix_users):
    owner, other = unix_users[0], unix_users[1]
    node = make_node(home)
    node.offer([lease(owner.name, [node.gpus[0]], [command(1, *SLEEPER)], reservation=42)])
    node.enforcer.restore()
    # The other user marks a process of theirs as the owner's launch, hoping a restarted agent ends it for them
    # and reports it on the owner's booking.
    forged = subprocess.Popen(
        ["/bin/sleep", "60"], user=other.uid, group=other.gid, env={"GPUBOOK_LAUNCH": "gpubook-42-1"}
    )
    try:
        assert node.launches.end_leftovers() == 0
        assert forged.poll() is None
        assert node.kinds() == []
    finally:
        forged.kill()
        forged.wait()
