"""A local user racing for a launch's endpoint never gets its holder's connection (issue 36).

Another throwaway account plays the attacker: it polls /proc for the launch's command line, as anyone on a node can,
and acts as soon as it sees it, before the server listens. On a Unix socket ({socket}) it can do nothing: it can
neither bind the path first, nor enter, list, rename or plant anything in the launch's directory, nor connect or
replace the socket once it serves; the holder, as their own account (as sshd connects for ``ssh -L``), reaches the
launch's own server. On a TCP port ({port}) it can bind first: then the port and token are never shown, and the
launch is refused (or its exit explained) in words. A control test turns the agent's check off and shows the race is
real: the holder's connection, token included, lands on the attacker's server. A rootless container serves on its
socket with no network at all; and the tunnel the booking page prints runs through a real sshd: the holder gets the
launch, another account logged in on the node gets nothing.

The server stands in for a notebook that takes a while to start: it waits for a file the test makes once the
attacker has acted, so the race is decided the same way on any machine, without timing.
"""

# Tests run fixed argument lists of interpreters and tools found on this machine (never a shell).
# ruff: noqa: S603, S607, F811

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubook_agent import endpoints, protocol
from gpubook_agent.launches import free_port
from tests.agent.conftest import UnixUser, read_line, run_as
from tests.agent.harness import wait_for
from tests.agent.test_launches import (  # noqa: F401 - home, node and podman_user are fixtures
    GRACE,
    PODMAN_OPTIONS,
    T0,
    T1,
    LaunchNode,
    alive,
    command,
    home,
    lease,
    make_node,
    node,
    pid_of,
    podman_user,
)

# The launch's server (as the booking's user): waits for the gate, then listens on --sock=PATH or --port=P and
# answers each connection with the launch's token, which only the launch knows (the holder checks it is theirs).
SERVER = r"""
import os, socket, sys, time
target, gate, on_taken = sys.argv[1], sys.argv[2], sys.argv[3]
print("starting", flush=True)
while not os.path.exists(gate):
    time.sleep(0.05)
if target.startswith("--sock="):
    server = socket.socket(socket.AF_UNIX)
    server.bind(target[len("--sock="):])
else:
    server = socket.socket()
    try:
        server.bind(("127.0.0.1", int(target[len("--port="):])))
    except OSError as error:
        print(f"cannot listen: {error}", flush=True)
        if on_taken == "exit":
            sys.exit(1)
        while True:  # a server that waits and tries again later, say: it runs on without its port
            time.sleep(1)
server.listen()
print("listening", flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(("launch " + os.environ["GPUBOOK_TOKEN"] + "\n").encode())
    connection.close()
"""

# The attacker (another account): polls /proc for a command line with the race's mark, then does what it can.
ATTACKER = r"""
import errno, json, os, socket, sys, threading, time
mark = sys.argv[1].encode()

def found():
    while True:
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as file:
                    argv = file.read().split(b"\0")
            except OSError:
                continue
            if mark in argv:
                for arg in argv:
                    if arg.startswith((b"--sock=", b"--port=")):
                        return arg.decode()
        time.sleep(0.001)

def attempt(action):
    try:
        action()
        return "done"
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))

target = found()
if target.startswith("--port="):
    port = int(target[len("--port="):])
    listener = socket.socket()
    listener.bind(("127.0.0.1", port))
    listener.listen()
    print(json.dumps({"bound": port}), flush=True)
    received = []

    def serve():
        while True:
            connection, _ = listener.accept()
            received.append(connection.recv(500).decode("utf-8", "replace"))
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    sys.stdin.readline()
    print(json.dumps({"received": received}), flush=True)
else:
    path = target[len("--sock="):]
    directory = os.path.dirname(path)
    root = os.path.dirname(directory)

    def bind():
        squatter = socket.socket(socket.AF_UNIX)
        squatter.bind(path)
        squatter.listen()

    def connect():
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
            client.recv(200)

    before = {
        "bind its path first": attempt(bind),
        "list its directory": attempt(lambda: os.listdir(directory)),
        "plant a link in its directory": attempt(lambda: os.symlink("/tmp", os.path.join(directory, "link"))),
        "move its directory away": attempt(lambda: os.rename(directory, directory + ".old")),
        "make a launch directory of its own": attempt(lambda: os.mkdir(os.path.join(root, "gpubook-999-1"))),
    }
    print(json.dumps({"before": before}), flush=True)
    sys.stdin.readline()  # the launch serves now
    after = {
        "connect to it": attempt(connect),
        "remove its socket": attempt(lambda: os.unlink(path)),
        "bind its path": attempt(bind),
    }
    print(json.dumps({"after": after}), flush=True)
"""

