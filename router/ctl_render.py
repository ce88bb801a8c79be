"""What people see of the admin API's documents in routerctl: tables and fields, for every command
that shows a router, its targets, a decision or the process (--json prints the documents as they
are instead: router/ctl_output.py)."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from router.ctl_output import Fields, Renderable, Table

if TYPE_CHECKING:
    from collections.abc import Sequence

    from router.ctl_output import Blocks

__all__ = [
    "decisions_blocks",
    "duration",
    "field",
    "items",
    "router_blocks",
    "status_blocks",
    "targets_table",
]


def field(document: object, name: str) -> object:
    return document.get(name) if isinstance(document, dict) else None


def items(document: object, name: str) -> list[object]:
    """A list field of a document ([] when it has none)."""
    value = field(document, name)
    return value if isinstance(value, list) else []


def duration(seconds: object) -> str:
    """12.3 s, 4m05s, 3h02m, 2d03h."""
    if not isinstance(seconds, (int, float)):
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


def _of(used: object, total: object) -> str:
    return f"{_text_of(used)} of {_text_of(total)}"


def _text_of(value: object) -> str:
    return "unlimited" if value is None else str(value)


def decisions_blocks(decisions: list[object]) -> list[Renderable]:
    table = Table(["key", "status", "node_id", "connector"])
    for d in decisions:
        node_id = field(d, "node_id")
        if node_id not in (None, "local") and field(d, "local"):
            node_id = f"{node_id} (local)"
        table.add(field(d, "key"), field(d, "status"), node_id, field(d, "connector"))
    return [table]


def targets_table(targets: Sequence[object], now: datetime.datetime | None = None) -> Table:
    """One line per target: its state, whether it takes new clients, its last check (how long
    ago, how long it took) and last change, and why it is not ready (as HAProxy's `show stat` puts
    the check status on the server's line). `now`: the time ages are counted to (default: now)."""
    now = datetime.datetime.now(datetime.UTC) if now is None else now
    table = Table(
        [
            "node_id",
            "state",
            "admin_state",
            "open",
            "connections",
            "checked",
            "changed",
            "connector",
            "reason",
        ]
    )
    for t in targets:
        if field(t, "in_pool") is False:
            table.add(
                field(t, "node_id"), "absent", field(t, "admin_state"), None, None, None, None, None, None
            )
            continue
        ejected = field(t, "operational_state") == "ejected"  # ready, but passive health took it out
        check = field(t, "last_check")
        checked = _ago(field(check, "at"), now)
        if checked is not None and isinstance(took := field(check, "duration_s"), (int, float)):
            checked += f" ({took * 1000:.1f} ms)"
        table.add(
            field(t, "node_id"),
            "ejected" if ejected else field(t, "state"),
            field(t, "admin_state"),
            None if field(t, "open") is None else ("yes" if field(t, "open") else "no"),
            field(t, "connections"),
            checked,
            _ago(field(t, "last_change"), now),
            field(t, "connector"),
            field(t, "not_ready_reason"),
        )
    return table


def _ago(at: object, now: datetime.datetime) -> str | None:
    """ "4m05s ago" for an RFC 3339 time; None when there is none (or it is not one)."""
    if not isinstance(at, str):
        return None
    try:
        then = datetime.datetime.fromisoformat(at)
    except ValueError:
        return None
    return f"{duration(max(0.0, (now - then).total_seconds()))} ago"


def router_blocks(router: object, features: Sequence[Blocks] = ()) -> list[Renderable]:
    """A router's document: its fields, its targets (and an HA pair's members), then the blocks
    `features` add (the features' `router_blocks`, `Ctl.router_blocks`) when it has a pool."""
    pool = field(router, "pool")
    fields = Fields()
    for name in ("name", "key_type", "key_filter", "local_target_filter", "policy", "cache_entries"):
        fields.add(name.replace("_", " "), field(router, name))
    if not isinstance(pool, dict):
        fields.add("pool", None)
        return [fields]
    fields.add("pool", f"{pool.get('kind')}, quorum {pool.get('quorum_size')}")
    fields.add("pool state", "active" if pool.get("active") else "inactive")
    why = pool.get("not_accepting_reason")
    fields.add("new clients", "accepted" if why is None else f"refused: {why}")
    targets = pool.get("targets", [])
    blocks: list[Renderable] = [fields, targets_table(targets)]
    members = Table(["member_of", "connector", "state", "active"])
    for t in targets:
        for m in t.get("members", ()):
            members.add(t.get("node_id"), m.get("connector"), m.get("state"), m.get("active"))
    if members.rows:
        blocks.append(members)
    for feature_blocks in features:
        blocks += feature_blocks(router)
    return blocks


def status_blocks(document: object) -> list[Renderable]:
    process = field(document, "process")
    descriptors = field(process, "descriptors")
    clients = field(process, "client_connections")
    fields = Fields()
    fields.add("pid", field(process, "pid"))
    fields.add("version", field(process, "version"))
    fields.add("uptime", duration(field(process, "uptime_s")))
    fields.add("descriptors", _of(field(descriptors, "open"), field(descriptors, "limit")))
    fields.add("client connections", _of(field(clients, "open"), field(clients, "budget")))
    state_file = field(document, "state_file")
    if state_file is not None:
        path, error = field(state_file, "path"), field(state_file, "error")
        if field(state_file, "persisted"):
            fields.add("state file", f"{path} (drain/maint states kept)")
        else:
            why = "a write is under way" if error is None else f"{error}; retried"
            lost = "a restart would lose drain/maint states"
            fields.add("state file", f"{path}: NOT PERSISTED, {lost} ({why})")
    workers = items(document, "workers")
    if workers:  # routerd --workers N: the rest of this document is the supervisor's own
        pids = [str(field(w, "pid")) for w in workers if field(w, "pid") is not None]
        restarts = sum(int(str(field(w, "restarts") or 0)) for w in workers)
        fields.add(
            "workers",
            f"{len(pids)} of {len(workers)} running (pid {', '.join(pids) or '-'}), {restarts} restart(s); "
            "connections below are this process's",
        )
    acceptors = Table(["acceptor", "router", "address", "mode", "path", "open", "pending", "limit"])
    for a in items(document, "acceptors"):
        host = str(field(a, "host"))
        address = f"[{host}]:{field(a, 'port')}" if ":" in host else f"{host}:{field(a, 'port')}"
        acceptors.add(
            field(a, "name"),
            field(a, "router"),
            address,
            field(a, "mode"),
            field(a, "data_path"),
            field(a, "open"),
            field(a, "pending"),
            field(a, "connections_allowed"),
        )
    routers = Table(["router", "key_type", "policy", "pool", "ready", "open", "cache"])
    for r in items(document, "routers"):
        pool = field(r, "pool")
        targets = items(pool, "targets")
        ready = sum(field(t, "state") == "ready" for t in targets)
        routers.add(
            field(r, "name"),
            field(r, "key_type"),
            field(r, "policy"),
            None if pool is None else ("active" if field(pool, "active") else "inactive"),
            None if pool is None else f"{ready}/{len(targets)}",
            None if pool is None else f"{sum(bool(field(t, 'open')) for t in targets)}/{len(targets)}",
            field(r, "cache_entries"),
        )
    blocks: list[Renderable] = [fields, acceptors, routers]
    sessions = items(document, "zookeeper")
    if sessions:  # only where a router uses ZooKeeper
        zookeeper = Table(["router", "zookeeper", "state", "since", "at"])
        for z in sessions:
            at = f"{field(z, 'connect')}{field(z, 'path')}"
            zookeeper.add(field(z, "router"), field(z, "use"), field(z, "state"), field(z, "since"), at)
        blocks.append(zookeeper)
    return blocks
