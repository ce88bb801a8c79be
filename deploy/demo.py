"""The demo behind ./run-demo: a fleet of three mosquitto brokers, routerd in front, real clients.

Starts three mosquitto brokers (ports 21883-21885) and routerd with deploy/examples/demo.xml
(MQTT acceptor 127.0.0.1:21880, admin API 127.0.0.1:21890), sends an MQTT client through the router
from each of 127.0.0.2-.9, and prints which broker each landed on (seen by a direct subscriber on
every broker) next to what the router's management API predicts. Then it keeps the fleet running
for you to try things until Ctrl-C, and stops everything it started, by PID.

    ./run-demo            run, print, keep running until Ctrl-C
    ./run-demo --once     run, print, stop (used by the tests)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "examples" / "demo.xml"
BROKERS = {"node4": 21883, "node9": 21884, "node20": 21885}
ROUTER_PORT = 21880
ADMIN = ("127.0.0.1", 21890)
SOURCES = [f"127.0.0.{i}" for i in range(2, 10)]
TIMEOUT_S = 10.0


def _say(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # The reader went away (`./run-demo | head`): keep going quietly, so the cleanup that
        # stops the brokers and routerd still runs.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is fine
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_port(port: int, what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"demo: {what} exited with status {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"demo: {what} does not accept on 127.0.0.1:{port} after 20 s")


def _admin_get(path: str) -> object:
    with urllib.request.urlopen(f"http://{ADMIN[0]}:{ADMIN[1]}{path}", timeout=5) as response:
        return json.loads(response.read())


def _observe(seen: dict[str, str], arrived: threading.Condition) -> list[mqtt.Client]:
    clients = []
    for node_id, port in BROKERS.items():
        done = threading.Event()
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"observer-{uuid.uuid4()}")

        def on_message(_c: mqtt.Client, _u: object, msg: mqtt.MQTTMessage, node: str = node_id) -> None:
            with arrived:
                seen[msg.topic] = node
                arrived.notify_all()

        client.on_message = on_message
        client.on_subscribe = lambda *_a, ev=done: ev.set()
        client.connect("127.0.0.1", port)
        client.loop_start()
        client.subscribe("demo/#", qos=1)
        if not done.wait(TIMEOUT_S):
            raise SystemExit(f"demo: cannot subscribe on broker {node_id}")
        clients.append(client)
    return clients


def _send_through_router(source: str) -> bool:
    got, subscribed = threading.Event(), threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"demo-{source}")
    client.on_message = lambda *_a: got.set()
    client.on_subscribe = lambda *_a: subscribed.set()
    client.connect("127.0.0.1", ROUTER_PORT, bind_address=source)
    client.loop_start()
    try:
        client.subscribe(f"demo/{source}", qos=1)
        if not subscribed.wait(TIMEOUT_S):
            return False
        client.publish(f"demo/{source}", f"hello from {source}".encode(), qos=1)
        return got.wait(TIMEOUT_S)
    finally:
        client.disconnect()
        client.loop_stop()


def _run_clients() -> int:
    seen: dict[str, str] = {}
    arrived = threading.Condition()
    observers = _observe(seen, arrived)
    failures = 0
    _say("\nsource       landed on   router predicts   round trip")
    try:
        for source in SOURCES:
            ok = _send_through_router(source)
            predicted = _admin_get(f"/api/v1/routers/demo/target?key={source}")
            assert isinstance(predicted, dict)
            topic = f"demo/{source}"
            with arrived:  # mosquitto hands it to other subscribers some 40 ms after the publisher
                arrived.wait_for(lambda: topic in seen, TIMEOUT_S)  # noqa: B023 - used at once
            landed = seen.get(topic, "-")
            failures += 0 if ok and landed == predicted["node_id"] else 1
            _say(f"{source:<12} {landed:<11} {predicted['node_id']!s:<17} {'ok' if ok else 'FAILED'}")
    finally:
        for client in observers:
            client.disconnect()
            client.loop_stop()
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--once", action="store_true", help="stop after printing the table")
    args = parser.parse_args()
    busy = [p for p in [*BROKERS.values(), ROUTER_PORT, ADMIN[1]] if not _port_free(p)]
    if busy:
        raise SystemExit(f"demo: ports {busy} on 127.0.0.1 are in use (another demo running?)")
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    work = Path(tempfile.mkdtemp(prefix="router-demo-"))
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        for node_id, port in BROKERS.items():
            conf = work / f"{node_id}.conf"
            conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
            # Own session: Ctrl-C reaches only the demo, which then stops each child in order.
            proc = subprocess.Popen(
                [mosquitto, "-c", str(conf)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            procs.append((f"mosquitto {node_id}", proc))
            _wait_port(port, f"mosquitto {node_id}", proc)
            _say(f"started mosquitto {node_id} on 127.0.0.1:{port} (pid {proc.pid})")
        log = open(work / "routerd.log", "wb")  # noqa: SIM115 - lives as long as routerd
        routerd = subprocess.Popen(
            [sys.executable, "-m", "router", "--config", str(CONFIG), "--admin", f"{ADMIN[0]}:{ADMIN[1]}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(("routerd", routerd))
        _wait_port(ADMIN[1], "routerd", routerd)
        _wait_port(ROUTER_PORT, "routerd", routerd)
        deadline = time.monotonic() + 15
        while True:  # the first probes run at start; wait until all three brokers are ready
            status = _admin_get("/api/v1/routers/demo")
            assert isinstance(status, dict)
            if all(t["state"] == "ready" for t in status["pool"]["targets"]):
                break
            if time.monotonic() > deadline:
                raise SystemExit("demo: the brokers did not become ready; see " + str(work / "routerd.log"))
            time.sleep(0.1)
        _say(
            f"started routerd on 127.0.0.1:{ROUTER_PORT} (pid {routerd.pid}), "
            f"admin API http://{ADMIN[0]}:{ADMIN[1]}, log {work / 'routerd.log'}"
        )
        failures = _run_clients()
        _say(f"\n{len(SOURCES) - failures}/{len(SOURCES)} clients landed where the router predicted.")
        if args.once:
            return 1 if failures else 0
        _say(
            "\nThe fleet keeps running. Try:\n"
            f"  .venv/bin/routerctl status --admin http://{ADMIN[0]}:{ADMIN[1]}\n"
            f"  .venv/bin/routerctl target --admin http://{ADMIN[0]}:{ADMIN[1]} demo 127.0.0.7\n"
            f"  curl -s http://{ADMIN[0]}:{ADMIN[1]}/metrics | grep ^router_\n"
            f"  kill {procs[0][1].pid}   # stop broker node4 and watch its clients move\n"
            "Press Ctrl-C to stop everything."
        )
        while True:
            signal.pause()
    except KeyboardInterrupt:
        return 0
    finally:
        for name, proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
            _say(f"stopped {name} (pid {proc.pid})")
        shutil.rmtree(work, ignore_errors=True)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    sys.exit(main())
