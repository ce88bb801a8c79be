"""`routerctl simulate` on small hand-made event logs: exact results, and agreement key by key with
`routerctl route` on the new configuration (in process, and once as a real `routerctl` process).

The logs are made the way the router makes them: each client is routed by the OLD configuration's
engine and its decision and close lines are written with `json_line`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from event_format.lines import json_line
from event_format.schema import RAW_KEY_CAP, CloseRecord, DecisionRecord, timestamp
from keys import ConnectionFacts
from pipeline.cli import add_commands, run
from pipeline.generate import generate
from pipeline.simulate import (
    AFTER_COLUMNS,
    KEY_SCHEMA_FIELDS,
    Replay,
    RouterPlan,
    SimulateError,
    plan_routers,
    read_events,
    replay_one,
    simulate,
)
from router.config import load_config
from router.config.settings import EventFileFormat
from router.core.engine import RoutingEngine, build_pool
from router.ctl import main_routerctl

ROUTERCTL = Path(sys.executable).with_name("routerctl")

PARQUET = EventFileFormat.PARQUET
NODES = ("mq0", "mq1", "mq2", "mq3")
CLIENTS = [f"app{i % 5}-dev{i}" for i in range(40)]
"""40 client ids in 5 families (`app0-...` to `app4-...`), so a prefix filter merges them."""
KETAMA = ("RING", "KETAMA")


def _config(
    tmp_path: Path,
    name: str,
    *,
    nodes: tuple[str, ...] = NODES[:3],
    policy: str = "CONSISTENT_HASH",
    key_type: str = "CLIENT_ID",
    key_filter: str | None = None,
    router: str = "mqtt",
    properties: tuple[tuple[str, str], ...] = (),
) -> Path:
    """A broker.xml with one connection router over `nodes` (one connector each, port 21000+i)."""
    policy_properties = "".join(f'<property key="{k}" value="{v}"/>' for k, v in properties)
    connectors = "\n".join(
        f'<connector name="c-{n}">tcp://127.0.0.1:{21000 + i}?nodeId={n}</connector>'
        for i, n in enumerate(NODES)
    )
    refs = "\n".join(f"<connector-ref>c-{n}</connector-ref>" for n in nodes)
    filter_element = "" if key_filter is None else f"<key-filter>{key_filter}</key-filter>"
    path = tmp_path / f"{name}.xml"
    path.write_text(
        f"""<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
<connectors>{connectors}</connectors>
<acceptors><acceptor name="in">tcp://127.0.0.1:21900?router={router}</acceptor></acceptors>
<connection-routers>
  <connection-router name="{router}">
    <key-type>{key_type}</key-type>{filter_element}
    <policy name="{policy}">{policy_properties}</policy>
    <pool><static-connectors>{refs}</static-connectors></pool>
  </connection-router>
