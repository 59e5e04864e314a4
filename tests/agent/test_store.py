"""What the agent keeps on disk: written atomically and privately, in a directory of its own, never
through a link; read back with a reason for anything it will not use; the revocation log signed.

Real files, real links, real owners (the tests that chown need root, as the agent does).
"""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpubook_agent import store as store_module
from gpubook_agent.signing import signed
from gpubook_agent.store import SnapshotStore, StateFileIgnored, UnsafeStateDir

SNAPSHOT = {"node": "gpu-a100", "version": 3, "leases": [{"user": "alice", "gpus": ["GPU-1"]}], "signature": "ab"}


def mode(path: object) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)  # type: ignore[arg-type]


def leftovers(store: SnapshotStore) -> list[str]:
    return sorted(name for name in os.listdir(store.directory) if name != SnapshotStore.FILENAME)


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: files owned by another account, as on a node")


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
def test_a_corrupt_file_is_ignored_with_its_path_and_reason(tmp_path, content):
    store = SnapshotStore(tmp_path)
    store.path.write_bytes(content.encode(errors="surrogateescape"))

    with pytest.raises(StateFileIgnored, match="not valid JSON") as ignored:
        store.load()

    assert str(store.path) in str(ignored.value)


@pytest.mark.parametrize("data", [[SNAPSHOT], "snapshot", 3, None])
def test_json_that_is_not_an_object_is_ignored(tmp_path, data):
    store = SnapshotStore(tmp_path)
    store.path.write_text(json.dumps(data))

    with pytest.raises(StateFileIgnored, match="not a JSON object"):
        store.load()


def test_a_directory_where_the_file_should_be_is_ignored(tmp_path):
    store = SnapshotStore(tmp_path)
    store.path.mkdir()

    with pytest.raises(StateFileIgnored, match="is not a regular file"):
        store.load()


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

    def interrupted(source, target, **dir_fds):
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


