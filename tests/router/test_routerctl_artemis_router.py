"""Artemis's own connection router side by side with `routerctl route` (issue 32, point 7).

A real Artemis 2.40 broker, `router` (web console and Jolokia on), gets three connectors, to the
session's brokers `a1`, `a2`, `a3` (`artemis_brokers`: its pool probes them over CORE with the
pool's login, so they must be real running brokers), an acceptor per router, and a
`<connection-routers>` element with two routers keyed on CLIENT_ID:

- `ch`: CONSISTENT_HASH over the three brokers (`quorum-size` 3, so Artemis answers only once all
  three are ready, and `quorum-timeout` 0, so a management lookup never blocks);
- `mod`: CONSISTENT_HASH_MODULO with MODULO 3 and local-target-filter `NULL|0`, no pool (the
  sharding set-up of Artemis's manual): keys of shard 0 stay, the others are refused.

`routerctl route` reads that very broker.xml as its configuration file. Each connector carries
`nodeId=<that broker's node id>` (from its `AMQ221001 … nodeID=` log line): Artemis keeps the
parameter aside (`extraProps`) and learns node ids by asking the brokers; routerd takes them from
the URL. The local target is the router broker for Artemis and `local` for routerctl (no
`<local-target-connector-ref>`: Artemis's schema would refuse our extension).

Compared, for 1,107 client ids (1,000 ordinary ones; 91 awkward ones: empty, blank, `NULL`,
Jolokia's `[null]`, NUL and control characters, lone surrogates, combining marks, astral and
right-to-left characters, up to 5,000 characters, regular-expression, shell and URL
metacharacters, option-like `-x` and `--`; 16 edge ones: the node ids themselves, and keys whose
hash is a ring point exactly, or one off it, or an int32 extreme, 0 or -1):

- Artemis's management answer (`getTargetAsJSON(key)` over Jolokia, in bulk requests) and
  `routerctl route KEY…` (one run over all keys) name the same target;
- for the 147 awkward, edge and 40 ordinary ones, the redirect a CORE client gets through the
  router's acceptor agrees with `routerctl route --client-id` and with the management answer;
- for 16 of them, so does the redirect an MQTT 5 client gets (CONNACK 0x9C with a Server
  Reference, a refusal, or a connection to the router broker).

The module starts one broker and compiles one Java program; every wait is bounded.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import random
import re
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.request import Request, urlopen

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from keys.resolve import DEFAULT_KEY_MAX_LENGTH, INTERNAL_CLIENT_ID_PREFIX
from policies.hashing import artemis_hash
from router.ctl import main_routerctl
from tests.conftest import (
    ARTEMIS_CLIENT_CLASSPATH,
    ARTEMIS_PASSWORD,
    ARTEMIS_TIMEOUT_S,
    ARTEMIS_USER,
    Artemis,
    free_port,
    require_java,
)
from tests.router.conftest import ROUTERCTL
from tools.artemis_instance import broker_xml

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0
"""Bound of every wait: the router broker's start, its pool's readiness, one Jolokia request, one
routerctl run, one MQTT exchange."""
CORE_PROBE_TIMEOUT_S = 60.0
"""Bound of the CORE program's run over the whole sample (a JVM start and 147 sessions)."""
CHECK_PERIOD_MS = 1000
"""The pool's `check-period` (Artemis's default is 5000): a target found down is probed again a
second later."""
MODULO = 3
LOCAL_FILTER = "NULL|0"
"""`mod`'s local-target filter: shard 0, and clients without a client id, stay on the broker."""
JOLOKIA_BATCH = 500
"""Requests per Jolokia bulk POST."""
ORDINARY_KEYS = 1000
REDIRECTED_ORDINARY_KEYS = 40
"""Ordinary keys in the CORE redirect sample (with every awkward and edge key)."""

LOCAL = "local"
"""A decision for the local target: Artemis's router broker, routerctl's node id `local`."""
REFUSED = "refused"
"""Any refusal: Artemis's management lookup answers null for both REFUSED_USE_ANOTHER and
REFUSED_UNAVAILABLE."""
USE_ANOTHER = "use-another"
"""A connection refused as REFUSED_USE_ANOTHER (CORE AMQ229240; MQTT 5 CONNACK 0x9C, no reference)."""
UNAVAILABLE = "unavailable"
"""A connection refused as REFUSED_UNAVAILABLE (CORE AMQ229238; MQTT 5 CONNACK 0x88)."""