</connection-routers>
</core></configuration>
"""
    )
    return path


def _engine(config_path: Path, router: str = "mqtt", ready: set[str] | None = None) -> RoutingEngine:
    """The engine `routerctl route --ready all` builds (or only `ready`)."""
    config = load_config(config_path)
    router_config = config.router(router)
    pool, local = build_pool(config, router_config)
    assert pool is not None
    for target in pool.targets:
        pool.record_check(target.node_id, ready is None or target.node_id in ready)
    return RoutingEngine(router_config, pool, local, round_robin_start=0)


@dataclass(frozen=True)
class Client:
    raw: str
    """The raw key (client id)."""
    connections: int
    source: str


def _clients(raws: list[str]) -> list[Client]:
    return [Client(raw, 1 + i % 3, f"10.0.{i // 200}.{i % 200 + 1}") for i, raw in enumerate(raws)]


def _write_log(
    path: Path,
    old: Path,
    clients: list[Client],
    *,
    router: str = "mqtt",
    refused_last: frozenset[str] = frozenset(),
) -> dict[str, str | None]:
    """Append the event lines of `clients` routed by the old configuration's engine: per connection
    a decision line and, when OK, a close line (bytes: 100 in, 10 out). Clients in `refused_last`
    get one more connection at the end, refused (nothing ready). Returns raw -> last target."""
    engines = [_engine(old, router), _engine(old, router, ready=set())]
    lines: list[str] = []
    targets: dict[str, str | None] = {}
    seq = 0
    for client in clients:
        facts = ConnectionFacts(client_id=client.raw, source_ip=client.source)
        refused = [engines[1]] if client.raw in refused_last else []
        for engine in [engines[0]] * client.connections + refused:
            decision = engine.route(facts, 0.0)
            node = None if decision.target is None else decision.target.node_id
            targets[client.raw] = node or targets.get(client.raw)
            seq += 1
            lines.append(
                json_line(
                    DecisionRecord(
                        router_id=f"r-{router}",
                        conn=seq,
                        router=router,
                        acceptor="in",
                        seq=seq * 2,
                        ts=timestamp(1_800_000_000 + seq),
                        source=client.source,
                        protocol="mqtt",
                        key_type="CLIENT_ID",
                        raw_key=client.raw[:RAW_KEY_CAP],
                        raw_key_length=len(client.raw),
                        key=decision.key,
                        status=decision.status.value,
                        reason=decision.reason.value,
                        mode="proxy" if node else "refuse",
                        node_id=node,
                        local=False,
                        cache_hit=False,
                        latency_us=50.0,
                    )
                )
            )
            if node is None:
                continue
            lines.append(
                json_line(
                    CloseRecord(
                        router_id=f"r-{router}",
                        conn=seq,
                        router=router,
                        acceptor="in",
                        seq=seq * 2 + 1,
                        ts=timestamp(1_800_000_000 + seq + 0.5),
                        node_id=node,
                        duration_s=1.0,
                        bytes_in=100,
                        bytes_out=10,
                        reason="closed",
                    )
                )
            )
    with path.open("a") as file:
        file.write("".join(lines))
    return targets


def _keys(spark, out: Path) -> dict[str, tuple[str | None, str | None, bool | None]]:
    """raw key -> (target before, target after, moved) from the written keys table."""
    rows = spark.read.parquet(str(out / "keys")).collect()
    return {r["input"]: (r["target_before"], r["target_after"], r["moved"]) for r in rows}


def _routerctl(config: Path, *args: str, router: str = "mqtt") -> list[dict[str, object]]:
    """`routerctl route` run in process: one JSON object per decision."""
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main_routerctl(["route", "--json", "--config", str(config), "--router", router, *args]) == 0
    return [json.loads(line) for line in stdout.getvalue().splitlines()]


def _route_client(config: Path, raw: str) -> str | None:
    (decision,) = _routerctl(config, "--client-id", raw)
    node = decision["node_id"]
    assert node is None or isinstance(node, str)
    return node


def _run(spark, tmp_path: Path, new: Path, *logs: Path, **options: Any) -> tuple[dict[str, Any], Path]:
    out = tmp_path / "out"
    events = read_events(spark, [str(p) for p in logs])
    return simulate(spark, events, load_config(new), str(out), **options), out


# -- the scenarios ------------------------------------------------------------------------------


def test_simulate_adding_a_node_moves_exactly_the_keys_routerctl_moves(spark, tmp_path):
    """Scenario: mq3 joins a 3-node CONSISTENT_HASH pool; the log was shipped twice."""
    old, new = _config(tmp_path, "old"), _config(tmp_path, "new", nodes=NODES)
    clients = _clients(CLIENTS)
    log = tmp_path / "events.jsonl"
    before = _write_log(log, old, clients)
    (tmp_path / "again.jsonl").write_text(log.read_text())  # duplicates: the same (router_id, seq)

    summary, out = _run(spark, tmp_path, new, log, tmp_path / "again.jsonl")

    after = {c.raw: _route_client(new, c.raw) for c in clients}
    moved = {raw for raw in after if after[raw] != before[raw]}
    assert moved, "the scenario must move some keys"
    assert {after[raw] for raw in moved} == {"mq3"}  # a consistent hash ring only moves keys to the new node
    assert _keys(spark, out) == {raw: (before[raw], after[raw], raw in moved) for raw in after}
    connections = sum(c.connections for c in clients)
    moved_connections = sum(c.connections for c in clients if c.raw in moved)
    assert summary["keys"] == 40
    assert summary["moved_keys"] == len(moved)
    assert summary["moved_fraction"] == len(moved) / 40
    assert summary["connections"] == connections
    assert summary["moved_connections"] == moved_connections
    assert summary["moved_connections_fraction"] == moved_connections / connections
    assert summary["bytes"] == 110 * connections
    assert summary["moved_bytes"] == 110 * moved_connections
    assert summary["fallback_keys"] == summary["unpredictable_keys"] == 0
    by_target = {n: sum(c.connections for c in clients if after[c.raw] == n) for n in NODES}
    assert summary["decisions_by_target_after"] == by_target
    loads_before = {n: sum(c.connections for c in clients if before[c.raw] == n) for n in NODES[:3]}
    # before: the targets the log shows (the old pool is not known)
    assert summary["decisions_by_target_before"] == {n: c for n, c in loads_before.items() if c}
    assert summary["balance_after"]["targets"] == 4
    mean = connections / 4
    assert summary["balance_after"]["max_over_mean"] == pytest.approx(max(by_target.values()) / mean)

    moves = {
        (r["target_before"], r["target_after"]): (r["keys"], r["connections"], r["moved"])
        for r in spark.read.parquet(str(out / "moves")).collect()
    }
    for (frm, to), (keys, conns, is_move) in moves.items():
        assert keys == sum(1 for c in clients if before[c.raw] == frm and after[c.raw] == to)
        assert conns == sum(c.connections for c in clients if before[c.raw] == frm and after[c.raw] == to)
        assert is_move == (frm != to)
    assert sum(k for k, _, _ in moves.values()) == 40
    balance = {r["node_id"]: r for r in spark.read.parquet(str(out / "balance")).collect()}
    assert {n: balance[n]["connections_after"] for n in NODES} == by_target
    written = json.loads((out / "summary.json").read_text())
    assert written["moved_keys"] == len(moved)
    assert written["routers"]["mqtt"]["decisions_by_target_after"] == by_target


def test_simulate_ketama_ring_moves_exactly_the_keys_routerctl_moves(spark, tmp_path):
    """Scenario: the pool of 3 goes from Artemis's ring to the ketama ring and mq3 joins."""
    old = _config(tmp_path, "old")
    new = _config(tmp_path, "new", nodes=NODES, properties=(KETAMA,))
    clients = _clients(CLIENTS)
    log = tmp_path / "events.jsonl"
    before = _write_log(log, old, clients)

    summary, out = _run(spark, tmp_path, new, log)

    after = {c.raw: _route_client(new, c.raw) for c in clients}
    moved = {raw for raw in after if after[raw] != before[raw]}
    assert moved
    assert _keys(spark, out) == {raw: (before[raw], after[raw], raw in moved) for raw in after}
    assert summary["moved_keys"] == len(moved)
    assert summary["unpredictable_keys"] == 0
    assert summary["routers"]["mqtt"]["deterministic"] is True


