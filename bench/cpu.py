"""Where the CPU goes during a benchmark: seconds of CPU per part of the portal host, from /proc.

    before = cpu.snapshot()
    ... the run ...
    cpu.print_split(cpu.since(before), seconds)

Parts: this benchmark process (its clients), the web server and the ingest process (children of this
process, told apart by their command line), PostgreSQL and Redis (every process of theirs on the
machine). Linux only; elsewhere the split is empty.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PARTS = ("web", "ingest", "postgresql", "redis", "bench clients")


def process_seconds(pid: int) -> float | None:
    """CPU seconds one process of this machine has used so far (None: gone, or not ours to read)."""
    try:
        return _parent_and_seconds((Path("/proc") / str(pid) / "stat").read_text())[1]
    except OSError:
        return None


def _parent_and_seconds(stat: str) -> tuple[int, float]:
    """A /proc/<pid>/stat line's parent pid, and its user + system CPU seconds."""
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def _processes() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command line, CPU seconds so far)."""
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parent, seconds = _parent_and_seconds(stat)
        found[int(entry.name)] = (parent, command, seconds)
    return found


def _part(pid: int, processes: dict[int, tuple[int, str, float]]) -> str | None:
    parent, command, _ = processes[pid]
    if pid == os.getpid():
        return "bench clients"
    if "postgres" in command.split(" ", 1)[0] or command.startswith("postgres:"):
        return "postgresql"
    if "redis-server" in command:
        return "redis"
    ancestors = []
    while parent in processes and parent != 1:
        ancestors.append(parent)
        parent = processes[parent][0]
    if os.getpid() not in ancestors:
        return None
    return "ingest" if "consume_telemetry" in command else "web"


def snapshot() -> dict[int, tuple[str, float]]:
    processes = _processes()
    taken = {}
    for pid in processes:
        part = _part(pid, processes)
        if part is not None:
            taken[pid] = (part, processes[pid][2])
    return taken


def since(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per part since ``before`` (processes started meanwhile count from zero)."""
    spent = dict.fromkeys(PARTS, 0.0)
    for pid, (part, seconds) in snapshot().items():
        spent[part] += seconds - before.get(pid, (part, 0.0))[1]
    return spent


def print_split(spent: dict[str, float], seconds: float) -> None:
    cores = os.cpu_count() or 1
    parts = "  ".join(f"{part} {spent[part] / seconds:4.0%}" for part in PARTS)
    idle = max(0.0, 1 - sum(spent.values()) / seconds / cores)
    print(f"   CPU (of one core; {cores} cores): {parts}   idle {idle:.0%} of the machine")
