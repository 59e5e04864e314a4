"""Live GPU status over websockets: fan-out latency to many clients, and telemetry ingest.

What it measures
    A lab of 8 nodes x 8 GPUs, each node with its agent token. daphne (``portal.asgi``, DEBUG=0,
    started by bench/_server.py) serves the portal with the Redis channel layer; one process, as the
    demo runs it, or with ``--web-processes N`` gunicorn with N uvicorn workers, as production does.
    Telemetry is queued and stored by ``manage.py consume_telemetry``, started beside it, as
    production does (``--ingest inline``: stored by the web process in the request). ``--clients``
    (default 500) websocket clients, asyncio tasks of this process, each connect with an API token and
    subscribe to "status", as a status page does.

    1. Fan-out: ``--reports`` times (default 40), one node's agent POSTs a telemetry report of its
       8 GPUs to /api/v1/agent/telemetry/ over HTTP, carrying a marker value; every client notes
       when the node update with that marker reaches it. Reported: from the start of the POST to
       the *last* client receiving it (the figure the issue asks for), p50/p99 over the reports;
       the same for every single delivery; and the POST's own latency. Reports go one at a time,
       ``--interval`` apart (default 0.6 s, longer than the server's telemetry batching interval,
       LIVE_TELEMETRY_BATCH_MS, so each goes out alone; a real node reports every 5 s). With ``--load R``
       the other 7 agents send R reports a second between them meanwhile (the fleet's steady ingest: 200
       for 1,000 nodes x 8 GPUs every 5 s), so the timed reports share the batches with theirs.
    2. Ingest: 8 agent threads (one per node, one keep-alive connection each) POST 8-GPU reports
       back to back for ``--seconds`` (default 10), first with no websocket client connected, then
       with all of them connected and reading. Reported: GPU samples stored per second (until the last
       queued report is stored), the messages the clients received per second, POST latency, and where
       the CPU went (bench/cpu.py).

How to run it
    It needs PostgreSQL (a database whose name contains "bench"; its nodes named live-bench-*
    are replaced each run) and Redis at REDIS_URL (default redis://127.0.0.1:6379/0).

        DATABASE_URL=postgres://portal:portal@127.0.0.1:5432/portal_bench_live .venv/bin/python bench/live.py
        ... bench/live.py --clients 500 --reports 40 --seconds 10
        DB_POOL_MAX_SIZE=8 ... bench/live.py --web-processes 2 --load 200   # as docker-compose runs it
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.* and the portal

from bench import cpu
from bench._server import HOST, Client, serving
from bench.benchdb import REPO_ROOT, create_lab, open_database, percentile_ms
from gpubook_agent import protocol

NODES = 8
GPUS_PER_NODE = 8
NODE_PREFIX = "live-bench-"
USERNAME = "live-bench-watcher"
CONNECT_BATCH = 50


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=500, help="websocket clients (default 500)")
    parser.add_argument("--reports", type=int, default=40, help="reports timed for fan-out (default 40)")
    parser.add_argument("--interval", type=float, default=0.6, help="seconds between timed reports (default 0.6)")
    parser.add_argument(
        "--load",
        type=float,
        default=0.0,
        help="while timing the fan-out, the other agents send this many reports a second between them (default 0)",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each ingest run (default 10)")
    parser.add_argument(
        "--ingest",
        choices=("queue", "inline"),
        default="queue",
        help="TELEMETRY_INGEST: queued for an ingest process (default, as production) or stored by the web process",
    )
    parser.add_argument(
        "--web-processes", type=int, default=0, help="gunicorn with this many uvicorn workers (default: one daphne)"
    )
    return parser.parse_args(argv)


# --- the lab ----------------------------------------------------------------------------------


def create_fleet() -> tuple[list[tuple[str, str, list[str]]], str]:
    """The nodes (name, agent token, GPU UUIDs), and an API token for the clients."""
    from django.contrib.auth import get_user_model

    from accounts.services import api_token_create
    from nodes.models import Gpu, Node
    from nodes.services import node_rotate_credentials

    Node.objects.filter(name__startswith=NODE_PREFIX).delete()
    names = [f"{NODE_PREFIX}{n}" for n in range(NODES)]
    create_lab(names, GPUS_PER_NODE, [("NVIDIA H100 80GB HBM3", 81559)], uuid_tag="lv")
    fleet = []
    for node in Node.objects.filter(name__in=names).order_by("name"):
        token = node_rotate_credentials(node=node).agent_token
        uuids = list(Gpu.objects.filter(node=node).order_by("index").values_list("uuid", flat=True))
        fleet.append((node.name, token, uuids))
    user, _ = get_user_model().objects.get_or_create(username=USERNAME, defaults={"unix_username": "watcher"})
    return fleet, api_token_create(user=user, name="bench/live.py")[1]


def report(uuids: list[str], marker: float | None = None) -> bytes:
    samples = [
        {
            "uuid": uuid,
            "utilization_pct": 50 + i,
            "memory_used_mib": 40000 + i,
            "memory_total_mib": 81559,
            "temperature_c": 60 + i,
            "power_w": marker if (marker is not None and i == 0) else 300.0 + i,
            "processes": [{"pid": 1000 + i, "user": "watcher", "used_memory_mib": 39000}],
        }
        for i, uuid in enumerate(uuids)
    ]
    return json.dumps(protocol.telemetry(samples)).encode()


class Agent:
    """One node's agent: a keep-alive HTTP connection with its token, posting reports."""

    def __init__(self, port: int, token: str, uuids: list[str]) -> None:
        self.client, self.uuids = Client(port, token), uuids

    def post(self, path: str, body: bytes) -> float:
        started = time.perf_counter()
        status, answer = self.client.send("POST", path, body)
        if status != 200:
            raise RuntimeError(f"{path} answered {status}: {answer[:300]!r}")
        return time.perf_counter() - started

    def heartbeat(self) -> None:
        body = protocol.heartbeat(backend="simulated", driver_version=None, applied_version=0, acls={})
        self.post(protocol.agent_path(protocol.HEARTBEAT), json.dumps(body).encode())

    def telemetry(self, marker: float | None = None) -> float:
        return self.post(protocol.agent_path(protocol.TELEMETRY), report(self.uuids, marker))


