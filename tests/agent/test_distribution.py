"""The agent installs on its own: ``pip install agent/`` into a fresh venv brings no Django, every agent
module imports there, and ``gpubook-agent --check`` runs from it.

The venv is built once per test session, from a copy of agent/ (so no build files land in the working
tree), by pip with whatever index and cache it is configured with. Only when no package index can be
reached at all are these tests skipped, and they say so; an install that fails otherwise fails them.
"""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.agent.harness import REPO, RecordingPortal, free_port, local_ca

AGENT_SOURCE = REPO / "agent"
PORTAL_ONLY = {"django", "daphne", "psycopg", "psycopg-binary", "djangorestframework", "channels", "channels-redis"}
AGENT_NEEDS = {"gpubook-agent", "celery", "kombu", "redis", "nvidia-ml-py"}
PIP_TIMEOUT = 600
FOREIGN_VARIABLES = ("PYTHON", "VIRTUAL_ENV", "GPUBOOK_", "DJANGO_")
CHECKS = ["config", "root", "gpus", "device files", "acls", "state", "portal", "clock", "broker", "launch"]


class AgentVenv:
    """A venv with nothing but the agent's distribution installed, and its interpreter's working directory
    outside the repository (so nothing of the portal's tree is on its path)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "venv" / "bin"

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / argv[0]), *argv[1:]]
        # This environment for pip (its index, cache and proxy settings), less what would reach into the
        # portal's venv and tree (PYTHON*, VIRTUAL_ENV) or override the agent's config (GPUBOOK_*).
        environment = {key: value for key, value in os.environ.items() if not key.startswith(FOREIGN_VARIABLES)}
        environment["PATH"] = f"{self.bin}:/usr/bin:/bin"
        return subprocess.run(
            command, cwd=self.root, env=environment, capture_output=True, text=True, timeout=timeout, check=False
        )

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run("python", "-I", "-c", code)


def _index_unreachable(venv: AgentVenv) -> str | None:
    """Why no package index can be reached, or None when pip can get the agent's dependencies somewhere
    (an index or its cache): asked with one download of celery, the largest of them."""
    download = venv.root / "probe"
    result = venv.run("python", "-m", "pip", "download", "--no-deps", "--dest", str(download), "celery>=5.4,<6")
    shutil.rmtree(download, ignore_errors=True)
    if result.returncode == 0:
        return None
    said = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return said[-1] if said else f"pip download exited {result.returncode}"


@pytest.fixture(scope="session")
def agent_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentVenv]:
    root = tmp_path_factory.mktemp("agent-venv")
    root.chmod(0o755)
    venv = AgentVenv(root)
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, capture_output=True, timeout=120)
    unreachable = _index_unreachable(venv)
    if unreachable is not None:
        pytest.skip(f"no package index reachable, so the agent's dependencies cannot be installed: {unreachable}")
    source = root / "agent"
    shutil.copytree(AGENT_SOURCE, source, ignore=shutil.ignore_patterns("*.egg-info", "build", "dist", "__pycache__"))
    installed = venv.run("python", "-m", "pip", "install", str(source), timeout=PIP_TIMEOUT)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    yield venv
    shutil.rmtree(root, ignore_errors=True)


def agent_modules() -> list[str]:
    """Every module of the agent's source tree, by its import name."""
    package = AGENT_SOURCE / "gpubook_agent"
    names = []
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(AGENT_SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def test_the_fresh_venv_has_the_agents_dependencies_and_nothing_of_the_portals(agent_venv):
    listed = agent_venv.run("python", "-m", "pip", "list", "--format=json")

    assert listed.returncode == 0, listed.stderr
    names = {package["name"].lower().replace("_", "-") for package in json.loads(listed.stdout)}
    assert not names & PORTAL_ONLY
    assert names >= AGENT_NEEDS


def test_every_agent_module_imports_there_without_django(agent_venv):
    modules = agent_modules()
    assert {"gpubook_agent.main", "gpubook_agent.protocol", "gpubook_agent.gpus.nvml"} <= set(modules)

    result = agent_venv.python(
        f"import importlib, sys\n"
        f"for name in {modules!r}:\n"
        f"    module = importlib.import_module(name)\n"
        f"    assert '/venv/' in module.__file__, module.__file__\n"
        f"print(sorted(name for name in sys.modules if name.split('.')[0] in ('django', 'rest_framework')))\n"
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_agent_imports_only_the_standard_library_and_its_dependencies_even_inside_functions():
    allowed = set(sys.stdlib_module_names) | {"gpubook_agent", "celery", "kombu", "redis", "pynvml"}
    found = set()
    for path in sorted((AGENT_SOURCE / "gpubook_agent").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found |= {(alias.name.split(".")[0], path.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add((node.module.split(".")[0], path.name))

    assert {(top, where) for top, where in found if top not in allowed} == set()
    assert {top for top, _ in found} >= {"celery", "kombu", "pynvml", "gpubook_agent"}  # the walk sees them


def test_django_is_not_there(agent_venv):
    result = agent_venv.python("import django")

    assert result.returncode == 1
    assert "ModuleNotFoundError: No module named 'django'" in result.stderr


def write_config(directory: Path, **values: str) -> Path:
    settings_ = {
        "NODE_NAME": "gpu-check",
        "BROKER_URL": settings.CELERY_BROKER_URL,
        "AGENT_TOKEN": "gpn_check-token",
        "LEASE_SECRET": "s3cret",
        "STATE_DIR": str(directory / "state"),
        "DEVICE_DIR": str(directory / "dev"),
        "BACKEND": "simulated",
        "SIMULATED_GPUS": "2",
        "CA_FILE": local_ca().ca_file,
        **values,
    }
    config = directory / "agent.conf"
    config.write_text("".join(f"{key}={value}\n" for key, value in settings_.items()))
    config.chmod(0o600)
    return config


def test_the_check_runs_from_the_fresh_venv_and_fails_when_the_portal_is_not_there(agent_venv, tmp_path):
    # As test_selfcheck's test of the JSON output: nothing listens at PORTAL_URL, the broker is the test Redis.
    (tmp_path / "dev").mkdir()
    config = write_config(tmp_path, PORTAL_URL=f"https://127.0.0.1:{free_port()}")

    result = agent_venv.run("gpubook-agent", "--config", str(config), "--check", "--json")

    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    by_name = {check["name"]: check for check in report["checks"]}
    assert list(by_name) == CHECKS
    assert by_name["portal"]["status"] == "FAIL" and "connection refused" in by_name["portal"]["message"]
    assert by_name["portal"]["fix"]
    assert by_name["gpus"]["status"] == "OK" and len(by_name["gpus"]["details"]) == 2
    assert by_name["broker"]["status"] == "OK"  # celery's redis transport came with the agent


def test_the_check_passes_from_the_fresh_venv_on_a_healthy_node(agent_venv, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: root-owned device files and ACLs, as on a node (as test_selfcheck)")
    # As test_selfcheck's healthy node: root-only device files, a portal over HTTPS, the test Redis.
    tmp_path.chmod(0o755)
    (tmp_path / "dev").mkdir(mode=0o755)
    for minor in range(2):
        device = tmp_path / "dev" / f"nvidia{minor}"
        device.touch()
        os.chown(device, 0, 0)
        device.chmod(0o600)
    portal = RecordingPortal(tls=True)
    try:
        config = write_config(tmp_path, PORTAL_URL=portal.url)
        result = agent_venv.run("gpubook-agent", "--config", str(config), "--check")
    finally:
        portal.stop()

    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if not line.startswith(" ")]
    assert [line.split()[0] for line in lines[:-1]] == ["OK"] * len(CHECKS)
    assert lines[-1] == "No failures (0 warning(s)): the agent can run here."
    (heartbeat,) = portal.received["heartbeat"]
    assert heartbeat["backend"] == "simulated" and heartbeat["applied_version"] == 0
