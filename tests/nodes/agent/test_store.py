"""The stored snapshot: written atomically and privately, read back without ever raising."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from nodes.agent import store as store_module
from nodes.agent.store import SnapshotStore

SNAPSHOT = {"node": "gpu-a100", "version": 3, "leases": [{"user": "alice", "gpus": ["GPU-1"]}], "signature": "ab"}


def mode(path: object) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)  # type: ignore[arg-type]


def leftovers(store: SnapshotStore) -> list[str]:
    return sorted(name for name in os.listdir(store.directory) if name != SnapshotStore.FILENAME)


def test_what_is_saved_loads_back(tmp_path):
    store = SnapshotStore(tmp_path / "state")

    store.save(SNAPSHOT)

    assert store.load() == SNAPSHOT
    assert SnapshotStore(tmp_path / "state").load() == SNAPSHOT  # a restarted agent reads the same
    assert leftovers(store) == []


def test_a_newer_save_replaces_the_older(tmp_path):
    store = SnapshotStore(tmp_path)
    store.save(SNAPSHOT)

    store.save({**SNAPSHOT, "version": 4})

    assert store.load() == {**SNAPSHOT, "version": 4}
    assert leftovers(store) == []


def test_the_file_is_0600_and_a_created_state_dir_0700(tmp_path):
    store = SnapshotStore(tmp_path / "var" / "gpubook-agent")

    store.save(SNAPSHOT)

    assert mode(store.directory) == 0o700
    assert mode(store.path) == 0o600


def test_nothing_stored_loads_as_none(tmp_path):
    assert SnapshotStore(tmp_path / "never-created").load() is None


@pytest.mark.parametrize(
    "content",
    ["{not json", "", '{"version": 3', "\udcff", "[" * 100_000],  # the last: nested too deep for json
    ids=["garbage", "empty", "truncated", "not-utf8", "deeply-nested"],
)
def test_a_corrupt_file_loads_as_none_and_is_logged(tmp_path, caplog, content):
    store = SnapshotStore(tmp_path)
    store.path.write_bytes(content.encode(errors="surrogateescape"))

    with caplog.at_level(logging.ERROR, logger="nodes.agent.store"):
        assert store.load() is None

    assert "ignoring" in caplog.text
    assert str(store.path) in caplog.text


@pytest.mark.parametrize("data", [[SNAPSHOT], "snapshot", 3, None])
def test_json_that_is_not_an_object_loads_as_none_and_is_logged(tmp_path, caplog, data):
    store = SnapshotStore(tmp_path)
    store.path.write_text(json.dumps(data))

    with caplog.at_level(logging.ERROR, logger="nodes.agent.store"):
        assert store.load() is None

    assert "not a JSON object" in caplog.text


def test_an_unreadable_path_loads_as_none(tmp_path, caplog):
    store = SnapshotStore(tmp_path)
    store.path.mkdir()  # a directory where the file should be

    with caplog.at_level(logging.ERROR, logger="nodes.agent.store"):
        assert store.load() is None

    assert "ignoring unreadable stored snapshot" in caplog.text


def test_a_save_that_fails_midway_keeps_the_previous_snapshot_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    store = SnapshotStore(tmp_path)
    store.save(SNAPSHOT)

    def dump_half_then_fail(obj, file, **kwargs):
        file.write('{"version": 4, "leas')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_module.json, "dump", dump_half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        store.save({**SNAPSHOT, "version": 4})

    assert store.load() == SNAPSHOT
    assert leftovers(store) == []


def test_a_save_interrupted_at_the_rename_leaves_no_temporary_file(tmp_path, monkeypatch):
    store = SnapshotStore(tmp_path)
    store.save(SNAPSHOT)

    def interrupted(source, target):
        raise KeyboardInterrupt

    monkeypatch.setattr(store_module.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.save({**SNAPSHOT, "version": 4})

    assert store.load() == SNAPSHOT
    assert leftovers(store) == []


def test_a_snapshot_that_cannot_be_serialised_is_not_half_written(tmp_path):
    store = SnapshotStore(tmp_path)
    store.save(SNAPSHOT)

    with pytest.raises(TypeError):
        store.save({**SNAPSHOT, "version": 4, "leases": [object()]})

    assert store.load() == SNAPSHOT
    assert leftovers(store) == []