_CORE_CLIENT_ID_VERSION = 131
"""The CORE channel version from which CREATESESSION_V2 carries the client id (Artemis 2.18,
`PacketImpl.ARTEMIS_2_18_0_VERSION`)."""

_FNV_PRIME = 0x01000193
_FNV_PRIME_INVERSE = pow(_FNV_PRIME, -1, 1 << 32)
_MASK32 = 0xFFFFFFFF

_ROUTER_XML = """
      <connectors>
{connectors}
      </connectors>
      <connection-routers>
         <connection-router name="ch">
            <key-type>CLIENT_ID</key-type>
            <policy name="CONSISTENT_HASH"/>
            <pool>
               <username>{user}</username>
               <password>{password}</password>
               <check-period>{check_period_ms}</check-period>
               <quorum-size>3</quorum-size>
               <quorum-timeout>0</quorum-timeout>
               <static-connectors>
{connector_refs}
               </static-connectors>
            </pool>
         </connection-router>
         <connection-router name="mod">
            <key-type>CLIENT_ID</key-type>
            <local-target-filter>{local_filter}</local-target-filter>
            <policy name="CONSISTENT_HASH_MODULO">
               <property key="MODULO" value="{modulo}"/>
            </policy>
         </connection-router>
      </connection-routers>
"""
"""What goes after `</acceptors>` in the router broker's broker.xml."""

_ACCEPTORS_XML = """
         <acceptor name="ch">tcp://127.0.0.1:{ch_port}?router=ch;protocols=CORE,MQTT</acceptor>
         <acceptor name="mod">tcp://127.0.0.1:{mod_port}?router=mod;protocols=CORE,MQTT</acceptor>
      """
"""What goes last inside `<acceptors>` in the router broker's broker.xml."""

_CORE_PROBE_JAVA = """
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import org.apache.activemq.artemis.api.core.ActiveMQException;
import org.apache.activemq.artemis.api.core.client.ActiveMQClient;
import org.apache.activemq.artemis.api.core.client.ClientSession;
import org.apache.activemq.artemis.api.core.client.ClientSessionFactory;
import org.apache.activemq.artemis.api.core.client.ServerLocator;
import org.apache.activemq.artemis.core.protocol.core.CoreRemotingConnection;

/**
 * RouteProbe URL USER PASSWORD: for each client id on stdin (one a line, as hex UTF-16 code units,
 * so that any Java String gets through), open a CORE connection, wait until it knows the server's
 * version, create a session with the client id, and print the line, the version the connection had
 * before the wait, then `local` when the session opens, else the error type, the factory's
 * connector (a redirect's DISCONNECT_V3 replaces it with the target's) and the message. No
 * reconnectAttempts: the client does not follow the redirect.
 *
 * The wait: the client learns the server's version from the topology answer (CLUSTER_TOPOLOGY_V4)
 * on channel 0, and sends its client id (CREATESESSION_V2) only once it knows it is 131 (2.18) or
 * more; a session created before that answer is CREATESESSION without a client id, routed as NULL.
 */
public class RouteProbe {
  public static void main(String[] a) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
    String line;
    while ((line = in.readLine()) != null) {
      StringBuilder id = new StringBuilder();
      for (int i = 0; i < line.length(); i += 4) {
        id.append((char) Integer.parseInt(line.substring(i, i + 4), 16));
      }
      String outcome;
      try (ServerLocator locator = ActiveMQClient.createServerLocator(a[0]);
           ClientSessionFactory factory = locator.createSessionFactory()) {
        CoreRemotingConnection connection = (CoreRemotingConnection) factory.getConnection();
        int before = connection.getChannelVersion();
        for (int i = 0; i < 5000 && !connection.isVersionSupportClientID(); i++) {
          Thread.sleep(1);
        }
        String clientId = id.toString();
        try (ClientSession s = factory.createSession(a[1], a[2], false, true, true, false, 0, clientId)) {
          outcome = before + " local";
        } catch (ActiveMQException e) {
          outcome = before + " " + e.getType() + " " + factory.getConnectorConfiguration()
              + " " + e.getMessage();
        }
      }
      System.out.println(line + " " + outcome.replace('\\n', ' '));
      System.out.flush();
    }
  }
}
"""


