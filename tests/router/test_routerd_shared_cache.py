"""Two routerd processes sharing their sticky cache through a real ZooKeeper, real mosquitto
brokers and real paho clients.

ROUND_ROBIN ignores the key and each routerd starts at a random position, so without sharing two
routers send one client id to different brokers about two times in three. With the cache shared,
whichever router a client reaches, its client id goes to one broker; a broker that goes down is
bypassed and its keys' entries overwritten for both routers; with ZooKeeper stopped both keep
routing, and they agree again once it is back.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from tests.router.conftest import ROUND_ROBIN_NODE_IDS, Routerd, client_id_landings, round_robin_config

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from tests.router.conftest import Mosquitto, ZooKeeperServer

NODE_IDS = ROUND_ROBIN_NODE_IDS


def _config(brokers: Sequence[Mosquitto], port: int, connect: str, path: str) -> Callable[[int], str]:
    cache = (
        f'<cache><timeout>600000</timeout><zookeeper connect="{connect}" path="{path}" '
        'session-timeout="4000"/></cache>'
    )
    return round_robin_config(brokers, port, cache)


class Pair:
    """Two routerd processes with the same configuration but their own ports and directories."""

    def __init__(
        self,
        tmp_path: Path,
        brokers: Sequence[Mosquitto],
        zookeeper: ZooKeeperServer,
        run: Callable[[Routerd], Routerd],
        free_port: Callable[[], int],
    ) -> None:
        path = f"/shared-cache-{uuid.uuid4().hex[:8]}"
        self.brokers = brokers
        self.ports = [free_port(), free_port()]
        self.routers = []
        for name, port in zip("ab", self.ports, strict=True):
            (tmp_path / name).mkdir()
            self.routers.append(
                run(Routerd(tmp_path / name, _config(brokers, port, zookeeper.connect, path)))
            )
        for router in self.routers:
            router.wait_for_log(r"router=rr connected to zookeeper", consume=False)

    def landings(self, visits: Sequence[tuple[int, str]]) -> list[str | None]:
        """For each (router index, client id) in order, the broker its round trip reached."""
        return client_id_landings(self.brokers, [(self.ports[router], key) for router, key in visits])


def _counter(router: Routerd, operation: str, outcome: str) -> float:
    """A router's `router_cache_shared_operations_total` for one operation and outcome."""
    sample = (
        f'router_cache_shared_operations_total{{operation="{operation}",outcome="{outcome}",router="rr"}} '
    )
    lines = [line for line in router.metrics().splitlines() if line.startswith(sample)]
    return float(lines[0].split()[-1]) if lines else 0.0


def _each_key_on_one_broker(pair: Pair, keys: Sequence[str]) -> dict[str, str]:
    """Visit each key through one router, then the other (alternating which goes first); assert
    both visits reached the same broker; key -> broker."""
    visits = []
    for i, key in enumerate(keys):
        first = i % 2
        visits += [(first, key), (1 - first, key)]
    landed = pair.landings(visits)
    brokers: dict[str, str] = {}
    for i, key in enumerate(keys):
        broker = landed[2 * i]
        assert broker is not None, key
        assert broker == landed[2 * i + 1], f"{key}: {broker} then {landed[2 * i + 1]}"
        brokers[key] = broker
    return brokers


def test_two_routers_send_each_key_to_one_broker_and_follow_a_broker_going_down(
    tmp_path, mosquitto_fleet, zookeeper, run_routerd, free_port
):
    pair = Pair(tmp_path, mosquitto_fleet, zookeeper, run_routerd, free_port)
    keys = [f"client-{i:03d}" for i in range(200)]
    placed = _each_key_on_one_broker(pair, keys)
    assert set(placed.values()) == set(NODE_IDS)  # round robin spread them
    # Each key's entry was created once, by the router it reached first; the other read it.
    assert sum(_counter(r, "create", "ok") for r in pair.routers) == len(keys)
    assert sum(_counter(r, "read", "ok") for r in pair.routers) >= 2 * len(keys)

    # b1 goes down: its keys move, and both routers agree where.
    down = NODE_IDS.index("b1")
    mosquitto_fleet[down].stop()
    for router in pair.routers:
        router.wait_for_log(r"target=b1 .*not ready", consume=False)
    moved = [k for k, n in placed.items() if n == "b1"][:20]
    after = _each_key_on_one_broker(pair, moved)
    assert set(after.values()) <= {"b0", "b2"}
    kept = [k for k, n in placed.items() if n != "b1"][:20]
    assert _each_key_on_one_broker(pair, kept) == {k: placed[k] for k in kept}


def test_with_zookeeper_stopped_both_route_and_agree_again_after_it_returns(
    tmp_path, mosquitto_fleet, own_zookeeper, run_routerd, free_port
):
    pair = Pair(tmp_path, mosquitto_fleet, own_zookeeper, run_routerd, free_port)
    before = _each_key_on_one_broker(pair, [f"early-{i}" for i in range(6)])

    own_zookeeper.stop()
    for router in pair.routers:
        router.wait_for_log(r"lost the connection to zookeeper", consume=True)
    alone = [f"alone-{i:02d}" for i in range(24)]
    # Each router decides the new keys by itself: every key through both, no failure. The two
    # round-robin positions move in step, so one extra connection through one router halfway
    # makes them disagree on one half of the keys at least, whatever positions they started at.
    visits = [(r, k) for k in alone[:12] for r in (0, 1)] + [(0, "shift")]
    visits += [(r, k) for k in alone[12:] for r in (0, 1)]
    landed = pair.landings(visits)
    assert None not in landed
    del landed[24]
    assert any(landed[2 * i] != landed[2 * i + 1] for i in range(len(alone)))  # they disagreed
    # The keys cached before the outage still go where they went.
    assert pair.landings([(r, k) for k in before for r in (0, 1)]) == [
        before[k] for k in before for _ in (0, 1)
    ]

    own_zookeeper.start()
    for router in pair.routers:
        router.wait_for_log(r"cache reconciled with zookeeper .*: \d+ key\(s\)", timeout=30)
    _each_key_on_one_broker(pair, alone)
