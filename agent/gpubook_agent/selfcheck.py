"""``gpubook-agent --check``: is this server ready to run the agent? Each check says OK, WARN or FAIL
in a sentence, and for a failure what to do.

Run it after installing and before enabling the service, and whenever a node misbehaves. It changes
nothing a running agent depends on: it opens the GPU backend (the simulated one creates its missing
stand-in files, as the agent would), sets and removes one ACL entry on a temporary file next to the
device files, sends the portal one heartbeat built from what is on disk (the stored snapshot's
version, the ACLs read from the device and MIG capability files, and the MIG layout, so a running
agent's state is reported truthfully), and connects to the broker without touching any queue.
"""

from __future__ import annotations

import email.utils
import grp
import json
import os
import pwd
import re
import shutil
import socket
import ssl
import stat
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from gpubook_agent import acl, procfs, protocol
from gpubook_agent.access import AccessMap
from gpubook_agent.config import AgentConfig, ConfigError, config_file, load_config
from gpubook_agent.gpus import BackendUnavailable, GpuBackend, MigCardInfo, open_configured_backend
from gpubook_agent.launcher import uses_units
from gpubook_agent.reporter import PortalClient, redirect_refusal
from gpubook_agent.snapshot import SnapshotRefused, decode_snapshot, parse_snapshot
from gpubook_agent.store import SnapshotStore, StateFileIgnored, UnsafeStateDir
from gpubook_agent.usernames import valid_username

OK, WARN, FAIL = "OK", "WARN", "FAIL"
TIMEOUT = 5.0  # seconds for each network probe
SKEW_WARN_SECONDS, SKEW_FAIL_SECONDS = 2.0, 30.0
NOBODY_UID = 65534  # the harmless account named in the test ACL entry
MODPROBE_FILE = "/etc/modprobe.d/nvidia-gpubook.conf"
MODPROBE_OPTIONS = (
    "options nvidia NVreg_DeviceFileMode=0660 NVreg_DeviceFileUID=0 NVreg_DeviceFileGID=0 NVreg_ModifyDeviceFiles=0"
)
DRIVER_FIX = (
    f"put `{MODPROBE_OPTIONS}` in {MODPROBE_FILE}, then reload the driver "
    "(rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia; modprobe nvidia) or reboot "
    "(rebuild the initramfs first if it loads nvidia)"
)
NTP_FIX = "enable NTP (timedatectl set-ntp true): leases start and end by this node's clock"
REGISTER_AGAIN = "register the node again or copy the token from `manage.py register_node`"
GPU_FILE_RE = re.compile(r"\Anvidia(\d+)\Z")
CONTROL_FILES = ("nvidiactl", "nvidia-uvm")
CAPS_MODE_FIX = (
    "make them root-only (for F in {files}; do chmod 0400 $F; done) and keep nvidia-modprobe from resetting them "
    "with NVreg_ModifyDeviceFiles=0 among the driver options (see the device files check); only the agent's ACLs "
    "then open a slice"
)
CAPS_CREATE_FIX = (
    "create the capability files root-only from mig-minors: "
    "major=$(awk '$2==\"nvidia-caps\" {{print $1}}' /proc/devices); mkdir -p -m 0755 {caps_dir}; "
    "while read -r name minor; do [ -e {caps_dir}/nvidia-cap$minor ] || "
    "mknod -m 0400 {caps_dir}/nvidia-cap$minor c $major $minor; done < {minors}"
)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, WARN or FAIL
    message: str
    fix: str = ""
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class PortalAnswer:
    """When the heartbeat left and came back (local clock), and the portal's idea of the time."""

    sent: float
    received: float
    portal_time: datetime | None
    date_header: datetime | None


def main(config_path: str | None, *, as_json: bool = False) -> int:
    """Run every check, print them, and return the exit status: 1 if any failed, else 0."""
    checks = run_checks(config_path)
    failed = any(check.status == FAIL for check in checks)
    if as_json:
        print(json.dumps({"ok": not failed, "checks": [asdict(check) for check in checks]}, indent=2))
    else:
        print(render(checks))
    return 1 if failed else 0


