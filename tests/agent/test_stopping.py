"""Every way the agent stops closes every grant it made: a real agent process, real ACLs on stand-in device files
(cards and MIG capability files), throwaway users. What no code can catch (SIGKILL) is ``revoke-all``'s, as the
systemd unit's ExecStopPost runs it."""

from __future__ import annotations

import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from tests.agent.harness import AgentRun, acl_users, lease, now, wait_for

# Four cards, the first split in three MIG slices: five bookable units besides the split card itself.
MIG_LAYOUT = "0:3g.40gb,2g.20gb,2g.20gb"

# The agent, slow to start and slow to take its grants back: after the start's reconcile, and before revoking, it
# says so in the log and sleeps, so a test can signal it in either moment.
SLOW_AGENT = """
import sys, time
from gpubook_agent import main as agent
from gpubook_agent.enforcer import Enforcer

startup, revoke_all = Enforcer.startup, Enforcer.revoke_all

def slow_startup(self):
    startup(self)
    print("started slowly", flush=True)
    time.sleep(30)

def slow_revoke_all(self):
    print("revoking slowly", flush=True)
    time.sleep(1)
    return revoke_all(self)

Enforcer.startup, Enforcer.revoke_all = slow_startup, slow_revoke_all
sys.exit(agent.main(sys.argv[1:]))
"""

# The agent with a slow setfacl: each change waits half a second first, said in the log, so a stop can come while
# grants are on their way in the pool's threads.
SLOW_SETFACL = """
import sys, time
from gpubook_agent import acl, main as agent

change_many = acl.change_many

def slowly(paths, **users):
    print("setfacl slowly", flush=True)
    time.sleep(0.5)
    change_many(paths, **users)

acl.change_many = slowly
sys.exit(agent.main(sys.argv[1:]))
"""

# The agent with a fault: SIGUSR2 raises an exception wherever its main thread is (the worker's loop, where
# Celery's WorkController catches it and stops). An exception main.py catches itself is the configuration error's
# test below (the worker cannot be made).
FAULTY_AGENT = """
import signal, sys
from gpubook_agent.main import main

def fault(signum, frame):
    raise RuntimeError("a fault injected by the test")

signal.signal(signal.SIGUSR2, fault)
sys.exit(main(sys.argv[1:]))
"""


def kept_files(agent: AgentRun) -> list[str]:
    """Every stand-in file whose ACL the agent keeps: the cards' device files and the MIG capability files."""
    caps = agent.device_dir / "nvidia-caps"
    return sorted(
        [str(path) for path in agent.device_dir.glob("nvidia[0-9]*")]
        + ([str(path) for path in caps.iterdir()] if caps.is_dir() else [])
    )


def granted(agent: AgentRun) -> dict[str, set[str]]:
    """The named users on each kept file that has any."""
    found = {path: acl_users(path) for path in kept_files(agent)}
    return {path: users for path, users in found.items() if users}


def slices_of_card_0(agent: AgentRun, portal) -> list[str]:
    assert wait_for(lambda: portal.received["heartbeat"], timeout=10)
    (card,) = portal.received["heartbeat"][0]["mig"]
    return [item["uuid"] for item in card["slices"]]


def hold_every_unit(agent: AgentRun, portal, users) -> None:
    """One lease an hour long per user: the MIG slices of card 0 first, then whole cards. Waits for every grant."""
    units = [*slices_of_card_0(agent, portal), agent.uuid(1), agent.uuid(2), agent.uuid(3)]
    leases = [
        lease(number, user.name, [unit], now(), now() + timedelta(hours=1))
        for number, (user, unit) in enumerate(zip(users, units, strict=False), start=1)
    ]
    agent.send(agent.snapshot(leases))
    everyone = {user.name for user in users}
    assert wait_for(lambda: {name for names in granted(agent).values() for name in names} == everyone, timeout=15)
    assert wait_for(lambda: len(portal.events("granted")) >= len(users), timeout=10)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT], ids=lambda s: s.name)