def test_simulate_removing_a_node_moves_exactly_its_keys(spark, tmp_path):
    """Scenario: mq1 leaves; the log has a second router the new configuration lacks, and two
    clients whose last connection was refused (their target before is the last one they got)."""
    old, new = _config(tmp_path, "old", nodes=NODES), _config(tmp_path, "new", nodes=("mq0", "mq2", "mq3"))
    log = tmp_path / "events.jsonl"
    before = _write_log(log, old, _clients(CLIENTS), refused_last=frozenset(CLIENTS[:2]))
    _write_log(log, _config(tmp_path, "other", router="other"), _clients(CLIENTS[:3]), router="other")

    summary, out = _run(spark, tmp_path, new, log)

    assert summary["routers_not_simulated"] == ["other"]
    assert list(summary["routers"]) == ["mqtt"]
    assert summary["keys"] == 40
    assert summary["connections"] == sum(c.connections for c in _clients(CLIENTS)) + 2

    keys = _keys(spark, out)
    on_mq1 = {raw for raw, node in before.items() if node == "mq1"}
    assert {raw for raw, (_, _, moved) in keys.items() if moved} == on_mq1
    assert all(after == _route_client(new, raw) for raw, (_, after, _) in keys.items())
    assert "mq1" not in summary["decisions_by_target_after"]