def render(checks: list[Check]) -> str:
    lines = []
    for check in checks:
        lines.append(f"{check.status:<4}  {check.name}: {check.message}")
        lines.extend(f"        {detail}" for detail in check.details)
        if check.fix:
            lines.append(f"        fix: {check.fix}")
    failures = sum(check.status == FAIL for check in checks)
    warnings = sum(check.status == WARN for check in checks)
    if failures:
        lines.append(f"{failures} failed, {warnings} warning(s): fix the failures before starting the agent.")
    else:
        lines.append(f"No failures ({warnings} warning(s)): the agent can run here.")
    return "\n".join(lines)


def run_checks(config_path: str | None, environ: dict[str, str] | None = None) -> list[Check]:
    environ = dict(os.environ) if environ is None else environ
    config_check, config = check_config(config_path, environ)
    if config is None:
        return [config_check]
    checks = [config_check, check_root(os.geteuid())]
    backend_check, backend = check_backend(config)
    checks.append(backend_check)
    try:
        paths = gpu_device_files(config, backend)
        if paths or backend is not None:  # without a backend, only files already there can be judged
            checks.append(check_device_files(paths, simulated=config.backend == "simulated"))
        if backend is not None and backend.name == "nvml":
            checks.append(check_control_files(config.device_dir))
        mig_check = check_mig(config, backend)
        if mig_check is not None:
            checks.append(mig_check)
        checks.append(check_acls(config.device_dir))
        checks.append(check_state_dir(config.state_dir))
        portal_check, answer = check_portal(config, heartbeat_body(config, backend))
        checks.append(portal_check)
        checks.append(check_clock(answer))
        checks.append(check_broker(config.broker_url))
        checks.append(check_launch(config.launch_kinds, config.launch_runner))
    finally:
        if backend is not None:
            backend.close()
    return checks


# -- the checks, each on its own --------------------------------------------------------------


def check_config(config_path: str | None, environ: dict[str, str]) -> tuple[Check, AgentConfig | None]:
    path = config_file(config_path, environ)
    source = path or "the environment (no config file)"
    try:
        config = load_config(config_path, environ)
    except ConfigError as error:
        fix = "correct the config file (deploy/agent.conf.example lists every setting)"
        return Check("config", FAIL, f"{source} is not usable: {error}", fix=fix), None
    message = f"{source} is valid: node {config.node_name}, backend {config.backend}, portal {config.portal_url}"
    problems: list[tuple[str, str]] = []  # (what is wrong, what to do)
    if path:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o044:
            problems.append(
                (
                    f"the file is readable by others (mode {mode:04o}) and holds the node token and the lease secret",
                    f"chmod 600 {path}",
                )
            )
    if config.allow_insecure_portal:
        if urlsplit(config.portal_url).scheme.lower() == "http":
            problem = "ALLOW_INSECURE_PORTAL=true lets the node token and every report travel in clear (http)"
            fix = "serve the portal over https, set PORTAL_URL=https://..., and remove ALLOW_INSECURE_PORTAL"
        else:
            problem = "ALLOW_INSECURE_PORTAL=true is set but unused (PORTAL_URL is https): an http URL would pass"
            fix = "remove ALLOW_INSECURE_PORTAL"
        problems.append((problem, fix))
    if problems:
        said = "; ".join(problem for problem, _ in problems)
        return Check("config", WARN, f"{message}; but {said}", fix="; ".join(fix for _, fix in problems)), config
    return Check("config", OK, message), config


def check_root(euid: int) -> Check:
    if euid == 0:
        return Check("root", OK, "running as root, as the agent must (it sets ACLs and ends other users' processes)")
    return Check(
        "root",
        WARN,
        f"running as uid {euid}, not root: the agent itself must run as root (the systemd unit does), and the ACL "
        "and state checks below may fail for this reason alone",
        fix="run the check as root (sudo gpubook-agent --check ...)",
    )


