"""CPU time of a server's process tree, split by part: the server process itself, engine replicas, and Ray's own
processes (its daemons, controller and workers), read from /proc. `bench.serve_replicas` uses it for Ray's cost per
request and for the CPU each arm spends per token streamed."""

from __future__ import annotations

import os
from pathlib import Path


def _processes() -> tuple[dict[int, list[int]], dict[int, int]]:
    """(children of each pid, clock ticks each has spent), read from /proc."""
    children: dict[int, list[int]] = {}
    spent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
            spent[int(entry)] = int(fields[11]) + int(fields[12])
    return children, spent


def _role(pid: int, root: int) -> str:
    """Which part of a server's process tree `pid` is: the server process itself ("door" for the replicas' door),
    an engine replica, or one of Ray's own processes (its daemons, controller, workers)."""
    if pid == root:
        return "server"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return "ray"
    return "replicas" if b"ServeReplica" in cmdline else "ray"


def tree_cpu(pid: int, by_role: bool = False) -> float | dict[str, float]:
    """CPU seconds (user + system) the live processes of `pid`'s tree have spent, `pid` included; `by_role`: split
    by `_role`."""
    children, spent = _processes()
    out: dict[str, float] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        role = _role(p, pid) if by_role else "all"
        out[role] = out.get(role, 0.0) + spent.get(p, 0) / os.sysconf("SC_CLK_TCK")
        todo += children.get(p, [])
    return out if by_role else out.get("all", 0.0)


def cpu_of(procs: list, before: list[dict[str, float]] | None = None) -> list[dict[str, float]]:
    """Each of `procs`' tree CPU by role; with `before` (an earlier answer), what was spent since."""
    now = [tree_cpu(p.pid, by_role=True) for p in procs]
    if before is None:
        return now
    return [{k: v - b.get(k, 0.0) for k, v in n.items()} for n, b in zip(now, before)]


def cpu_per_token(rows: list[dict], clients: int, arms: tuple[str, ...]) -> str:
    """Per arm, the CPU milliseconds each part of its processes spent per token streamed, over its batches at
    `clients` (the server itself, and for the replicas the door, the replicas and Ray's own processes)."""
    out = []
    for name in arms:
        sel = [r for r in rows if r["clients"] == clients and r["server"] == name]
        tokens = sum(r["tokens"] for r in sel)
        roles: dict[str, float] = {}
        for r in sel:
            for role, seconds in r["cpu_s"].items():
                roles[role] = roles.get(role, 0.0) + seconds
        label = {"server": "door" if name == "replicas" else "engine"}
        parts = ", ".join(f"{label.get(k, k)} {1000 * v / tokens:.2f}" for k, v in sorted(roles.items()))
        out.append(f"{name}: {parts} (all {1000 * sum(roles.values()) / tokens:.2f})")
    return "; ".join(out)
