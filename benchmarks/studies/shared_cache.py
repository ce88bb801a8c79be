"""The cache shared through ZooKeeper at 100,000 keys: what it costs ZooKeeper and a decision.

    .venv/bin/python -m benchmarks.studies.shared_cache [--keys 100000] [--concurrency 32]
                                                        [--zookeeper HOST:PORT]

Quoted by docs/configuration.md ("Shared cache": Scale) and benchmarks/README.md ("The shared
cache at 100,000 keys").

Starts a standalone ZooKeeper (Debian's, as the tests do; or uses `--zookeeper`), builds two routers'
`RouterRuntime`s with a ROUND_ROBIN router over three (unprobed, marked ready) targets and a
shared cache each (`SharedCache`, as routerd runs it), and measures:

- **first decisions**: `--keys` distinct client ids decided by router A through
  `router.runtime.decide` (own cache miss, ZooKeeper read, policy, create-if-absent), `--concurrency`
  at a time: decisions/s, and latency p50/p99 of a sample run one at a time;
- **adoptions**: the same keys decided by router B (own cache miss, ZooKeeper read of A's entry,
  adopted): decisions/s and latency;
- **hits**: the keys again on A (its own cache, no ZooKeeper): latency p50/p99;
- **extensions**: version-checked updates of the entries' expiry (what use costs every half
  timeout), updates/s;
- what ZooKeeper holds then (`mntr`: znodes, approximate data size, watches) and the write rate
  that 100,000 keys in use cost per timeout.

Each router's session is its own kazoo client in this process; ZooKeeper runs on this machine's
other core. Figures are for one loopback ZooKeeper, not an ensemble (an ensemble's writes cost a
quorum round trip more).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

from benchmarks.decision import percentile
from cache import CacheConfig
from keys import ConnectionFacts, KeyType
from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind
from router.config.settings import Config, RouterConfig, ZooKeeperConfig
from router.features.shared_cache.service import SharedCache
from router.features.shared_cache.znodes import SharedEntry, znode_of
from router.metrics import Metrics
from router.runtime import RouterRuntime, decide

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

ZOOKEEPER_JARS: Final = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")
TIMEOUT_MS: Final = 3_600_000
"""The cache timeout of the benchmark's routers (an hour): entries do not expire during it."""
SAMPLE: Final = 2000
"""Decisions timed one at a time for the latency percentiles."""


@contextlib.contextmanager
def _zookeeper(workdir: Path) -> Iterator[str]:
    """A standalone ZooKeeper on a free loopback port, stopped by its PID; its `host:port`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (workdir / "data").mkdir()
    config = workdir / "zoo.cfg"
    config.write_text(
        f"tickTime=250\ndataDir={workdir / 'data'}\nclientPort={port}\nclientPortAddress=127.0.0.1\n"
        "admin.enableServer=false\n4lw.commands.whitelist=ruok,mntr\n"
    )
    with (workdir / "zookeeper.log").open("wb") as out:
        proc = subprocess.Popen(
            [
                "java",
                "-Xmx1g",
                "-cp",
                ":".join(ZOOKEEPER_JARS),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                str(config),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while _four_letters(f"127.0.0.1:{port}", "ruok") != "imok":
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ZooKeeper did not start: see {workdir / 'zookeeper.log'}")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _four_letters(connect: str, word: str) -> str:
    host, _, port = connect.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(word.encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks).decode()
    except OSError:
        return ""


def _runtime(zookeeper: ZooKeeperConfig) -> RouterRuntime:
    nodes = ("b1", "b2", "b3")
    connectors = tuple(
        Connector.from_url(n, f"tcp://127.0.0.1:{21200 + i}?nodeId={n}") for i, n in enumerate(nodes)
    )
    router = RouterConfig(
        name="r",
        key_type=KeyType.CLIENT_ID,
        cache=CacheConfig(timeout_ms=TIMEOUT_MS, max_entries=1_000_000),
        cache_zookeeper=zookeeper,
        policy=PolicyConfig(name="ROUND_ROBIN"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=nodes),
    )
    runtime = RouterRuntime(
        Config(source="bench.xml", connectors=connectors, routers=(router,)), router, Metrics()
    )
    for node in nodes:
        runtime.pool.record_check(node, True)
    return runtime


async def _decide_all(runtime: RouterRuntime, keys: Sequence[str], concurrency: int) -> float:
    """Decide every key, `concurrency` at a time; the wall time."""
    limiter = trio.CapacityLimiter(concurrency)

    async def one(key: str) -> None:
        async with limiter:
            await decide(runtime, ConnectionFacts(client_id=key))

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(one, key)
    return time.perf_counter() - started


async def _timed(runtime: RouterRuntime, keys: Sequence[str]) -> list[float]:
    """Decide the keys one at a time; each decision's time in µs."""
    samples = []
    for key in keys:
        started = time.perf_counter_ns()
        await decide(runtime, ConnectionFacts(client_id=key))
        samples.append((time.perf_counter_ns() - started) / 1000)
    return samples


