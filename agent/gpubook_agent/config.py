"""The agent's configuration: a ``KEY=value`` file, overridden by ``GPUBOOK_<KEY>`` variables.

The file has the same lines ``manage.py register_node`` prints, so an admin pastes them into
``/etc/gpubook/agent.conf`` and adds what differs from the defaults. The same file can serve
as a systemd ``EnvironmentFile``.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpubook_agent.endpoints import socket_dir_problem
from gpubook_agent.gpus import mig, simulated
from gpubook_agent.protocol import LAUNCH_KINDS, queue_name

DEFAULT_CONFIG_FILE = "/etc/gpubook/agent.conf"
ENV_PREFIX = "GPUBOOK_"
NODE_NAME_RE = re.compile(r"\A[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LAUNCH_RUNNERS = ("auto", "systemd", "supervisor")
# Far beyond any sensible period, yet well inside what timedelta and threading timeouts accept: a larger
# value would raise OverflowError inside the enforcer's or the reporter's thread and stop it.
MAX_SECONDS = 366 * 24 * 3600.0


class ConfigError(ValueError):
    """A configuration a person must fix; the message says what and where."""


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    broker_url: str
    portal_url: str
    agent_token: str
    lease_secret: str
    state_dir: str = "/var/lib/gpubook-agent"
    device_dir: str = "/dev"
    backend: str = "nvml"
    simulated_gpus: int = 4
    # The simulated cards (all alike, as on a demo node): what they report as their model, memory and power limit.
    simulated_model: str = simulated.MODEL
    simulated_memory_mib: int = simulated.MEMORY_TOTAL_MIB
    simulated_power_w: float = simulated.POWER_LIMIT_W
    # Simulated cards in MIG mode and their slices ("0:3g.40gb,2g.20gb,2g.20gb;1:7g.80gb"), checked when loaded.
    simulated_mig: str = ""
    # Where the driver numbers the MIG capability files, and where those files are (the simulated backend's
    # stand-ins go under DEVICE_DIR unless these are set).
    mig_minors_file: str = mig.MIG_MINORS_FILE
    mig_caps_dir: str = mig.CAPS_DIR
    grace_seconds: float = 30.0
    reconcile_seconds: float = 5.0
    heartbeat_seconds: float = 10.0
    telemetry_seconds: float = 5.0
    # How long the agent waits, after a heartbeat reply shows the portal at a newer lease version, for
    # the push to arrive before it pulls the snapshot over HTTPS (a push normally takes milliseconds).
    pull_after_seconds: float = 15.0
    # A snapshot received (pushed or pulled) issued longer ago than this is refused: a replay, or one held
    # back. The portal issues a fresh one for every push and pull, and beat re-pushes each minute.
    max_snapshot_age_seconds: float = 600.0
    end_violations: bool = False
    protected_users: frozenset[str] = frozenset()
    ca_file: str = ""
    log_level: str = "INFO"
    # http:// for PORTAL_URL sends the node token in clear: only for the demo or a test network.
    allow_insecure_portal: bool = False
    # Whether the agent may lower idle cards' power limits when the portal asks (the idle power cap, power.py):
    # the node's root has the last word on its hardware. False: the portal's cap is refused, and reported.
    allow_power_cap: bool = True
    # Which environments a booking may launch here (issue 22; launches.py): containers (rootless podman), plain
    # commands, both (the default) or none (LAUNCH_KINDS=none). Both run as the booking's user, never as root.
    launch_kinds: frozenset[str] = frozenset(LAUNCH_KINDS)
    # Options podman gets before ``run`` on this node, e.g. "--runtime runc --cgroup-manager cgroupfs" where
    # cgroups v1 make crun refuse (an argument list split as a shell would, never run by a shell).
    podman_options: tuple[str, ...] = ()
    # Device files every container gets besides its booking's own (the driver's control files, which are open to
    # all anyway); those missing on the node are left out. Empty: the defaults under DEVICE_DIR.
    container_devices: tuple[str, ...] = ()
    # What runs a launch: "systemd" (a transient unit per launch, in a cgroup of its own), "supervisor" (the agent's
    # own child, in a session of its own), or "auto": systemd where it is PID 1 and systemd-run is installed.
    launch_runner: str = "auto"
    # Where launches serve on Unix sockets ({socket}; endpoints.py): a directory of root's, 0755, with one 0700
    # directory of the user's per launch. Outside the agent's private /tmp and read-only paths, since both the launch
    # and its holder's ssh session reach it (the unit's RuntimeDirectory=gpubook-launches makes the default one).
    # BACKEND=simulated: a directory per node in it, as several stand-in agents share a machine.
    launch_socket_dir: str = "/run/gpubook-launches"

    @property
    def queue(self) -> str:
        """The Celery queue the portal pushes this node's snapshots to."""
        return queue_name(self.node_name)


