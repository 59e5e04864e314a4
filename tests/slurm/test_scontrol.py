"""Reading scontrol's one-line records (slurm/scontrol.py) as Slurm 22.05 writes them (recorded from the test
cluster: tests/slurm/cluster.py), and refusing to send Slurm a value that could become another setting."""

from __future__ import annotations

import socket
from datetime import UTC, datetime

import pytest

from slurm.scontrol import (
    Scontrol,
    SlurmError,
    SlurmReservation,
    SlurmUnreachable,
    _settings,
    is_ours,
    node_from,
    parse_line,
    reservation_from,
)
from slurm.services import slurm_nodes_import

NODE = (
    "NodeName=vm Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.33 AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=gpu:a100:4 NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18.44 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=22353 Sockets=2 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 "
    "Reason=fan failure [root@2026-12-06T06:50:52]"
)
RESERVATION = (
    "ReservationName=gpubook-1 StartTime=2026-12-06T06:50:59 EndTime=2026-12-06T07:00:59 Duration=00:10:00 Nodes=vm "
    "NodeCnt=1 CoreCnt=2 Features=(null) PartitionName=(null) Flags=SPEC_NODES,MAGNETIC TRES=cpu=2 Users=alice "
    "Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)"
)

CONFIG = """Configuration data as of 2026-12-06T09:13:21
AccountingStorageBackupHost = (null)
AccountingStorageEnforce = none
SlurmctldPidFile        = /tmp/gpbt-slurm-m9ee7mk_/slurmctld.pid
SLURM_CONF              = /tmp/gpbt-slurm-m9ee7mk_/slurm.conf
SLURM_VERSION           = 22.05.8
SrunPortRange           = 0-0
"""


def test_the_clusters_release_is_read_from_its_controllers_configuration():
    capabilities = RecordedScontrol(NODE).capabilities()
    assert capabilities.version == (22, 5, 8) and capabilities.version_text == "22.05.8"
    assert not capabilities.gpu_reservations  # 22.05 reserves whole nodes: its nodes are booked whole


@pytest.mark.parametrize(
    ("release", "gpus"), [("22.05.8", False), ("23.02.7", False), ("23.11.0", True), ("25.05.1", True)]
)
def test_single_gpus_are_reserved_from_the_release_that_can(release, gpus):
    scontrol = RecordedScontrol(NODE)
    scontrol.config = CONFIG.replace("22.05.8", release)
    assert scontrol.capabilities().gpu_reservations is gpus


def test_a_configuration_without_a_release_is_an_error_not_a_guess():
    scontrol = RecordedScontrol(NODE)
    scontrol.config = "SlurmctldPort = 6817\n"
    with pytest.raises(SlurmError, match="names no SLURM_VERSION"):
        scontrol.capabilities()


def test_a_value_may_hold_spaces_and_runs_to_the_next_key():
    record = parse_line(NODE)
    assert record["OS"] == "Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0"
    assert record["Reason"] == "fan failure [root@2026-12-06T06:50:52]"
    node = node_from(record)
    assert (node.name, node.gpu_type, node.gpu_count, node.state) == ("vm", "a100", 4, "IDLE+DRAIN")
    assert node.offline  # drained: it runs no new jobs


def test_a_reservation_is_read_with_its_users_flags_and_times():
    reservation = reservation_from(parse_line(RESERVATION))
    assert reservation.users == ("alice",) and reservation.flags == ("SPEC_NODES", "MAGNETIC")
    assert reservation.start == datetime(2026, 12, 6, 6, 50, 59, tzinfo=UTC) and reservation.is_ours


@pytest.mark.parametrize(
    "field",
    [{"users": ("alice Flags=IGNORE_JOBS",)}, {"nodes": "vm Users=root"}, {"name": "maint"}, {"users": ("a,b",)}],
)
def test_nothing_that_could_become_another_setting_is_sent(field):
    at = datetime(2030, 1, 1, tzinfo=UTC)
    values = {"name": "gpubook-1", "users": ("alice",), "start": at, "end": at, "nodes": "vm", "flags": (), "tres": ""}
    with pytest.raises(SlurmError, match="refused to send Slurm"):
        _settings(SlurmReservation(**{**values, **field}))


class RecordedScontrol(Scontrol):
    """scontrol's answer as recorded (a node named with capitals cannot be made on the test cluster, whose node is
    named after this machine)."""

    def __init__(self, text: str) -> None:
        super().__init__(["scontrol"])
        self.text, self.config = text, CONFIG

    def run(self, *arguments: str) -> str:
        return self.config if arguments[:2] == ("show", "config") else self.text


def test_a_node_whose_name_the_portal_cannot_keep_as_it_is_is_skipped_with_words(db):
    done = slurm_nodes_import(controller=RecordedScontrol(NODE.replace("NodeName=vm", "NodeName=GPU-Node7")))
    assert done.created == [] and "not a node name the portal takes" in done.skipped["GPU-Node7"]


def test_only_gpubook_and_a_booking_number_is_the_portals():
    assert is_ours("gpubook-12") and not is_ours("gpubook-x") and not is_ours("gpubook-") and not is_ours("maint")
    with pytest.raises(SlurmError, match="never deleted"):
        Scontrol(["scontrol"]).delete("gpubook-x")  # an operator's, whatever its name starts with


def test_a_gpu_type_or_tres_that_could_become_another_setting_is_refused():
    at = datetime(2030, 1, 1, tzinfo=UTC)
    values = {"name": "gpubook-1", "users": ("alice",), "start": at, "end": at, "nodes": "vm", "flags": ()}
    with pytest.raises(SlurmError, match="refused to send Slurm"):
        _settings(SlurmReservation(**values, tres="gres/gpu:a100=2 Flags=IGNORE_JOBS"))
    assert "TRES=gres/gpu:a100=2" in _settings(SlurmReservation(**values, tres="gres/gpu:a100=2"))
    node = node_from(parse_line(NODE.replace("Gres=gpu:a100:4", "Gres=gpu:a100;rm:4")))
    assert node.gpu_type == "" and node.gpu_count == 4  # a type the portal could not send back is not kept


def test_an_ssh_that_cannot_connect_is_a_controller_out_of_reach():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    over_ssh = Scontrol(["ssh", "-o", "BatchMode=yes", "-p", str(closed), "127.0.0.1", "scontrol"], timeout=20)
    with pytest.raises(SlurmUnreachable, match="Connection refused"):
        over_ssh.reservations()
