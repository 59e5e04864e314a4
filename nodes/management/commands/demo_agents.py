"""Write a config file for a simulated agent per demo node (used by scripts/run).

A config whose credentials still match the database (same lease secret, token and broker password) keeps
them, so a restarted demo's agents trust the snapshots they stored; otherwise fresh credentials are issued
(which makes the node's broker user too). scripts/run re-creates the kept ones' broker users first
(sync_broker_users), should Redis have restarted since. The rest of the config (the simulated cards, where
the files live) is written from the database and this command's options every time it changed, so an older
demo's config is brought up to date without new credentials.

The simulated cards are the node's GPU rows: model, memory and a power limit from ``POWER_LIMITS``. Their
stand-in device files live under ``--device-root`` (default /var/tmp/gpubook-demo), in 0755 folders owned
by whoever runs this (the agent, in the demo): outside the checkout, whose parent folders may be private,
so the demo users' own jobs reach the files their ACLs open, as on a real node. The agent's state and its
config stay private, under ``--dir``.
"""

from __future__ import annotations

import os
import re
import stat
from collections import Counter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.services import hash_token
from gpubook_agent.config import ConfigError, config_from_values, read_config_file
from gpubook_agent.gpus.simulated import (
    DEMO_DEVICE_ROOT,
    MAX_MODEL_CHARS,
    POWER_LIMIT_W,
    closed_to_others,
    demo_device_dir,
)
from nodes.broker_users import BrokerUserError, broker_url_still_valid
from nodes.mig import simulated_layout
from nodes.models import Gpu, Node
from nodes.services import node_rotate_credentials

# Board power limits (W) of common cards, by a pattern of the model name as NVML reports it; the first match
# wins, so the more specific patterns come first. Anything else gets POWER_LIMIT_W.
POWER_LIMITS: tuple[tuple[re.Pattern[str], float], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), watts)
    for pattern, watts in (
        (r"\bA100\b.*\bPCIE\b", 300.0),
        (r"\bA100\b", 400.0),  # SXM4
        (r"\bH100\b.*\bPCIE\b", 350.0),
        (r"\bH100\b.*\bNVL\b", 400.0),
        (r"\bH100\b", 700.0),  # SXM5
        (r"\bH200\b", 700.0),
        (r"\bRTX 4090\b", 450.0),
        (r"\bRTX 3090\b", 350.0),
        (r"\bL40S\b", 350.0),
        (r"\bL40\b", 300.0),
        (r"\bL4\b", 72.0),
        (r"\bV100\b", 300.0),
        (r"\bT4\b", 70.0),
    )
)
CREDENTIALS = ("NODE_NAME", "BROKER_URL", "LEASE_SECRET", "AGENT_TOKEN")


def power_limit(model: str) -> float:
    """The power limit a simulated card of ``model`` reports."""
    return next((watts for pattern, watts in POWER_LIMITS if pattern.search(model)), POWER_LIMIT_W)


class Command(BaseCommand):
    help = "Write simulated agent configs for every node into DIR (default var/agents)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dir", default=str(settings.VAR_DIR / "agents"))
        parser.add_argument(
            "--device-root",
            default=DEMO_DEVICE_ROOT,
            help="where the stand-in device files go (<root>/<node>/dev), in folders anyone may traverse "
            f"(default {DEMO_DEVICE_ROOT})",
        )
        parser.add_argument("--portal-url", default="http://127.0.0.1:8000")
        parser.add_argument("--grace-seconds", type=int, default=30)

    def handle(self, *args: Any, **options: Any) -> None:
        directory = Path(options["dir"]).resolve()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        device_root = Path(os.path.abspath(options["device_root"]))
        self._reachable(device_root.parent)
        self._shared_folder(device_root)
        for node in Node.objects.exclude(status=Node.Status.DISABLED).order_by("name"):
            cards = list(Gpu.objects.filter(node=node, parent=None).order_by("index"))
            if not cards:
                self.stdout.write(f"  no agent config for {node.name}: it has no GPUs")
                continue
            device_dir = Path(demo_device_dir(str(device_root), node.name))
            self._shared_folder(device_dir.parent)
            self._shared_folder(device_dir)
            home = directory / node.name
            simulated = _simulated_lines(node, cards, home=home, device_dir=device_dir, options=options)
            path = directory / f"{node.name}.conf"
            kept = _still_valid(path, node)
            if kept is not None:
                config = _config_text(kept, options["portal_url"], simulated)
                if path.read_text() == config:
                    self.stdout.write(f"  agent config for {node.name}: {path} (kept)")
                    continue
                _write(path, config)
                self.stdout.write(f"  agent config for {node.name}: {path} (same credentials, settings updated)")
                continue
            try:
                credentials = node_rotate_credentials(node=node)
            except BrokerUserError as error:  # nothing changed; say why rather than show a traceback
                raise CommandError(f"No agent config for {node.name}: {error}") from error
            values = {
                "NODE_NAME": node.name,
                "BROKER_URL": credentials.broker_url,
                "LEASE_SECRET": credentials.lease_secret,
                "AGENT_TOKEN": credentials.agent_token,
            }
            _write(path, _config_text(values, options["portal_url"], simulated))
            self.stdout.write(f"  agent config for {node.name}: {path}")

    def _shared_folder(self, path: Path) -> None:
        """``path`` as a 0755 folder of ours: made when missing, its mode repaired when it is ours. One that is
        not ours, or not a folder, is refused: whoever owns it could swap the stand-in files (a world-writable
        parent such as /var/tmp lets anybody make it first)."""
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        except OSError as error:
            raise CommandError(f"cannot create {path}: {error.strerror}; choose another --device-root") from error
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise CommandError(f"{path} is not a folder (a link?): remove it, or choose another --device-root")
        if info.st_uid != os.geteuid():
            raise CommandError(
                f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}): anyone who owns it "
                "could replace the stand-in device files. Remove it, or choose another --device-root"
            )
        if stat.S_IMODE(info.st_mode) != 0o755:
            # Group- or world-writable lets others swap the files; closed keeps the demo users out of theirs.
            os.chmod(path, 0o755)  # noqa: S103 - the demo users must reach the files their ACLs open
            self.stdout.write(f"  {path}: mode {stat.S_IMODE(info.st_mode):04o} repaired to 0755")

    def _reachable(self, path: Path) -> None:
        """Every folder above the device root must let others through, or the demo users' jobs never reach
        their files (a checkout under /root, for one, does not)."""
        closed = closed_to_others(str(path))
        if closed is None:
            return
        folder, error, mode = closed
        if error is not None:
            raise CommandError(f"cannot use --device-root under {path}: {folder}: {error.strerror}") from error
        raise CommandError(
            f"--device-root must be where every user can reach it: {folder} is closed to others "
            f"(mode {stat.S_IMODE(mode):04o}). Choose one under /var/tmp or /run"
        )