_REQUIRED = ("NODE_NAME", "BROKER_URL", "PORTAL_URL", "AGENT_TOKEN", "LEASE_SECRET")
_FLOATS = {
    "GRACE_SECONDS": "grace_seconds",
    "RECONCILE_SECONDS": "reconcile_seconds",
    "HEARTBEAT_SECONDS": "heartbeat_seconds",
    "TELEMETRY_SECONDS": "telemetry_seconds",
    "PULL_AFTER_SECONDS": "pull_after_seconds",
    "MAX_SNAPSHOT_AGE_SECONDS": "max_snapshot_age_seconds",
}
_STRINGS = {
    "STATE_DIR": "state_dir",
    "DEVICE_DIR": "device_dir",
    "BACKEND": "backend",
    "CA_FILE": "ca_file",
    "LOG_LEVEL": "log_level",
    "MIG_MINORS_FILE": "mig_minors_file",
    "MIG_CAPS_DIR": "mig_caps_dir",
    "LAUNCH_SOCKET_DIR": "launch_socket_dir",
}
_KNOWN = (
    set(_REQUIRED)
    | set(_FLOATS)
    | set(_STRINGS)
    | {"SIMULATED_GPUS", "END_VIOLATIONS", "PROTECTED_USERS", "ALLOW_INSECURE_PORTAL", "ALLOW_POWER_CAP"}
    | {"SIMULATED_MODEL", "SIMULATED_MEMORY_MIB", "SIMULATED_POWER_W", "SIMULATED_MIG"}
    | {"LAUNCH_KINDS", "PODMAN_OPTIONS", "CONTAINER_DEVICES", "LAUNCH_RUNNER"}
)


def read_config_file(path: str | Path, *, lenient: bool = False) -> dict[str, str]:
    """``KEY=value`` lines; blank lines and ``#`` comments skipped; optional quotes stripped. ``lenient``: a line
    that is not ``KEY=value`` is skipped rather than refused."""
    values: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(f"cannot read the config file {path}: {error.strerror}") from error
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            if lenient:
                continue
            raise ConfigError(f"{path}, line {number}: expected KEY=value")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.upper()] = value
    return values


def config_file(path: str | Path | None, environ: Mapping[str, str]) -> str | Path | None:
    """The config file to read: the one named (argument, else the environment), else the default one
    if it exists. A file named on purpose must exist; the default one may not."""
    named = path or environ.get(ENV_PREFIX + "AGENT_CONFIG")
    return named or (DEFAULT_CONFIG_FILE if Path(DEFAULT_CONFIG_FILE).exists() else None)


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> AgentConfig:
    """The file (when given, or the default file when it exists), then the environment on top."""
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    file = config_file(path, environ)
    if file:
        values.update(read_config_file(file))
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :] in _KNOWN:
            values[key[len(ENV_PREFIX) :]] = value
    unknown = sorted(set(values) - _KNOWN)
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")
    return config_from_values(values)