def check_backend(config: AgentConfig) -> tuple[Check, GpuBackend | None]:
    try:
        backend = open_configured_backend(config)
    except ImportError as error:  # the nvml backend imports pynvml when it opens
        return Check(
            "gpus",
            FAIL,
            f"NVML could not be loaded: the Python package nvidia-ml-py is missing ({error})",
            fix="install the agent with its dependencies in its venv (pip install ./agent from the portal's "
            "repository, or a wheel built from it; or pip install nvidia-ml-py alone)",
        ), None
    except BackendUnavailable as error:
        if config.backend == "nvml":
            cause = error.__cause__ or error
            return Check(
                "gpus",
                FAIL,
                f"NVML could not be loaded: {type(cause).__name__}: {cause}",
                fix="install the NVIDIA driver (nvidia-smi must list the GPUs), or set BACKEND=simulated for a trial",
            ), None
        return Check("gpus", FAIL, str(error), fix=f"make {config.device_dir} writable, or set DEVICE_DIR"), None
    gpus = backend.gpus()
    paths = {gpu.uuid: backend.device_path(gpu.uuid) for gpu in gpus}
    details = tuple(
        f"{gpu.uuid}  minor {gpu.minor} -> {paths[gpu.uuid]}  ({gpu.name}"
        + (f", {gpu.memory_total_mib} MiB)" if gpu.memory_total_mib is not None else ")")
        for gpu in gpus
    )
    if not gpus:
        return Check(
            "gpus",
            FAIL,
            "NVML started but lists no GPU this agent can identify (UUID and minor number)",
            fix="check nvidia-smi -L and the kernel log (dmesg | grep -i nvrm)",
        ), backend
    missing = [paths[gpu.uuid] for gpu in gpus if not os.path.exists(paths[gpu.uuid])]
    if missing:
        minors = " ".join(str(gpu.minor) for gpu in gpus if paths[gpu.uuid] in missing)
        return Check(
            "gpus",
            FAIL,
            f"{len(gpus)} GPU(s) found, but device file(s) {', '.join(missing)} are missing",
            fix=f"create them root-only: for N in {minors}; do mknod -m 0660 /dev/nvidia$N c 195 $N; done "
            "(with NVreg_ModifyDeviceFiles=0 the driver leaves that to you: a udev rule or a unit at boot)",
            details=details,
        ), backend
    if backend.name == "simulated":
        message = f"simulated backend: {len(gpus)} stand-in GPU(s) in {config.device_dir} (no real GPU is guarded)"
    else:
        message = f"NVML loaded (driver {backend.driver_version or 'unknown'}): {len(gpus)} GPU(s), each with its file"
    return Check("gpus", OK, message, details=details), backend


def gpu_device_files(config: AgentConfig, backend: GpuBackend | None) -> list[str]:
    """The files of the GPUs the backend lists, and any other ``nvidia<N>`` in the device directory
    (so the check also speaks when NVML cannot start), ordered by minor number."""
    paths = {backend.device_path(gpu.uuid) for gpu in backend.gpus()} if backend else set()
    try:
        names = os.listdir(config.device_dir)
    except OSError:
        names = []
    paths.update(os.path.join(config.device_dir, name) for name in names if GPU_FILE_RE.match(name))
    existing = [path for path in paths if os.path.exists(path)]
    return sorted(existing, key=_minor)


def _minor(path: str) -> int:
    """The minor number in a device file's name ``nvidia<N>`` (every backend names its files so)."""
    match = GPU_FILE_RE.match(os.path.basename(path))
    return int(match.group(1)) if match else -1


def check_device_files(paths: list[str], *, simulated: bool) -> Check:
    if not paths:
        return Check("device files", WARN, "no nvidia<N> device file to check")
    uid_min = procfs.uid_min()
    problems: list[str] = []
    open_to_all: list[str] = []
    details = []
    for path in paths:
        info = os.stat(path)
        mode, owner, group = stat.S_IMODE(info.st_mode), procfs.user_label(info.st_uid), _group(info.st_gid)
        details.append(f"{stat.filemode(info.st_mode)} {owner} {group} {path}")
        if mode & 0o006:
            open_to_all.append(f"{path} ({mode:04o})")
        elif info.st_uid != 0 and mode & 0o600:
            problems.append(f"{path} belongs to {owner}, who can always open it")
        elif mode & 0o060:
            members = _ordinary_members(info.st_gid, uid_min)
            if members:
                shown = ", ".join(members[:5]) + (f" and {len(members) - 5} more" if len(members) > 5 else "")
                problems.append(f"{path} is open to group {group}, which ordinary users belong to ({shown})")
    if open_to_all:
        problems.insert(0, f"everyone can open {', '.join(open_to_all)}")
    if not problems:
        return Check(
            "device files",
            OK,
            f"{len(paths)} GPU device file(s) are closed to ordinary users: only the agent's ACLs open them",
            details=tuple(details),
        )
    fix = DRIVER_FIX
    if simulated:
        fix = f"for the simulated stand-ins: chmod 0660 and chown root:root them; on a real node: {DRIVER_FIX}"
    return Check(
        "device files",
        FAIL,
        "; ".join(problems) + ": the ACLs restrict nothing while a file is open to them",
        fix=fix,
        details=tuple(details),
    )


