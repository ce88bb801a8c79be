"""Study: does mosquitto's `max_connections` hold under connection churn?

    .venv/bin/python -m benchmarks.studies.mosquitto_max_connections [--churn N]

Quoted by docs/configuration.md ("Outlier detection", the 3,000-session storm): the storm's
"before" landed more clients than the full brokers had free slots. This study shows why, without
routerd: one mosquitto on a 127.0.0.1 port chosen at run time, `max_connections 10`, 5 sessions
held, then `--churn` short connections of one kind (default 100), then as many new sessions as
will land (at most 200). A broker that honours its limit lets 5 land after every kind.

    probe     TCP connect and close, nothing sent (what routerd's TCP health probe does)
    session   MQTT CONNECT, CONNACK, close
    refused   the broker full (10 held), each new connection closed by the broker

Prints one line per kind: how many sessions landed where 5 slots were free. Exit status 0; 2 when
mosquitto is missing. mosquitto is stopped by its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

from benchmarks.configs import mosquitto_config
from benchmarks.fleet import Fleet, pick_ports
from keys import NEED_MORE, mqtt

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

LIMIT: Final = 10
HELD: Final = 5
MOST: Final = 200
KINDS: Final = ("probe", "session", "refused")


def _session(port: int, client_id: str) -> socket.socket | None:
    """An MQTT 3.1.1 session that the broker accepted (its socket), or None."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=2.0)
    try:
        sock.sendall(mqtt.encode_connect(client_id, keepalive_s=0))
        data = b""
        while (code := mqtt.parse_connack(data)) is NEED_MORE:
            chunk = sock.recv(64)
            if not chunk:
                break
            data += chunk
    except OSError:
        code = None
    if code == 0:
        return sock
    sock.close()
    return None


@contextlib.contextmanager
def _holding(port: int, prefix: str, count: int) -> Iterator[list[socket.socket]]:
    held = [s for i in range(count) if (s := _session(port, f"{prefix}-{i}")) is not None]
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


def _landed_after(port: int, kind: str, churn: int) -> int:
    with _holding(port, f"{kind}-held", HELD) as held:
        if len(held) != HELD:
            raise SystemExit(f"only {len(held)} of {HELD} sessions landed on an empty broker")
        if kind == "refused":
            with _holding(port, f"{kind}-fill", LIMIT - HELD):
                for i in range(churn):
                    if (sock := _session(port, f"{kind}-churn-{i}")) is not None:
                        sock.close()
        else:
            for i in range(churn):
                if kind == "probe":
                    socket.create_connection(("127.0.0.1", port), timeout=2.0).close()
                elif (sock := _session(port, f"{kind}-churn-{i}")) is not None:
                    sock.close()
        time.sleep(0.3)  # the broker's own closes are done
        with _holding(port, f"{kind}-new", MOST) as landed:
            return len(landed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--churn", type=int, default=100, help="short connections of each kind")
    args = parser.parse_args(argv)
    if shutil.which("mosquitto") is None:
        print("mosquitto is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, Fleet(Path(tmp), say=lambda _: None) as fleet:
        for kind in KINDS:  # a new broker for each kind: its count starts right
            (port,) = pick_ports(1)
            conf = Path(tmp) / f"{kind}.conf"
            conf.write_text(mosquitto_config(port) + f"max_connections {LIMIT}\n")
            proc = fleet.start(f"mosquitto-{kind}", ["mosquitto", "-c", str(conf)], ports=[port])
            landed = _landed_after(port, kind, args.churn)
            print(f"{kind:8} after {args.churn} churned: {landed} landed where {LIMIT - HELD} were free")
            fleet.stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
