"""MIG layouts on paper: the mig-minors file, which files open a card or a slice, and what the MIG guard lets
a slice's grant touch (gpubook_agent/gpus/mig.py and gpubook_agent/access.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpubook_agent.access import AccessMap
from gpubook_agent.gpus.mig import MigCardInfo, MigMinorsError, MigSliceInfo, parse_mig_minors, read_mig_minors
from gpubook_agent.gpus.simulated import mig_minors_text

CARD, OTHER = "GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002"
DEVICES = {CARD: "/dev/nvidia0", OTHER: "/dev/nvidia1"}
FIRST, SECOND = "MIG-11111111-0000-0000-0000-000000000001", "MIG-22222222-0000-0000-0000-000000000002"


def _slice(uuid: str, gi: int, start: int, caps: tuple[str, ...]) -> MigSliceInfo:
    return MigSliceInfo(
        uuid=uuid,
        card=CARD,
        profile="3g.40gb",
        gpu_instance_id=gi,
        compute_instance_id=0,
        placement_start=start,
        placement_size=4,
        compute_slices=3,
        memory_mib=40960,
        capability_files=caps,
    )


def _card(*, current: bool = True, pending: bool = True, unused: tuple[str, ...] = ()) -> MigCardInfo:
    slices = (
        _slice(FIRST, 1, 0, ("/caps/nvidia-cap12", "/caps/nvidia-cap13")),
        _slice(SECOND, 2, 4, ("/caps/nvidia-cap21", "/caps/nvidia-cap22")),
    )
    return MigCardInfo(
        uuid=CARD,
        minor=0,
        mode_current=current,
        mode_pending=pending,
        placement_slots=8,
        compute_slices=7,
        slices=slices if current else (),
        capability_files=unused,
    )


def test_the_drivers_mig_minors_format_is_read():
    minors = parse_mig_minors("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n\n")

    assert minors == {"config": 1, "monitor": 2, "gpu0/gi0/access": 3, "gpu0/gi0/ci0/access": 4}
    assert parse_mig_minors(mig_minors_text(32))["gpu31/gi14/ci7/access"] == 4322  # the last line of the real file


@pytest.mark.parametrize("line", ["gpu0/gi0/access", "gpu0/gi0/access x", "gpu0/mig/access 3", "../etc 4"])
def test_a_line_outside_the_format_is_refused(line):
    with pytest.raises(MigMinorsError, match="line 2"):
        parse_mig_minors(f"config 1\n{line}\n")


def test_a_huge_mig_minors_file_is_refused(tmp_path):
    path = tmp_path / "mig-minors"
    path.write_text("config 1\n" * 600_000)

    with pytest.raises(MigMinorsError, match="larger than"):
        read_mig_minors(str(path))


def test_a_slice_opens_its_card_file_and_its_capability_files_a_card_in_mig_mode_all_of_them():
    access = AccessMap.build(DEVICES, [_card()])

    assert access.grant_files[FIRST] == ("/dev/nvidia0", "/caps/nvidia-cap12", "/caps/nvidia-cap13")
    assert access.grant_files[CARD] == (
        "/dev/nvidia0",
        "/caps/nvidia-cap12",
        "/caps/nvidia-cap13",
        "/caps/nvidia-cap21",
        "/caps/nvidia-cap22",
    )
    assert access.grant_files[OTHER] == ("/dev/nvidia1",)
    assert access.lease_units(CARD) == (CARD, FIRST, SECOND)
    assert access.lease_units(FIRST) == (FIRST,)
    assert access.units_of_file["/dev/nvidia0"] == (CARD, FIRST, SECOND)
    assert access.owner("/caps/nvidia-cap21") == SECOND


def test_the_device_file_is_wanted_for_every_user_of_any_of_its_slices():
    access = AccessMap.build(DEVICES, [_card()])

    files = access.files_wanted({FIRST: {"alice"}, SECOND: {"bob"}, CARD: set(), OTHER: set()})

    assert files["/dev/nvidia0"] == {"alice", "bob"}
    assert files["/caps/nvidia-cap12"] == {"alice"} and files["/caps/nvidia-cap22"] == {"bob"}
    assert files["/dev/nvidia1"] == set()


@pytest.mark.parametrize(("current", "pending"), [(True, False), (False, True), (False, False)])
def test_the_mig_guard_keeps_a_slices_grant_off_the_device_file_unless_mig_is_on_and_stays_on(current, pending):
    access = AccessMap.build(DEVICES, [_card(current=current, pending=pending)])

    if current:  # the slices exist: their capability files alone, which open nothing by themselves
        assert access.grant_files[FIRST] == ("/caps/nvidia-cap12", "/caps/nvidia-cap13")
        assert access.reach[FIRST][0] == "/dev/nvidia0"  # where its leftovers may still be
        assert access.keeps_open("/dev/nvidia0", "alice", {FIRST: {"alice"}})
    else:  # no slices: a lease naming one opens nothing, and the card is one GPU
        assert FIRST not in access.grant_files
        assert access.lease_units(FIRST) == ()
        assert access.grant_files[CARD] == ("/dev/nvidia0",)


def test_a_slice_without_both_capability_files_opens_nothing():
    half = replace(_card(), slices=(_slice(FIRST, 1, 0, ("/caps/nvidia-cap12",)),))

    assert AccessMap.build(DEVICES, [half]).grant_files[FIRST] == ()


def test_every_capability_file_of_the_card_on_disk_is_kept_free_of_stray_entries(tmp_path):
    unused = tmp_path / "nvidia-cap30"
    unused.touch()
    access = AccessMap.build(DEVICES, [_card(unused=(str(unused), str(tmp_path / "nvidia-cap31")))])

    assert str(unused) in access.managed  # a minor the driver will hand to the next slice made
    assert str(tmp_path / "nvidia-cap31") not in access.managed  # not on disk: nobody can open it
    assert access.owner(str(unused)) == CARD