def check_control_files(device_dir: str) -> Check:
    """/dev/nvidiactl and /dev/nvidia-uvm open no GPU by themselves and every CUDA program needs them."""
    details, problems = [], []
    for name in CONTROL_FILES:
        path = os.path.join(device_dir, name)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            problems.append(f"{path} is missing")
            continue
        details.append(f"{stat.filemode(info.st_mode)} {procfs.user_label(info.st_uid)} {_group(info.st_gid)} {path}")
        if stat.S_IMODE(info.st_mode) & 0o006 != 0o006:
            problems.append(f"{path} is not open to everyone")
    if problems:
        return Check(
            "control files",
            WARN,
            "; ".join(problems) + ": users will not be able to run CUDA on the GPUs they booked",
            fix="load nvidia-uvm (modprobe nvidia-uvm; nvidia-modprobe -u -c 0) and keep these two files "
            "mode 0666: they open no GPU by themselves",
            details=tuple(details),
        )
    return Check("control files", OK, "nvidiactl and nvidia-uvm are open to all, as CUDA needs", details=tuple(details))


def check_mig(config: AgentConfig, backend: GpuBackend | None) -> Check | None:
    """The MIG cards: each one's mode and slices, the mig-minors file and the slices' capability files, which
    must open to nobody but the agent's grants. None on a node without a card that supports MIG."""
    cards = backend.mig_cards() if backend is not None else []
    if backend is None or not cards:
        return None
    details: list[str] = []
    failures: list[tuple[str, str]] = []  # (what is wrong, what to do)
    pending: list[str] = []
    for card in cards:
        mode = "on" if card.mode_current else "off"
        if card.mode_current != card.mode_pending:
            mode += f", {'on' if card.mode_pending else 'off'} after the next reset"
            pending.append(card.uuid)
        details.append(f"{card.uuid}  minor {card.minor}: MIG {mode}, {len(card.slices)} slice(s)")
        details.extend(
            f"  {item.uuid}  {item.profile}  GPU instance {item.gpu_instance_id}, compute instance "
            f"{item.compute_instance_id}, memory slices {item.placement_start}-"
            f"{item.placement_start + item.placement_size - 1} -> {', '.join(item.capability_files) or 'none'}"
            for item in card.slices
        )
    slices = [item for card in cards for item in card.slices]
    minors_fix = CAPS_CREATE_FIX.format(caps_dir=config.mig_caps_dir, minors=config.mig_minors_file)
    if slices and not os.path.exists(config.mig_minors_file):
        failures.append(
            (
                f"{config.mig_minors_file} does not exist, so no slice's capability files are known",
                "use a driver with MIG support (R470 or later) and check MIG_MINORS_FILE",
            )
        )
    unnamed = [item.uuid for item in slices if len(item.capability_files) < 2]
    if unnamed and os.path.exists(config.mig_minors_file):
        failures.append((f"{config.mig_minors_file} does not name the capability files of {', '.join(unnamed)}", ""))
    missing = sorted({path for item in slices for path in item.capability_files if not os.path.exists(path)})
    if missing:
        failures.append(
            (f"capability file(s) {', '.join(missing)} are missing: nobody can use those slices", minors_fix)
        )
    failures.extend(_open_capability_files(config, cards))
    if failures:
        fixes = [fix for _, fix in failures if fix]
        return Check(
            "mig",
            FAIL,
            "; ".join(problem for problem, _ in failures),
            fix="; ".join(dict.fromkeys(fixes)),
            details=tuple(details),
        )
    summary = f"{len(cards)} MIG card(s), {len(slices)} slice(s); their capability files open to no one but leases"
    if pending:
        return Check(
            "mig",
            WARN,
            f"{summary}; a MIG mode change is pending on {', '.join(pending)}: its slices' leases do not open the "
            "card's device file until it is reset (nvidia-smi -i <index> -r) and MIG stays on",
            fix="finish the change: reset the card when it is idle (nvidia-smi -i <index> -r), or undo it "
            "(nvidia-smi -i <index> -mig 1, or -mig 0 if MIG is off now)",
            details=tuple(details),
        )
    return Check("mig", OK, summary, details=tuple(details))