BEFORE = (
    "bind its path first",
    "list its directory",
    "plant a link in its directory",
    "move its directory away",
    "make a launch directory of its own",
)
AFTER = ("connect to it", "remove its socket", "bind its path")
ENDED = ("exited", "stopped", "refused")


class Racer:
    """The attacker's process, as another account; its answers as JSON lines."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def said(self, timeout: float = 60.0) -> dict[str, Any]:
        line = read_line(self.process, timeout=timeout)
        assert line, f"the attacker said nothing: {self.process.stderr.read() if self.process.poll() else ''}"
        return dict(json.loads(line))

    def go_on(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()


@pytest.fixture
def racer(user_python: str) -> Iterator[Callable[[UnixUser, str], Racer]]:
    started: list[subprocess.Popen[str]] = []

    def start(user: UnixUser, mark: str) -> Racer:
        process = subprocess.Popen(
            [user_python, "-I", "-c", ATTACKER, mark],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **run_as(user),
        )
        started.append(process)
        return Racer(process)

    try:
        yield start
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=10)


def server(user_python: str, target: str, gate: Path, mark: str, on_taken: str = "wait") -> protocol.LaunchRequest:
    return command(1, user_python, "-I", "-c", SERVER, target, str(gate), on_taken, mark)


def watch(node: LaunchNode, seen: list[dict[str, Any]], condition: Callable[[dict[str, Any]], bool]) -> bool:
    """Step the launches until the launch's status meets ``condition``; every status on the way goes in ``seen``."""

    def check() -> bool:
        node.launches.step(node.clock.now)
        status = node.status()
        if status is not None:
            seen.append(status)
        return status is not None and condition(status)

    return wait_for(check, timeout=30, interval=0.05) is not None