# -- links, and files that are not the agent's own ---------------------------------------------------


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A file outside the state directory with content of its own (think /etc/shadow)."""
    path = tmp_path / "elsewhere.json"
    path.write_text(json.dumps(SNAPSHOT))
    return path


@pytest.mark.parametrize("name", [SnapshotStore.FILENAME, SnapshotStore.REVOCATIONS])
def test_a_state_file_that_is_a_symlink_is_not_followed_when_read(tmp_path, elsewhere, name):
    store = SnapshotStore(tmp_path / "state")
    store.prepare()
    (store.directory / name).symlink_to(elsewhere)

    with pytest.raises(StateFileIgnored, match="is a symbolic link: not followed"):
        store.load() if name == SnapshotStore.FILENAME else store.load_revocations(secret="s3cret")


@pytest.mark.parametrize("name", [SnapshotStore.FILENAME, SnapshotStore.REVOCATIONS])
def test_a_save_replaces_a_symlink_and_writes_nothing_through_it(tmp_path, elsewhere, name):
    store = SnapshotStore(tmp_path / "state")
    store.prepare()
    link = store.directory / name
    link.symlink_to(elsewhere)
    before = elsewhere.read_bytes()

    if name == SnapshotStore.FILENAME:
        store.save({**SNAPSHOT, "version": 9})
        assert store.load() == {**SNAPSHOT, "version": 9}
    else:
        store.save_revocations({("GPU-1", "alice"): datetime.now(UTC)}, secret="s3cret")
        assert list(store.load_revocations(secret="s3cret")) == [("GPU-1", "alice")]

    assert not link.is_symlink() and stat.S_ISREG(os.lstat(link).st_mode)
    assert elsewhere.read_bytes() == before


def test_a_dangling_symlink_is_not_followed_to_create_its_target(tmp_path):
    store = SnapshotStore(tmp_path / "state")
    store.prepare()
    target = tmp_path / "created-through-the-link"
    store.path.symlink_to(target)

    with pytest.raises(StateFileIgnored, match="symbolic link"):
        store.load()
    store.save(SNAPSHOT)

    assert not target.exists()
    assert store.load() == SNAPSHOT


def test_the_temporary_file_is_never_opened_through_a_link(tmp_path, elsewhere, monkeypatch):
    """Someone who guessed the temporary name and planted a link there gets an error, not a write."""
    store = SnapshotStore(tmp_path / "state")
    store.prepare()
    (store.directory / ".snapshot-guessed.tmp").symlink_to(elsewhere)
    before = elsewhere.read_bytes()
    monkeypatch.setattr(SnapshotStore, "_temporary_name", staticmethod(lambda name: ".snapshot-guessed.tmp"))

    with pytest.raises(FileExistsError):
        store.save({**SNAPSHOT, "version": 9})

    assert elsewhere.read_bytes() == before
    assert (store.directory / ".snapshot-guessed.tmp").is_symlink()  # not removed either: it is not ours


def test_a_fifo_under_the_name_is_ignored_without_hanging(tmp_path):
    store = SnapshotStore(tmp_path / "state")
    store.prepare()
    os.mkfifo(store.path)

    with pytest.raises(StateFileIgnored, match="is not a regular file"):
        store.load()


def test_a_state_file_of_another_account_is_ignored(tmp_path, unix_users):
    needs_root()
    store = SnapshotStore(tmp_path / "state")
    store.save(SNAPSHOT)
    os.chown(store.path, unix_users[0].uid, unix_users[0].gid)

    with pytest.raises(StateFileIgnored, match=f"belongs to {unix_users[0].name}, not to the agent"):
        store.load()


@pytest.mark.parametrize("bits", [0o620, 0o602])
def test_a_state_file_others_may_write_is_ignored(tmp_path, bits):
    store = SnapshotStore(tmp_path / "state")
    store.save(SNAPSHOT)
    os.chmod(store.path, bits)

    with pytest.raises(StateFileIgnored, match=f"writable by group or others \\(mode {bits:04o}\\)"):
        store.load()


# -- the directory must be the agent's own -------------------------------------------------------------


def test_prepare_creates_a_missing_state_dir_0700_and_accepts_it(tmp_path):
    store = SnapshotStore(tmp_path / "var" / "lib" / "gpubook-agent")

    store.prepare()
    store.prepare()  # and again, now that it exists

    assert mode(store.directory) == 0o700
    assert os.stat(store.directory).st_uid == os.geteuid()


@pytest.mark.parametrize("bits", [0o770, 0o730, 0o707, 0o777, 0o1777], ids=oct)
def test_a_state_dir_writable_by_group_or_others_is_refused_with_the_fix(tmp_path, bits):
    needs_root()
    directory = tmp_path / "state"
    store = SnapshotStore(directory)
    store.save(SNAPSHOT)
    directory.chmod(bits)

    with pytest.raises(UnsafeStateDir) as refused:
        store.prepare()

    message = str(refused.value)
    assert f"STATE_DIR {directory} is owned by root (uid 0) with mode {bits:04o}" in message
    assert refused.value.fix == f"chown root: {directory}; chmod 700 {directory}"
    assert message.endswith(f"fix: chown root: {directory}; chmod 700 {directory}")
    with pytest.raises(StateFileIgnored, match=f"mode {bits:04o}"):
        store.load()  # what is in it is not believed either
    with pytest.raises(UnsafeStateDir):
        store.save({**SNAPSHOT, "version": 4})
    directory.chmod(0o700)
    assert store.load() == SNAPSHOT  # the refused save wrote nothing


def test_a_state_dir_of_another_account_is_refused(tmp_path, unix_users):
    needs_root()
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    os.chown(directory, unix_users[0].uid, unix_users[0].gid)

    owner = rf"{unix_users[0].name} \(uid {unix_users[0].uid}\)"
    with pytest.raises(UnsafeStateDir, match=f"owned by {owner} with mode 0700"):
        SnapshotStore(directory).prepare()
    with pytest.raises(UnsafeStateDir):
        SnapshotStore(directory).save(SNAPSHOT)
    assert os.listdir(directory) == []


def test_a_group_readable_state_dir_is_fine(tmp_path):
    directory = tmp_path / "state"
    directory.mkdir(mode=0o750)
    directory.chmod(0o750)

    SnapshotStore(directory).save(SNAPSHOT)

    assert SnapshotStore(directory).load() == SNAPSHOT


# -- the revocation log ---------------------------------------------------------------------------------

SECRET = "the-lease-secret"
NOW = datetime(2026, 12, 3, 14, 0, tzinfo=UTC)


def test_the_revocation_log_loads_back_and_is_signed(tmp_path):
    store = SnapshotStore(tmp_path)
    revocations = {("GPU-1", "alice"): NOW, ("GPU-2", "bob"): NOW - timedelta(hours=2)}

    store.save_revocations(revocations, secret=SECRET)

    assert store.load_revocations(secret=SECRET) == revocations
    on_disk = json.loads(store.revocations_path.read_text())
    assert on_disk["kind"] == "revocation-log"
    assert len(on_disk["signature"]) == 64
    assert mode(store.revocations_path) == 0o600


def test_no_revocation_log_is_an_empty_one(tmp_path):
    assert SnapshotStore(tmp_path).load_revocations(secret=SECRET) == {}


def log_signed(rows: list, secret: str = SECRET, **extra: object) -> dict:
    return signed({"kind": "revocation-log", "revocations": rows, **extra}, secret)


def entry_added_by_hand() -> dict:
    good = log_signed([["GPU-1", "alice", NOW.isoformat()]])
    return {**good, "revocations": [*good["revocations"], ["GPU-1", "bob", NOW.isoformat()]]}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (
            lambda: log_signed([["GPU-1", "alice", NOW.isoformat()]], secret="another-secret"),
            "bad or missing signature",
        ),
        (entry_added_by_hand, "bad or missing signature"),
        (lambda: {**log_signed([]), "signature": ""}, "bad or missing signature"),
        (lambda: {**log_signed([]), "signature": "é" * 64}, "bad or missing signature"),  # not ASCII
        (lambda: {key: value for key, value in log_signed([]).items() if key != "signature"}, "bad or missing"),
        (lambda: [["GPU-1", "alice", NOW.isoformat()]], "not a revocation log"),  # the old, unsigned format
        (lambda: signed({"node": "gpu-a100", "version": 3, "leases": []}, SECRET), "not a revocation log"),
        (lambda: log_signed([["GPU-1", "alice"]]), "malformed entry"),
        (lambda: log_signed([["GPU-1", "alice", "yesterday"]]), "malformed time"),
        (lambda: log_signed([["GPU-1", "alice", "2026-12-03T14:00:00"]]), "a time without a zone"),
        (lambda: log_signed({"GPU-1": "alice"}), "no list of revocations"),
    ],
    ids=[
        "other-secret",
        "entry-added",
        "empty-signature",
        "non-ascii-signature",
        "unsigned",
        "old-format",
        "a-snapshot",
        "short-entry",
        "bad-time",
        "naive-time",
        "not-a-list",
    ],
)
def test_a_revocation_log_that_is_not_the_agents_own_is_ignored_with_the_reason(tmp_path, content, reason):
    store = SnapshotStore(tmp_path)
    store.revocations_path.write_text(json.dumps(content()))

    with pytest.raises(StateFileIgnored, match=reason) as ignored:
        store.load_revocations(secret=SECRET)

    assert str(store.revocations_path) in str(ignored.value)


def test_a_revocation_log_signed_by_hand_with_the_secret_is_believed(tmp_path):
    """The control for the test above: the format it forges is the real one."""
    store = SnapshotStore(tmp_path)
    store.revocations_path.write_text(json.dumps(log_signed([["GPU-1", "bob", NOW.isoformat()]])))

    assert store.load_revocations(secret=SECRET) == {("GPU-1", "bob"): NOW}


# -- the grant ledger ---------------------------------------------------------------------------------------


class Journal:
    """The enforcer's side of the ledger: the entries it holds, each change appended with the whole ledger after it."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store, self.entries = store, store.load_grants(secret=SECRET)

    def add(self, *entries: tuple[str, str]) -> None:
        self.entries |= set(entries)
        self.store.append_grants("+", set(entries), current=set(self.entries), secret=SECRET)

    def remove(self, *entries: tuple[str, str]) -> None:
        self.entries -= set(entries)
        self.store.append_grants("-", set(entries), current=set(self.entries), secret=SECRET)