def _open_capability_files(config: AgentConfig, cards: list[MigCardInfo]) -> list[tuple[str, str]]:
    """What opens a card's capability files (every one on disk: the driver reuses their minors) to ordinary
    users: the others bits, a group of ordinary users, or an ACL entry for a user no lease now explains."""
    allowed = _leased_capability_users(config, cards)
    uid_min = procfs.uid_min()
    open_to_all: list[str] = []
    open_to_group: list[str] = []
    unleased: list[str] = []
    too_open: list[str] = []
    for path in sorted({path for card in cards for path in card.capability_files if os.path.exists(path)}):
        info = os.stat(path)
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o006:
            open_to_all.append(f"{path} ({mode:04o})")
            too_open.append(path)
        elif info.st_uid != 0 and mode & 0o600:
            open_to_group.append(f"{path} (owned by {procfs.user_label(info.st_uid)})")
            too_open.append(path)
        elif mode & 0o060 and _ordinary_members(info.st_gid, uid_min):
            open_to_group.append(f"{path} (group {_group(info.st_gid)})")
            too_open.append(path)
        try:
            users = acl.granted_users(path)
        except acl.AclError:
            continue
        unleased.extend(f"{user} on {path}" for user in sorted(users - allowed.get(path, set())))
    found: list[tuple[str, str]] = []
    mode_fix = (
        "for the simulated stand-ins: chmod 0660 and chown root:root them"
        if config.backend == "simulated"
        else CAPS_MODE_FIX.format(files=" ".join(too_open))
    )
    if open_to_all:
        found.append((f"everyone can open the MIG capability file(s) {', '.join(open_to_all)}", mode_fix))
    if open_to_group:
        found.append((f"ordinary users can open the MIG capability file(s) {', '.join(open_to_group)}", mode_fix))
    if unleased:
        found.append(
            (
                f"ACL entries for users with no lease on the slice: {', '.join(unleased)}",
                "start the agent (it removes every entry no lease backs), or remove them: setfacl -x u:<user> <file>",
            )
        )
    return found


def _leased_capability_users(config: AgentConfig, cards: list[MigCardInfo]) -> dict[str, set[str]]:
    """Per capability file, the users whose lease in the stored snapshot covers now a slice it opens."""
    try:
        stored = SnapshotStore(config.state_dir).load()
        snapshot = (
            parse_snapshot(decode_snapshot(stored), node_name=config.node_name, secret=config.lease_secret)
            if stored is not None
            else None
        )
    except (StateFileIgnored, SnapshotRefused, OSError):
        snapshot = None
    access = AccessMap.build({card.uuid: f"card:{card.uuid}" for card in cards}, cards)
    now = datetime.now(UTC)
    allowed: dict[str, set[str]] = {}
    for lease in snapshot.leases if snapshot else ():
        if lease.active_at(now):
            for uuid in lease.gpus:
                for unit in access.lease_units(uuid):
                    for path in access.reach.get(unit, ()):
                        allowed.setdefault(path, set()).add(lease.user)
    return allowed


def check_acls(device_dir: str) -> Check:
    try:
        setfacl = acl.tool("setfacl")
    except acl.AclError:
        return Check("acls", FAIL, "setfacl is missing: the agent gives GPUs with it", fix="apt-get install acl")
    if not os.path.isdir(device_dir):
        return Check("acls", FAIL, f"DEVICE_DIR {device_dir} does not exist", fix="correct DEVICE_DIR in the config")
    try:
        fd, path = tempfile.mkstemp(prefix=".gpubook-check-", dir=device_dir)
    except OSError as error:
        return Check(
            "acls",
            FAIL,
            f"cannot create a test file in {device_dir} to try an ACL: {error.strerror}",
            fix="run the check as root",
        )
    os.close(fd)
    entry = f"u:{NOBODY_UID}"
    try:
        result = acl.run([setfacl, "-P", "-m", f"{entry}:r", "--", path])
        if result.returncode != 0:
            reason = acl.failure_message(result)
            if "not supported" in reason.lower():
                return Check(
                    "acls",
                    FAIL,
                    f"the filesystem of {device_dir} does not support POSIX ACLs ({reason})",
                    fix=f"mount it with acl (for /dev, a devtmpfs: a kernel with CONFIG_TMPFS_POSIX_ACL); "
                    f"see `findmnt -T {device_dir}`",
                )
            return Check("acls", FAIL, f"setfacl could not set a test entry in {device_dir}: {reason}")
        if NOBODY_UID not in acl.user_ids(path):
            return Check("acls", FAIL, f"setfacl succeeded but no ACL entry is kept in {device_dir}")
        result = acl.run([setfacl, "-P", "-x", entry, "--", path])
        if result.returncode != 0 or NOBODY_UID in acl.user_ids(path):
            reason = result.stderr.strip() or "the entry stayed"
            return Check("acls", FAIL, f"setfacl could not remove a test entry in {device_dir}: {reason}")
    except acl.AclError as error:  # setfacl hung or could not start, or the ACL could not be read
        return Check("acls", FAIL, f"could not try an ACL in {device_dir}: {error}")
    finally:
        Path(path).unlink(missing_ok=True)
    return Check("acls", OK, f"POSIX ACLs work in {device_dir} (one set and removed on a test file)")


