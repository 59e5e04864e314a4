"""tests/outages/postgres.py finds the PostgreSQL installed, whichever version, and a test that needs a cluster of
its own fails, saying why, where none can run: a skip would hide that the outage went untested."""

from __future__ import annotations

import pytest

from tests.outages import postgres


def install(root, version, programs=postgres.PROGRAMS):
    (root / version / "bin").mkdir(parents=True)
    for program in programs:
        (root / version / "bin" / program).write_text("#!/bin/sh\n")


def test_the_newest_installed_postgresql_with_initdb_and_pg_ctl_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(postgres, "INSTALLED", tmp_path)
    install(tmp_path, "9.6")
    install(tmp_path, "15")
    install(tmp_path, "18", programs=("initdb",))  # half a package: no pg_ctl
    (tmp_path / "common").mkdir()
    assert postgres.server_bin() == tmp_path / "15" / "bin"
    install(tmp_path, "17")
    assert postgres.server_bin() == tmp_path / "17" / "bin"


def test_without_postgresql_a_cluster_of_the_tests_own_fails_the_test_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(postgres, "INSTALLED", tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"needs a PostgreSQL cluster of its own: .*install PostgreSQL"):
        postgres.LocalPostgres()
    assert list(tmp_path.iterdir()) == []  # nothing made