# --- the clients ------------------------------------------------------------------------------


class Clients:
    """Websocket clients subscribed to "status"; they note when each marker reaches them."""

    def __init__(self, port: int, token: str) -> None:
        self.url = f"ws://{HOST}:{port}/ws/live/"
        self.token = token
        self.arrivals: dict[str, list[float]] = {}  # marker text -> arrival times
        self.watching: list[str] = []
        self.received = 0
        self.tasks: list[asyncio.Task[None]] = []

    async def connect(self, count: int) -> float:
        started = time.perf_counter()
        for first in range(0, count, CONNECT_BATCH):
            ready = [asyncio.get_running_loop().create_future() for _ in range(min(CONNECT_BATCH, count - first))]
            self.tasks += [asyncio.create_task(self._client(future)) for future in ready]
            await asyncio.gather(*ready)
        return time.perf_counter() - started

    async def _client(self, ready: asyncio.Future[None]) -> None:
        from websockets.asyncio.client import connect

        headers = {"Authorization": f"Bearer {self.token}"}
        async with connect(self.url, additional_headers=headers, max_size=None, open_timeout=60) as socket:
            await socket.send(json.dumps({"subscribe": ["status"]}))
            async for text in socket:
                if not ready.done():
                    if '"type":"subscribed"' in text:
                        ready.set_result(None)
                    continue
                self.received += 1
                now = time.time()
                for marker in self.watching:
                    if marker in text:
                        self.arrivals[marker].append(now)

    def watch(self, marker: str) -> None:
        self.arrivals[marker] = []
        self.watching = [marker]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


# --- the runs ---------------------------------------------------------------------------------


async def fan_out(clients: Clients, agents: list[Agent], args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    last_client, deliveries, posts, missing = [], [], [], 0
    timed, others = agents[0], agents[1:]
    stop = threading.Event()
    background = [
        threading.Thread(target=paced, args=(agent, args.load / len(others), stop)) for agent in others if args.load
    ]
    for thread in background:
        thread.start()
    for r in range(args.reports):
        marker = 1000.0 + r + 0.25
        text = f'"power_w":{marker}'
        clients.watch(text)
        sent = time.time()
        posts.append(await loop.run_in_executor(None, timed.telemetry, marker))
        deadline = time.monotonic() + 15
        while len(clients.arrivals[text]) < args.clients and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        arrivals = clients.arrivals[text]
        missing += args.clients - len(arrivals)
        if arrivals:
            last_client.append(max(arrivals) - sent)
            deliveries += [at - sent for at in arrivals]
        await asyncio.sleep(args.interval)
    stop.set()
    for thread in background:
        thread.join()
    load = f", {args.load:.0f} other reports a second meanwhile" if args.load else ""
    what = f"{args.clients} websocket clients ({args.reports} reports{load})"
    print(f"\n1. fan-out of one 8-GPU telemetry report to {what}")
    for label, figures in (("report -> last client:", last_client), ("report -> each client:", deliveries)):
        print(f"   {label:<24} p50 {percentile_ms(figures, 50):7.1f} ms   p99 {percentile_ms(figures, 99):7.1f} ms")
    posts_p50, posts_p99 = percentile_ms(posts, 50), percentile_ms(posts, 99)
    print(f"   {'the POST itself:':<24} p50 {posts_p50:7.1f} ms   p99 {posts_p99:7.1f} ms")
    print(f"   deliveries missing after 15 s: {missing} of {args.clients * args.reports}")


def paced(agent: Agent, rate: float, stop: threading.Event) -> None:
    """Post reports at ``rate`` a second until ``stop`` (behind schedule: as fast as the server answers)."""
    due = time.perf_counter()
    while not stop.is_set():
        agent.telemetry()
        due += 1 / rate
        stop.wait(max(0.0, due - time.perf_counter()))


def ingest(agents: list[Agent], seconds: float) -> tuple[int, list[float], float]:
    """Every agent posts back to back for ``seconds``, and (queued) the ingest process stores the last of
    them; (reports, latencies, elapsed until all were stored). The CPU split of the run is printed."""
    before = cpu.snapshot()
    reports, latencies, posting = post_for(agents, seconds)
    drained = wait_until_stored()
    elapsed = posting + drained
    cpu.print_split(cpu.since(before), elapsed)
    if drained > 0.05:
        print(f"   (the last reports were stored {drained:.2f} s after the last POST)")
    return reports, latencies, elapsed


def wait_until_stored() -> float:
    """Seconds until the telemetry queue is empty (0 when the web process stores reports itself)."""
    from nodes.telemetry_queue import telemetry_backlog

    started = time.perf_counter()
    while os.environ["TELEMETRY_INGEST"] == "queue" and telemetry_backlog():
        if time.perf_counter() - started > 120:
            raise RuntimeError(f"{telemetry_backlog()} reports still queued after 120 s: is the ingest process up?")
        time.sleep(0.01)
    return time.perf_counter() - started


def post_for(agents: list[Agent], seconds: float) -> tuple[int, list[float], float]:
    """Every agent posts back to back for ``seconds``; (reports, latencies, elapsed)."""
    latencies: list[float] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def run(agent: Agent) -> None:
        mine = []
        while time.perf_counter() < stop_at:
            mine.append(agent.telemetry())
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run, args=(agent,)) for agent in agents]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(latencies), latencies, time.perf_counter() - started