def check_state_dir(state_dir: str) -> Check:
    directory = Path(state_dir)
    if not directory.exists():
        parent = next((p for p in directory.parents if p.exists()), Path("/"))
        if os.access(parent, os.W_OK | os.X_OK):
            return Check("state", OK, f"STATE_DIR {state_dir} does not exist yet; the agent will create it")
        return Check(
            "state",
            FAIL,
            f"STATE_DIR {state_dir} does not exist and {parent} is not writable",
            fix=f"install -d -m 0700 {state_dir} (the systemd unit's StateDirectory= does it)",
        )
    if not directory.is_dir():
        return Check("state", FAIL, f"STATE_DIR {state_dir} is not a directory", fix="correct STATE_DIR")
    try:
        SnapshotStore(directory).prepare()  # exists: only checks it is the agent's own
    except UnsafeStateDir as error:
        return Check("state", FAIL, error.problem, fix=error.fix)
    except OSError as error:
        return Check("state", FAIL, f"STATE_DIR {state_dir} cannot be opened ({error.strerror})", fix="run as root")
    try:
        fd, path = tempfile.mkstemp(prefix=".gpubook-check-", dir=directory)
    except OSError as error:
        return Check(
            "state",
            FAIL,
            f"STATE_DIR {state_dir} is not writable ({error.strerror}): the agent keeps its last snapshot there",
            fix="run the agent as root, or make the directory writable by it",
        )
    os.close(fd)
    os.unlink(path)
    return Check("state", OK, f"STATE_DIR {state_dir} is the agent's own (not writable by others) and writable")


def heartbeat_body(config: AgentConfig, backend: GpuBackend | None) -> protocol.Heartbeat:
    """A true heartbeat from what is on disk: a running agent's next one will say the same."""
    try:
        stored = SnapshotStore(config.state_dir).load()
    except StateFileIgnored:  # the agent will not use it either
        stored = None
    try:
        version = int(stored["version"]) if stored is not None else 0
    except (ValueError, KeyError, TypeError):
        version = 0
    acls: dict[str, list[str]] = {}
    paths = {gpu.uuid: backend.device_path(gpu.uuid) for gpu in backend.gpus()} if backend else {}
    cards = backend.mig_cards() if backend else []
    access = AccessMap.build(paths, cards)
    for uuid in access.units():
        files = access.grant_files.get(uuid)
        if not files:
            continue
        try:
            users = set.intersection(*(acl.granted_users(path) for path in files))  # open to them: every file
        except acl.AclError:
            continue
        acls[uuid] = sorted(user for user in users if valid_username(user))  # as the portal accepts them
    return protocol.heartbeat(
        backend=config.backend,
        driver_version=backend.driver_version if backend else None,
        applied_version=max(0, version),
        acls=acls,
        mig=[card.as_dict() for card in cards],
    )


def check_portal(config: AgentConfig, body: protocol.Heartbeat) -> tuple[Check, PortalAnswer | None]:
    where = _address(config.portal_url)
    try:
        client = PortalClient(config, timeout=TIMEOUT)
    except (OSError, ssl.SSLError) as error:
        return Check("portal", FAIL, f"CA_FILE {config.ca_file} cannot be used: {error}", fix="correct CA_FILE"), None
    request = client.request(protocol.HEARTBEAT, body)
    url = request.full_url
    sent = time.time()
    try:
        with client.open(request) as response:  # never follows a redirect: the token goes only to PORTAL_URL
            raw, headers = response.read(), response.headers
    except urllib.error.HTTPError as error:
        return _http_failure(error, url), None
    except urllib.error.URLError as error:
        return _network_failure(error.reason, where), None
    except (TimeoutError, OSError) as error:
        return _network_failure(error, where), None
    received = time.time()
    try:
        answer = json.loads(raw or b"{}")
    except ValueError:
        return Check(
            "portal",
            FAIL,
            f"{url} answered, but not with JSON: is PORTAL_URL the portal's address?",
            fix="set PORTAL_URL to the address the portal is served at (https://host, nothing after it)",
        ), None
    portal_time = _parse_time(answer.get("portal_time")) if isinstance(answer, dict) else None
    date = _parse_date(headers.get("Date"))
    said = f", portal time {portal_time.isoformat()}" if portal_time else ""
    message = f"the portal at {where} accepted the node token (answered in {1000 * (received - sent):.0f} ms{said})"
    return Check("portal", OK, message), PortalAnswer(sent, received, portal_time, date)