def connect_as(user: UnixUser, user_python: str, path: str) -> str:
    """What a client of ``user`` (as sshd connects for their ``ssh -L``) reads from the Unix socket ``path``."""
    client = (
        "import socket, sys\nwith socket.socket(socket.AF_UNIX) as c:\n"
        "    c.connect(sys.argv[1]); print(c.makefile().readline().strip())"
    )
    done = subprocess.run(
        [user_python, "-I", "-c", client, path], **run_as(user), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_racer_for_a_notebooks_socket_can_neither_take_nor_reach_it_and_the_holder_gets_the_launch(
    node, home, unix_users, user_python, racer
):
    holder, attacker = unix_users[0], unix_users[1]
    gate, mark = home / "listen-now", f"race-{secrets.token_hex(4)}"
    attack = racer(attacker, mark)
    node.offer([lease(holder.name, [node.gpus[0]], [server(user_python, "--sock={socket}", gate, mark)])])
    node.at(T0)

    # It saw the command line and acted before the server listened: the kernel refused it everything.
    assert attack.said()["before"] == dict.fromkeys(BEFORE, "EACCES")
    seen: list[dict[str, Any]] = []
    assert watch(node, seen, lambda status: "starting" in status["tail"])
    node.launches.step(node.clock.now)
    assert (node.status()["socket"], node.status()["token"]) == ("", "")  # not serving yet: nothing shown
    assert node.status()["message"] == "waiting for it to listen on its socket (no socket yet)"

    gate.touch()
    assert watch(node, seen, lambda status: bool(status["socket"]))
    status = node.status()
    path = f"{node.config.launch_socket_dir}/gpubook-1-1/socket"
    assert (status["state"], status["socket"], status["port"], status["message"]) == ("running", path, None, "")
    attack.go_on()
    assert attack.said()["after"] == dict.fromkeys(AFTER, "EACCES")

    assert connect_as(holder, user_python, path) == f"launch {status['token']}"  # the launch itself, and theirs
    assert all(not item["port"] for item in seen)

    node.at(T1)  # the slot ends: the launch, and its directory, go
    assert wait_for(lambda: node.state() == "stopped", timeout=GRACE + 5)
    assert not os.path.exists(os.path.dirname(path))
    assert node.status()["socket"] == path  # still said where it served, for the portal's record


@pytest.mark.parametrize("on_taken", ["wait", "exit"])
def test_a_racer_that_binds_a_notebooks_port_first_never_gets_the_holders_connection(
    node, home, unix_users, user_python, racer, on_taken
):
    holder, attacker = unix_users[0], unix_users[1]
    gate, mark = home / "listen-now", f"race-{secrets.token_hex(4)}"
    attack = racer(attacker, mark)
    node.offer([lease(holder.name, [node.gpus[0]], [server(user_python, "--port={port}", gate, mark, on_taken)])])
    node.at(T0)

    port = attack.said()["bound"]  # it won the race to the port
    assert wait_for(lambda: "gpubook-1-1" in node.launches.supervisor._launches, timeout=10)
    pid = pid_of(node)
    gate.touch()
    if on_taken == "exit":  # the agent looks only after the server gave up (else it refuses what still runs)
        assert wait_for(lambda: not alive(pid), timeout=30)
    seen: list[dict[str, Any]] = []
    assert watch(node, seen, lambda status: status["state"] in ("refused", "exited"))

    status = node.status()
    taker = f"another account ({attacker.name})"
    if on_taken == "wait":  # the server runs on without its port: the agent refuses it, and ends it
        assert status["state"] == "refused"
        assert status["message"] == (
            f"refused: port {port} on the node's loopback is held by {taker}, not by the launch: its port and token "
            "were not shown"
        )
        assert node.event("launch_refused")["message"] == status["message"]
        assert wait_for(lambda: not alive(pid), timeout=GRACE + 5)
    else:  # the server gave up: its exit says why
        assert (status["state"], status["exit_code"]) == ("exited", 1)
        assert status["message"] == (
            f"exited with code 1; port {port} was taken by {taker} first: its port and token were not shown"
        )
    assert all(item["port"] is None and item["token"] == "" for item in seen)  # never shown, so never used
    attack.go_on()
    assert attack.said()["received"] == []  # the holder never connected to the racer


def test_control_without_the_check_the_racer_gets_the_holders_connection_and_token(
    node, home, unix_users, user_python, racer, monkeypatch
):
    """The race is real: with the listener's owner taken on trust (as before issue 36), the holder is shown the
    racer's port, and their connection, with their token, goes to the racer."""
    monkeypatch.setattr(endpoints, "port_verdict", lambda *args, **kwargs: endpoints.PortVerdict("ours"))
    holder, attacker = unix_users[0], unix_users[1]
    gate, mark = home / "listen-now", f"race-{secrets.token_hex(4)}"
    attack = racer(attacker, mark)
    node.offer([lease(holder.name, [node.gpus[0]], [server(user_python, "--port={port}", gate, mark)])])
    node.at(T0)
    port = attack.said()["bound"]
    gate.touch()

    assert watch(node, [], lambda status: status["port"] == port)
    token = node.status()["token"]
    holder_client = (
        "import socket, sys\nwith socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=10) as c:\n"
        "    c.sendall(('GET /?token=' + sys.argv[2] + ' HTTP/1.0\\r\\n\\r\\n').encode())"
    )
    subprocess.run([user_python, "-I", "-c", holder_client, str(port), token], **run_as(holder), check=True)
    attack.go_on()
    assert any(token in received for received in attack.said()["received"])


@pytest.fixture
def container_node(home: Path, podman_user: UnixUser) -> Iterator[tuple[LaunchNode, str]]:
    """A node that runs containers, its stand-in GPUs real character devices (podman passes only those), and an
    image in the podman user's storage: busybox and a tiny static socket server (busybox has none)."""
    image = "localhost/gpubook-test-sockserve:1"
    _import_image(podman_user, home, image, _static_socket_server(home))
    (home / "dev").mkdir(mode=0o755)
    for index, minor in ((0, 3), (1, 5)):  # /dev/null's and /dev/zero's numbers
        subprocess.run(["mknod", "-m", "660", str(home / "dev" / f"nvidia{index}"), "c", "1", str(minor)], check=True)
    made = make_node(home, PODMAN_OPTIONS=PODMAN_OPTIONS)
    try:
        yield made, image
    finally:
        made.launches.stop_all("the test ended")


def test_a_container_serves_on_its_socket_with_no_network(container_node, podman_user, unix_users, user_python, racer):
    node, image = container_node
    mark = f"race-{secrets.token_hex(4)}"
    attack = racer(unix_users[1], mark)
    probe = 'echo "networks: $(ls /sys/class/net)"; exec sockserve "${0#--sock=}"'
    argv = ["sh", "-c", probe, "--sock={socket}", mark]
    node.offer([lease(podman_user.name, [node.gpus[0]], [protocol.launch_request(
        number=1, kind="container", image=image, argv=argv)])])  # fmt: skip
    node.at(T0)
    assert attack.said()["before"] == dict.fromkeys(BEFORE, "EACCES")

    assert watch(node, [], lambda status: bool(status["socket"])), node.status()["tail"]
    status = node.status()
    assert "networks: lo" in status["tail"]  # no network but its own loopback: the socket is its way out
    assert connect_as(podman_user, user_python, status["socket"]) == f"container {status['token']}"
    attack.go_on()
    assert attack.said()["after"] == dict.fromkeys(AFTER, "EACCES")

    node.at(T1)
    assert wait_for(lambda: node.state() == "stopped", timeout=GRACE + 15)
    assert not os.path.exists(os.path.dirname(status["socket"]))


def test_a_containers_published_port_counts_as_the_launchs_own(container_node, podman_user):
    """podman publishes a container's {port} through its rootlessport process, the user's, in podman's family: the
    agent finds it there, and shows the port once it listens."""
    node, image = container_node
    argv = ["busybox", "httpd", "-f", "-p", "{port}", "-h", "/"]
    node.offer([lease(podman_user.name, [node.gpus[0]], [protocol.launch_request(
        number=1, kind="container", image=image, argv=argv)])])  # fmt: skip
    node.at(T0)

    assert watch(node, [], lambda status: bool(status["port"]) or status["state"] in ENDED), node.status()
    status = node.status()
    assert (status["state"], status["message"], len(status["token"])) == ("running", "", 32)
    listeners = endpoints.loopback_listeners(status["port"])
    assert [(item.address, item.uid) for item in listeners] == [("127.0.0.1", podman_user.uid)]


SOCKSERVE_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    const char *token = getenv("GPUBOOK_TOKEN");
    int server = socket(AF_UNIX, SOCK_STREAM, 0);
    if (argc < 2) return 2;
    strncpy(address.sun_path, argv[1], sizeof address.sun_path - 1);
    if (bind(server, (struct sockaddr *)&address, sizeof address) || listen(server, 8)) {
        perror("sockserve");
        return 1;
    }
    printf("listening\n");
    fflush(stdout);
    for (;;) {
        int client = accept(server, NULL, NULL);
        if (client < 0) continue;
        dprintf(client, "container %s\n", token ? token : "-");
        close(client);
    }
}
"""


def _static_socket_server(home: Path) -> Path:
    """A tiny static program that serves on a Unix socket, for the busybox image (which has none)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the container's tiny socket server")
    source, binary = home / "sockserve.c", home / "sockserve"
    source.write_text(SOCKSERVE_C)
    built = subprocess.run([compiler, "-static", "-O2", "-o", str(binary), str(source)], capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"cannot build a static program here (libc6-dev's libc.a?): {built.stderr.strip()[-300:]}")
    return binary


