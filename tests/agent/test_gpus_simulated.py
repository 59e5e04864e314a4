"""The simulated backend: stand-in device files whose real holders are the GPU's processes."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from gpubook_agent import procfs
from gpubook_agent.gpus import BackendUnavailable, GpuBackend, open_backend
from gpubook_agent.gpus.simulated import (
    BASE_MIB,
    MEMORY_TOTAL_MIB,
    SimulatedBackend,
    parse_simulated_mig,
    process_mib,
    simulated_mig_uuid,
    simulated_uuid,
)

PROCESS_MIB = process_mib(MEMORY_TOTAL_MIB, 1)  # one holder on a default card

UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
HOLD_OPEN = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(120)"


@pytest.fixture
def device_dir(tmp_path) -> str:
    return str(tmp_path / "dev")


@pytest.fixture
def backend(device_dir) -> Iterator[GpuBackend]:
    opened = open_backend("simulated", device_dir=device_dir, node_name="gpu-demo", simulated_gpus=4)
    yield opened
    opened.close()


@pytest.fixture
def hold_open() -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    """Start a real process that holds a file open; every one is killed and reaped afterwards."""
    started: list[subprocess.Popen[str]] = []

    def start(path: str) -> subprocess.Popen[str]:
        child = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, path], stdout=subprocess.PIPE, text=True)  # noqa: S603
        started.append(child)
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        return child

    yield start
    for child in started:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_uuids_are_deterministic_and_look_like_nvidia_ones():
    assert simulated_uuid("gpu-demo", 0) == simulated_uuid("gpu-demo", 0)
    assert simulated_uuid("gpu-demo", 0) != simulated_uuid("gpu-demo", 1)
    assert simulated_uuid("gpu-demo", 0) != simulated_uuid("gpu-other", 0)
    assert all(UUID_RE.match(simulated_uuid(node, i)) for node in ("gpu-demo", "x") for i in range(8))


def test_the_backend_lists_its_gpus_by_those_uuids(backend, device_dir):
    assert isinstance(backend, GpuBackend)
    assert (backend.name, backend.driver_version) == ("simulated", "simulated")
    gpus = backend.gpus()
    assert [gpu.uuid for gpu in gpus] == [simulated_uuid("gpu-demo", i) for i in range(4)]
    assert [(gpu.index, gpu.minor) for gpu in gpus] == [(i, i) for i in range(4)]
    assert {(gpu.name, gpu.memory_total_mib) for gpu in gpus} == {("Simulated GPU", 24576)}
    assert backend.device_path(gpus[2].uuid) == os.path.join(device_dir, "nvidia2")


def test_device_files_are_created_as_empty_0660_files(backend, device_dir):
    assert stat.S_IMODE(os.stat(device_dir).st_mode) == 0o755
    for gpu in backend.gpus():
        info = os.stat(backend.device_path(gpu.uuid))
        assert stat.S_ISREG(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o660
        assert info.st_size == 0


def test_existing_device_files_are_left_as_they_are(device_dir):
    os.makedirs(device_dir)
    path = os.path.join(device_dir, "nvidia0")
    with open(path, "w") as existing:
        existing.write("keep")
    os.chmod(path, 0o600)
    open_backend("simulated", device_dir=device_dir, node_name="gpu-demo", simulated_gpus=2).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as existing:
        assert existing.read() == "keep"
    assert os.path.exists(os.path.join(device_dir, "nvidia1"))


def test_an_unusable_device_dir_makes_the_backend_unavailable(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(BackendUnavailable, match="simulated GPU device files"):
        open_backend("simulated", device_dir=str(tmp_path / "file" / "dev"), node_name="gpu-demo")


def test_idle_gpus_report_idle_numbers(backend):
    for sample in backend.sample():
        assert sample.processes == ()
        assert sample.utilization_pct == 0
        assert sample.memory_used_mib == BASE_MIB
        assert (sample.temperature_c, sample.slowdown_temperature_c) == (30, 90)
        assert sample.power_w == 45.0  # 15 % of the default 300 W limit
        assert sample.ecc_errors_uncorrected == 0
        assert sample.missing == ()


def test_a_process_holding_the_device_file_runs_on_that_gpu_only(backend, hold_open):
    busy, *idle = backend.gpus()
    child = hold_open(backend.device_path(busy.uuid))

    samples = {sample.uuid: sample for sample in backend.sample()}
    assert [process.pid for process in samples[busy.uuid].processes] == [child.pid]
    assert samples[busy.uuid].processes[0].used_memory_mib == PROCESS_MIB
    assert samples[busy.uuid].memory_used_mib == BASE_MIB + PROCESS_MIB
    assert 60 <= samples[busy.uuid].utilization_pct <= 100
    assert samples[busy.uuid].temperature_c > 30
    assert samples[busy.uuid].power_w > 45
    for gpu in idle:
        assert samples[gpu.uuid].processes == ()
        assert samples[gpu.uuid].utilization_pct == 0

    child.kill()
    child.wait()
    after = {sample.uuid: sample for sample in backend.sample()}[busy.uuid]
    assert after.processes == ()
    assert (after.utilization_pct, after.memory_used_mib) == (0, BASE_MIB)


def test_busy_utilization_varies_but_stays_plausible(backend, hold_open):
    busy = backend.gpus()[1]
    hold_open(backend.device_path(busy.uuid))
    readings = {backend.sample()[1].utilization_pct for _ in range(30)}
    assert all(60 <= reading <= 100 for reading in readings)
    assert len(readings) > 1


def test_one_proc_scan_serves_all_gpus(device_dir, monkeypatch):
    scans: list[list[str]] = []
    real_fd_holders = procfs.fd_holders

    def counting(paths, **kwargs):
        paths = list(paths)
        scans.append(paths)
        return real_fd_holders(paths, **kwargs)

    monkeypatch.setattr(procfs, "fd_holders", counting)
    backend = open_backend("simulated", device_dir=device_dir, node_name="gpu-demo", simulated_gpus=8)
    assert len(backend.sample()) == 8
    assert len(scans) == 1
    assert len(scans[0]) == 8


def test_a_sample_is_json_ready(backend, hold_open):
    child = hold_open(backend.device_path(backend.gpus()[0].uuid))
    data = [sample.as_dict() for sample in backend.sample()]
    assert json.loads(json.dumps(data)) == data
    assert data[0]["processes"] == [{"pid": child.pid, "used_memory_mib": PROCESS_MIB}]


def test_an_unknown_uuid_has_no_device_path(backend):
    with pytest.raises(KeyError):
        backend.device_path(simulated_uuid("gpu-other", 0))


def test_open_backend_names_the_allowed_kinds(device_dir):
    with pytest.raises(ValueError, match="nvml, simulated"):
        open_backend("cuda", device_dir=device_dir, node_name="gpu-demo")


def test_a_simulated_node_needs_a_gpu(device_dir):
    with pytest.raises(ValueError, match="at least one GPU"):
        open_backend("simulated", device_dir=device_dir, node_name="gpu-demo", simulated_gpus=0)


def test_the_cards_are_the_model_memory_and_power_limit_the_config_names(device_dir, hold_open):
    """An 80 GB A100 reads "x / 80.0 GB" (81920 MiB), idles at 15 % of its 400 W and fills a share of its memory."""
    backend = open_backend(
        "simulated",
        device_dir=device_dir,
        node_name="gpu-a100",
        simulated_gpus=2,
        simulated={"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "power_w": 400.0},
    )
    busy, idle = backend.gpus()
    assert {(gpu.name, gpu.memory_total_mib) for gpu in backend.gpus()} == {("NVIDIA A100-SXM4-80GB", 81920)}
    hold_open(backend.device_path(busy.uuid))
    samples = {sample.uuid: sample for sample in backend.sample()}

    assert samples[idle.uuid].memory_total_mib == 81920
    assert (samples[idle.uuid].memory_used_mib, samples[idle.uuid].power_w) == (BASE_MIB, 60.0)
    assert samples[busy.uuid].memory_total_mib == 81920
    assert samples[busy.uuid].memory_used_mib == BASE_MIB + 32768  # 40 % of the card: a job on an A100
    assert samples[busy.uuid].processes[0].used_memory_mib == 32768
    assert 60.0 < samples[busy.uuid].power_w <= 360.0  # never above 90 % of the limit


def test_many_holders_never_use_more_memory_than_the_card_has(device_dir, hold_open):
    backend = open_backend(
        "simulated", device_dir=device_dir, node_name="gpu-demo", simulated_gpus=1, simulated={"memory_mib": 24564}
    )
    path = backend.device_path(backend.gpus()[0].uuid)
    for _ in range(4):
        hold_open(path)
    sample = backend.sample()[0]
    assert len(sample.processes) == 4
    assert sample.memory_used_mib <= 24564
    assert sum(process.used_memory_mib for process in sample.processes) + BASE_MIB == sample.memory_used_mib


@pytest.mark.parametrize(
    ("card", "message"),
    [
        ({"memory_mib": 4}, "memory must be"),
        ({"memory_mib": 5 * 1024 * 1024}, "memory must be"),
        ({"power_w": 0.0}, "power limit must be"),
        ({"power_w": 6000.0}, "power limit must be"),
    ],
)
def test_impossible_cards_are_refused(device_dir, card, message):
    with pytest.raises(ValueError, match=message):
        open_backend("simulated", device_dir=device_dir, node_name="gpu-demo", simulated=card)


# -- MIG ---------------------------------------------------------------------------------------------------

MIG_UUID_RE = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _mig_backend(device_dir: str, layout: str, gpus: int = 2) -> GpuBackend:
    return open_backend(
        "simulated",
        device_dir=device_dir,
        node_name="gpu-demo",
        simulated_gpus=gpus,
        simulated={"memory_mib": 81920, "mig_layout": layout},
    )


@pytest.mark.parametrize(
    ("layout", "placed"),
    [
        # The 3g goes first to 0, then 2g at 4 leaves no room for the second 2g: it moves to 4.
        ("0:3g.40gb,2g.20gb,2g.20gb", {0: [("3g.40gb", 4, 4), ("2g.20gb", 0, 2), ("2g.20gb", 2, 2)]}),
        ("0:1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb", {0: [("1g.10gb", i, 1) for i in range(7)]}),
        ("0:4g.40gb,3g.40gb", {0: [("4g.40gb", 0, 4), ("3g.40gb", 4, 4)]}),
        ("1:7g.80gb; 0:2g.20gb", {1: [("7g.80gb", 0, 8)], 0: [("2g.20gb", 0, 2)]}),
    ],
)
def test_layouts_are_placed_by_a100_rules(layout, placed):
    found = parse_simulated_mig(layout)

    assert {card: [(s.profile, s.placement_start, s.placement_size) for s in plan] for card, plan in found.items()} == (
        placed
    )


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("0:5g.50gb", "unknown MIG profile '5g.50gb'"),
        ("0:3g", "unknown MIG profile '3g'"),
        ("0:4g.40gb,4g.40gb", "need 8 compute slices and a card has 7"),
        ("0:3g.40gb,3g.40gb,1g.10gb", "do not fit on a card of 8 memory slices"),
        ("0:7g.80gb,1g.10gb", "need 8 compute slices and a card has 7"),
        ("0:2g.20gb,2g.20gb,2g.20gb,2g.20gb", "need 8 compute slices"),
        ("3g.40gb", "is not '<card index>:<profile>,<profile>...'"),
        ("0:3g.40gb;0:2g.20gb", "card 0 is given twice"),
        ("0:", "card 0 has no slices"),
        ("40:1g.10gb", "card index 40 is out of range"),
    ],
)
def test_impossible_layouts_are_refused_saying_why(layout, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_simulated_mig(layout)


def test_a_layout_for_a_card_the_node_lacks_is_refused(device_dir):
    with pytest.raises(ValueError, match="names card 2, but the node has 2"):
        _mig_backend(device_dir, "2:7g.80gb")


def test_mig_slices_have_deterministic_uuids_and_their_card_s_share_of_memory(device_dir):
    backend = _mig_backend(device_dir, "0:3g.40gb,2g.20gb,2g.20gb")
    (card,) = backend.mig_cards()
    again = _mig_backend(device_dir, "0:3g.40gb,2g.20gb,2g.20gb").mig_cards()[0]

    assert [s.uuid for s in card.slices] == [s.uuid for s in again.slices]
    assert all(MIG_UUID_RE.match(s.uuid) for s in card.slices)
    assert len({s.uuid for s in card.slices}) == 3
    assert card.slices[0].uuid == simulated_mig_uuid("gpu-demo", 0, 0, "2g.20gb")
    assert [(s.memory_mib, s.compute_slices, s.gpu_instance_id) for s in card.slices] == [
        (20480, 2, 2),
        (20480, 2, 3),
        (40960, 3, 1),
    ]
    assert [c.uuid for c in backend.mig_cards()] == [backend.gpus()[0].uuid]  # card 1 has no MIG layout


def test_stand_in_capability_files_are_root_only_and_numbered_by_a_real_format_mig_minors(device_dir):
    backend = _mig_backend(device_dir, "1:3g.40gb,2g.20gb,2g.20gb")
    (card,) = backend.mig_cards()

    minors_file = os.path.join(device_dir, "mig-minors")
    lines = open(minors_file).read().splitlines()  # noqa: SIM115
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu1/gi1/access 147" in lines and "gpu1/gi1/ci0/access 148" in lines  # 3 + 135 × card + 9 × GI
    assert stat.S_IMODE(os.stat(minors_file).st_mode) == 0o444
    three_g = next(s for s in card.slices if s.profile == "3g.40gb")
    caps = os.path.join(device_dir, "nvidia-caps")
    assert three_g.capability_files == (f"{caps}/nvidia-cap147", f"{caps}/nvidia-cap148")
    for path in (p for s in card.slices for p in s.capability_files):
        info = os.stat(path)
        assert (stat.S_ISREG(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid) == (True, 0o660, os.geteuid())
    assert sorted(os.listdir(caps)) == sorted(os.path.basename(p) for s in card.slices for p in s.capability_files)
    assert len(card.capability_files) == 135


def test_a_job_on_a_slice_is_a_process_holding_its_capability_files(device_dir, hold_open):
    backend = _mig_backend(device_dir, "0:4g.40gb,3g.40gb")
    (card,) = backend.mig_cards()
    four_g, three_g = card.slices
    job = hold_open(three_g.capability_files[1])

    samples = {sample.uuid: sample for sample in backend.sample()}

    assert len(samples) == 4  # two cards, two slices
    assert [p.pid for p in samples[three_g.uuid].processes] == [job.pid]
    assert samples[four_g.uuid].processes == ()
    assert samples[three_g.uuid].memory_total_mib == 40960
    assert 60 <= samples[three_g.uuid].utilization_pct <= 100
    assert samples[three_g.uuid].power_w is None and "power_w" in samples[three_g.uuid].missing
    assert samples[three_g.uuid].energy_mj is None and "energy_mj" in samples[three_g.uuid].missing  # per card


def test_a_card_whose_mig_mode_is_off_lists_no_slices(device_dir):
    backend = _mig_backend(device_dir, "0:7g.80gb")
    assert isinstance(backend, SimulatedBackend)
    card_uuid = backend.gpus()[0].uuid
    slice_uuid = backend.mig_cards()[0].slices[0].uuid
    assert backend.device_files(slice_uuid)[0] == backend.device_path(card_uuid)

    backend.set_mig_mode(card_uuid, current=True, pending=False)
    (pending,) = backend.mig_cards()
    backend.set_mig_mode(card_uuid, current=False, pending=False)
    (off,) = backend.mig_cards()

    assert (pending.mode_current, pending.mode_pending, len(pending.slices)) == (True, False, 1)
    assert (off.mode_current, off.slices) == (False, ())
    assert backend.device_files(card_uuid) == (backend.device_path(card_uuid),)
    with pytest.raises(KeyError):
        backend.device_files(slice_uuid)