def check_clock(answer: PortalAnswer | None) -> Check:
    if answer is None:
        return Check("clock", WARN, "not compared with the portal's: the portal did not answer")
    local = (answer.sent + answer.received) / 2
    if answer.portal_time is not None:
        skew, precision, source = local - answer.portal_time.timestamp(), "", "the portal's time"
    elif answer.date_header is not None:
        # An HTTP Date has whole seconds: the portal's clock read somewhere in [date, date + 1).
        skew, precision, source = local - answer.date_header.timestamp() - 0.5, " (±1 s)", "the portal's Date header"
    else:
        return Check("clock", WARN, "not compared: the portal's answer carries no time")
    direction = "ahead of" if skew > 0 else "behind"
    message = f"this clock is {abs(skew):.1f} s{precision} {direction} {source}"
    if abs(skew) > SKEW_FAIL_SECONDS:
        return Check("clock", FAIL, message + f" (more than {SKEW_FAIL_SECONDS:g} s)", fix=NTP_FIX)
    if abs(skew) > SKEW_WARN_SECONDS:
        return Check("clock", WARN, message + f" (more than {SKEW_WARN_SECONDS:g} s)", fix=NTP_FIX)
    return Check("clock", OK, message)


def check_launch(
    kinds: frozenset[str] = frozenset(protocol.LAUNCH_KINDS),
    runner: str = "auto",
    which: Callable[[str], str | None] = shutil.which,
    pid1: str = "/proc/1/comm",
) -> Check:
    """What a booking's environment runs under on this node (launches.py, launcher.py; issue 22): transient systemd
    units (LAUNCH_RUNNER=systemd, or auto where systemd is PID 1) or the agent's own supervisor, and rootless podman
    for containers. A kind LAUNCH_KINDS allows that this node cannot run is a warning: such launches are refused,
    and said so to the person who asked."""
    tools = {name: which(name) for name in ("prlimit", "podman", "newuidmap", "systemd-run")}
    details = tuple(f"{name}: {path or 'missing'}" for name, path in tools.items())
    if not kinds:
        return Check("launch", OK, "environments are off here (LAUNCH_KINDS=none)", details=details)
    allowed = " and ".join(f"{kind}s" for kind in sorted(kinds))
    units = uses_units(runner, systemd_run=tools["systemd-run"], pid1=pid1)
    problems = []
    if units and not tools["systemd-run"]:
        problems.append("no systemd-run for LAUNCH_RUNNER=systemd: every launch is refused")
    if "container" in kinds and not (tools["podman"] and tools["newuidmap"]):
        missing = " and ".join(name for name in ("podman", "newuidmap") if not tools[name])
        problems.append(f"no {missing}: container launches are refused")
    if not units and not tools["prlimit"]:
        problems.append("no prlimit (util-linux): launches with limits are refused")
    runs_under = "transient systemd units" if units else "the agent's own supervisor"
    message = f"{allowed} run under {runs_under}" + ("; " + "; ".join(problems) if problems else "")
    if problems:
        fix = "apt install podman runc uidmap util-linux, or narrow LAUNCH_KINDS (e.g. LAUNCH_KINDS=command)"
        return Check("launch", WARN, message, fix=fix, details=details)
    return Check("launch", OK, message, details=details)