def _import_image(user: UnixUser, home: Path, image: str, server_binary: Path) -> None:
    """The busybox image with the socket server, in the user's own storage."""
    user_home = Path(os.path.expanduser(f"~{user.name}"))
    rootfs = home / "sockserve-rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
    shutil.copy(server_binary, rootfs / "bin" / "sockserve")
    for applet in ("sh", "ls", "echo"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    tar = user_home / "sockserve.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
    os.chown(tar, user.uid, user.gid)
    run = {"user": user.uid, "group": user.gid, "cwd": str(user_home)}
    imported = subprocess.run(
        ["podman", *PODMAN_OPTIONS.split(), "import", str(tar), image],
        capture_output=True,
        text=True,
        env={"HOME": str(user_home), "PATH": "/usr/bin:/bin"},
        **run,
    )
    assert imported.returncode == 0, imported.stderr


# -- the holder's way in: ssh -L to the socket ------------------------------------------------------------------


@pytest.fixture
def sshd(home: Path) -> Iterator[tuple[int, Path, Path]]:
    """A real sshd on the loopback, for the test's accounts (a key in ``keys/<user>``): (port, its client key, the
    keys' directory). StrictModes is off only because its files live under /tmp (world-writable, sticky)."""
    sshd_path, keygen = shutil.which("sshd") or "/usr/sbin/sshd", shutil.which("ssh-keygen")
    if not os.path.exists(sshd_path) or keygen is None or shutil.which("ssh") is None:
        pytest.skip("openssh-server and openssh-client are not installed (scripts/services installs them)")
    directory = home / "sshd"
    (directory / "keys").mkdir(parents=True)
    for key in ("host", "client"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(directory / key)], check=True)
    port = free_port()
    (directory / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {directory / 'host'}\nPidFile {directory / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {directory / 'keys'}/%u\nStrictModes no\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM yes\nAllowStreamLocalForwarding yes\nLogLevel VERBOSE\n"
    )
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # its privilege separation directory
    log = open(directory / "sshd.log", "w")  # noqa: SIM115 - closed below, after the daemon
    daemon = subprocess.Popen([sshd_path, "-D", "-e", "-f", str(directory / "sshd_config")], stderr=log)
    try:
        assert wait_for(lambda: _accepts(port), timeout=30), (directory / "sshd.log").read_text()
        yield port, directory / "client", directory / "keys"
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
        log.close()


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_the_booking_pages_ssh_tunnel_reaches_the_launch_as_its_holder_and_no_one_else(
    node, home, unix_users, user_python, sshd
):
    """What the booking page prints, ``ssh -N -L 8888:<socket> <user>@<node>``, run for real: sshd connects to the
    socket as the account that logged in, so the holder reaches the launch and another account, logged in on the
    node too, gets nothing through the same command."""
    sshd_port, client_key, keys = sshd
    holder, other = unix_users[0], unix_users[1]
    for user in (holder, other):
        (keys / user.name).write_text(Path(f"{client_key}.pub").read_text())
    gate = home / "listen-now"
    gate.touch()
    node.offer([lease(holder.name, [node.gpus[0]], [server(user_python, "--sock={socket}", gate, "ssh")])])
    node.at(T0)
    assert watch(node, [], lambda status: bool(status["socket"]))
    path, token = node.status()["socket"], node.status()["token"]

    tunnels = []
    try:
        answers = {}
        for user in (holder, other):
            local = free_port()
            tunnels.append(
                subprocess.Popen(
                    ["ssh", "-N", "-L", f"{local}:{path}", f"{user.name}@127.0.0.1", "-p", str(sshd_port),
                     "-i", str(client_key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                     "-o", "UserKnownHostsFile=/dev/null", "-o", "ExitOnForwardFailure=yes", "-o", "LogLevel=ERROR"],
                    stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                )
            )  # fmt: skip
            assert wait_for(lambda local=local: _accepts(local), timeout=30), tunnels[-1].stderr
            with socket.create_connection(("127.0.0.1", local), timeout=30) as through:
                answers[user.name] = through.makefile().readline().strip()
    finally:
        for tunnel in tunnels:
            tunnel.terminate()
            tunnel.communicate(timeout=10)

    assert answers == {holder.name: f"launch {token}", other.name: ""}  # the other's sshd got "Permission denied"
    assert f"connect to {path} port -2 failed: Permission denied" in (home / "sshd" / "sshd.log").read_text()
