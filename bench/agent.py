"""The node agent: how late slot boundaries are enforced, and what a telemetry sample costs.

What it measures
    Boundary delay. The real enforcer (its boundary timer, its reconcile every 5 s, its cleaner
    thread) runs in this process on 8 simulated GPUs whose stand-in device files live in a
    temporary directory. It is given one signed snapshot of 100 leases for throw-away users:
    back-to-back and gapped slots of 0.4-1.2 s on every GPU, starting 2 s after the snapshot.
    Each grant and revoke is reported with the lease boundary behind it and the time setfacl
    returned; the delay is the difference. 100 leases make 200 boundaries (hand-overs included:
    one slot's end and the next one's start on the same GPU, revoke first).

    With ``--mig-cards K`` the first K cards are in MIG mode (3g.40gb, 2g.20gb, 2g.20gb each) and
    their leases mix both levels: two rounds of three slice leases side by side (one per slice,
    each a different user), then one lease of the whole card, and so on. A slice's grant is three
    files (the card's device file, shared, and two capability files); a card's is seven. A lease's
    boundary counts as enforced when the last of its units (a card and its slices) is, so the
    figures stay per lease boundary.

    Telemetry cost. CPU time (user + system, of this process) per telemetry sample of the 8
    GPUs, as the agent builds it for the portal: backend sample (one /proc scan for the holders
    of the device files), process owners resolved. 8 real processes hold device files during it.

How to run it
    As root (it creates 4 throw-away users for the ACLs, and removes them), with the acl package:

        .venv/bin/python bench/agent.py
        .venv/bin/python bench/agent.py --leases 100 --gpus 8 --samples 500
        .venv/bin/python bench/agent.py --mig-cards 4      # half the cards split, card and slice leases

    Nothing else is needed: no database, broker or portal.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.* and the portal

from bench.benchdb import percentile_ms
from gpubook_agent.config import config_from_values
from gpubook_agent.enforcer import Enforcer
from gpubook_agent.gpus import open_configured_backend
from gpubook_agent.main import telemetry_body
from gpubook_agent.signing import signed
from gpubook_agent.store import SnapshotStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leases", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--mig-cards", type=int, default=0, help="cards in MIG mode, with card and slice leases")
    args = parser.parse_args()
    if not 0 <= args.mig_cards <= args.gpus:
        parser.error("--mig-cards must be between 0 and --gpus")
    if os.geteuid() != 0:
        sys.exit("bench/agent.py needs root: it creates throw-away users and sets ACLs for them")

    home = Path(tempfile.mkdtemp(prefix="gpubook-bench-agent-"))
    users = [f"gpbb_{secrets.token_hex(3)}" for _ in range(4)]
    try:
        for user in users:
            subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", user], check=True)  # noqa: S603, S607
        boundary_delays(home, users, args.leases, args.gpus, args.mig_cards)
        telemetry_cost(home, args.gpus, args.samples, args.mig_cards)
    finally:
        for user in users:
            subprocess.run(["userdel", user], check=False, capture_output=True)  # noqa: S603, S607
        shutil.rmtree(home, ignore_errors=True)


MIG_LAYOUT = ("3g.40gb", "2g.20gb", "2g.20gb")


def _enforcer(home: Path, gpus: int, report, mig_cards: int = 0) -> tuple[Enforcer, object, str]:
    secret = secrets.token_hex(32)
    layout = ";".join(f"{index}:{','.join(MIG_LAYOUT)}" for index in range(mig_cards))
    config = config_from_values(
        {
            "NODE_NAME": "bench-node",
            "BROKER_URL": "redis://127.0.0.1:1/0",
            "PORTAL_URL": "https://127.0.0.1:1",  # never contacted here
            "AGENT_TOKEN": "gpn_bench",
            "LEASE_SECRET": secret,
            "BACKEND": "simulated",
            "SIMULATED_GPUS": str(gpus),
            "SIMULATED_MEMORY_MIB": "81920",
            "SIMULATED_MIG": layout,
            "STATE_DIR": str(home / "state"),
        }
    )
    backend = open_configured_backend(config)
    return (
        Enforcer(config=config, backend=backend, store=SnapshotStore(config.state_dir), report=report),
        backend,
        secret,
    )


def boundary_delays(home: Path, users: list[str], lease_count: int, gpu_count: int, mig_cards: int = 0) -> None:
    events: list[tuple[str, dict, datetime]] = []

    def report(kind: str, **fields: object) -> None:  # called right after setfacl returns
        events.append((kind, fields, datetime.now(UTC)))

    enforcer, backend, secret = _enforcer(home, gpu_count, report, mig_cards)
    uuids = [gpu.uuid for gpu in backend.gpus()]
    slices = {card.uuid: [item.uuid for item in card.slices] for card in backend.mig_cards()}
    origin = datetime.now(UTC) + timedelta(seconds=2)
    cursor = {uuid: origin + timedelta(milliseconds=37 * i) for i, uuid in enumerate(uuids)}
    rounds = dict.fromkeys(uuids, 0)
    leases: list[dict] = []
    number = 0
    while len(leases) < lease_count:
        uuid = uuids[number % gpu_count]
        start = cursor[uuid] + (timedelta(0) if number % 3 else timedelta(milliseconds=250))  # some gaps
        end = start + timedelta(milliseconds=400 + (number * 53) % 800)
        cursor[uuid] = end
        user = users[(number // gpu_count) % len(users)]  # the next slot on a GPU is someone else's
        cycle, turn = divmod(rounds[uuid], 3)
        if uuid in slices and turn < 2:  # two rounds of slices, then the whole card
            # Four users, three slices: each slice goes to someone else than the round before, the card to the
            # one who had none of its slices, and its slices after it to the other three, so that every lease
            # boundary changes an ACL (a user keeping a unit across a boundary would change none).
            for offset, item in enumerate(slices[uuid][: lease_count - len(leases)]):
                lane_user = users[(cycle + turn + offset) % len(users)]
                leases.append(_lease(len(leases) + 1, lane_user, [item], start, end))
        elif uuid in slices:
            leases.append(_lease(len(leases) + 1, users[cycle % len(users)], [uuid], start, end))
        else:
            leases.append(_lease(len(leases) + 1, user, [uuid], start, end))
        rounds[uuid] += 1
        number += 1
    snapshot = signed(
        {"node": "bench-node", "version": 1, "issued_at": datetime.now(UTC).isoformat(), "leases": leases}, secret
    )
    enforcer.startup()
    enforcer.start()
    assert enforcer.offer(snapshot) == "applied"
    last_end = max(cursor.values())
    time.sleep(max(0.0, (last_end - datetime.now(UTC)).total_seconds()) + 1.0)
    enforcer.stop()
    backend.close()

    # A lease's boundary is enforced when the last of its units is (a card in MIG mode is the card and its slices).
    done: dict[tuple[str, int], tuple[datetime, datetime]] = {}
    for kind, fields, at in events:
        if kind in ("granted", "revoked") and "boundary" in fields:
            key = (kind, int(fields["reservation"]))
            boundary = datetime.fromisoformat(str(fields["boundary"]))
            done[key] = (boundary, max(at, done[key][1]) if key in done else at)
    delays: dict[str, list[timedelta]] = {"granted": [], "revoked": []}
    for (kind, _), (boundary, at) in done.items():
        delays[kind].append(at - boundary)
    every = [d.total_seconds() for d in delays["granted"] + delays["revoked"]]
    slice_leases = sum(1 for lease in leases if lease["gpus"][0].startswith("MIG-"))
    mix = f", {slice_leases} of them on MIG slices ({mig_cards} MIG cards)" if mig_cards else ""
    print(f"boundary -> ACL change, {len(leases)} leases on {gpu_count} simulated GPUs{mix} ({len(every)} boundaries)")
    for kind, values in delays.items():
        seconds = [d.total_seconds() for d in values]
        print(
            f"  {kind:8} n={len(seconds):3}  p50 {percentile_ms(seconds, 50):6.2f} ms  "
            f"p99 {percentile_ms(seconds, 99):6.2f} ms  max {max(seconds) * 1000:6.2f} ms"
        )
    print(
        f"  all      n={len(every):3}  p50 {percentile_ms(every, 50):6.2f} ms  p99 {percentile_ms(every, 99):6.2f} ms"
    )
    missing = 2 * len(leases) - len(every)
    if missing:
        print(f"  WARNING: {missing} boundaries produced no ACL change event")


def _lease(reservation: int, user: str, gpus: list[str], start: datetime, end: datetime) -> dict:
    return {"reservation": reservation, "user": user, "gpus": gpus, "start": start.isoformat(), "end": end.isoformat()}


def telemetry_cost(home: Path, gpu_count: int, samples: int, mig_cards: int = 0) -> None:
    enforcer, backend, _ = _enforcer(home / "telemetry", gpu_count, lambda kind, **fields: None, mig_cards)
    holders = [
        subprocess.Popen(["sleep", "600"], stdin=open(backend.device_path(gpu.uuid), "rb"))  # noqa: S607, SIM115
        for gpu in backend.gpus()
    ]
    try:
        telemetry_body(backend, enforcer)  # warm up
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        for _ in range(samples):
            body = telemetry_body(backend, enforcer)
        cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
        busy = sum(1 for gpu in body if gpu["processes"])
        print(
            f"telemetry sample of {gpu_count} GPUs and {len(body) - gpu_count} MIG slices ({busy} busy, "
            f"{len(os.listdir('/proc'))} /proc entries)"
        )
        print(
            f"  CPU {cpu / samples * 1000:.2f} ms per sample, wall {wall / samples * 1000:.2f} ms ({samples} samples)"
        )
    finally:
        for process in holders:
            process.kill()
            process.wait()
        backend.close()


if __name__ == "__main__":
    main()