def test_a_stop_signal_takes_back_every_grant_of_five_users_on_cards_and_slices(make_agent, portal, five_users, sig):
    agent = make_agent(gpus=4, simulated_mig=MIG_LAYOUT)
    hold_every_unit(agent, portal, five_users)
    capability_files = [path for path in granted(agent) if "nvidia-caps" in path]
    assert len(capability_files) >= 5  # slices' grants include capability files: they must close too

    agent.process.send_signal(sig)
    assert agent.process.wait(timeout=30) == 0

    assert granted(agent) == {}
    assert wait_for(lambda: any("every grant taken back" in line for line in agent.log), timeout=5)
    assert not any("cannot schedule new futures" in line or "Traceback" in line for line in agent.log)
    revoked = {(event["gpu"], event["user"]) for event in portal.events("revoked")}
    assert {name for _, name in revoked} == {user.name for user in five_users}  # and the portal was told


def test_a_clean_stop_with_two_users_leaves_nothing_for_revoke_all(make_agent, portal, unix_users):
    agent = make_agent(gpus=4, simulated_mig=MIG_LAYOUT)
    hold_every_unit(agent, portal, unix_users[:2])

    agent.stop()  # SIGTERM, as systemctl stop does
    assert agent.process.returncode == 0
    assert granted(agent) == {}
    result = agent.revoke_all()  # what ExecStopPost= runs after every stop
    assert (result.returncode, result.stdout.strip()) == (0, "gpubook-agent revoke-all: nothing to revoke")


def test_a_second_signal_while_stopping_does_not_cut_the_revocation_short(make_agent, portal, five_users):
    # A stop during the start, before the worker has handlers of its own, is the case where a second signal could
    # interrupt the revocation itself (the start's handler raises): the start finds the grants of a killed run.
    agent = make_agent(gpus=4, simulated_mig=MIG_LAYOUT)
    hold_every_unit(agent, portal, five_users)
    agent.kill()
    agent.start(entry=("-c", SLOW_AGENT), ready="started slowly")

    agent.process.send_signal(signal.SIGTERM)
    assert wait_for(lambda: any("revoking slowly" in line for line in agent.log), timeout=15)
    # An impatient admin. Each a different signal: the kernel keeps one of a kind pending, so a repeat sent before
    # the first is handled would be one signal.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
        agent.process.send_signal(sig)
    assert agent.process.wait(timeout=30) == 0

    assert granted(agent) == {}
    assert sum("received while stopping" in line for line in agent.log) == 4


def test_sigusr1_shows_the_threads_and_stops_nothing(make_agent, portal, unix_users):
    alice = unix_users[0]
    agent = make_agent()
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)

    agent.process.send_signal(signal.SIGUSR1)  # Celery's "cry": its default action would end the process

    assert wait_for(lambda: any("agent-enforcer" in line for line in agent.log), timeout=10)
    assert agent.process.poll() is None and acl_users(agent.device(0)) == {alice.name}


def test_an_exception_escaping_the_worker_takes_every_grant_back(make_agent, portal, five_users):
    agent = make_agent(gpus=4, simulated_mig=MIG_LAYOUT, entry=("-c", FAULTY_AGENT))
    hold_every_unit(agent, portal, five_users)

    agent.process.send_signal(signal.SIGUSR2)
    assert agent.process.wait(timeout=30) != 0  # a failure, and it says so

    assert granted(agent) == {}
    assert any("a fault injected by the test" in line for line in agent.log)


def test_a_configuration_error_found_after_the_start_takes_back_what_the_start_granted(make_agent, portal, unix_users):
    alice = unix_users[0]
    agent = make_agent()
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    agent.kill()  # gone; the stored snapshot still gives alice the card
    assert agent.revoke_all().returncode == 0  # as systemd does after a kill: closed
    config = agent.config_path.read_text().replace(f"BROKER_URL={agent.broker_url}", "BROKER_URL=nosuch://broker")
    agent.config_path.write_text(config)
    seen = len(portal.events())

    # The start enforces the stored snapshot (alice's grant comes back) before the worker finds it has no broker.
    result = agent.run_until_exit()

    assert result.returncode != 0
    assert "No such transport: nosuch" in result.stdout + result.stderr
    assert acl_users(agent.device(0)) == set()
    this_run = [(event["kind"], event.get("user")) for event in portal.events()[seen:]]
    assert this_run.index(("granted", alice.name)) < this_run.index(("revoked", alice.name))