def test_simulate_changing_the_key_filter_replays_the_raw_keys(spark, tmp_path):
    """Scenario: a prefix filter puts each client family (`app3-...`) on one broker."""
    old, new = _config(tmp_path, "old"), _config(tmp_path, "new", key_filter="^app[0-9]")
    log = tmp_path / "events.jsonl"
    before = _write_log(log, old, _clients(CLIENTS))

    summary, out = _run(spark, tmp_path, new, log)

    rows = spark.read.parquet(str(out / "keys")).collect()
    assert {r["input"]: r["key_after"] for r in rows} == {raw: raw[:4] for raw in CLIENTS}
    assert {r["input"]: r["key_before"] for r in rows} == {raw: raw for raw in CLIENTS}
    after = {raw: _route_client(new, raw) for raw in CLIENTS}
    assert {r["input"]: r["target_after"] for r in rows} == after
    assert summary["moved_keys"] == sum(1 for raw in CLIENTS if after[raw] != before[raw])
    families = {raw[:4]: after[raw] for raw in CLIENTS}
    assert all(after[raw] == families[raw[:4]] for raw in CLIENTS)  # one broker per family


def test_simulate_switching_to_first_element_moves_every_key_off_the_other_nodes(spark, tmp_path):
    old, new = _config(tmp_path, "old"), _config(tmp_path, "new", policy="FIRST_ELEMENT")
    log = tmp_path / "events.jsonl"
    clients = _clients(CLIENTS)
    before = _write_log(log, old, clients)

    summary, out = _run(spark, tmp_path, new, log)

    assert {after for _, after, _ in _keys(spark, out).values()} == {"mq0"}
    assert summary["moved_keys"] == sum(1 for n in before.values() if n != "mq0")
    assert summary["decisions_by_target_after"] == {
        "mq0": sum(c.connections for c in clients),
        "mq1": 0,
        "mq2": 0,
    }
    assert summary["balance_after"] == {"targets": 3, "max_over_mean": 3.0, "cv": pytest.approx(2**0.5)}


@pytest.mark.parametrize(
    ("policy", "properties"),
    [
        ("ROUND_ROBIN", ()),
        ("LEAST_CONNECTIONS", ()),
        ("CONSISTENT_HASH", (KETAMA, ("LOAD_FACTOR", "1.25"))),
    ],
)
def test_simulate_stateful_policy_is_reported_unpredictable(spark, tmp_path, policy, properties):
    """Scenario: a fresh engine's round-robin position (or unknown counts) says nothing about
    where a key would go: no target after, no move, out of the balance."""
    old = _config(tmp_path, "old")
    new = _config(tmp_path, "new", policy=policy, properties=properties)
    log = tmp_path / "events.jsonl"
    clients = _clients(CLIENTS[:6])
    _write_log(log, old, clients)

    summary, out = _run(spark, tmp_path, new, log)

    assert summary["unpredictable_keys"] == 6
    assert summary["unpredictable_connections"] == sum(c.connections for c in clients)
    assert summary["moved_keys"] == 0
    assert summary["moved_fraction"] is None
    assert summary["decisions_by_target_after"] == {"mq0": 0, "mq1": 0, "mq2": 0}
    assert summary["routers"]["mqtt"]["deterministic"] is False
    keys = _keys(spark, out)
    assert all(after is None and moved is None for _, after, moved in keys.values())