def _line(name: str, count: int, seconds: float | None, samples: Sequence[float] | None) -> None:
    rate = "" if seconds is None else f"{count / seconds:>10,.0f}/s"
    spread = (
        ""
        if not samples
        else f"  p50 {percentile(samples, 0.5):>8.1f} µs  p99 {percentile(samples, 0.99):>8.1f} µs"
    )
    print(f"{name:<34} {count:>8,} {rate:>12}{spread}")


async def _run(connect: str, keys: int, concurrency: int) -> None:
    zookeeper = ZooKeeperConfig(
        connect=connect, path=f"/bench-{uuid.uuid4().hex[:8]}", session_timeout_ms=10_000
    )
    routers = []
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            runtime = _runtime(zookeeper)
            shared = SharedCache(runtime, zookeeper)
            runtime.held().resolver = shared.resolve
            await nursery.start(shared.serve)
            routers.append((runtime, shared))
        with trio.fail_after(30):
            while True:
                if all(s.connected for _, s in routers):
                    break
                await trio.sleep(0.05)
        (a, shared_a), (b, _) = routers
        names = [f"client-{i}" for i in range(keys)]
        sample = [f"sample-{i}" for i in range(SAMPLE)]
        print(f"{'':<34} {'count':>8} {'rate':>12}")
        _line(
            "first decisions (read + create)",
            keys,
            await _decide_all(a, names, concurrency),
            await _timed(a, sample),
        )
        _line(
            "adoptions by another router",
            keys,
            await _decide_all(b, names, concurrency),
            await _timed(b, sample),
        )
        _line("hits (own cache)", SAMPLE, None, await _timed(a, sample))
        entries = [(k, shared_a.known[k]) for k in names[: min(keys, 20_000)]]
        limiter = trio.CapacityLimiter(concurrency)

        async def extend(key: str, entry: SharedEntry) -> None:
            async with limiter:
                await shared_a._extend(key, entry)

        started = time.perf_counter()
        async with trio.open_nursery() as extending:
            for key, entry in entries:
                extending.start_soon(extend, key, entry)
        _line("expiry extensions (updates)", len(entries), time.perf_counter() - started, None)
        stats = dict(
            line.split("\t", 1) for line in _four_letters(connect, "mntr").splitlines() if "\t" in line
        )
        print(
            f"\nZooKeeper holds {int(stats.get('zk_znode_count', 0)):,} znodes (keys + 256 buckets + "
            f"parents), about {int(stats.get('zk_approximate_data_size', 0)) / 1e6:.1f} MB "
            f"of data and paths, {int(stats.get('zk_watch_count', 0)):,} watches (two routers); "
            f"its heap: {_heap(stats)}"
        )
        per_timeout = 2 * keys
        print(
            f"In use, {keys:,} keys cost at most {per_timeout:,} expiry updates per timeout: "
            f"{per_timeout / 3600:,.0f}/s at a 1-hour timeout, {per_timeout / 60:,.0f}/s at 1 minute "
            f"(plus one read per watching router per update)."
        )
        print(f"Znode of key 'client-0': {znode_of(zookeeper.path, 'client-0')}")
        nursery.cancel_scope.cancel()


def _heap(stats: dict[str, str]) -> str:
    used = stats.get("zk_jvm_memory_used") or stats.get("zk_heap_used")
    return "n/a" if used is None else f"{int(used) / 1e6:.0f} MB"


def main(argv: Sequence[str] | None = None) -> None:
    """Run the measurements and print them."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.shared_cache", description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument(
        "--concurrency", type=int, default=32, help="decisions in flight at once (default 32)"
    )
    parser.add_argument("--zookeeper", metavar="HOST:PORT", help="use this ZooKeeper instead of starting one")
    args = parser.parse_args(argv)
    if args.zookeeper is not None:
        trio.run(_run, args.zookeeper, args.keys, args.concurrency)
        return
    if shutil.which("java") is None or not all(Path(j).exists() for j in ZOOKEEPER_JARS):
        raise SystemExit("ZooKeeper is not installed: run deploy/bootstrap.sh")
    with tempfile.TemporaryDirectory(prefix="bench-zk-") as workdir, _zookeeper(Path(workdir)) as connect:
        trio.run(_run, connect, args.keys, args.concurrency)


if __name__ == "__main__":
    main()