def load_state_settings(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """STATE_DIR and LEASE_SECRET alone, read as ``load_config`` reads them but leniently: ``revoke-all`` needs
    nothing else, and must work after a kill even if an edit since broke the rest of the config (a typo, a missing
    setting, an http PORTAL_URL). ConfigError only when the file cannot be read or LEASE_SECRET is missing."""
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    file = config_file(path, environ)
    if file:
        values.update(read_config_file(file, lenient=True))
    for key in ("STATE_DIR", "LEASE_SECRET"):
        if ENV_PREFIX + key in environ:
            values[key] = environ[ENV_PREFIX + key]
    if not values.get("LEASE_SECRET"):
        raise ConfigError("missing setting: LEASE_SECRET (the grant ledger is signed with it)")
    return values.get("STATE_DIR") or AgentConfig.state_dir, values["LEASE_SECRET"]


def config_from_values(values: Mapping[str, str]) -> AgentConfig:
    missing = [key for key in _REQUIRED if not values.get(key)]
    if missing:
        raise ConfigError(f"missing setting(s): {', '.join(missing)} (manage.py register_node prints them)")
    name = values["NODE_NAME"]
    if not NODE_NAME_RE.match(name):
        raise ConfigError(f"NODE_NAME {name!r} is not a valid node name (lowercase letters, digits and dashes)")
    portal = urlsplit(values["PORTAL_URL"])
    if portal.scheme.lower() not in ("https", "http") or not portal.hostname:
        raise ConfigError(f"PORTAL_URL must start with https://: {values['PORTAL_URL']!r}")
    insecure = bool(values.get("ALLOW_INSECURE_PORTAL")) and _boolean(
        "ALLOW_INSECURE_PORTAL", values["ALLOW_INSECURE_PORTAL"]
    )
    if portal.scheme.lower() == "http" and not insecure:
        raise ConfigError(
            f"PORTAL_URL {values['PORTAL_URL']!r} is plain http: the node token would travel in clear with every "
            "report. Use the portal's https:// address (CA_FILE for a private CA), or set ALLOW_INSECURE_PORTAL=true "
            "for a demo or a test network"
        )
    kwargs: dict[str, object] = {
        "node_name": name,
        "broker_url": values["BROKER_URL"],
        "portal_url": values["PORTAL_URL"].rstrip("/"),
        "agent_token": values["AGENT_TOKEN"],
        "lease_secret": values["LEASE_SECRET"],
        "allow_insecure_portal": insecure,
    }
    for key, attr in _STRINGS.items():
        if values.get(key):
            kwargs[attr] = values[key]
    for key, attr in _FLOATS.items():
        if values.get(key):
            kwargs[attr] = _positive_float(key, values[key])
    if values.get("SIMULATED_GPUS"):
        kwargs["simulated_gpus"] = _positive_int("SIMULATED_GPUS", values["SIMULATED_GPUS"])
    kwargs.update(_simulated_card(values))
    if values.get("END_VIOLATIONS"):
        kwargs["end_violations"] = _boolean("END_VIOLATIONS", values["END_VIOLATIONS"])
    if values.get("ALLOW_POWER_CAP"):
        kwargs["allow_power_cap"] = _boolean("ALLOW_POWER_CAP", values["ALLOW_POWER_CAP"])
    kwargs.update(_launch_settings(values))
    if values.get("PROTECTED_USERS"):
        names = {item.strip() for item in values["PROTECTED_USERS"].split(",") if item.strip()}
        kwargs["protected_users"] = frozenset(names)
    if kwargs.get("backend", "nvml") not in ("nvml", "simulated"):
        raise ConfigError(f"BACKEND must be nvml or simulated, not {kwargs['backend']!r}")
    if str(kwargs.get("log_level", AgentConfig.log_level)).upper() not in LOG_LEVELS:
        raise ConfigError(f"LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, not {kwargs['log_level']!r}")
    if kwargs.get("backend") == "simulated" and "device_dir" not in kwargs:
        # Stand-in device files are plain files: never create them in the real /dev.
        kwargs["device_dir"] = str(Path(str(kwargs.get("state_dir", AgentConfig.state_dir))) / "dev")
    if kwargs.get("backend") == "simulated" and "launch_socket_dir" not in kwargs:
        kwargs["launch_socket_dir"] = f"{AgentConfig.launch_socket_dir}/{name}"
    socket_problem = socket_dir_problem(str(kwargs.get("launch_socket_dir", AgentConfig.launch_socket_dir)))
    if socket_problem:
        raise ConfigError(f"LAUNCH_SOCKET_DIR must be {socket_problem}, not {kwargs.get('launch_socket_dir')!r}")
    if kwargs.get("backend") == "simulated":
        # The stand-in capability files and mig-minors go with the stand-in device files, never into the
        # driver's /dev/nvidia-caps or /proc.
        device_dir = Path(str(kwargs["device_dir"]))
        kwargs.setdefault("mig_caps_dir", str(device_dir / "nvidia-caps"))
        kwargs.setdefault("mig_minors_file", str(device_dir / "mig-minors"))
    kwargs.update(_simulated_mig(values, kwargs))
    # Each value was checked above, by key; mypy cannot follow a dict's types key by key.
    return AgentConfig(**kwargs)  # type: ignore[arg-type]


def _simulated_card(values: Mapping[str, str]) -> dict[str, object]:
    """SIMULATED_MODEL, SIMULATED_MEMORY_MIB and SIMULATED_POWER_W, those given, checked."""
    card: dict[str, object] = {}
    model = values.get("SIMULATED_MODEL")
    if model:
        # It is shown on pages and written back into config lines: one printable line of text.
        if not model.isprintable() or len(model) > simulated.MAX_MODEL_CHARS:
            raise ConfigError(
                f"SIMULATED_MODEL must be printable text of at most {simulated.MAX_MODEL_CHARS} characters "
                f"(e.g. NVIDIA A100-SXM4-80GB), not {model!r}"
            )
        card["simulated_model"] = model
    if values.get("SIMULATED_MEMORY_MIB"):
        memory = _positive_int("SIMULATED_MEMORY_MIB", values["SIMULATED_MEMORY_MIB"])
        if not simulated.BASE_MIB < memory <= simulated.MAX_MEMORY_MIB:
            raise ConfigError(
                f"SIMULATED_MEMORY_MIB must be between {simulated.BASE_MIB + 1} and {simulated.MAX_MEMORY_MIB} "
                f"(MiB; an 80 GB A100 has 81920), not {values['SIMULATED_MEMORY_MIB']!r}"
            )
        card["simulated_memory_mib"] = memory
    if values.get("SIMULATED_POWER_W"):
        raw = values["SIMULATED_POWER_W"]
        try:
            power = float(raw)
        except ValueError:
            raise ConfigError(f"SIMULATED_POWER_W must be a number of watts, not {raw!r}") from None
        if not (math.isfinite(power) and 0 < power <= simulated.MAX_POWER_W):
            raise ConfigError(
                f"SIMULATED_POWER_W must be more than 0 and at most {simulated.MAX_POWER_W:.0f} (watts), not {raw!r}"
            )
        card["simulated_power_w"] = power
    return card


def _simulated_mig(values: Mapping[str, str], kwargs: Mapping[str, object]) -> dict[str, object]:
    """SIMULATED_MIG, checked against the simulated cards (their count, A100 placement rules)."""
    raw = values.get("SIMULATED_MIG", "").strip()
    if not raw:
        return {}
    if kwargs.get("backend", AgentConfig.backend) != "simulated":
        raise ConfigError("SIMULATED_MIG is for BACKEND=simulated; with NVML the agent reads the real MIG layout")
    try:
        layout = simulated.parse_simulated_mig(raw)
    except ValueError as error:
        raise ConfigError(f"SIMULATED_MIG: {error}") from None
    cards = int(str(kwargs.get("simulated_gpus", AgentConfig.simulated_gpus)))
    beyond = sorted(index for index in layout if index >= cards)
    if beyond:
        raise ConfigError(
            f"SIMULATED_MIG: card {beyond[0]} does not exist: SIMULATED_GPUS is {cards} (cards 0-{cards - 1})"
        )
    return {"simulated_mig": raw}


def _launch_settings(values: Mapping[str, str]) -> dict[str, object]:
    """LAUNCH_KINDS, LAUNCH_RUNNER, PODMAN_OPTIONS and CONTAINER_DEVICES, those given, checked."""
    settings: dict[str, object] = {}
    if "LAUNCH_KINDS" in values:
        kinds = {item.strip() for item in values["LAUNCH_KINDS"].split(",") if item.strip()} - {"none"}
        if "both" in kinds:
            kinds = (kinds - {"both"}) | set(LAUNCH_KINDS)
        unknown = sorted(kinds - set(LAUNCH_KINDS))
        if unknown:
            raise ConfigError(f"LAUNCH_KINDS: {', '.join(unknown)}? Give container, command, both or none")
        settings["launch_kinds"] = frozenset(kinds)
    if values.get("LAUNCH_RUNNER"):
        runner = values["LAUNCH_RUNNER"].strip().lower()
        if runner not in LAUNCH_RUNNERS:
            raise ConfigError(
                f"LAUNCH_RUNNER must be one of {', '.join(LAUNCH_RUNNERS)}, not {values['LAUNCH_RUNNER']!r}"
            )
        settings["launch_runner"] = runner
    if values.get("PODMAN_OPTIONS"):
        try:
            options = tuple(shlex.split(values["PODMAN_OPTIONS"]))
        except ValueError as error:
            raise ConfigError(f"PODMAN_OPTIONS: {error}") from None
        if not options[0].startswith("-") or "run" in options:
            raise ConfigError(
                f"PODMAN_OPTIONS are podman's global options (like --runtime runc), not {values['PODMAN_OPTIONS']!r}"
            )
        settings["podman_options"] = options
    if values.get("CONTAINER_DEVICES"):
        paths = tuple(item.strip() for item in values["CONTAINER_DEVICES"].split(",") if item.strip())
        bad = [path for path in paths if not path.startswith("/") or ":" in path]
        if bad:
            raise ConfigError(f"CONTAINER_DEVICES are absolute paths of device files, not {bad[0]!r}")
        settings["container_devices"] = paths
    return settings


def _positive_float(key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key} must be a number, not {raw!r}") from None
    if not value > 0:
        raise ConfigError(f"{key} must be greater than 0, not {raw!r}")
    if not math.isfinite(value) or value > MAX_SECONDS:
        raise ConfigError(f"{key} must be at most {MAX_SECONDS:.0f} (a year), not {raw!r}")
    return value


def _positive_int(key: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key} must be a whole number, not {raw!r}") from None
    if value < 1:
        raise ConfigError(f"{key} must be at least 1, not {raw!r}")
    return value


def _boolean(key: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{key} must be true or false, not {raw!r}")
