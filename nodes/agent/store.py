"""The newest accepted snapshot, kept on disk so a restarted agent enforces it at once.

Written atomically (temporary file, fsync, rename, fsync of the directory): after a crash
the file holds either the old snapshot or the new one, never half of each. The stored copy
is verified again when it is read back, so a file edited on disk is not trusted either.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class SnapshotStore:
    FILENAME = "snapshot.json"
    REVOCATIONS = "revoked.json"

    def __init__(self, state_dir: str | Path) -> None:
        self.directory = Path(state_dir)
        self.path = self.directory / self.FILENAME
        self.revocations_path = self.directory / self.REVOCATIONS

    def load_revocations(self) -> dict[tuple[str, str], datetime]:
        """Recent revocations, (gpu, user) -> when: a restarted agent still ends what they left."""
        try:
            data = json.loads(self.revocations_path.read_text())
            return {(gpu, user): datetime.fromisoformat(at) for gpu, user, at in data}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, RecursionError) as error:
            log.error("ignoring unreadable revocation log %s: %s", self.revocations_path, error)
            return {}

    def save_revocations(self, revocations: dict[tuple[str, str], datetime]) -> None:
        rows = [[gpu, user, at.isoformat()] for (gpu, user), at in sorted(revocations.items())]
        self._write(self.revocations_path, rows)

    def load(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as error:  # RecursionError: JSON nested too deep
            log.error("ignoring unreadable stored snapshot %s: %s", self.path, error)
            return None
        if not isinstance(data, dict):
            log.error("ignoring stored snapshot %s: not a JSON object", self.path)
            return None
        return data

    def save(self, snapshot: dict[str, Any]) -> None:
        self._write(self.path, snapshot)

    def _write(self, path: Path, data: Any) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=f".{path.stem}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as file:
                json.dump(data, file, sort_keys=True)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        directory_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)