def test_revoke_all_after_a_sigkill_removes_the_agents_grants_and_nothing_an_admin_set(make_agent, portal, five_users):
    agent = make_agent(gpus=4, simulated_mig=MIG_LAYOUT)
    hold_every_unit(agent, portal, five_users)
    before = granted(agent)
    admin = five_users[4].name  # holds card 2 by lease; an admin also gives them two other files by hand
    agent.kill()  # SIGKILL: no code of the agent runs
    assert granted(agent) == before  # still open: this is what ExecStopPost= is for
    by_hand = [agent.device(3), str(sorted((agent.device_dir / "nvidia-caps").iterdir())[-1])]
    for path in by_hand:
        subprocess.run(["setfacl", "-m", f"u:{admin}:r", "--", path], check=True)  # noqa: S603, S607

    result = agent.revoke_all()

    assert result.returncode == 0, result.stderr
    assert granted(agent) == {path: {admin} for path in by_hand}
    assert result.stdout.count("revoked ") == sum(len(users) for users in before.values())
    again = agent.revoke_all()
    assert (again.returncode, again.stdout.strip()) == (0, "gpubook-agent revoke-all: nothing to revoke")

    agent.start()  # the next start reconciles: the leases still running open again
    assert wait_for(lambda: granted(agent).get(agent.device(1)) == {five_users[3].name}, timeout=10)


def test_revoke_all_refuses_beside_a_running_agent(make_agent, portal, unix_users):
    alice = unix_users[0]
    agent = make_agent()
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)

    result = agent.revoke_all()

    assert result.returncode == 2
    assert f"an agent (pid {agent.process.pid}) is running" in result.stderr
    assert "stop it instead" in result.stderr
    assert acl_users(agent.device(0)) == {alice.name}


def test_a_second_agent_on_the_same_state_dir_refuses_to_start(make_agent, portal):
    agent = make_agent()

    result = agent.run_until_exit()

    assert result.returncode == 2
    assert f"an agent (pid {agent.process.pid}) is running with STATE_DIR" in result.stderr
    assert agent.process.poll() is None


def test_revoke_all_does_not_believe_an_edited_ledger(make_agent, portal, unix_users):
    alice, bob, _ = unix_users
    agent = make_agent()
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    agent.kill()
    subprocess.run(["setfacl", "-m", f"u:{bob.name}:r", "--", agent.device(1)], check=True)  # noqa: S603, S607
    ledger = Path(agent.state_dir) / "granted.log"
    ledger.write_text(ledger.read_text().replace(agent.device(0), agent.device(1)).replace(alice.name, bob.name))

    result = agent.revoke_all()

    assert result.returncode == 1
    assert "not trusted" in result.stderr and "nothing was revoked" in result.stderr
    assert acl_users(agent.device(1)) == {bob.name}  # the edit chose whose access goes: not believed


def test_revoke_all_works_with_a_config_an_edit_broke_since_the_start(make_agent, portal, unix_users):
    alice = unix_users[0]
    agent = make_agent()
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    agent.kill()
    broken = agent.config_path.read_text().replace("NODE_NAME=", "NODE NAME ").replace("ALLOW_INSECURE_PORTAL", "X")
    agent.config_path.write_text(broken + "a line that is no setting\nUNKNOWN_SETTING=1\n")
    assert agent.run_until_exit().returncode == 2  # the agent itself refuses it

    result = agent.revoke_all()  # needs STATE_DIR and LEASE_SECRET, nothing else

    assert result.returncode == 0, result.stderr
    assert acl_users(agent.device(0)) == set()


def test_a_stop_while_grants_are_on_their_way_waits_for_them_and_takes_them_back(make_agent, portal, five_users):
    agent = make_agent(gpus=4, simulated_mig=MIG_LAYOUT)
    hold_every_unit(agent, portal, five_users)
    agent.kill()
    assert agent.revoke_all().returncode == 0  # closed; the start will grant all five again, slowly

    agent.start(entry=("-c", SLOW_SETFACL), ready="setfacl slowly")
    agent.process.send_signal(signal.SIGTERM)  # the start's pass is waiting for its pool's setfacls

    assert agent.process.wait(timeout=30) == 0
    assert granted(agent) == {}
    result = agent.revoke_all()
    assert (result.returncode, result.stdout.strip()) == (0, "gpubook-agent revoke-all: nothing to revoke")