def test_simulate_ready_takes_the_nodes_routerctl_ready_takes(spark, tmp_path):
    old = _config(tmp_path, "old")
    log = tmp_path / "events.jsonl"
    _write_log(log, old, _clients(CLIENTS[:5]))

    summary, out = _run(spark, tmp_path, old, log, ready="mq1")

    only_mq1 = {
        raw: _routerctl(old, "--ready", "mq1", "--client-id", raw)[0]["node_id"] for raw in CLIENTS[:5]
    }
    assert {raw: after for raw, (_, after, _) in _keys(spark, out).items()} == only_mq1
    assert summary["decisions_by_target_after"] == {"mq1": 1 + 2 + 3 + 1 + 2}


def test_simulate_source_ip_replays_the_client_address(spark, tmp_path):
    old, new = _config(tmp_path, "old"), _config(tmp_path, "new", key_type="SOURCE_IP")
    log = tmp_path / "events.jsonl"
    clients = _clients(CLIENTS[:10])
    _write_log(log, old, clients)

    summary, out = _run(spark, tmp_path, new, log)

    expected = {c.source: _routerctl(new, "--source-ip", c.source)[0]["node_id"] for c in clients}
    assert {raw: after for raw, (_, after, _) in _keys(spark, out).items()} == expected
    assert summary["routers"]["mqtt"]["replayed_from"] == "source"


def test_simulate_key_type_change_is_a_clear_error(spark, tmp_path):
    old, new = _config(tmp_path, "old"), _config(tmp_path, "new", key_type="USER_NAME")
    log = tmp_path / "events.jsonl"
    _write_log(log, old, _clients(CLIENTS[:3]))
    with pytest.raises(
        SimulateError, match="new key type USER_NAME cannot be replayed from a log of CLIENT_ID"
    ):
        _run(spark, tmp_path, new, log)


def test_simulate_cut_raw_key_falls_back_to_the_logged_key(spark, tmp_path):
    old, new = _config(tmp_path, "old"), _config(tmp_path, "new", nodes=NODES)
    long_id = "x" * 300
    log = tmp_path / "events.jsonl"
    _write_log(log, old, _clients(["short", long_id]))

    summary, out = _run(spark, tmp_path, new, log)

    assert summary["fallback_keys"] == 1
    rows = {r["input"]: r for r in spark.read.parquet(str(out / "keys")).collect()}
    assert rows[long_id]["fallback"] is True  # the logged key is the whole id (no filter)
    assert rows[long_id]["raw_length"] == 300
    (by_key,) = _routerctl(new, long_id)
    assert rows[long_id]["target_after"] == by_key["node_id"]
    assert rows["short"]["fallback"] is False