@dataclass(frozen=True, slots=True)
class SideBySide:
    """The router broker and what the tests ask it and routerctl."""

    router: Artemis
    config: Path
    """The router broker's etc/broker.xml: Artemis's configuration and routerctl's."""
    ports: dict[str, int]
    """Acceptor of each connection router (`ch`, `mod`)."""
    node_ids: dict[str, str]
    """Connector name (`a1`, …) -> the node id of that broker."""
    target_ports: dict[int, str]
    """Port of each target broker (all on 127.0.0.1) -> its node id."""

    def jolokia(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Jolokia's answers to a bulk POST of `requests`, in order (ENVIRONMENT.md §8: an `Origin`
        of the console's own address, and Basic auth). `includeRequest=false`: Jolokia 2.1.1 echoes
        each request in its answer and writes U+001F there as `\\u001?`, which is not JSON; the
        answers' values are written correctly."""
        answers: list[dict[str, Any]] = []
        login = base64.b64encode(f"{ARTEMIS_USER}:{ARTEMIS_PASSWORD}".encode()).decode()
        for start in range(0, len(requests), JOLOKIA_BATCH):
            request = Request(
                f"http://127.0.0.1:{self.router.web_port}/console/jolokia/?includeRequest=false",
                data=json.dumps(requests[start : start + JOLOKIA_BATCH]).encode(),
                headers={
                    "Origin": f"http://127.0.0.1:{self.router.web_port}",
                    "Content-Type": "application/json",
                },
            )
            request.add_unredirected_header("Authorization", f"Basic {login}")
            with urlopen(request, timeout=TIMEOUT_S) as answer:
                answers += json.loads(answer.read())
        return answers

    def artemis_targets(self, router: str, keys: Sequence[str]) -> list[str]:
        """Artemis's management lookup `getTargetAsJSON(key)` for each key: the node id, `LOCAL`,
        or `REFUSED`."""
        mbean = f'org.apache.activemq.artemis:broker="router",component=connection-routers,name="{router}"'
        operation = "getTargetAsJSON(java.lang.String)"
        answers = self.jolokia(
            [{"type": "exec", "mbean": mbean, "operation": operation, "arguments": [key]} for key in keys]
        )
        found = []
        for key, answer in zip(keys, answers, strict=True):
            assert answer.get("status") == 200, f"{router} {key!r}: {answer}"
            if answer.get("value") is None:
                found.append(REFUSED)
                continue
            target = json.loads(answer["value"])
            if target["local"]:
                found.append(LOCAL)
            else:
                # Artemis learnt the node id from the broker: it is the one routerd has in the URL
                assert target["connector"]["extraProps"]["nodeId"] == target["nodeID"], target
                found.append(target["nodeID"])
        return found

    def routerctl_targets(self, router: str, keys: Sequence[str]) -> list[str]:
        """`routerctl route --json --config <broker.xml> --router ROUTER -- KEY…`, run once over the
        keys a command line can carry; the others (NUL, a lone high surrogate) through the same
        entry point in this process. The node id, `LOCAL` or `REFUSED` for each key."""
        carried = [key for key in keys if _fits_argv(key)]
        command = ["route", "--json", "--config", str(self.config), "--router", router]
        ran = subprocess.run(
            [*ROUTERCTL, *command, "--", *carried],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        decisions = dict(zip(carried, (json.loads(line) for line in ran.stdout.splitlines()), strict=True))
        rest = [key for key in keys if key not in decisions]
        decisions.update(zip(rest, _routerctl_in_process([*command, "--", *rest]), strict=True))
        return [_outcome(decisions[key]) for key in keys]

    def routerctl_connection(self, router: str, client_id: str) -> dict[str, Any]:
        """`routerctl route … --client-id=ID`, in this process: the whole workflow for one
        connection (the internal-client-id rule, key resolution), its decision."""
        command = ["route", "--json", "--config", str(self.config), "--router", router]
        [decision] = _routerctl_in_process([*command, f"--client-id={client_id}"])
        return decision

    def core_redirects(self, probe: Path, router: str, client_ids: Sequence[str]) -> tuple[list[str], int]:
        """Where a CORE session with each client id is sent by the router's acceptor (the compiled
        `RouteProbe` in `probe`, one JVM for all): a node id, `LOCAL`, `USE_ANOTHER` or
        `UNAVAILABLE` for each; and how many of the connections did not know the server's version
        yet when they were opened (without RouteProbe's wait, their client id would not have been
        sent)."""
        ran = subprocess.run(
            [
                *("java", "-Xmx64m", "-XX:TieredStopAtLevel=1"),
                *("-cp", ":".join([*map(str, ARTEMIS_CLIENT_CLASSPATH), str(probe)]), "RouteProbe"),
                *(f"tcp://127.0.0.1:{self.ports[router]}", ARTEMIS_USER, ARTEMIS_PASSWORD),
            ],
            input="".join(_utf16_hex(key) + "\n" for key in client_ids),
            capture_output=True,
            text=True,
            timeout=CORE_PROBE_TIMEOUT_S,
            check=False,
        )
        lines = ran.stdout.splitlines()
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert len(lines) == len(client_ids), ran.stdout + ran.stderr
        found: list[str] = []
        before: list[int] = []
        for key, line in zip(client_ids, lines, strict=True):
            sent, version, outcome = line.split(" ", 2)
            assert sent == _utf16_hex(key), line
            before.append(int(version))
            port = re.search(r"\?port=(\d+)", outcome)
            if outcome == "local":
                found.append(LOCAL)
            elif port is not None and int(port.group(1)) in self.target_ports:
                found.append(self.target_ports[int(port.group(1))])
            elif "AMQ229240" in outcome:
                found.append(USE_ANOTHER)
            elif "AMQ229238" in outcome:
                found.append(UNAVAILABLE)
            else:
                raise AssertionError(f"{router} {key!r}: {outcome}")
        return found, sum(version < _CORE_CLIENT_ID_VERSION for version in before)

    def mqtt_redirect(self, router: str, client_id: str) -> str:
        """Where an MQTT 5 client with this client id is sent by the router's acceptor: the node id
        of its CONNACK 0x9C's Server Reference, `LOCAL` when the router broker takes it (CONNACK
        0), `USE_ANOTHER` for 0x9C without a reference, `UNAVAILABLE` for 0x88."""
        reason, reference = mqtt5_connack(self.ports[router], client_id)
        if reason == 0:
            return LOCAL
        if reason == 0x9C:
            if reference is None:
                return USE_ANOTHER
            host, port = reference.rsplit(":", 1)
            assert host == "127.0.0.1", reference
            return self.target_ports[int(port)]
        if reason == 0x88:
            return UNAVAILABLE
        raise AssertionError(f"{router} {client_id!r}: CONNACK {reason:#x}")


def _utf16_hex(text: str) -> str:
    """The UTF-16 code units of `text` in hex, four digits each (a lone surrogate is one unit)."""
    return text.encode("utf-16-be", "surrogatepass").hex()


def _fits_argv(key: str) -> bool:
    """Whether a command line carries `key` unchanged (no NUL; encodable in the file system
    encoding with surrogateescape, so a lone U+D800 is not)."""
    if "\x00" in key:
        return False
    try:
        return os.fsdecode(os.fsencode(key)) == key
    except UnicodeEncodeError:
        return False


def _routerctl_in_process(argv: Sequence[str]) -> list[dict[str, Any]]:
    """routerctl's entry point (`main_routerctl`) in this process: its JSON lines."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main_routerctl(list(argv)) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _outcome(decision: dict[str, Any]) -> str:
    """A routerctl decision as the management lookup shows it: node id, `LOCAL` or `REFUSED`."""
    if decision["status"] != "OK":
        return REFUSED
    return LOCAL if decision["local"] else str(decision["node_id"])


def _connection_outcome(decision: dict[str, Any]) -> str:
    """A routerctl decision as a client sees it: node id, `LOCAL`, `USE_ANOTHER`, `UNAVAILABLE`."""
    if decision["status"] == "REFUSED_USE_ANOTHER":
        return USE_ANOTHER
    if decision["status"] == "REFUSED_UNAVAILABLE":
        return UNAVAILABLE
    return LOCAL if decision["local"] else str(decision["node_id"])


def _as_looked_up(landed: str) -> str:
    """Where a client landed, as the management lookup shows it (null for any refusal)."""
    return REFUSED if landed in (USE_ANOTHER, UNAVAILABLE) else landed


def mqtt5_connack(port: int, client_id: str) -> tuple[int, str | None]:
    """CONNECT with MQTT 5 (paho, login admin/admin) to 127.0.0.1:port: the CONNACK's reason code
    and Server Reference (None when absent). paho never follows a redirect (ENVIRONMENT.md §5).

    Returns only once the broker has closed the connection (after a refusal or a redirect), or
    answered our DISCONNECT (after a local connection), so that Artemis cleans connections up one
    at a time: Artemis 2.40 cleans a refused or redirected MQTT 5 connection up holding one lock
    that all of them share (`MQTTSessionState.DEFAULT`, MQTTSession.java:96, locked at
    MQTTSubscriptionManager.java:245) while `storeSessionState` waits up to 5 s for the commit of
    a journal record (MQTTStateManager.java:192). Here that wait sometimes ran its full 5 s
    (`AMQ850000: Unable to store MQTT state within given timeout: 5000ms`) even one connection at
    a time; with four clients redirected at once the waits piled up behind the lock and the
    broker answered no MQTT CONNECT any more (a thread dump showed them all blocked on it)."""
    got: list[tuple[int, str | None]] = []
    answered, closed = threading.Event(), threading.Event()

    def on_connect(client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        got.append((reason.value, getattr(props, "ServerReference", None)))
        answered.set()

    def on_disconnect(client: mqtt.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        closed.set()

    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=MQTTProtocolVersion.MQTTv5,
        reconnect_on_failure=False,
    )
    client.username_pw_set(ARTEMIS_USER, ARTEMIS_PASSWORD)
    client.on_connect = on_connect
    client.on_disconnect = on_disconnect
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert answered.wait(TIMEOUT_S), f"no CONNACK for {client_id!r} on {port}"
        if got[0][0] == 0:
            client.disconnect()
        assert closed.wait(TIMEOUT_S), f"{port} did not close the connection of {client_id!r}"
    finally:
        client.disconnect()
        client.loop_stop()
    return got[0]


# --- the client ids ----------------------------------------------------------------------------

AWKWARD_KEYS: tuple[str, ...] = (
    "",  # empty: the management lookup hashes it; a connection's key would be NULL in routerd
    " ",
    "   ",
    "\t",
    "\n",
    "\r\n",
    "NULL",  # the key of a connection without a client id: never transformed
    "null",
    "Null ",
    "[null]",  # Jolokia's marker for null in GET requests
    '""',  # Jolokia's marker for the empty string in GET requests
    "\x00",
    "a\x00b",
    "\x01\x1f\x7f",
    "\u0085\u00a0",
    "é",  # one UTF-16 unit, two UTF-8 bytes
    "e\u0301",  # the same, decomposed
    "日本語のクライアント",
    "клиент",
    "\U0001f600",  # astral: a surrogate pair, two UTF-16 units
    "\U0001f600" * 3 + "x",
    "\U00010000",
    "\U0010ffff",
    "\ud800",  # a lone high surrogate (a Java String may hold one; UTF-8 cannot)
    "a\udfff",  # a lone low surrogate
    "\udc80",
    "\ufffd",
    "\ufeffbom",
    "\u200b",
    "\u202eevil",
    "\ufffe",
    "\uffff",
    "x" * 5000,
    "é" * 3000,
    "\U0001f600" * 1500,
    "y" * DEFAULT_KEY_MAX_LENGTH,
    "y" * (DEFAULT_KEY_MAX_LENGTH + 1),
    ".*",
    "^$",
    "(a+)+$",
    "[",
    "]",
    "(",
    "\\",
    "\\d+",
    "a|b",
    "NULL|0",
    "0",
    "1",
    "2",
    "-1",
    "2147483648",
    "-x",
    "--",
    "--router",
    "-",
    "a b",
    "a/b/c",
    "a+b",
    "a#b",
    "#",
    "+",
    "$SYS/x",
    "${env:HOME}",
    "$(id)",
    "`id`",
    "%s%n",
    "%00",
    "%2F",
    "'; DROP TABLE t; --",
    "<xml/>",
    "&amp;",
    '"quoted"',
    "{}",
    '{"key": 1}',
    "a=b;c=d",
    "?x=1&y=2",
    "tcp://127.0.0.1:61616",
    "127.0.0.1",
    "::1",
    "user@example.com",
    "CLIENT_ID",
    "$.artemis.internal.router.client.",  # the internal prefix: routed by hash in a lookup
    INTERNAL_CLIENT_ID_PREFIX + "abc",
    "ID:host-1234-1700000000000-1:1",  # an OpenWire connection id
    "paho" + "9" * 20,
    "mqttx_1a2b3c4d",
    "ÀÉÎÕÜ",
    "🙂 client",
    "\u0000\u0000",
    "tab\tinside",
)
"""Client ids a key filter, a parser, a shell, an encoder or a hash might treat specially."""


def _nice(unit: int) -> bool:
    """A BMP character an MQTT 5 client id may hold (§1.5.4: no surrogates, no control characters,
    no non-characters)."""
    return not (
        unit < 0x20
        or 0x7F <= unit <= 0x9F
        or 0xD800 <= unit <= 0xDFFF
        or 0xFDD0 <= unit <= 0xFDEF
        or unit >= 0xFFFE
    )


def key_with_hash(wanted: int, prefix: str) -> str | None:
    """A key `prefix` + two printable BMP characters whose Artemis hash is `wanted` (a signed
    int32), or None when no such pair follows this prefix. FNV-1a steps are invertible: the last
    one must turn `h1 ^ c2` into `wanted`, so `h1 ^ c2 = wanted * prime⁻¹ mod 2³²`, and the first
    character is searched for an `h1` whose high 16 bits match."""
    before_last = ((wanted & _MASK32) * _FNV_PRIME_INVERSE) & _MASK32
    h0 = artemis_hash(prefix) & _MASK32
    for c1 in range(0x20, 0x10000):
        h1 = ((h0 ^ c1) * _FNV_PRIME) & _MASK32
        if h1 >> 16 == before_last >> 16 and _nice(c1) and _nice(c2 := (h1 ^ before_last) & 0xFFFF):
            return prefix + chr(c1) + chr(c2)
    return None


def edge_keys(node_ids: Sequence[str]) -> list[str]:
    """The node ids themselves, and keys whose hash is each node's ring point, one below, one
    above, and the int32 extremes, 0 and -1 (CONSISTENT_HASH's `floorEntry(hash) ?? firstEntry()`)."""
    wanted = [-(2**31), 2**31 - 1, 0, -1]
    for node_id in node_ids:
        point = artemis_hash(node_id)
        wanted += [point - 1, point, point + 1]
    keys = list(node_ids)
    for value in wanted:
        value = (value + 2**31) % 2**32 - 2**31  # wrap into int32
        key = next(k for n in range(100) if (k := key_with_hash(value, f"edge{value}-{n}-")) is not None)
        assert artemis_hash(key) == value
        keys.append(key)
    return keys


def ordinary_keys(count: int) -> list[str]:
    """`count` different client ids of the kinds real clients use, from a fixed seed."""
    rng = random.Random(32)
    makers = (
        lambda i: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        lambda i: f"client-{i}",
        lambda i: f"paho{rng.randrange(10**15)}",
        lambda i: f"device/{rng.randrange(10**6):06d}/sensor",
        lambda i: f"user{i}@example.com",
        lambda i: f"ID:host-{rng.randrange(10**5)}-{rng.randrange(10**13)}-1:{i}",
        lambda i: "".join(
            rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(rng.randrange(4, 40))
        ),
    )
    keys: dict[str, None] = {}
    while len(keys) < count:
        keys[makers[len(keys) % len(makers)](len(keys))] = None
    return list(keys)


MQTT_KEYS = (
    "NULL",
    "null",
    "é",
    "e\u0301",
    "日本語のクライアント",
    "\U0001f600" * 3 + "x",
    "\ufeffbom",
    "[null]",
    "a b",
    "$SYS/x",
    "y" * DEFAULT_KEY_MAX_LENGTH,
    INTERNAL_CLIENT_ID_PREFIX + "abc",
)
"""The MQTT 5 sample, with two edge keys and two ordinary ones: client ids an MQTT client can send
(UTF-8 without NUL or surrogates, MQTT 5 §1.5.4) that routerd keeps as they are (not empty, at most
`key-max-length` characters). Not `'` (Artemis 2.40 builds a selector from the MQTT client id
unescaped, `_AMQ_LVQ_NAME = '<id>'`, and logs AMQ229020 at every such disconnect; the routing is
right, the CORE sample has the key)."""


# --- the router broker and the CORE client -----------------------------------------------------


@pytest.fixture(scope="module")
def side_by_side(
    tmp_path_factory: pytest.TempPathFactory, artemis_template: Path, artemis_brokers: tuple[Artemis, ...]
) -> Iterator[SideBySide]:
    """The router broker with the two connection routers over the session's brokers, started, its
    `ch` pool ready (every target probed ready: quorum 3)."""
    node_ids = {}
    for broker in artemis_brokers:
        line = broker.wait_log(r"AMQ221001: .*nodeID=", timeout=0)
        match = re.search(r"nodeID=([0-9a-f-]+)", line)
        assert match is not None, line
        node_ids[broker.name] = match.group(1)
    router = Artemis("router", tmp_path_factory.mktemp("artemis-router") / "router", web_port=free_port())
    router.make(artemis_template)
    ports = {"ch": free_port(), "mod": free_port()}
    config = router.base / "etc" / "broker.xml"
    routers_xml = _ROUTER_XML.format(
        connectors="\n".join(
            f'         <connector name="{b.name}">tcp://127.0.0.1:{b.port}?nodeId={node_ids[b.name]}</connector>'
            for b in artemis_brokers
        ),
        connector_refs="\n".join(
            f"                  <connector-ref>{b.name}</connector-ref>" for b in artemis_brokers
        ),
        user=ARTEMIS_USER,
        password=ARTEMIS_PASSWORD,
        check_period_ms=CHECK_PERIOD_MS,
        local_filter=LOCAL_FILTER,
        modulo=MODULO,
    )
    acceptors_xml = _ACCEPTORS_XML.format(ch_port=ports["ch"], mod_port=ports["mod"])
    config.write_text(
        broker_xml(config.read_text(), what=router.name, acceptors=acceptors_xml, after_acceptors=routers_xml)
    )
    try:
        started = time.monotonic()
        router.start()
        router.wait_ready(TIMEOUT_S)
        side = SideBySide(
            router=router,
            config=config,
            ports=ports,
            node_ids=node_ids,
            target_ports={b.port: node_ids[b.name] for b in artemis_brokers},
        )
        # The pool probes its targets every check-period; with quorum 3 a lookup answers only once
        # all three are ready, so the first answer for a probe key is the readiness signal.
        while side.artemis_targets("ch", ["readiness-probe"]) == [REFUSED]:
            assert time.monotonic() - started < TIMEOUT_S, (
                "Artemis's pool never became ready:\n" + router.since_start()[-3000:]
            )
            time.sleep(0.1)  # another process's probes: nothing to wait on
        yield side
    finally:
        router.stop()


@pytest.fixture(scope="module")
def core_probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`RouteProbe` compiled against Artemis's standalone client jar: the directory of its class."""
    require_java()
    directory = tmp_path_factory.mktemp("core-probe")
    (directory / "RouteProbe.java").write_text(_CORE_PROBE_JAVA)
    subprocess.run(
        [
            *("javac", "-cp", ":".join(map(str, ARTEMIS_CLIENT_CLASSPATH))),
            *("-d", str(directory), str(directory / "RouteProbe.java")),
        ],
        check=True,
        timeout=ARTEMIS_TIMEOUT_S,
    )
    return directory


# --- the comparisons ---------------------------------------------------------------------------


def all_keys(side: SideBySide) -> list[str]:
    """The awkward keys, the edge keys of this ring and the ordinary keys, each once, in order."""
    keys = [*AWKWARD_KEYS, *edge_keys(sorted(side.node_ids.values())), *ordinary_keys(ORDINARY_KEYS)]
    return list(dict.fromkeys(keys))


def disagreements(keys: Sequence[str], first: Sequence[str], second: Sequence[str]) -> list[str]:
    """`key: first / second` for each key on which the two lists differ."""
    return [
        f"{key[:40]!r}{'…' if len(key) > 40 else ''} ({len(key)} chars): {a} / {b}"
        for key, a, b in zip(keys, first, second, strict=True)
        if a != b
    ]


def test_side_by_side_consistent_hash_management_lookup(side_by_side: SideBySide):
    """Scenario: CONSISTENT_HASH on 1,107 client ids: Artemis's `getTargetAsJSON` and `routerctl
    route` name the same broker for every one, and every broker gets some."""
    keys = all_keys(side_by_side)
    assert len(keys) == 1107
    artemis = side_by_side.artemis_targets("ch", keys)
    ours = side_by_side.routerctl_targets("ch", keys)
    assert disagreements(keys, artemis, ours) == [], "Artemis / routerctl"
    assert set(artemis) == set(side_by_side.node_ids.values()), "a ready pool: no refusal, every target"


def test_side_by_side_consistent_hash_modulo_management_lookup(side_by_side: SideBySide):
    """Scenario: CONSISTENT_HASH_MODULO (MODULO 3, local-target-filter `NULL|0`, no pool) on the
    same client ids: the same keys stay local in both, the others are refused in both."""
    keys = all_keys(side_by_side)
    artemis = side_by_side.artemis_targets("mod", keys)
    ours = side_by_side.routerctl_targets("mod", keys)
    assert disagreements(keys, artemis, ours) == [], "Artemis / routerctl"
    assert set(artemis) == {LOCAL, REFUSED}
    assert artemis[keys.index("NULL")] == LOCAL, "NULL is never transformed, and the filter takes it"


@pytest.mark.parametrize("router", ["ch", "mod"])
def test_side_by_side_core_redirect(side_by_side: SideBySide, core_probe: Path, router: str):
    """Scenario: a CORE client opens a session with each of 147 client ids (every awkward and edge
    one, and 40 ordinary ones; a CORE client id is any Java String, NUL and lone surrogates
    included) through the router's acceptor. Where Artemis sends it (DISCONNECT_V3's connector, a
    session on the router broker, AMQ229240) is where `routerctl route --client-id` sends it, except
    for the keys routerd treats as missing on purpose (empty, or longer than `key-max-length`: the
    key is `NULL`); and it is what the management lookup says, except for the internal client-id
    prefix, which only a connection checks (`ConnectionRouter.getTarget(connection, clientID,
    username)`)."""
    keys = all_keys(side_by_side)
    sample = keys[: len(keys) - ORDINARY_KEYS] + keys[-REDIRECTED_ORDINARY_KEYS:]
    outcomes, early = side_by_side.core_redirects(core_probe, router, sample)
    landed = dict(zip(sample, outcomes, strict=True))
    print(f"{early} of {len(sample)} CORE connections did not know the server's version when opened")

    asked = sample  # `--client-id=--` too (routerctl gives back what Python 3.11's argparse drops)
    ours = {key: side_by_side.routerctl_connection(router, key) for key in asked}
    missing = [key for key in asked if key == "" or len(key) > DEFAULT_KEY_MAX_LENGTH]
    assert len(missing) == 5
    assert [ours[key]["key"] for key in missing] == ["NULL"] * len(missing)
    kept = [key for key in asked if key not in missing]
    assert (
        disagreements(kept, [landed[key] for key in kept], [_connection_outcome(ours[key]) for key in kept])
        == []
    ), "Artemis's redirect / routerctl route --client-id"

    looked_up = dict(zip(sample, side_by_side.artemis_targets(router, sample), strict=True))
    internal = [key for key in sample if key.startswith(INTERNAL_CLIENT_ID_PREFIX)]
    assert len(internal) == 2
    assert [landed[key] for key in internal] == [LOCAL, LOCAL]
    others = [key for key in sample if key not in internal]
    assert (
        disagreements(
            others, [_as_looked_up(landed[key]) for key in others], [looked_up[key] for key in others]
        )
        == []
    ), "Artemis's redirect / Artemis's management lookup"


@pytest.mark.parametrize("router", ["ch", "mod"])
def test_side_by_side_mqtt5_redirect(side_by_side: SideBySide, router: str):
    """Scenario: MQTT 5 clients with 16 of the client ids, one at a time: the CONNACK (0x9C with
    the Server Reference of a target, 0x9C without one, or success on the router broker) says
    what `routerctl route --client-id` says, and the management lookup (but for the internal
    prefix)."""
    keys = all_keys(side_by_side)
    edge = edge_keys(sorted(side_by_side.node_ids.values()))
    sample = [*MQTT_KEYS, *edge[4:6], *keys[-2:]]
    assert all(key in keys for key in sample)
    landed = [side_by_side.mqtt_redirect(router, key) for key in sample]
    ours = [_connection_outcome(side_by_side.routerctl_connection(router, key)) for key in sample]
    assert disagreements(sample, landed, ours) == [], "Artemis's redirect / routerctl route --client-id"
    looked_up = side_by_side.artemis_targets(router, sample)
    others = [i for i, key in enumerate(sample) if not key.startswith(INTERNAL_CLIENT_ID_PREFIX)]
    assert len(others) == len(sample) - 1
    assert (
        disagreements(
            [sample[i] for i in others],
            [_as_looked_up(landed[i]) for i in others],
            [looked_up[i] for i in others],
        )
        == []
    ), "Artemis's redirect / Artemis's management lookup"
    assert landed[sample.index(INTERNAL_CLIENT_ID_PREFIX + "abc")] == LOCAL, "the internal prefix stays"
