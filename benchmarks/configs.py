"""The configurations the benchmark generates: HAProxy, its Lua MQTT redirect, routerd, mosquitto,
and for the artemis group Artemis's broker.xml as a pure router, its targets' and routerd's.

Pure text from a `Ports` (or `ArtemisPorts`) plan and the text `artemis create` wrote (changed
through tools/artemis_instance.py, as the test suite's brokers are); no I/O here. Every HAProxy
setting is explained in benchmarks/README.md ("HAProxy settings"), the artemis group's in
"Artemis's own router"; keep them in step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Final

from tools.artemis_instance import broker_xml

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "ARTEMIS_PASSWORD",
    "ARTEMIS_ROUTER",
    "ARTEMIS_TARGETS",
    "ARTEMIS_USER",
    "HAPROXY_MAXCONN",
    "PROBE_LOCAL_CLIENT_ID",
    "PROBE_OTHER_CLIENT_ID",
    "ArtemisPorts",
    "HaproxyLimits",
    "Ports",
    "artemis_log4j2",
    "artemis_router_xml",
    "artemis_target_xml",
    "haproxy_config",
    "haproxy_maxconn",
    "haproxy_mqtt_pool_config",
    "mosquitto_config",
    "mqtt_redirect_lua",
    "routerd_artemis_config",
    "routerd_config",
]

HAPROXY_MAXCONN: Final = 9000
"""Above the 5,000 idle connections of the memory figure; HAProxy needs about two descriptors per
connection, so 9,000 stays under the FD hard limit of 20,000 (ENVIRONMENT.md §3.6, gotcha 7)."""

_FDS_PER_HAPROXY_CONN: Final = 2
_HAPROXY_SPARE_FDS: Final = 500
"""Listeners, health checks, the Lua runtime and HAProxy's own margin."""

PROBE_LOCAL_CLIENT_ID: Final = "bench-probe-local"
"""A client id that the probe router's local-target-filter takes (see `routerd_config`)."""
PROBE_OTHER_CLIENT_ID: Final = "bench-probe-other"
"""A client id that the probe router sends to mosquitto."""

CHECK_PERIOD_MS: Final = 1000
"""Health probes of routerd's pools and HAProxy's `check inter`: the same period on both."""

IPERF_CHECK_PERIOD_MS: Final = 600_000
"""iperf3's server takes every connection for a test client and logs probes as errors; a
connection arriving while a test sets up its streams could even be taken for one. routerd probes
its pools at start (which makes the target ready), so a period longer than the run means one probe."""


_MQTT_VALID: Final = """\
    tcp-request inspect-delay 10s
    tcp-request content reject unless { req.payload(0,0),mqtt_is_valid }"""
"""A HAProxy frontend's lines that wait for a whole, valid MQTT CONNECT (and refuse anything else)."""

_MQTT_CLIENT_ID_HASH: Final = """\
    balance hash req.payload(0,0),mqtt_field_value(connect,client_identifier)
    hash-type consistent"""