def _simulated_lines(node: Node, cards: list[Gpu], *, home: Path, device_dir: Path, options: dict[str, Any]) -> str:
    # One model for the node (SIMULATED_* apply to all its cards): the most common, as a demo node has one.
    model, memory = Counter((card.model, card.memory_mib) for card in cards).most_common(1)[0][0]
    # A config line: one line of printable text, whatever an admin typed into the model field.
    model = "".join(ch for ch in " ".join(model.split()) if ch.isprintable())[:MAX_MODEL_CHARS] or "Simulated GPU"
    layout = simulated_layout(node)
    mig = f"SIMULATED_MIG={layout}\n" if layout else ""  # the demo's MIG card (demo_lab made its slices)
    return (
        f"BACKEND=simulated\nSIMULATED_GPUS={len(cards)}\n{mig}"
        f"SIMULATED_MODEL={model}\nSIMULATED_MEMORY_MIB={memory}\nSIMULATED_POWER_W={power_limit(model):g}\n"
        f"STATE_DIR={home / 'state'}\nDEVICE_DIR={device_dir}\n"
        f"GRACE_SECONDS={options['grace_seconds']}\n"
        # A demo agent runs a booking's environments as its own children, never as units of this machine's systemd.
        "LAUNCH_RUNNER=supervisor\n"
    )


def _config_text(credentials: dict[str, str], portal_url: str, simulated: str) -> str:
    # The demo portal answers on plain http: the agents accept that only when told (gpubook_agent/config.py).
    insecure = "ALLOW_INSECURE_PORTAL=true\n" if portal_url.startswith("http://") else ""
    return (
        f"NODE_NAME={credentials['NODE_NAME']}\n"
        f"BROKER_URL={credentials['BROKER_URL']}\n"
        f"PORTAL_URL={portal_url}\n"
        f"LEASE_SECRET={credentials['LEASE_SECRET']}\n"
        f"AGENT_TOKEN={credentials['AGENT_TOKEN']}\n" + insecure + simulated
    )


def _write(path: Path, text: str) -> None:
    """The config holds the node's token and secret: readable by its owner only."""
    path.touch(mode=0o600)
    os.chmod(path, 0o600)
    path.write_text(text)


def _still_valid(path: Path, node: Node) -> dict[str, str] | None:
    """The config's credentials when they still work for ``node``, else None (fresh ones are issued)."""
    try:
        values = read_config_file(path)
        config_from_values(values)  # one the agent would refuse (an older demo's: http, no ALLOW_INSECURE_PORTAL)
    except ConfigError:
        return None
    token = values.get("AGENT_TOKEN", "")
    valid = (
        bool(token)
        and values.get("NODE_NAME") == node.name
        and values.get("LEASE_SECRET") == node.lease_secret
        and hash_token(token) == node.agent_token_hash
        # The node's own broker user (or, with NODE_BROKER_USERS off, the shared URL) as it is now.
        and broker_url_still_valid(node, values.get("BROKER_URL", ""))
    )
    return {key: values[key] for key in CREDENTIALS} if valid else None
