"""Where a launch serves (gpubook_agent/endpoints.py, issue 36), with real directories, real sockets and throwaway
accounts: a launch's socket directory is its user's alone, in a root-owned one reached only through directories no
other account can change, and goes without following a link its user planted; a TCP listener counts as the launch's
only when its user made it and the launch's processes hold it."""

# Tests run fixed argument lists of interpreters found on this machine (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubook_agent import endpoints, procfs
from gpubook_agent.config import ConfigError, config_from_values
from gpubook_agent.endpoints import UnsafeSocketDir
from tests.agent.conftest import _need_root, run_as, start_ready


@pytest.fixture
def root() -> Iterator[Path]:
    """A place for LAUNCH_SOCKET_DIR that other accounts can pass through (pytest's tmp_path is in root's 0700)."""
    _need_root()
    base = Path(tempfile.mkdtemp(prefix="gpbt-sockets-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base / "run" / "gpubook-launches"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_launchs_directory_is_its_users_alone_inside_a_root_owned_one(root, unix_users, user_python):
    owner, other = unix_users[0], unix_users[1]
    path = endpoints.make_socket_dir(str(root), "gpubook-7-1", uid=owner.uid, gid=owner.gid)

    assert path == f"{root}/gpubook-7-1/socket"
    parent, own = os.lstat(root), os.lstat(root / "gpubook-7-1")
    assert (parent.st_uid, stat.S_IMODE(parent.st_mode)) == (0, 0o755)
    assert (own.st_uid, own.st_gid, stat.S_IMODE(own.st_mode)) == (owner.uid, owner.gid, 0o700)
    probe = "import os, sys\ntry:\n    os.listdir(sys.argv[1]); print('entered')\nexcept OSError: print('denied')"
    entered = [
        subprocess.run(
            [user_python, "-I", "-c", probe, str(root / "gpubook-7-1")], **run_as(user), capture_output=True, text=True
        ).stdout.strip()
        for user in (owner, other)
    ]
    assert entered == ["entered", "denied"]


def test_a_leftover_of_the_same_name_is_replaced_and_no_link_in_it_is_followed(root, unix_users):
    owner = unix_users[0]
    endpoints.make_socket_dir(str(root), "gpubook-7-1", uid=owner.uid, gid=owner.gid)
    precious = root.parent / "precious"
    precious.mkdir()
    (precious / "keep").write_text("keep")
    (root / "gpubook-7-1" / "link").symlink_to(precious)  # the user's own directory: they may plant links

    endpoints.make_socket_dir(str(root), "gpubook-7-1", uid=owner.uid, gid=owner.gid)  # a new run of that launch
    assert os.listdir(root / "gpubook-7-1") == []
    (root / "gpubook-7-1" / "link").symlink_to(precious)
    endpoints.remove_socket_dir(str(root), "gpubook-7-1")

    assert not (root / "gpubook-7-1").exists()
    assert (precious / "keep").read_text() == "keep"


@pytest.mark.parametrize("flaw", ["link", "not root's", "world-writable"])
def test_a_socket_dir_that_is_not_roots_alone_is_refused_with_words(root, unix_users, flaw):
    root.parent.mkdir(parents=True)
    real = root.parent / "real"
    real.mkdir()
    configured = root.parent / "sockets"
    if flaw == "link":
        configured.symlink_to(real)
    else:
        configured.mkdir()
        if flaw == "not root's":
            os.chown(configured, unix_users[0].uid, unix_users[0].gid)
        else:
            configured.chmod(0o777)

    with pytest.raises(UnsafeSocketDir) as refused:
        endpoints.make_socket_dir(str(configured), "gpubook-7-1", uid=unix_users[0].uid, gid=unix_users[0].gid)
    words = {"link": "is not a directory", "not root's": "not root", "world-writable": "writable by others"}[flaw]
    assert words in str(refused.value)
    assert os.listdir(real) == []


def test_leftover_directories_are_cleared_at_the_start_but_the_known_ones(root, unix_users):
    owner = unix_users[0]
    for name in ("gpubook-7-1", "gpubook-7-2"):
        endpoints.make_socket_dir(str(root), name, uid=owner.uid, gid=owner.gid)
    (root / "README").write_text("the admin's")  # not a launch's: never touched

    assert endpoints.clear_socket_dirs(str(root), keep={"gpubook-7-2"}) == 1
    assert sorted(os.listdir(root)) == ["README", "gpubook-7-2"]


def test_only_a_socket_the_user_made_in_their_directory_counts(root, unix_users, user_python):
    owner = unix_users[0]
    path = endpoints.make_socket_dir(str(root), "gpubook-7-1", uid=owner.uid, gid=owner.gid)
    assert endpoints.socket_problem(path, uid=owner.uid) == "no socket yet"

    with socket.socket(socket.AF_UNIX) as made_by_root:
        made_by_root.bind(path)
        assert "was made by uid 0" in str(endpoints.socket_problem(path, uid=owner.uid))
    os.unlink(path)
    serve = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\nprint('bound')"
    made = subprocess.run([user_python, "-I", "-c", serve, path], **run_as(owner), capture_output=True, text=True)
    assert made.stdout.strip() == "bound", made.stderr
    assert endpoints.socket_problem(path, uid=owner.uid) is None

    (root / "gpubook-7-1").chmod(0o777)  # its user opened their directory to all: it is no longer theirs alone
    assert "no longer its user's alone" in str(endpoints.socket_problem(path, uid=owner.uid))


@pytest.mark.parametrize(
    ("family", "address"),
    [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0")],  # noqa: S104
)
def test_a_listener_that_reaches_the_loopback_counts_only_when_the_launch_holds_it(family, address):
    with socket.socket(family) as listener:
        listener.bind((address, 0))
        listener.listen()
        port = listener.getsockname()[1]
        me = os.getuid()

        assert [item.address for item in endpoints.loopback_listeners(port)] == [address]
        assert endpoints.port_verdict(port, uid=me, pids=[os.getpid()]).kind == "ours"
        outside = endpoints.port_verdict(port, uid=me, pids=[])  # the same account, not the launch's process
        assert (outside.kind, "a process outside the launch" in outside.message) == ("foreign", True)
        other = endpoints.port_verdict(port, uid=4242, pids=[os.getpid()])  # the launch is another account's
        assert other.kind == "foreign" and "held by another account (root)" in other.message
        assert "its port and token were not shown" in other.message
    assert endpoints.port_verdict(port, uid=me, pids=[os.getpid()]).kind == "waiting"


def test_an_ipv6_wildcard_alone_is_the_launchs_when_it_holds_it_and_otherwise_never_shown_nor_refused():
    with socket.socket(socket.AF_INET6) as listener:
        listener.bind(("::", 0))
        listener.listen()
        port = listener.getsockname()[1]
        me = os.getuid()

        assert endpoints.port_verdict(port, uid=me, pids=[os.getpid()]).kind == "ours"
        # It may be IPV6_V6ONLY and take no IPv4: not the launch's, so not shown, but no reason to refuse it either.
        assert endpoints.port_verdict(port, uid=4242, pids=[os.getpid()]).kind == "waiting"


LISTENER = """
import socket, sys, time
family, address, port, v6only = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "v6only"
listener = socket.socket(socket.AF_INET6 if family == "6" else socket.AF_INET)
if v6only:
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
listener.bind((address, port))
listener.listen()
print("ready", flush=True)
time.sleep(60)
"""


def test_another_accounts_ipv6_only_wildcard_beside_the_launchs_listener_changes_nothing(
    unix_users, user_python, started
):
    # Any account can listen on [::]:P with IPV6_V6ONLY beside the launch's 127.0.0.1:P (no conflict): a connection
    # to 127.0.0.1 never reaches it, and it must not refuse (stop) the launch.
    with socket.socket(socket.AF_INET) as launch:
        launch.bind(("127.0.0.1", 0))
        launch.listen()
        port = launch.getsockname()[1]
        start_ready(
            [user_python, "-I", "-c", LISTENER, "6", "::", str(port), "v6only"], started, **run_as(unix_users[1])
        )

        assert sorted(item.address for item in endpoints.loopback_listeners(port)) == ["127.0.0.1", "::"]
        assert endpoints.port_verdict(port, uid=os.getuid(), pids=[os.getpid()]).kind == "ours"


def test_another_accounts_listener_on_the_loopback_address_refuses_the_launch(unix_users, user_python, started):
    # It took the port before the launch could: a connection to 127.0.0.1:P reaches it, whatever the launch holds.
    with socket.socket(socket.AF_INET6) as launch:
        launch.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        launch.bind(("::", 0))
        launch.listen()
        port = launch.getsockname()[1]
        start_ready(
            [user_python, "-I", "-c", LISTENER, "4", "127.0.0.1", str(port), "-"], started, **run_as(unix_users[1])
        )

        verdict = endpoints.port_verdict(port, uid=os.getuid(), pids=[os.getpid()])
        assert verdict.kind == "foreign" and f"held by another account ({unix_users[1].name})" in verdict.message


def test_a_listener_on_another_loopback_address_is_not_one_the_holder_reaches():
    with socket.socket(socket.AF_INET6) as elsewhere:
        elsewhere.bind(("::1", 0))  # a connection to 127.0.0.1 never lands on ::1
        elsewhere.listen()
        assert endpoints.loopback_listeners(elsewhere.getsockname()[1]) == []


def test_the_socket_dir_setting_is_checked_for_what_ssh_and_podman_take():
    assert endpoints.socket_dir_problem("/run/gpubook-launches") is None
    for bad in ("run/x", "/run/x/", "/run/../etc", "/run/a b", "/run/a:b", "/" + "x" * 70):
        assert endpoints.socket_dir_problem(bad) is not None, bad


def test_a_units_processes_are_those_in_its_cgroup_or_below(tmp_path):
    """With LAUNCH_RUNNER=systemd the command is PID 1's child, not the agent's: its unit's cgroup says what is the
    launch's (podman's own cgroups below it with Delegate=yes too). systemd is not PID 1 here: /proc as it reads on
    such a node (cgroup v2, and v1's named hierarchy)."""
    lines = {
        11: "0::/system.slice/gpubook-7-1.service\n",
        12: "0::/system.slice/gpubook-7-1.service/libpod-payload-abc\n",
        13: "12:pids:/system.slice/gpubook-7-1.service\n1:name=systemd:/system.slice/gpubook-7-1.service\n",
        14: "0::/system.slice/gpubook-7-10.service\n",  # another launch, whose name starts alike
        15: "0::/user.slice/user-1000.slice/session-3.scope\n",
    }
    for pid, text in lines.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)

    assert sorted(procfs.cgroup_members("gpubook-7-1.service", proc=str(tmp_path))) == [11, 12, 13]


def test_launch_socket_dir_is_checked_when_the_config_is_loaded_and_stand_in_nodes_get_one_each():
    base = {"NODE_NAME": "gpu-a100", "BROKER_URL": "redis://x", "PORTAL_URL": "https://portal", "AGENT_TOKEN": "t",
            "LEASE_SECRET": "s"}  # fmt: skip
    assert config_from_values(base).launch_socket_dir == "/run/gpubook-launches"
    simulated = config_from_values({**base, "BACKEND": "simulated", "STATE_DIR": "/var/lib/x"})
    assert simulated.launch_socket_dir == "/run/gpubook-launches/gpu-a100"  # stand-in agents share a machine
    with pytest.raises(ConfigError) as refused:
        config_from_values({**base, "LAUNCH_SOCKET_DIR": "/run/sockets; rm -rf /"})
    assert str(refused.value).startswith("LAUNCH_SOCKET_DIR must be an absolute path of letters, digits")
