"""Broker-reported connection counts read over HTTP: the request of each source and the parse of
its answer. Pure: a `CountSource` in, a `CountRequest` out; an answer's status and body in, a count
or `CountError` out. No I/O here (count_reader.py sends the request, service.py runs the reads).

    artemis-jolokia      GET {url}/read/org.apache.activemq.artemis:broker="NAME"/ConnectionCount
                         (`ActiveMQServerControl.getConnectionCount`, what Artemis's own
                         LEAST_CONNECTIONS reads over CORE management)
    activemq-jolokia     GET {url}/read/org.apache.activemq:type=Broker,brokerName=NAME/
                         CurrentConnectionsCount (ActiveMQ Classic's `BrokerViewMBean`)
    rabbitmq-prometheus  GET {url}: the Prometheus text format of the rabbitmq_prometheus plugin,
                         whose per-node gauge `rabbitmq_connections` is "Connections currently open"

Without `connectionCountBroker` a Jolokia read names the broker with a pattern (`broker=*`,
`brokerName=*`): Jolokia answers with every matching MBean, and one broker per JVM is the rule;
more than one is an error that asks for the name.
"""

from __future__ import annotations

import base64
import json
import math
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pools import CountSource

__all__ = [
    "BODY_MAX_BYTES",
    "CountError",
    "CountRequest",
    "count_request",
    "jolokia_read_target",
    "parse_count",
    "parse_jolokia_count",
    "parse_prometheus_gauge",
]

BODY_MAX_BYTES: Final = 1024 * 1024
"""Cap of an answer's body. A Jolokia read answers in about 200 bytes (5 KB with a Java stack trace
in an error); RabbitMQ 3.10's aggregated /metrics page is 83 KB on a fresh node and grows little
with queues (it grows with them only with `prometheus.return_per_object_metrics = true`)."""

_MESSAGE_MAX_CHARS: Final = 200
"""What of a broker's own error message goes into ours (Jolokia's `error` may be long)."""

_JOLOKIA: Final = {
    "artemis-jolokia": (
        'org.apache.activemq.artemis:broker="{name}"',
        "org.apache.activemq.artemis:broker=*",
        "ConnectionCount",
    ),
    "activemq-jolokia": (
        "org.apache.activemq:type=Broker,brokerName={name}",
        "org.apache.activemq:type=Broker,brokerName=*",
        "CurrentConnectionsCount",
    ),
}
"""Per Jolokia source: the broker MBean's object name with the broker's name, the pattern without
it, and the attribute. Artemis quotes the name (`ObjectNameBuilder`), ActiveMQ Classic does not
(`BrokerMBeanSupport`)."""

_PROMETHEUS_GAUGE: Final = "rabbitmq_connections"


class CountError(ValueError):
    """A broker's count could not be read: `reason` says why (the target status's `last_error`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CountRequest:
    """One HTTP GET that reads a broker's count."""

    host: str
    port: int
    target: str
    """The request target: path and query."""
    headers: tuple[tuple[str, str], ...]
    url: str
    """The URL read, for messages (without credentials)."""


def jolokia_read_target(base_path: str, mbean: str, attribute: str) -> str:
    """The path of a Jolokia GET read: `{base}/read/{mbean}/{attribute}`, with Jolokia's escapes
    (`!` as `!!`, `/` as `!/`: Jolokia's GET URLs split on `/`) and then percent-encoding (the
    quotes of Artemis's object names become `%22`)."""

    def escape(part: str) -> str:
        return urllib.parse.quote(part.replace("!", "!!").replace("/", "!/"), safe=":=,*!/")

    return f"{base_path.rstrip('/')}/read/{escape(mbean)}/{escape(attribute)}"


def count_request(source: CountSource, *, user: str | None, password: str | None) -> CountRequest:
    """The GET that reads `source`'s count.

    Args:
        source: an HTTP source (`source.url` set).
        user: the basic-authentication user (the source's own, else the caller's choice); None:
            no `Authorization` header.
        password: its password ("" when None).

    Raises:
        ValueError: the source is not read over HTTP (`mqtt-sys`).
    """
    host, port, path = source.endpoint
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    headers: list[tuple[str, str]] = [
        ("Host", netloc),
        ("User-Agent", "connection-router"),
        ("Connection", "close"),
    ]
    jolokia = _JOLOKIA.get(source.kind)
    if jolokia is None:
        target = path
        headers.append(("Accept", "text/plain"))
    else:
        exact, pattern, attribute = jolokia
        mbean = pattern if source.broker is None else exact.format(name=source.broker)
        base, _, query = path.partition("?")
        target = jolokia_read_target(base, mbean, attribute) + (f"?{query}" if query else "")
        # Jolokia refuses a request whose Origin its CORS policy does not allow, and Artemis's
        # jolokia-access.xml allows only `*://<its http host>*` (strict-checking also refuses a
        # request without Origin): the console's own origin passes.
        headers += [("Accept", "application/json"), ("Origin", source.origin or f"http://{netloc}")]
    if user is not None:
        token = base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")
        headers.append(("Authorization", f"Basic {token}"))
    return CountRequest(
        host=host, port=port, target=target, headers=tuple(headers), url=f"http://{netloc}{target}"
    )