"""A HAProxy backend's lines that pick the server by a consistent hash of the MQTT client id."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _PortPlan:
    """What every port plan shares (`Ports`, `ArtemisPorts`): `COUNT` TCP ports on 127.0.0.1, listed
    in field order by `all` and taken in that order by `from_numbers`, distinct and below the
    ephemeral range (benchmarks/fleet.py `pick_ports` chooses them)."""

    COUNT: ClassVar[int]
    """How many ports a plan has."""

    def all(self) -> list[int]:
        """Every port of the plan, in field order."""
        raise NotImplementedError

    @classmethod
    def _taken(cls, numbers: Sequence[int]) -> Sequence[int]:
        """`numbers`, checked to be `COUNT` of them (`from_numbers`).

        Raises:
            ValueError: not `COUNT` numbers.
        """
        if len(numbers) != cls.COUNT:
            raise ValueError(f"a {cls.__name__} plan takes {cls.COUNT} ports, got {len(numbers)}")
        return numbers

    def __post_init__(self) -> None:
        ports = self.all()
        if len(set(ports)) != len(ports):
            raise ValueError(f"ports must be distinct, got {ports!r}")
        bad = [p for p in ports if not 1024 <= p < 32768]
        if bad:
            raise ValueError(f"ports must be in 1024-32767 (below the ephemeral range), got {bad!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ports(_PortPlan):
    """Every TCP port of one run (a `_PortPlan`)."""

    echo: tuple[int, int]
    """The two echo backends (one C process listening on both)."""
    iperf: int
    """`iperf3 -s`."""
    mosquitto: int
    haproxy_echo: int
    haproxy_iperf: int
    haproxy_mqtt: int
    haproxy_redirect: int
    routerd_echo: int
    routerd_iperf: int
    routerd_mqtt: int
    routerd_redirect: int
    routerd_probe: int
    """An MQTT acceptor whose router shows whether CLIENT_ID reaches routerd (see `routerd_config`)."""
    routerd_admin: int

    COUNT: ClassVar[int] = 14
    """How many ports a plan has (`all` lists them, `from_numbers` takes them, in field order)."""

    @classmethod
    def from_numbers(cls, numbers: Sequence[int]) -> Ports:
        """A plan from `COUNT` port numbers in field order (the inverse of `all`).

        Raises:
            ValueError: not `COUNT` numbers, or the plan is invalid (see `__post_init__`).
        """
        n = cls._taken(numbers)
        return cls(
            echo=(n[0], n[1]), iperf=n[2], mosquitto=n[3], haproxy_echo=n[4], haproxy_iperf=n[5],
            haproxy_mqtt=n[6], haproxy_redirect=n[7], routerd_echo=n[8], routerd_iperf=n[9],
            routerd_mqtt=n[10], routerd_redirect=n[11], routerd_probe=n[12], routerd_admin=n[13],
        )  # fmt: skip

    PROXY_COUNT: ClassVar[int] = 10
    """How many of them the proxies listen on (`with_proxy_ports`)."""

    def with_proxy_ports(self, numbers: Sequence[int]) -> Ports:
        """This plan with new ports for HAProxy's frontends and routerd's acceptors and admin API, the
        backends kept: a second HAProxy and routerd (the instructions group's, under callgrind) in
        front of the same backends as the fleet's, which keep their own ports.

        Args:
            numbers: `PROXY_COUNT` ports, in field order (haproxy_echo ... routerd_admin).

        Raises:
            ValueError: not `PROXY_COUNT` numbers, or the plan is invalid (see `__post_init__`).
        """
        if len(numbers) != self.PROXY_COUNT:
            raise ValueError(f"a plan's proxies take {self.PROXY_COUNT} ports, got {len(numbers)}")
        return Ports.from_numbers([*self.all()[: self.COUNT - self.PROXY_COUNT], *numbers])

    def all(self) -> list[int]:
        return [
            *self.echo,
            self.iperf,
            self.mosquitto,
            self.haproxy_echo,
            self.haproxy_iperf,
            self.haproxy_mqtt,
            self.haproxy_redirect,
            self.routerd_echo,
            self.routerd_iperf,
            self.routerd_mqtt,
            self.routerd_redirect,
            self.routerd_probe,
            self.routerd_admin,
        ]


def haproxy_maxconn(fd_limit: int) -> int:
    """`HAPROXY_MAXCONN`, lowered when the descriptor limit could not hold it.

    Args:
        fd_limit: the RLIMIT_NOFILE soft limit HAProxy will inherit.

    Returns:
        The maxconn to write, at least 1.
    """
    return max(1, min(HAPROXY_MAXCONN, (fd_limit - _HAPROXY_SPARE_FDS) // _FDS_PER_HAPROXY_CONN))


def haproxy_config(ports: Ports, *, lua_path: str, maxconn: int = HAPROXY_MAXCONN) -> str:
    """HAProxy 2.6 in TCP mode, one thread, in front of the same backends as routerd.

    Args:
        ports: the run's ports.
        lua_path: the file written from `mqtt_redirect_lua`.
        maxconn: from `haproxy_maxconn`.

    Returns:
        The text of haproxy.cfg (check it with `haproxy -c -f`).
    """
    e1, e2 = ports.echo
    return f"""\
# Generated by benchmarks/run.py. Every setting is explained in benchmarks/README.md.
global
    nbthread 1
    maxconn {maxconn}
    lua-load {lua_path}

defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s

frontend echo
    bind 127.0.0.1:{ports.haproxy_echo}
    default_backend echo

backend echo
    balance source
    hash-type consistent
    server echo-1 127.0.0.1:{e1} check inter {CHECK_PERIOD_MS}
    server echo-2 127.0.0.1:{e2} check inter {CHECK_PERIOD_MS}

frontend iperf
    bind 127.0.0.1:{ports.haproxy_iperf}
    default_backend iperf

backend iperf
    balance source
    hash-type consistent
    server iperf 127.0.0.1:{ports.iperf}

frontend mqtt
    bind 127.0.0.1:{ports.haproxy_mqtt}
{_MQTT_VALID}
    default_backend mqtt

backend mqtt
{_MQTT_CLIENT_ID_HASH}
    server mosquitto 127.0.0.1:{ports.mosquitto} check inter {CHECK_PERIOD_MS}

frontend mqtt-redirect
    bind 127.0.0.1:{ports.haproxy_redirect}
    tcp-request inspect-delay 10s
    tcp-request content use-service lua.mqtt_redirect
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class HaproxyLimits:
    """HAProxy's storm levers for `haproxy_mqtt_pool_config`; None = not set."""

    server_maxconn: int | None = None
    """Each server's `maxconn`: connections open to it at once; more wait in its queue."""
    server_maxqueue: int | None = None
    """Each server's `maxqueue`: connections that may wait for it (HAProxy's default: no bound)."""
    queue_timeout_ms: int | None = None
    """`timeout queue`: how long one may wait (HAProxy's default: `timeout connect`)."""
    rate_limit_sessions: int | None = None
    """The frontend's `rate-limit sessions`: new sessions a second it accepts, all servers
    together (HAProxy has no per-server connect rate)."""


def haproxy_mqtt_pool_config(
    port: int,
    servers: Sequence[tuple[str, int]],
    *,
    maxconn: int,
    limits: HaproxyLimits,
    check_ms: int = CHECK_PERIOD_MS,
) -> str:
    """HAProxy 2.6, TCP mode, one thread, in front of several MQTT brokers, each client sent by a
    consistent hash of its MQTT client id (`mqtt_field_value`, as the `mqtt` backend of
    `haproxy_config`), with HAProxy's storm levers (`HaproxyLimits`).

    A server that refuses a connect is marked down at once (`observe layer4`, `error-limit 1`,
    `on-error mark-down`: HAProxy's passive health, as routerd's) and the connect goes to another
    server (`option redispatch`, `retries 2`); checks every `check_ms` as routerd's probes.

    Args:
        port: the frontend's port on 127.0.0.1.
        servers: (name, port on 127.0.0.1) of each broker.
        maxconn: the global and the frontend's `maxconn` (from `haproxy_maxconn`).
        limits: the levers to set.
        check_ms: `check inter`.

    Returns:
        The text of haproxy.cfg (check it with `haproxy -c -f`).
    """
    server_opts = f" check inter {check_ms} observe layer4 error-limit 1 on-error mark-down"
    if limits.server_maxconn is not None:
        server_opts += f" maxconn {limits.server_maxconn}"
    if limits.server_maxqueue is not None:
        server_opts += f" maxqueue {limits.server_maxqueue}"
    lines = "\n".join(f"    server {name} 127.0.0.1:{p}{server_opts}" for name, p in servers)
    queue = "" if limits.queue_timeout_ms is None else f"\n    timeout queue {limits.queue_timeout_ms}ms"
    rate = (
        ""
        if limits.rate_limit_sessions is None
        else f"\n    rate-limit sessions {limits.rate_limit_sessions}"
    )
    return f"""\
# Generated by benchmarks/configs.py (haproxy_mqtt_pool_config).
global
    nbthread 1
    maxconn {maxconn}

defaults
    mode tcp
    timeout connect 5s
    timeout client 600s
    timeout server 600s{queue}

frontend mqtt
    bind 127.0.0.1:{port}
    maxconn {maxconn}{rate}
{_MQTT_VALID}
    default_backend brokers

backend brokers
{_MQTT_CLIENT_ID_HASH}
    option redispatch
    retries 2
{lines}
"""


def mqtt_redirect_lua(server_reference: str) -> str:
    """A HAProxy Lua TCP service that answers one MQTT 5 CONNECT with CONNACK 0x9C and closes.

    HAProxy cannot redirect MQTT by itself; this is the smallest fair equivalent of routerd's
    redirect mode: read the whole CONNECT (MQTT 5 §3.1: fixed header, remaining length as a
    variable byte integer, then the body), answer CONNACK (§3.2) with reason code 0x9C "Use another
    server" and the property Server Reference (0x1C, a UTF-8 string, §3.2.2.3.16). It does not
    look at the client id: with one broker the reference is the same for every client.

    Args:
        server_reference: "host:port" to send.

    Returns:
        The Lua source.
    """
    if not server_reference or len(server_reference) > 100 or '"' in server_reference:
        raise ValueError(
            f"server reference must be 1-100 characters without quotes, got {server_reference!r}"
        )
    return f"""\
-- Generated by benchmarks/run.py: MQTT 5 CONNECT -> CONNACK 0x9C (Use another server).
local reference = "{server_reference}"

core.register_service("mqtt_redirect", "tcp", function(applet)
    local head = applet:receive(2)
    if head == nil or #head < 2 or head:byte(1) ~= 0x10 then return end
    local remaining, multiplier, byte, count = 0, 1, head:byte(2), 1
    while true do
        remaining = remaining + (byte & 0x7f) * multiplier
        if byte & 0x80 == 0 then break end
        count = count + 1
        if count > 4 then return end
        multiplier = multiplier * 128
        local more = applet:receive(1)
        if more == nil or #more < 1 then return end
        byte = more:byte(1)
    end
    local body = applet:receive(remaining)
    if body == nil or #body < remaining then return end
    local properties = string.char(0x1c) .. string.pack(">s2", reference)
    local variable = string.char(0x00, 0x9c, #properties) .. properties
    applet:send(string.char(0x20, #variable) .. variable)
end)
"""


def _router(name: str, key_type: str, connectors: list[str], *, extra: str = "", check_ms: int) -> str:
    refs = "\n".join(f"            <connector-ref>{c}</connector-ref>" for c in connectors)
    return f"""\
      <connection-router name="{name}">
        <key-type>{key_type}</key-type>{extra}
        <cache>
          <timeout>60000</timeout>
        </cache>
        <policy name="CONSISTENT_HASH"/>
        <pool>
          <check-period>{check_ms}</check-period>
          <quorum-size>1</quorum-size>
          <static-connectors>
{refs}
          </static-connectors>
        </pool>
      </connection-router>"""


def routerd_config(ports: Ports) -> str:
    """routerd's broker.xml: static pools, CONSISTENT_HASH, proxy mode (and one redirect acceptor).

    Routers: `echo` (SOURCE_IP over the two echo backends), `iperf` (SOURCE_IP), `mqtt` (CLIENT_ID
    over mosquitto; a proxy acceptor and a `mode=redirect` acceptor), and `mqtt-probe`: CLIENT_ID
    with a local-target-filter that takes only `PROBE_LOCAL_CLIENT_ID` and no local connector, so
    a client with that id is refused exactly when routerd has read the client id from the CONNECT
    (otherwise the key is NULL and the client reaches mosquitto).

    Args:
        ports: the run's ports.

    Returns:
        The XML text.
    """
    e1, e2 = ports.echo
    probe_filter = f"\n        <local-target-filter>{PROBE_LOCAL_CLIENT_ID}</local-target-filter>"
    routers = "\n".join(
        [
            _router("echo", "SOURCE_IP", ["echo-1", "echo-2"], check_ms=CHECK_PERIOD_MS),
            _router("iperf", "SOURCE_IP", ["iperf"], check_ms=IPERF_CHECK_PERIOD_MS),
            _router("mqtt", "CLIENT_ID", ["mosquitto"], check_ms=CHECK_PERIOD_MS),
            _router("mqtt-probe", "CLIENT_ID", ["mosquitto"], extra=probe_filter, check_ms=CHECK_PERIOD_MS),
        ]
    )
    return f"""\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by benchmarks/run.py: routerd in front of the benchmark's backends. -->
<configuration xmlns="urn:activemq">
  <core xmlns="urn:activemq:core">
    <connectors>
      <connector name="echo-1">tcp://127.0.0.1:{e1}?nodeId=echo-1</connector>
      <connector name="echo-2">tcp://127.0.0.1:{e2}?nodeId=echo-2</connector>
      <connector name="iperf">tcp://127.0.0.1:{ports.iperf}?nodeId=iperf</connector>
      <connector name="mosquitto">tcp://127.0.0.1:{ports.mosquitto}?nodeId=mosquitto</connector>
    </connectors>
    <acceptors>
      <acceptor name="echo">tcp://127.0.0.1:{ports.routerd_echo}?router=echo;mode=proxy</acceptor>
      <acceptor name="iperf">tcp://127.0.0.1:{ports.routerd_iperf}?router=iperf;mode=proxy</acceptor>
      <acceptor name="mqtt">tcp://127.0.0.1:{ports.routerd_mqtt}?router=mqtt;protocols=MQTT;mode=proxy</acceptor>
      <acceptor name="mqtt-redirect">tcp://127.0.0.1:{ports.routerd_redirect}?router=mqtt;protocols=MQTT;mode=redirect</acceptor>
      <acceptor name="mqtt-probe">tcp://127.0.0.1:{ports.routerd_probe}?router=mqtt-probe;protocols=MQTT;mode=proxy</acceptor>
    </acceptors>
    <connection-routers>
{routers}
    </connection-routers>
  </core>
</configuration>
"""


def mosquitto_config(port: int) -> str:
    """mosquitto on 127.0.0.1:port, anonymous, no persistence, errors and warnings to stderr."""
    return (
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        "log_dest stderr\nlog_type error\nlog_type warning\n"
    )


# --- the artemis group: Artemis 2.40 as a pure router, its target brokers, routerd beside it ------

ARTEMIS_USER: Final = "admin"
ARTEMIS_PASSWORD: Final = "admin"
"""The target brokers' login (`artemis create --user --password --require-login`): the pools'
credentials (Artemis's pool opens a CORE session to each target) and the Java client's."""
ARTEMIS_ROUTER: Final = "bench"
"""The connection router's name, in Artemis's broker.xml and routerd's configuration alike."""
ARTEMIS_TARGETS: Final = ("target-1", "target-2")
"""The target brokers' names: the connectors' names (and routerd's node ids, by default)."""
_ARTEMIS_CREATED_PROTOCOLS: Final = "protocols=CORE,AMQP,STOMP,HORNETQ,MQTT,OPENWIRE"
ARTEMIS_ROUTER_PROTOCOLS: Final = "CORE,AMQP,MQTT"
"""What the router acceptors of both take: the three protocols the group measures."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ArtemisPorts(_PortPlan):
    """The artemis group's TCP ports (a `_PortPlan`)."""

    targets: tuple[int, int]
    """The two target brokers' acceptors (every protocol)."""
    artemis_router: int
    """The Artemis router broker's acceptor (`router=`, CORE, AMQP, MQTT)."""
    routerd_redirect: int
    """routerd's `mode=redirect` acceptor (CORE, AMQP, MQTT)."""
    routerd_admin: int

    COUNT: ClassVar[int] = 5

    @classmethod
    def from_numbers(cls, numbers: Sequence[int]) -> ArtemisPorts:
        """A plan from `COUNT` port numbers in field order.

        Raises:
            ValueError: not `COUNT` numbers, or not distinct ports in 1024-32767.
        """
        n = cls._taken(numbers)
        return cls(targets=(n[0], n[1]), artemis_router=n[2], routerd_redirect=n[3], routerd_admin=n[4])

    def all(self) -> list[int]:
        return [*self.targets, self.artemis_router, self.routerd_redirect, self.routerd_admin]


def artemis_target_xml(created: str, *, name: str, port: int) -> str:
    """A target broker's broker.xml: what `artemis create` wrote, with its name and port.

    Args:
        created: the template's etc/broker.xml.
        name: the broker's name.
        port: its acceptor's port (all protocols, login required).

    Raises:
        ValueError: `created` lacks the name or the acceptor `artemis create` writes.
    """
    return broker_xml(created, what=f"target {name}", name=name, port=port)


def _routers_xml(targets: tuple[int, int], *, check_ms: int) -> str:
    """The connectors and the connection router, the same text in both routers' files."""
    connectors = "\n".join(
        f'      <connector name="{n}">tcp://127.0.0.1:{p}</connector>'
        for n, p in zip(ARTEMIS_TARGETS, targets, strict=True)
    )
    refs = "\n".join(f"            <connector-ref>{n}</connector-ref>" for n in ARTEMIS_TARGETS)
    return f"""
    <connectors>
{connectors}
    </connectors>
    <connection-routers>
      <connection-router name="{ARTEMIS_ROUTER}">
        <key-type>CLIENT_ID</key-type>
        <policy name="CONSISTENT_HASH"/>
        <pool>
          <username>{ARTEMIS_USER}</username>
          <password>{ARTEMIS_PASSWORD}</password>
          <check-period>{check_ms}</check-period>
          <quorum-size>1</quorum-size>
          <static-connectors>
{refs}
          </static-connectors>
        </pool>
      </connection-router>
    </connection-routers>"""


def artemis_router_xml(created: str, *, name: str, port: int, targets: tuple[int, int]) -> str:
    """The router broker's broker.xml: what `artemis create` wrote, with its acceptor made a router
    acceptor (`router=bench;protocols=CORE,AMQP,MQTT`, its other parameters as created), and the
    connectors and router of `_routers_xml`: CONSISTENT_HASH on CLIENT_ID over the two targets, no
    cache, no local target. A pure router holds no messages, so:

    - persistence off: with the journal on, each MQTT redirect stores the client's session state
      in it (`MQTTSession.stop` -> `MQTTStateManager.storeSessionState`, bounded by 5 s), and under
      load the redirects queued behind those writes for seconds (AMQ850000 "Unable to store MQTT
      state within given timeout"), CORE and AMQP connections with them;
    - security off: routerd's benchmark configuration authenticates nobody either (the targets
      still require a login).

    Args:
        created: the template's etc/broker.xml.
        name: the broker's name.
        port: the router acceptor's port.
        targets: the target brokers' ports, in `ARTEMIS_TARGETS` order.

    Raises:
        ValueError: `created` lacks what `artemis create` writes.
    """
    return broker_xml(
        created,
        what=f"router {name}",
        name=name,
        port=port,
        replace=[
            (_ARTEMIS_CREATED_PROTOCOLS, f"router={ARTEMIS_ROUTER};protocols={ARTEMIS_ROUTER_PROTOCOLS}"),
            (
                "<persistence-enabled>true</persistence-enabled>",
                "<persistence-enabled>false</persistence-enabled>\n"
                "      <security-enabled>false</security-enabled>",
            ),
        ],
        after_acceptors=_routers_xml(targets, check_ms=CHECK_PERIOD_MS),
    )


_LOG4J2_LEVELS: Final = {"DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARN", "ERROR": "ERROR"}


def artemis_log4j2(created: str, *, level: str) -> str:
    """The router broker's etc/log4j2.properties: every logger `artemis create` set to INFO at the
    level routerd runs at (`--routerd-log-level`, WARNING by default), and the server's client
    connection logger at ERROR.

    As created, Artemis's router writes one INFO line per redirect (AMQ221085 "Route ... to
    ActiveMQTarget ...") and one WARN line per redirected client that closes (AMQ212037 "...
    connection failure ... has been detected"), each to the console and to log/artemis.log;
    routerd at WARNING writes none (benchmarks/README.md: no per-connection logging on either side).

    Args:
        created: the template's etc/log4j2.properties.
        level: routerd's log level (DEBUG, INFO, WARNING, ERROR).

    Raises:
        ValueError: an unknown level, or `created` sets no logger to INFO.
    """
    java = _LOG4J2_LEVELS.get(level)
    if java is None:
        raise ValueError(f"level must be one of {', '.join(_LOG4J2_LEVELS)}, got {level!r}")
    pattern = re.compile(r"^((?:rootLogger|logger\.\w+)\.level\s*=\s*)INFO\s*$", re.MULTILINE)
    if not pattern.search(created):
        raise ValueError("log4j2.properties: expected loggers at INFO in what artemis create wrote")
    text = pattern.sub(lambda m: m.group(1) + java, created)
    return (
        text.rstrip("\n")
        + "\n\n# benchmarks/configs.py: no line per redirected client that closes (AMQ212037)\n"
        + "logger.bench_client.name=org.apache.activemq.artemis.core.client\n"
        + "logger.bench_client.level=ERROR\n"
    )


def routerd_artemis_config(ports: ArtemisPorts) -> str:
    """routerd's configuration for the artemis group: the connectors and router of
    `artemis_router_xml` (the same text) and one `mode=redirect` acceptor for CORE, AMQP and MQTT.

    Args:
        ports: the group's ports.

    Returns:
        The XML text.
    """
    return f"""\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by benchmarks/run.py: routerd beside Artemis's own router (the artemis group). -->
<configuration xmlns="urn:activemq">
  <core xmlns="urn:activemq:core">
    <acceptors>
      <acceptor name="redirect">tcp://127.0.0.1:{ports.routerd_redirect}?router={ARTEMIS_ROUTER};protocols={ARTEMIS_ROUTER_PROTOCOLS};mode=redirect</acceptor>
    </acceptors>{_routers_xml(ports.targets, check_ms=CHECK_PERIOD_MS)}
  </core>
</configuration>
"""