def test_the_grant_ledger_replays_its_journal_across_processes(tmp_path):
    writer = Journal(SnapshotStore(tmp_path))
    writer.add(("/dev/nvidia0", "alice"), ("/dev/nvidia1", "bob"))
    writer.remove(("/dev/nvidia0", "alice"))
    writer.add(("/dev/nvidia-caps/nvidia-cap21", "carol"))

    reader = Journal(SnapshotStore(tmp_path))  # revoke-all, after the agent is gone
    assert reader.entries == {("/dev/nvidia1", "bob"), ("/dev/nvidia-caps/nvidia-cap21", "carol")}
    assert mode(reader.store.grants_path) == 0o600
    reader.remove(("/dev/nvidia1", "bob"))  # continues the numbering
    assert SnapshotStore(tmp_path).load_grants(secret=SECRET) == {("/dev/nvidia-caps/nvidia-cap21", "carol")}


def test_a_rewritten_grant_ledger_is_short_and_says_the_same(tmp_path):
    journal = Journal(SnapshotStore(tmp_path))
    for _ in range(50):
        journal.add(("/dev/nvidia0", "alice"))
        journal.remove(("/dev/nvidia0", "alice"))
    journal.add(("/dev/nvidia2", "bob"))

    journal.store.rewrite_grants({("/dev/nvidia2", "bob")}, secret=SECRET)
    journal.add(("/dev/nvidia3", "carol"))  # appends to the new file, not the old

    assert journal.store.grants_path.read_text().count("\n") == 2
    assert SnapshotStore(tmp_path).load_grants(secret=SECRET) == {("/dev/nvidia2", "bob"), ("/dev/nvidia3", "carol")}
    assert leftovers(journal.store) == [SnapshotStore.GRANTS]