def print_ingest(label: str, reports: int, latencies: list[float], elapsed: float, received: int | None) -> None:
    samples = reports * GPUS_PER_NODE
    line = (
        f"   {label:<24} {samples / elapsed:7.0f} GPU samples/s stored ({reports / elapsed:5.0f} reports/s)"
        f"   POST p50 {percentile_ms(latencies, 50):6.1f} ms  p99 {percentile_ms(latencies, 99):6.1f} ms"
    )
    if received is not None:
        line += f"   clients received {received / elapsed:7.0f} messages/s"
    print(line)


async def main_async(args: argparse.Namespace, port: int, fleet: list[tuple[str, str, list[str]]], token: str) -> None:
    agents = [Agent(port, agent_token, uuids) for _name, agent_token, uuids in fleet]
    for agent in agents:
        agent.heartbeat()
    loop = asyncio.get_running_loop()

    print(f"\n2. telemetry ingest, {NODES} agents posting 8-GPU reports back to back for {args.seconds:.0f} s")
    reports, latencies, elapsed = await loop.run_in_executor(None, ingest, agents, args.seconds)
    print_ingest("no websocket client:", reports, latencies, elapsed, None)

    clients = Clients(port, token)
    took = await clients.connect(args.clients)
    print(f"\n   ({args.clients} websocket clients connected and subscribed in {took:.1f} s)")
    before = clients.received
    reports, latencies, elapsed = await loop.run_in_executor(None, ingest, agents, args.seconds)
    await asyncio.sleep(1)
    print_ingest(f"{args.clients} clients reading:", reports, latencies, elapsed, clients.received - before)

    await asyncio.sleep(2)  # let the backlog drain before timing single reports
    await fan_out(clients, agents, args)
    await clients.close()


@contextmanager
def ingest_process(url: str, kind: str) -> Iterator[None]:
    """``manage.py consume_telemetry`` on ``url``'s database while the block runs (queued ingest only)."""
    if kind != "queue":
        yield
        return
    env = os.environ | {"DATABASE_URL": url, "DEBUG": "0", "DJANGO_SETTINGS_MODULE": "portal.settings"}
    process = subprocess.Popen(
        [sys.executable, "manage.py", "consume_telemetry"], cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL
    )
    try:
        yield
    finally:
        process.terminate()
        process.wait(30)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ["TELEMETRY_INGEST"] = args.ingest
    url = open_database("bench/live.py", "portal_bench_live")
    fleet, token = create_fleet()
    from kernel.redis_client import redis_client
    from nodes.telemetry_queue import STREAM

    redis_client().delete(STREAM)  # an earlier run's leftovers are not this run's work
    web = f"gunicorn with {args.web_processes} uvicorn workers" if args.web_processes else "one daphne process"
    ingesting = "queued for one ingest process" if args.ingest == "queue" else "stored by the web process"
    print(f"lab: {NODES} nodes x {GPUS_PER_NODE} GPUs; {web}; telemetry {ingesting}; {os.cpu_count()} CPUs")
    with serving(url, processes=args.web_processes) as (port, _log), ingest_process(url, args.ingest):
        asyncio.run(main_async(args, port, fleet, token))


if __name__ == "__main__":
    main()