def check_broker(broker_url: str) -> Check:
    from kombu import Connection  # celery's messaging library: whatever broker Celery can use
    from kombu.utils.url import maybe_sanitize_url

    shown = maybe_sanitize_url(broker_url)
    started = time.monotonic()
    try:
        with Connection(
            broker_url,
            connect_timeout=TIMEOUT,
            transport_options={"socket_timeout": TIMEOUT, "socket_connect_timeout": TIMEOUT},
        ) as connection:
            # kombu counts this timeout in whole seconds.
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=int(TIMEOUT))
            connection.default_channel  # noqa: B018 - opening a channel is the round trip (Redis: a PING)
    except Exception as error:  # kombu raises the transport's own errors, wrapped or not
        return Check(
            "broker",
            FAIL,
            f"cannot reach the broker at {shown}: {error}",
            fix="check BROKER_URL (as register_node printed it), that the broker listens on an address this node "
            "reaches, and the firewall",
        )
    return Check("broker", OK, f"the broker at {shown} answered in {1000 * (time.monotonic() - started):.0f} ms")


# -- helpers ------------------------------------------------------------------------------------


def _http_failure(error: urllib.error.HTTPError, url: str) -> Check:
    if 300 <= error.code < 400:
        return Check(
            "portal",
            FAIL,
            f"{url} answered with a {redirect_refusal(error)}",
            fix="set PORTAL_URL to the address the portal answers at (https://host, nothing after it); "
            "a redirect from http:// means the portal is served over https",
        )
    detail = _detail(error)
    said = f"HTTP {error.code}" + (f": {detail}" if detail else "")
    if error.code in (401, 403):
        return Check("portal", FAIL, f"the portal refused the node token ({said})", fix=REGISTER_AGAIN)
    if error.code == 404:
        return Check(
            "portal",
            FAIL,
            f"{url} does not exist ({said}): PORTAL_URL does not point at the portal",
            fix="set PORTAL_URL to the portal's base address (https://host, without /api/...)",
        )
    if error.code == 429:
        return Check("portal", WARN, f"the portal accepted the token but is throttling this node ({said})")
    if error.code == 400:
        return Check(
            "portal",
            FAIL,
            f"the portal refused the heartbeat ({said})",
            fix="install the agent from the same release as the portal",
        )
    return Check(
        "portal", FAIL, f"the portal could not answer ({said})", fix="check the portal's web server and its logs"
    )


def _network_failure(reason: object, where: str) -> Check:
    if isinstance(reason, ssl.SSLCertVerificationError):
        return Check(
            "portal",
            FAIL,
            f"the portal's TLS certificate is not trusted ({reason.verify_message})",
            fix="set CA_FILE to the CA bundle that signed it, or give the portal a certificate this node trusts",
        )
    if isinstance(reason, ssl.SSLError):
        return Check("portal", FAIL, f"TLS with {where} failed ({reason})", fix="check PORTAL_URL (https or http?)")
    if isinstance(reason, ConnectionRefusedError):
        return Check(
            "portal",
            FAIL,
            f"connection refused by {where}: nothing listens there",
            fix="start the portal, or correct PORTAL_URL",
        )
    if isinstance(reason, socket.gaierror):
        return Check("portal", FAIL, f"cannot resolve {where} ({reason})", fix="correct PORTAL_URL, or check DNS")
    if isinstance(reason, TimeoutError):
        return Check(
            "portal", FAIL, f"no answer from {where} within {TIMEOUT:g} s", fix="check the firewall and any proxy"
        )
    message = f"cannot reach the portal at {where}: {reason}"
    return Check("portal", FAIL, message, fix="check PORTAL_URL and the network")


def _detail(error: urllib.error.HTTPError) -> str:
    try:
        raw = error.read()[:500].decode(errors="replace")
    except OSError:
        return ""
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.strip()[:200]
    # The portal's error envelope {"error": {"message": ...}}, or DRF's plain {"detail": ...}.
    error_body = data.get("error") if isinstance(data, dict) else None
    if isinstance(error_body, dict) and isinstance(message := error_body.get("message"), str):
        return message
    if isinstance(data, dict) and isinstance(detail := data.get("detail"), str):
        return detail
    return raw.strip()[:200]


def _address(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _parse_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _ordinary_members(gid: int, uid_min: int) -> list[str]:
    """Accounts with a uid from UID_MIN up (not nobody) in the group, as a member or by their primary group."""
    try:
        names = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        names = set()
    names.update(entry.pw_name for entry in pwd.getpwall() if entry.pw_gid == gid)
    ordinary = []
    for name in names:
        uid = procfs.uid_of(name)
        if uid is None or (uid >= uid_min and uid != NOBODY_UID):
            ordinary.append(name)
    return sorted(ordinary)