def test_an_unfinished_last_line_is_a_grant_never_made_and_the_next_change_rewrites_the_ledger(tmp_path):
    journal = Journal(SnapshotStore(tmp_path))
    journal.add(("/dev/nvidia0", "alice"))
    with open(journal.store.grants_path, "a") as ledger:
        ledger.write('{"kind": "grant-ledger", "op": "+", "path": "/dev/nvi')  # killed while writing

    again = Journal(SnapshotStore(tmp_path))  # the next start
    assert again.entries == {("/dev/nvidia0", "alice")}
    again.add(("/dev/nvidia1", "bob"))  # not glued to the torn line
    assert SnapshotStore(tmp_path).load_grants(secret=SECRET) == {("/dev/nvidia0", "alice"), ("/dev/nvidia1", "bob")}


def test_after_a_failed_write_the_next_change_rewrites_the_ledger_rather_than_leave_a_gap(tmp_path, monkeypatch):
    journal = Journal(SnapshotStore(tmp_path))
    journal.add(("/dev/nvidia0", "alice"))
    real_write = os.write

    def disk_full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_module.os, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        journal.add(("/dev/nvidia1", "bob"))  # the grant is made all the same; its line is not written
    monkeypatch.setattr(store_module.os, "write", real_write)
    journal.add(("/dev/nvidia2", "carol"))

    assert SnapshotStore(tmp_path).load_grants(secret=SECRET) == {
        ("/dev/nvidia0", "alice"),
        ("/dev/nvidia1", "bob"),
        ("/dev/nvidia2", "carol"),
    }


def test_a_rewrite_that_fails_keeps_the_old_ledger_and_the_next_change_rewrites_again(tmp_path, monkeypatch):
    journal = Journal(SnapshotStore(tmp_path))
    journal.add(("/dev/nvidia0", "alice"), ("/dev/nvidia1", "bob"))

    def interrupted(source, target, **dir_fds):
        raise OSError(5, "Input/output error")

    real_replace = os.replace
    monkeypatch.setattr(store_module.os, "replace", interrupted)
    with pytest.raises(OSError):
        journal.store.rewrite_grants({("/dev/nvidia1", "bob")}, secret=SECRET)
    monkeypatch.setattr(store_module.os, "replace", real_replace)
    assert SnapshotStore(tmp_path).load_grants(secret=SECRET) == {("/dev/nvidia0", "alice"), ("/dev/nvidia1", "bob")}

    journal.remove(("/dev/nvidia0", "alice"))
    assert SnapshotStore(tmp_path).load_grants(secret=SECRET) == {("/dev/nvidia1", "bob")}
    assert leftovers(journal.store) == [SnapshotStore.GRANTS]


UNSIGNED_LINE = {"kind": "grant-ledger", "seq": 1, "op": "+", "path": "/etc/shadow", "user": "alice"}


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda lines: lines[:1] + lines[2:], "line 2 is missing"),  # a line taken out: a grant hidden
        (lambda lines: [lines[0].replace("alice", "mallory"), *lines[1:]], "bad or missing signature"),
        (
            lambda lines: [json.dumps({"kind": "grant-ledger", "seq": 1, "op": "+", "path": "/x", "user": "a"})],
            "signature",
        ),
        (lambda lines: ["not json", *lines], "not valid JSON"),
    ],
    ids=["line-removed", "name-changed", "unsigned", "not-json"],
)
def test_an_edited_grant_ledger_is_not_believed(tmp_path, edit, reason):
    journal = Journal(SnapshotStore(tmp_path))
    journal.add(("/dev/nvidia0", "alice"))
    journal.add(("/dev/nvidia1", "bob"))
    journal.add(("/dev/nvidia2", "carol"))
    lines = journal.store.grants_path.read_text().splitlines()
    journal.store.grants_path.write_text("".join(line + "\n" for line in edit(lines)))

    with pytest.raises(StateFileIgnored, match=reason):
        SnapshotStore(tmp_path).load_grants(secret=SECRET)


def test_the_ledger_is_never_appended_through_a_link(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / SnapshotStore.GRANTS).symlink_to(target)

    with pytest.raises(OSError):
        SnapshotStore(state).append_grants("+", {("/dev/nvidia0", "alice")}, current=set(), secret=SECRET)
    assert target.read_text() == ""
