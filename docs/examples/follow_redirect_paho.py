"""Following a connection router's MQTT 5 redirect with paho-mqtt 2.x (paho does not follow it).

The router answers CONNECT with CONNACK reason 0x9C "Use another server" and the Server
Reference property `host:port`; the client connects there instead, with the same client id and
credentials. Run:
    python follow_redirect_paho.py ROUTER_HOST ROUTER_PORT CLIENT_ID [USER PASSWORD]
"""

from __future__ import annotations

import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion


def _connect_once(
    host: str, port: int, client_id: str, username: str | None, password: str | None
) -> tuple[mqtt.Client, int, str | None]:
    """Connect once; return the client (loop running), the CONNACK reason code and Server Reference."""
    answered = threading.Event()
    result: dict[str, object] = {}

    def on_connect(c: mqtt.Client, userdata: object, flags: object, reason: object, props: object) -> None:
        result["reason"] = getattr(reason, "value", reason)
        result["reference"] = getattr(props, "ServerReference", None)
        answered.set()

    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
    )
    if username is not None:
        client.username_pw_set(username, password)
    client.on_connect = on_connect
    client.connect(host, port)
    client.loop_start()
    if not answered.wait(10):
        raise TimeoutError(f"no CONNACK from {host}:{port}")
    reference = result["reference"]
    return client, int(str(result["reason"])), None if reference is None else str(reference)


def connect_following_redirects(
    host: str,
    port: int,
    client_id: str,
    max_hops: int = 3,
    *,
    username: str | None = None,
    password: str | None = None,
) -> mqtt.Client:
    """Connect, following up to `max_hops` redirects, with the same client id and credentials (the
    router reads them; the broker checks them); return the connected client (loop running)."""
    for _ in range(max_hops + 1):
        client, reason, reference = _connect_once(host, port, client_id, username, password)
        if reason != 0x9C or reference is None:  # not "Use another server": this is the answer
            return client
        client.loop_stop()
        client.disconnect()
        host, _, port_text = reference.rpartition(":")
        port = int(port_text)
    raise RuntimeError(f"more than {max_hops} redirects")


if __name__ == "__main__":
    user, secret = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else (None, None)
    connected = connect_following_redirects(
        sys.argv[1], int(sys.argv[2]), sys.argv[3], username=user, password=secret
    )
    print("connected to", connected.host, connected.port)
    connected.disconnect()
    connected.loop_stop()
