from __future__ import annotations

import pwd
import secrets
import subprocess
from collections.abc import Iterator

import pytest

from tests.slurm.cluster import LocalSlurm, unavailable


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalSlurm]:
    problem = unavailable()
    if problem:
        pytest.skip(problem)
    cluster = LocalSlurm()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_accounting_cluster() -> Iterator[LocalSlurm]:
    """A cluster of its own with job accounting: slurmdbd on a MariaDB server of its own (starts in ~3 s, not 0.3)."""
    problem = unavailable(accounting=True)
    if problem:
        pytest.skip(problem)
    cluster = LocalSlurm(accounting=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_accounts() -> Iterator[list[str]]:
    """Two throwaway unix accounts the cluster's jobs run as."""
    names = [f"gpbs_{secrets.token_hex(3)}" for _ in range(2)]
    try:
        for name in names:
            subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", name], check=True)  # noqa: S603, S607
            pwd.getpwnam(name)
        yield names
    finally:
        for name in names:
            subprocess.run(["userdel", name], check=False, capture_output=True)  # noqa: S603, S607