def parse_count(source: CountSource, status: int, body: bytes) -> int:
    """The count in an answer to `count_request(source)`.

    Raises:
        CountError: an HTTP status other than 200, or a body without the count.
    """
    if status != 200:
        hint = " (check connectionCountUser, or the pool's user)" if status in (401, 403) else ""
        raise CountError(f"HTTP status {status}{hint}")
    jolokia = _JOLOKIA.get(source.kind)
    if jolokia is None:
        return parse_prometheus_gauge(body, _PROMETHEUS_GAUGE)
    return parse_jolokia_count(body, jolokia[2])


def _count_value(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CountError(f"{what} is not a count: {str(value)[:_MESSAGE_MAX_CHARS]!r}")
    return value


def parse_jolokia_count(body: bytes, attribute: str) -> int:
    """The value of `attribute` in a Jolokia read answer: `{"value": N, "status": 200, …}` for one
    MBean, `{"value": {"<object name>": {"<attribute>": N}}, …}` for a pattern, which must match
    exactly one MBean.

    Raises:
        CountError: not JSON, a Jolokia error (its `status` other than 200: Jolokia answers
            errors with HTTP 200), no value, not exactly one MBean, or not a count.
    """
    try:
        document = json.loads(body)
    except ValueError as exc:  # UnicodeDecodeError too
        raise CountError(f"jolokia answer is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise CountError(f"jolokia answer is not a JSON object: {body[:64]!r}")
    status = document.get("status")
    if status != 200:
        error = str(document.get("error", "no error message"))[:_MESSAGE_MAX_CHARS]
        raise CountError(f"jolokia status {status}: {error}")
    if "value" not in document:
        raise CountError("jolokia answer has no value")
    value = document["value"]
    if not isinstance(value, dict):
        return _count_value(value, attribute)
    if len(value) != 1:
        names = (", ".join(sorted(str(name) for name in value)) or "none")[:_MESSAGE_MAX_CHARS]
        raise CountError(f"jolokia: {len(value)} brokers match, not one ({names}): set connectionCountBroker")
    ((name, attributes),) = value.items()
    if not isinstance(attributes, dict) or attribute not in attributes:
        raise CountError(f"jolokia: no {attribute} for {name}")
    return _count_value(attributes[attribute], attribute)


def parse_prometheus_gauge(body: bytes, name: str) -> int:
    """The value of gauge `name` in a Prometheus text-format page (version 0.0.4): the sum of its
    samples (one without labels, as rabbitmq_prometheus gives it), which must be a whole number.

    Raises:
        CountError: not UTF-8, no sample of `name`, a sample that is not a count.
    """
    try:
        text = body.decode()
    except UnicodeDecodeError as exc:
        raise CountError(f"metrics page is not UTF-8: {exc}") from None
    total, samples = 0, 0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name) :]
        if rest.startswith("{"):
            rest = _after_labels(rest, line)
        elif not rest[:1].isspace():
            continue  # another metric whose name starts with this one (rabbitmq_connections_opened_total)
        fields = rest.split()  # the value, then an optional timestamp
        try:
            value = float(fields[0]) if fields else math.nan
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0 and value == int(value)):
            raise CountError(f"{name} is not a count: {line[:_MESSAGE_MAX_CHARS]!r}")
        total += int(value)
        samples += 1
    if samples == 0:
        raise CountError(f"no {name} sample in the {len(body)} bytes of the metrics page")
    return total


def _after_labels(rest: str, line: str) -> str:
    """What follows a sample's `{labels}` (label values are quoted, and may hold `}` and `\\"`)."""
    quoted = escaped = False
    for i, char in enumerate(rest):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = quoted
        elif char == '"':
            quoted = not quoted
        elif char == "}" and not quoted:
            return rest[i + 1 :]
    raise CountError(f"unterminated labels: {line[:_MESSAGE_MAX_CHARS]!r}")