def test_simulate_agrees_with_a_routerctl_process(spark, tmp_path):
    """Scenario: the real `routerctl route KEY...` (no filter: a key is its raw value) on the new
    configuration gives each key the target simulate gives it."""
    old, new = _config(tmp_path, "old"), _config(tmp_path, "new", nodes=("mq1", "mq2", "mq3"))
    log = tmp_path / "events.jsonl"
    _write_log(log, old, _clients(CLIENTS))

    _, out = _run(spark, tmp_path, new, log)

    done = subprocess.run(
        [str(ROUTERCTL), "route", "--json", "--config", str(new), "--router", "mqtt", *CLIENTS],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    by_routerctl = {d["key"]: d["node_id"] for d in map(json.loads, done.stdout.splitlines())}
    assert {raw: after for raw, (_, after, _) in _keys(spark, out).items()} == by_routerctl


def test_simulate_command_line(spark, tmp_path, capsys):
    old, new = _config(tmp_path, "old"), _config(tmp_path, "new", nodes=NODES)
    log = tmp_path / "events.jsonl"
    _write_log(log, old, _clients(CLIENTS[:8]))
    parser = argparse.ArgumentParser(prog="routerctl")
    add_commands(parser.add_subparsers(dest="command"))

    def simulate_status(config: Path, out: str, *more: str) -> int:
        args = parser.parse_args(["simulate", str(log), "--config", str(config), "--out", out, *more])
        return run(args)

    assert simulate_status(new, str(tmp_path / "o")) == 0
    assert capsys.readouterr().out.startswith("mqtt: 8 keys, ")
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["keys"] == 8
    written = sorted(p.name for p in (tmp_path / "o").iterdir() if not p.name.startswith("."))
    assert written == ["balance", "keys", "moves", "summary.json"]  # the staged copy is gone
    columns = spark.read.parquet(str(tmp_path / "o" / "keys")).columns
    assert columns == [*KEY_SCHEMA_FIELDS, *(name for name, _ in AFTER_COLUMNS), "moved"]

    assert simulate_status(_config(tmp_path, "bad", key_type="SNI_HOST"), str(tmp_path / "p")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("routerctl simulate: router 'mqtt': the new key type SNI_HOST cannot be replayed")

    assert simulate_status(new, str(tmp_path / "q"), "--router", "amqp") == 2
    assert capsys.readouterr().err.startswith("routerctl simulate: no connection router 'amqp' in ")

    (tmp_path / "broken.xml").write_text("<configuration>")
    assert simulate_status(tmp_path / "broken.xml", str(tmp_path / "r")) == 2
    assert capsys.readouterr().err.startswith("routerctl simulate: ")


# -- planning (driver only, no Spark) ------------------------------------------------------------


def test_plan_routers_takes_the_routers_in_both_and_reads_ready_like_routerctl(tmp_path):
    config = load_config(_config(tmp_path, "new", nodes=NODES))
    (plan,) = plan_routers(config, {"mqtt": ["CLIENT_ID"], "gone": ["CLIENT_ID"]}, ready="mq1, mq3")
    assert (plan.name, plan.replay, plan.ready, plan.targets) == (
        "mqtt",
        Replay.RAW_KEY,
        frozenset({"mq1", "mq3"}),
        NODES,
    )
    assert plan.deterministic


@pytest.mark.parametrize(
    ("logged", "options", "message"),
    [
        ({"mqtt": ["CLIENT_ID"]}, {"ready": "mq1,mq9"}, r"--ready names unknown node ids \['mq9'\]"),
        (
            {"mqtt": ["CLIENT_ID"]},
            {"router": "amqp"},
            r"no connection router 'amqp' in .*new\.xml \(has: mqtt\)",
        ),
        (
            {"amqp": ["CLIENT_ID"]},
            {"router": "mqtt"},
            r"the event log has no decisions of router 'mqtt' \(has: amqp\)",
        ),
        (
            {"amqp": ["CLIENT_ID"]},
            {},
            r"no connection router of .* \(mqtt\) is in the event log \(has: amqp\)",
        ),
        (
            {"mqtt": ["CLIENT_ID", "USER_NAME"]},
            {},
            "cannot be replayed from a log of CLIENT_ID/USER_NAME keys",
        ),
    ],
)
def test_plan_routers_errors_say_what_is_wrong(tmp_path, logged, options, message):
    config = load_config(_config(tmp_path, "new"))
    with pytest.raises(SimulateError, match=message):
        plan_routers(config, logged, **options)


@pytest.mark.parametrize(
    ("properties", "deterministic"),
    [((), True), ((KETAMA,), True), ((KETAMA, ("LOAD_FACTOR", "1.25")), False)],
)
def test_plan_routers_consistent_hash_is_deterministic_without_a_load_factor(
    tmp_path, properties, deterministic
):
    config = load_config(_config(tmp_path, "new", properties=properties))
    (plan,) = plan_routers(config, {"mqtt": ["CLIENT_ID"]})
    assert plan.deterministic is deterministic


def test_plan_routers_source_ip_replays_any_logged_key_type(tmp_path):
    config = load_config(_config(tmp_path, "new", key_type="SOURCE_IP", policy="ROUND_ROBIN"))
    (plan,) = plan_routers(config, {"mqtt": ["CLIENT_ID", "USER_NAME"]}, ready="none")
    assert (plan.replay, plan.ready, plan.deterministic) == (Replay.SOURCE, frozenset(), False)


# -- one key (driver only, no Spark) ------------------------------------------------------------


def _plan_and_engine(config_path: Path, logged: str = "CLIENT_ID") -> tuple[RouterPlan, RoutingEngine]:
    (plan,) = plan_routers(load_config(config_path), {"mqtt": [logged]})
    return plan, _engine(config_path)


def test_replay_one_role_name_takes_the_roles_apart_like_routerctl(tmp_path):
    new = _config(tmp_path, "new", key_type="ROLE_NAME", key_filter="^ops")
    plan, engine = _plan_and_engine(new, "ROLE_NAME")
    decision = replay_one(engine, plan, "admin,ops-eu", fallback=False, raw_length=12)
    assert decision.key == "ops"
    (by_routerctl,) = _routerctl(new, "--role", "admin", "--role", "ops-eu")
    assert decision.to_json() == by_routerctl


def test_replay_one_cut_key_longer_than_the_new_limit_is_null(tmp_path):
    plan, engine = _plan_and_engine(_config(tmp_path, "new"))
    assert replay_one(engine, plan, "x" * 300, fallback=True, raw_length=2000).key == "NULL"
    assert replay_one(engine, plan, "x" * 300, fallback=True, raw_length=1000).key == "x" * 300


def test_replay_one_internal_client_id_goes_to_the_local_target(tmp_path):
    plan, engine = _plan_and_engine(_config(tmp_path, "new"))
    decision = replay_one(engine, plan, "$.artemis.internal.router.client.r2", fallback=False, raw_length=35)
    assert decision.target is not None
    assert decision.target.local


def test_simulate_command_line_sets_damaged_files_aside(spark, tmp_path, capsys):
    """Scenario: a good JSON-lines log beside a Parquet file from the router's writer cut short and
    a .jsonl.zst that is not zstd: simulate replays the good log (exit 0) and names both; with no
    readable file left the status is 6."""
    old, new = _config(tmp_path, "old"), _config(tmp_path, "new", nodes=NODES)
    logs = tmp_path / "logs"
    logs.mkdir()
    _write_log(logs / "events.jsonl", old, _clients(CLIENTS[:8]))
    generate(
        tmp_path / "pq", 300, routers=1, keys=30, duplicate_rate=0, malformed_rate=0, file_format=PARQUET
    )
    (written,) = (tmp_path / "pq").glob("*.parquet")
    (logs / "cut.parquet").write_bytes(written.read_bytes()[:-100])
    (logs / "plain.jsonl.zst").write_text('{"kind": "close"}\n')
    parser = argparse.ArgumentParser(prog="routerctl")
    add_commands(parser.add_subparsers(dest="command"))

    def simulate_status(*events: Path) -> int:
        out = str(tmp_path / "o")
        return run(parser.parse_args(["simulate", *map(str, events), "--config", str(new), "--out", out]))

    assert simulate_status(logs) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["keys"] == 8
    assert {Path(u["file"]).name: u["reason"] for u in summary["unreadable_files"]} == {
        "cut.parquet": "parquet: no magic number at the end (cut short, or not a Parquet file)",
        "plain.jsonl.zst": "zstd: Unknown frame descriptor",
    }
    captured = capsys.readouterr()
    assert captured.out.startswith("mqtt: 8 keys, ")
    assert captured.err == (
        f"routerctl simulate: set aside file:{logs / 'cut.parquet'}: parquet: no magic number at the "
        "end (cut short, or not a Parquet file)\n"
        f"routerctl simulate: set aside file:{logs / 'plain.jsonl.zst'}: zstd: Unknown frame descriptor\n"
    )
    assert simulate_status(logs / "cut.parquet", logs / "plain.jsonl.zst") == 6
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"routerctl simulate: every event file is unreadable (2): file:{logs / 'cut.parquet'}: "
        "parquet: no magic number at the end (cut short, or not a Parquet file) (and 1 more)"
    )
