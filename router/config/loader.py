"""The one configuration loader: a `broker.xml`-shaped document in, a checked `Config` out (SPEC A8).

This module reads and validates; each package owns its section's type (`pools.Connector`,
`pools.PoolConfig`, `policies.PolicyConfig`, `cache.CacheConfig`, and the `router.config.settings`
dataclasses), and their constructors keep the value rules. No I/O besides reading the file.
`routerd`, `routerctl` and the tests all load configuration through `load_config`.

How a document is read:

1. Parse with lxml (no entity expansion, no network). File and syntax errors are `ConfigError`s.
2. Find `<core>`: the root itself, or the child of a `<configuration>` root (a real `broker.xml`).
3. Take the direct children of `<core>` named in `SECTIONS`, matching on local names, and strip
   their namespaces in place (line numbers survive); everything else in `<core>` is ignored.
4. Validate each section element against `router/config/schema/connection-router.xsd` (structure and
   simple types), translating libxml2's first error into a one-line `ConfigError`.
5. Build the dataclasses and check what the schema cannot: URLs, regular expressions, policy
   names and properties, one pool kind, duplicate names and children, cross references.

Every error carries the file, the line and the element, and never contains a password: values
of `<password>` elements and of URL parameters whose name contains "password" are masked. A pool
`<password>` may be masked (`ENC(…)`) or read from the environment or a file (`router.config.passwords`).
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
import os
import re
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from lxml import etree

from cache import CacheConfig
from keys import KeyType
from policies import PolicyConfig
from pools import LOCAL_NODE_ID, Connector, PoolConfig, PoolKind, parse_url_params
from router.config.passwords import resolve_password
from router.config.settings import (
    AcceptorConfig,
    AcceptorMode,
    ClusterConnectionConfig,
    Config,
    ConnectionTtlConfig,
    DiscoveryGroupConfig,
    RouterConfig,
    TlsConfig,
    ZooKeeperConfig,
    compile_filter,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Iterator, Mapping

__all__ = ["SECTIONS", "ConfigError", "load_config", "load_config_text"]

logger = logging.getLogger(__name__)

SECTIONS: Final = (
    "connectors",
    "acceptors",
    "discovery-groups",
    "cluster-connections",
    "connection-routers",
    "connection-ttl-override",
    "connection-ttl-check-interval",
)
"""The children of `<core>` the router reads; all others are ignored."""

_SCHEMA_RESOURCE: Final = "connection-router.xsd"

_LONG_MAX: Final = 2**63 - 1
"""Upper bound of XSD `xsd:long`, the type Artemis's schema gives periods and sizes."""

_ValueKind = Literal["positive", "non-negative", "ttl", "boolean", "key-type", "name"]

_VALUE_KINDS: Final[Mapping[str, _ValueKind]] = {
    "check-period": "positive",
    "quorum-size": "positive",
    "quorum-timeout": "non-negative",
    "timeout": "non-negative",
    "refresh-timeout": "non-negative",
    "connection-ttl-override": "ttl",
    "connection-ttl-check-interval": "positive",
    "persisted": "boolean",
    "local-target-enabled": "boolean",
    "allow-direct-connections-only": "boolean",
    "key-type": "key-type",
    "name": "name",
    "key": "name",
    "discovery-group-name": "name",
    "connector-ref": "name",
    "cluster-connection": "name",
    "local-target-connector-ref": "name",
    "env": "name",
    "file": "name",
    "session-timeout": "positive",
    "connect": "name",
    "path": "name",
}
"""Element or attribute name -> the simple type the XSD gives it, for wording value errors."""

_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_URL_SECRET: Final = re.compile(r"[?;&][^=;&?]*password[^=;&?]*=([^;&]*)", re.IGNORECASE)
_LXML_POSITION: Final = re.compile(r", line \d+, column \d+$")
_XSD_PREFIX: Final = re.compile(
    r"Element '(?P<element>[^']+)'(?:, attribute '(?P<attribute>[^']+)')?: (?P<detail>.*)", re.S
)
_XSD_UNEXPECTED: Final = re.compile(
    r"This element is not expected\.(?: Expected is (?:one of )?\( (?P<expected>.*) \)\.)?"
)
_XSD_MISSING_CHILD: Final = re.compile(
    r"Missing child element\(s\)\. Expected is (?:one of )?\( (?P<expected>.*) \)\."
)
_XSD_REQUIRED_ATTRIBUTE: Final = re.compile(r"The attribute '(?P<attribute>[^']+)' is required but missing\.")
_XSD_UNKNOWN_ATTRIBUTE: Final = re.compile(r"The attribute '(?P<attribute>[^']+)' is not allowed\.")
_XSD_FIXED_WORDING: Final[Mapping[str, str]] = {
    "Element content is not allowed, because the content type is a simple type definition.": (
        "must hold text only, not child elements"
    ),
    "Element content is not allowed, because the type definition is simple.": (
        "must hold text only, not child elements"
    ),
    "Character content other than whitespace is not allowed because the content type is 'element-only'.": (
        "must hold child elements only, not text"
    ),
    "Character content is not allowed, because the content type is empty.": "must be empty",
    "Element content is not allowed, because the content type is empty.": "must be empty",
}


class ConfigError(ValueError):
    """A configuration that cannot be used, with where and why.

    `str(error)` is one line, `{source}:{line}: <{element}>: {reason}`, for example
    `router.xml:42: <quorum-size>: must be > 0, got '-5'`. The line is left out when unknown (a
    file that cannot be read) and the element when there is none (a file or XML syntax error).
    """

    source: str
    """The file (or the `source` name given to `load_config_text`)."""
    line: int | None
    """Line of the offending element, when known."""
    element: str
    """Local name of the offending element, or "" for file and syntax errors."""
    reason: str
    """What is wrong: lower-case start, no final full stop, values quoted with `!r`."""

    def __init__(self, source: str, line: int | None, element: str, reason: str) -> None:
        reason = re.sub(r"\s*\n\s*", " ", reason)
        where = source if line is None else f"{source}:{line}"
        what = f"<{element}>: " if element else ""
        super().__init__(f"{where}: {what}{reason}")
        self.source = source
        self.line = line
        self.element = element
        self.reason = reason

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, int | None, str, str]]:
        return type(self), (self.source, self.line, self.element, self.reason)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, validate and build the configuration in a file.

    Args:
        path: a `broker.xml`-shaped file (`<configuration><core>…` or `<core>…`).

    Returns:
        The configuration, cross references checked; `Config.source` is `path` as a string.

    Raises:
        ConfigError: the file cannot be read, is not well-formed XML, or holds a bad value.
    """
    source = os.fspath(path)
    try:
        with open(source, "rb") as file:
            data = file.read()
    except OSError as exc:
        reason = f"cannot read the configuration file: {exc.strerror or exc}"
        raise ConfigError(source, None, "", reason) from exc
    return load_config_text(data, source=source)


def load_config_text(text: str | bytes, source: str = "<string>") -> Config:
    """Validate and build a configuration held in memory.

    Args:
        text: the document; `bytes` are decoded as the XML declaration says, `str` is taken as is.
        source: the name errors and `Config.source` give the document.

    Returns:
        The configuration, cross references checked.

    Raises:
        ConfigError: the text is not well-formed XML or holds a bad value.
    """
    root = _parse(text, source)
    return _Loader(source).load(_find_core(root, source))


def _parse(text: str | bytes, source: str) -> etree._Element:
    if isinstance(text, str):
        # lxml refuses str input with an encoding declaration, so hand it bytes it is told are UTF-8.
        data = text.encode("utf-8")
        parser = etree.XMLParser(resolve_entities=False, no_network=True, encoding="utf-8")
    else:
        data = text
        parser = etree.XMLParser(resolve_entities=False, no_network=True)
    try:
        return etree.fromstring(data, parser)
    except etree.XMLSyntaxError as exc:
        message = _LXML_POSITION.sub("", str(exc.msg))
        raise ConfigError(source, exc.lineno, "", f"not well-formed XML: {_as_reason(message)}") from exc


def _find_core(root: etree._Element, source: str) -> etree._Element:
    name = _local(root)
    if name == "core":
        return root
    if name == "configuration":
        for child in _children(root):
            if _local(child) == "core":
                return child
        raise ConfigError(source, root.sourceline, name, "has no <core> element")
    raise ConfigError(source, root.sourceline, name, "expected <configuration> or <core> as the root element")


def _children(element: etree._Element) -> Iterator[etree._Element]:
    """Child elements, skipping comments, processing instructions and entity references."""
    return element.iterchildren(etree.Element)


def _local(element: etree._Element) -> str:
    return etree.QName(element).localname


def _text(element: etree._Element) -> str:
    return (element.text or "").strip()


def _strip_namespaces(section: etree._Element) -> None:
    # Renaming in place keeps each node's sourceline, so schema errors still point into the file.
    for element in section.iter(etree.Element):
        element.tag = _local(element)


def _canonical(element: etree._Element) -> tuple[object, ...]:
    """What makes two elements 'textually identical': tag, attributes, text and children."""
    return (
        _local(element),
        tuple(sorted(element.attrib.items())),
        _text(element),
        tuple(_canonical(child) for child in _children(element)),
    )


def _describe(element: etree._Element) -> str:
    name = element.get("name")
    tag = _local(element)
    return f"<{tag}>" if name is None else f"<{tag} name={name!r}>"


def _names(expected: str) -> str:
    items = [f"<{item.strip()}>" for item in expected.split(",") if item.strip()]
    return items[0] if len(items) == 1 else f"one of {', '.join(items)}"


def _as_reason(sentence: str) -> str:
    """A library's sentence in our message style: lower-case start, no final full stop."""
    sentence = sentence.strip().rstrip(".")
    return sentence[:1].lower() + sentence[1:]


def _value_reason(kind: _ValueKind, value: str) -> str:
    """Why `value` is not a valid value of one of the schema's simple types."""
    match kind:
        case "positive" | "non-negative":
            bound = "> 0" if kind == "positive" else ">= 0"
            if not _INTEGER.fullmatch(value):
                rule = f"must be an integer {bound}"
            elif int(value) > _LONG_MAX:
                rule = f"must be at most {_LONG_MAX}"
            else:
                rule = f"must be {bound}"
        case "ttl":
            rule = "must be -1 (off) or an integer > 0"
            if _INTEGER.fullmatch(value) and int(value) > _LONG_MAX:
                rule = f"must be at most {_LONG_MAX}"
        case "boolean":
            rule = "must be true or false"
        case "key-type":
            rule = f"must be one of {', '.join(k.value for k in KeyType)}"
        case "name":
            rule = "must not be empty"
    return f"{rule}, got {value!r}"


def _is_number(kind: _ValueKind, text: str) -> bool:
    """Whether `text` is a value of a numeric kind: an `xsd:long` that is > 0 ("positive"), >= 0
    ("non-negative"), or -1 or > 0 ("ttl"); `_value_reason` words the rule when it is not."""
    if not _INTEGER.fullmatch(text):
        return False
    value = int(text)
    if kind == "ttl":
        return value == -1 or 0 < value <= _LONG_MAX
    return (1 if kind == "positive" else 0) <= value <= _LONG_MAX


def _node_at(section: etree._Element, path: str | None) -> etree._Element | None:
    """The element an XSD error's path names; the section was validated as its own root."""
    steps = (path or "").strip("/").split("/", 1)
    if steps[0] != _local(section):
        return None
    if len(steps) == 1:
        return section
    try:
        found = section.xpath(steps[1])
    except etree.XPathError:
        return None
    if isinstance(found, list) and found and isinstance(found[0], etree._Element):
        return found[0]
    return None


@functools.cache
def _schema_document() -> etree._ElementTree:
    data = importlib.resources.files("router.config").joinpath("schema", _SCHEMA_RESOURCE).read_bytes()
    return etree.ElementTree(etree.fromstring(data, etree.XMLParser(resolve_entities=False, no_network=True)))


def _schema() -> etree.XMLSchema:
    # A fresh validator per load: its error_log is per instance, and loads may run in threads.
    return etree.XMLSchema(_schema_document())


class _Loader:
    """One load: the source name for messages, the secrets to mask, and what was built so far."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.secrets: set[str] = set()
        self.connectors: dict[str, Connector] = {}
        self.foreign_connectors: dict[str, str] = {}
        """Connectors with a scheme other than tcp (vm://, …): not ours, name -> scheme."""
        self.discovery_groups: dict[str, DiscoveryGroupConfig] = {}
        self.cluster_connections: dict[str, ClusterConnectionConfig] = {}

    # -- messages --

    def _mask(self, text: str) -> str:
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text

    def error(self, element: etree._Element, reason: str, *, line: int | None = None) -> ConfigError:
        """A ConfigError at an element (or at `line`), with every known secret masked."""
        return ConfigError(
            self.source, element.sourceline if line is None else line, _local(element), self._mask(reason)
        )

    def _unknown(self, element: etree._Element, kind: str, name: str, known: Iterable[str]) -> ConfigError:
        names = sorted(known)
        defined = ", ".join(repr(n) for n in names) if names else "none"
        return self.error(element, f"unknown {kind} {name!r} (defined: {defined})")

    # -- document --

    def load(self, core: etree._Element) -> Config:
        for child in _children(core):
            if _local(child) in SECTIONS:
                _strip_namespaces(child)
        sections = self._unique_children(core, SECTIONS)
        self._collect_secrets(sections.values())
        schema = _schema()
        for section in sections.values():
            for entity in section.iter(etree.Entity):
                # Entities are never expanded (resolve_entities=False), so one would leave a hole.
                parent = entity.getparent()
                where = section if parent is None else parent
                raise self.error(where, f"entity reference {entity.text} is not supported")
            try:
                valid = schema.validate(section)
            except etree.XMLSchemaValidateError as exc:
                raise self.error(section, f"cannot be validated: {_as_reason(str(exc))}") from exc
            if not valid:
                raise self._schema_error(section, schema.error_log)

        if (element := sections.get("connectors")) is not None:
            self._connectors(element)
        if (element := sections.get("discovery-groups")) is not None:
            self._discovery_groups(element)
        if (element := sections.get("cluster-connections")) is not None:
            self._cluster_connections(element)
        routers: dict[str, RouterConfig] = {}
        if (element := sections.get("connection-routers")) is not None:
            routers = self._routers(element)
        acceptors: list[AcceptorConfig] = []
        if (element := sections.get("acceptors")) is not None:
            acceptors = self._acceptors(element, routers)
        connection_ttl = ConnectionTtlConfig()
        if (element := sections.get("connection-ttl-override")) is not None:
            connection_ttl = ConnectionTtlConfig(override_ms=self._ttl(element))
        if (element := sections.get("connection-ttl-check-interval")) is not None:
            interval = self._integer(element)
            connection_ttl = ConnectionTtlConfig(
                override_ms=connection_ttl.override_ms, check_interval_ms=interval
            )
        return Config(
            source=self.source,
            connectors=tuple(self.connectors.values()),
            acceptors=tuple(acceptors),
            routers=tuple(routers.values()),
            discovery_groups=tuple(self.discovery_groups.values()),
            cluster_connections=tuple(self.cluster_connections.values()),
            connection_ttl=connection_ttl,
        )

    def _collect_secrets(self, sections: Iterable[etree._Element]) -> None:
        for section in sections:
            for element in section.iter(etree.Element):
                text = element.text or ""
                if "password" in _local(element).lower():
                    self.secrets.update(s for s in (text, text.strip()) if s.strip())
                for value in _URL_SECRET.findall(text):
                    self.secrets.update(s for s in (value, urllib.parse.unquote(value)) if s)
                for name, value in element.attrib.items():
                    if "password" in str(name).lower() and value:
                        self.secrets.add(value)
        # A secret also shows up in messages as the inside of its repr.
        self.secrets.update([repr(s)[1:-1] for s in self.secrets])

    def _schema_error(self, section: etree._Element, log: etree._ListErrorLog) -> ConfigError:
        if not log:
            return self.error(section, "does not match the schema")
        entry = log[0]
        node = _node_at(section, entry.path)
        match = _XSD_PREFIX.fullmatch(entry.message)
        if match is None:
            element = section if node is None else node
            return self.error(element, _as_reason(entry.message), line=entry.line)
        name, attribute, detail = match["element"], match["attribute"], match["detail"]
        reason = _as_reason(detail)
        kind = _VALUE_KINDS.get(attribute or name)
        if (
            (detail.startswith("[facet ") or " is not a valid value of " in detail)
            and node is not None
            and kind
        ):
            raw = node.get(attribute, "") if attribute else node.text or ""
            reason = _value_reason(kind, raw.strip())
            if attribute:
                reason = f"attribute {attribute!r} {reason}"
        elif found := _XSD_UNEXPECTED.fullmatch(detail):
            parent = None if node is None else node.getparent()
            reason = "not allowed here" if parent is None else f"not allowed inside {_describe(parent)}"
            if found["expected"]:
                reason += f", expected {_names(found['expected'])}"
        elif found := _XSD_MISSING_CHILD.fullmatch(detail):
            reason = f"missing child element, expected {_names(found['expected'])}"
        elif found := _XSD_REQUIRED_ATTRIBUTE.fullmatch(detail):
            reason = f"missing required attribute {found['attribute']!r}"
        elif found := _XSD_UNKNOWN_ATTRIBUTE.fullmatch(detail):
            reason = f"attribute {found['attribute']!r} is not allowed"
        elif detail in _XSD_FIXED_WORDING:
            reason = _XSD_FIXED_WORDING[detail]
        return ConfigError(self.source, entry.line, name, self._mask(reason))

    def _unique_children(
        self, parent: etree._Element, names: Collection[str] | None = None
    ) -> dict[str, etree._Element]:
        """Children by local name (only `names` when given), each name at most once.

        Identical repeats (same tag, attributes, text and children) are merged with one warning;
        Artemis's own manual repeats `<policy>` in a router. Differing repeats are an error.
        """
        found: dict[str, etree._Element] = {}
        warned: set[str] = set()
        for child in _children(parent):
            tag = _local(child)
            if names is not None and tag not in names:
                continue
            first = found.get(tag)
            if first is None:
                found[tag] = child
                continue
            if _canonical(first) != _canonical(child):
                raise self.error(
                    child,
                    f"given twice in {_describe(parent)} with different content "
                    f"(lines {first.sourceline} and {child.sourceline})",
                )
            if tag not in warned:
                warned.add(tag)
                logger.warning(
                    "%s:%s: <%s> is repeated with identical content in %s (first at line %s); using one",
                    self.source,
                    child.sourceline,
                    tag,
                    _describe(parent),
                    first.sourceline,
                )
        return found

    # -- simple values (the schema has checked them; these convert, and word errors the same) --

    def _integer(self, element: etree._Element) -> int:
        text = _text(element)
        kind = _VALUE_KINDS[_local(element)]
        if not _is_number(kind, text):
            raise self.error(element, _value_reason(kind, text))
        return int(text)

    def _ttl(self, element: etree._Element) -> int:
        text = _text(element)
        if not _is_number("ttl", text):
            raise self.error(element, _value_reason("ttl", text))
        return int(text)

    def _boolean(self, element: etree._Element) -> bool:
        text = _text(element).lower()
        if text not in ("true", "false", "1", "0"):
            raise self.error(element, _value_reason("boolean", _text(element)))
        return text in ("true", "1")

    def _name(self, element: etree._Element, attribute: str = "name") -> str:
        value = (element.get(attribute) or "").strip()
        if not value:
            raise self.error(element, f"attribute {attribute!r} {_value_reason('name', value)}")
        return value

    def _ref(self, element: etree._Element) -> str:
        value = _text(element)
        if not value:
            raise self.error(element, _value_reason("name", value))
        return value

    def _check_duplicate(
        self, seen: dict[str, int | None], element: etree._Element, kind: str, name: str
    ) -> None:
        if name in seen:
            raise self.error(element, f"duplicate {kind} name {name!r}, first defined at line {seen[name]}")
        seen[name] = element.sourceline

    def _connector_ref(self, element: etree._Element, name: str, *, tcp_only: bool) -> None:
        if name in self.connectors:
            return
        if name in self.foreign_connectors:
            if not tcp_only:
                return
            scheme = self.foreign_connectors[name]
            raise self.error(
                element, f"connector {name!r} is a {scheme}:// connector, the router needs tcp://"
            )
        raise self._unknown(element, "connector", name, [*self.connectors, *self.foreign_connectors])

    # -- sections --

    def _connectors(self, section: etree._Element) -> None:
        seen: dict[str, int | None] = {}
        for element in _children(section):
            name = self._name(element)
            self._check_duplicate(seen, element, "connector", name)
            url = _text(element)
            scheme, sep, _ = url.lstrip("(").partition("://")  # "(tcp://a,tcp://b)" is an HA pair
            if sep and scheme and scheme.lower() != "tcp":
                # vm:// and other transports of an embedded broker: not something the router dials.
                self.foreign_connectors[name] = scheme
                logger.debug(
                    "%s:%s: ignoring %s:// connector %r", self.source, element.sourceline, scheme, name
                )
                continue
            try:
                self.connectors[name] = Connector.from_url(name, url)
            except ValueError as exc:
                raise self.error(element, str(exc)) from exc

    def _discovery_groups(self, section: etree._Element) -> None:
        seen: dict[str, int | None] = {}
        for element in _children(section):
            name = self._name(element)
            self._check_duplicate(seen, element, "discovery-group", name)
            children = self._unique_children(element, ("refresh-timeout", "zookeeper"))
            refresh = children.get("refresh-timeout")
            zookeeper = children.get("zookeeper")
            self.discovery_groups[name] = DiscoveryGroupConfig(
                name=name,
                refresh_timeout_ms=10000 if refresh is None else self._integer(refresh),
                zookeeper=None if zookeeper is None else self._zookeeper(zookeeper),
            )

    def _zookeeper(self, element: etree._Element) -> ZooKeeperConfig:
        """Our `<zookeeper connect= path= session-timeout=/>` (the schema checked the attributes'
        presence and the timeout's type)."""
        timeout = (element.get("session-timeout") or "10000").strip()
        if not _is_number("positive", timeout):
            raise self.error(element, f"attribute 'session-timeout' {_value_reason('positive', timeout)}")
        try:
            return ZooKeeperConfig(
                connect=(element.get("connect") or "").strip(),
                path=(element.get("path") or "").strip(),
                session_timeout_ms=int(timeout),
            )
        except ValueError as exc:
            raise self.error(element, str(exc)) from exc

    def _discovery_group_ref(self, element: etree._Element) -> str:
        name = self._name(element, "discovery-group-name")
        if name not in self.discovery_groups:
            raise self._unknown(element, "discovery group", name, self.discovery_groups)
        return name

    def _static_connectors(self, element: etree._Element, *, tcp_only: bool) -> tuple[str, ...]:
        names: list[str] = []
        for ref in _children(element):
            name = self._ref(ref)
            self._connector_ref(ref, name, tcp_only=tcp_only)
            names.append(name)
        return tuple(names)

    def _cluster_connections(self, section: etree._Element) -> None:
        seen: dict[str, int | None] = {}
        for element in _children(section):
            if _local(element) != "cluster-connection":
                continue  # <cluster-connection-uri> is Artemis's business
            name = self._name(element)
            self._check_duplicate(seen, element, "cluster-connection", name)
            used = self._unique_children(
                element, ("connector-ref", "static-connectors", "discovery-group-ref")
            )
            if "static-connectors" in used and "discovery-group-ref" in used:
                raise self.error(
                    element, "has both <static-connectors> and <discovery-group-ref>, expected one"
                )
            connector_ref = None
            if (ref := used.get("connector-ref")) is not None:
                connector_ref = self._ref(ref)
                self._connector_ref(ref, connector_ref, tcp_only=False)
            static: tuple[str, ...] = ()
            if (static_element := used.get("static-connectors")) is not None:
                static = self._static_connectors(static_element, tcp_only=False)
            group = None
            if (group_element := used.get("discovery-group-ref")) is not None:
                group = self._discovery_group_ref(group_element)
            self.cluster_connections[name] = ClusterConnectionConfig(
                name=name, connector_ref=connector_ref, static_connectors=static, discovery_group=group
            )

    def _routers(self, section: etree._Element) -> dict[str, RouterConfig]:
        routers: dict[str, RouterConfig] = {}
        seen: dict[str, int | None] = {}
        for element in _children(section):
            name = self._name(element)
            self._check_duplicate(seen, element, "connection-router", name)
            routers[name] = self._router(element, name)
        return routers

    def _router(self, element: etree._Element, name: str) -> RouterConfig:
        children = self._unique_children(element)
        key_type = KeyType.SOURCE_IP
        if (key_type_element := children.get("key-type")) is not None:
            try:
                key_type = KeyType(_text(key_type_element))
            except ValueError as exc:
                raise self.error(
                    key_type_element, _value_reason("key-type", _text(key_type_element))
                ) from exc
        local_connector = None
        if (ref := children.get("local-target-connector-ref")) is not None:
            local_connector = self._ref(ref)
            self._connector_ref(ref, local_connector, tcp_only=True)
        cache = None
        if (cache_element := children.get("cache")) is not None:
            cache = self._cache(cache_element, name)
        pool = None
        if (pool_element := children.get("pool")) is not None:
            pool = self._pool(pool_element)
            self._check_node_ids(pool_element, pool, local_connector)
        key_filter = self._filter(children.get("key-filter"))
        local_target_filter = self._filter(children.get("local-target-filter"))
        policy = self._policy(children, name)
        try:
            return RouterConfig(
                name=name,
                key_type=key_type,
                key_filter=key_filter,
                local_target_filter=local_target_filter,
                local_connector=local_connector,
                cache=cache,
                policy=policy,
                pool=pool,
            )
        except ValueError as exc:
            raise self.error(element, str(exc)) from exc

    def _check_node_ids(self, element: etree._Element, pool: PoolConfig, local_connector: str | None) -> None:
        """Targets are identified by node id (the cache stores it, CONSISTENT_HASH hashes it), so
        two members of one pool must not share one."""
        members: list[tuple[str, str]] = []  # (node id, where it comes from)
        if pool.local_target_enabled:
            if local_connector is None:
                members.append((LOCAL_NODE_ID, "the local target"))
            else:
                members.append((self.connectors[local_connector].node_id, "the local target"))
        names: tuple[str, ...] = pool.static_connectors
        if pool.kind is PoolKind.CLUSTER and pool.cluster_connection is not None:
            names = self.cluster_connections[pool.cluster_connection].static_connectors
        members.extend((self.connectors[n].node_id, f"connector {n!r}") for n in names)
        first: dict[str, str] = {}
        for node_id, origin in members:
            if node_id in first:
                raise self.error(
                    element,
                    f"node id {node_id!r} of {origin} is already the node id of {first[node_id]} "
                    "in this pool; node ids must be unique (set nodeId=… on the connector URL)",
                )
            first[node_id] = origin

    def _filter(self, element: etree._Element | None) -> str | None:
        # Trimmed like Artemis's getTrimmedTextContent; blank means no filter (SPEC A7).
        if element is None or not _text(element):
            return None
        try:
            compile_filter(_text(element), _local(element))
        except ValueError as exc:
            raise self.error(element, str(exc)) from exc
        return _text(element)

    def _cache(self, element: etree._Element, router: str) -> CacheConfig:
        children = self._unique_children(element)
        persisted = False
        if (persisted_element := children.get("persisted")) is not None:
            persisted = self._boolean(persisted_element)
        timeout = 0
        if (timeout_element := children.get("timeout")) is not None:
            timeout = self._integer(timeout_element)
        if persisted:
            logger.warning(
                "%s:%s: connection-router %r: persisted caches are kept in memory only for now "
                "(persistence arrives in a later release)",
                self.source,
                element.sourceline,
                router,
            )
        try:
            return CacheConfig(persisted=persisted, timeout_ms=timeout)
        except ValueError as exc:
            raise self.error(element, str(exc)) from exc

    def _policy(self, children: Mapping[str, etree._Element], router: str) -> PolicyConfig | None:
        element = children.get("policy")
        if (transformer := children.get("key-transformer")) is not None:
            logger.warning(
                "%s:%s: connection-router %r: <key-transformer> is deprecated, use <policy>%s",
                self.source,
                transformer.sourceline,
                router,
                "; ignoring it because the router also has a <policy>" if element is not None else "",
            )
            if element is None:
                element = transformer
        if element is None:
            return None
        name = self._name(element)
        properties: dict[str, str] = {}
        lines: dict[str, int | None] = {}
        for prop in _children(element):
            key = self._name(prop, "key")
            value = (prop.get("value") or "").strip()
            if key in properties and properties[key] != value:
                raise self.error(
                    prop,
                    f"property {key!r} given twice with different values "
                    f"(lines {lines[key]} and {prop.sourceline})",
                )
            properties[key] = value
            lines.setdefault(key, prop.sourceline)
        try:
            return PolicyConfig(name=name, properties=tuple(properties.items()))
        except ValueError as exc:
            raise self.error(element, str(exc)) from exc

    def _password(self, element: etree._Element) -> str | None:
        """A `<password>`: text, `ENC(…)`, `env=` or `file=` (`router.config.passwords`); None if empty."""
        text, env, file = _text(element), element.get("env"), element.get("file")
        if not text and env is None and file is None:
            return None
        try:
            return resolve_password(text, env=env, file=file, base_dir=Path(self.source).parent)
        except ValueError as exc:
            raise self.error(element, str(exc)) from None

    def _pool(self, element: etree._Element) -> PoolConfig:
        children = self._unique_children(element)
        static_element = children.get("static-connectors")
        group_element = children.get("discovery-group-ref")
        cluster_element = children.get("cluster-connection")
        if static_element is not None:
            kind = PoolKind.STATIC
        elif group_element is not None:
            kind = PoolKind.DISCOVERY
        else:
            kind = PoolKind.CLUSTER if cluster_element is not None else PoolKind.STATIC
        username = None if (u := children.get("username")) is None else _text(u) or None
        password = None if (p := children.get("password")) is None else self._password(p)
        numbers = {
            tag: self._integer(child)
            for tag in ("check-period", "quorum-size", "quorum-timeout")
            if (child := children.get(tag)) is not None
        }
        local_target_enabled = False
        if (enabled := children.get("local-target-enabled")) is not None:
            local_target_enabled = self._boolean(enabled)
        try:
            config = PoolConfig(
                kind=kind,
                static_connectors=()
                if static_element is None
                else tuple(map(_text, _children(static_element))),
                discovery_group=None
                if group_element is None
                else (group_element.get("discovery-group-name") or "").strip(),
                cluster_connection=None if cluster_element is None else _text(cluster_element),
                username=username,
                password=password,
                check_period_ms=numbers.get("check-period", 5000),
                quorum_size=numbers.get("quorum-size", 1),
                quorum_timeout_ms=numbers.get("quorum-timeout", 3000),
                local_target_enabled=local_target_enabled,
            )
        except ValueError as exc:
            raise self.error(element, str(exc)) from exc
        # Cross references, each reported at the referring element.
        if static_element is not None:
            self._static_connectors(static_element, tcp_only=True)
        if group_element is not None:
            self._discovery_group_ref(group_element)
        if cluster_element is not None:
            self._cluster_ref(cluster_element)
        return config

    def _cluster_ref(self, element: etree._Element) -> None:
        name = self._ref(element)
        cluster = self.cluster_connections.get(name)
        if cluster is None:
            raise self._unknown(element, "cluster connection", name, self.cluster_connections)
        for connector in cluster.static_connectors:
            if connector in self.foreign_connectors:
                scheme = self.foreign_connectors[connector]
                raise self.error(
                    element,
                    f"cluster connection {name!r} uses {scheme}:// connector {connector!r}, "
                    "the router needs tcp://",
                )

    def _acceptors(
        self, section: etree._Element, routers: Mapping[str, RouterConfig]
    ) -> list[AcceptorConfig]:
        acceptors: list[AcceptorConfig] = []
        seen: dict[str, tuple[int | None, bool]] = {}
        for element in _children(section):
            name = self._name(element)
            url = _text(element)
            routed = _is_routed(url)
            if name in seen and (routed or seen[name][1]):
                line = seen[name][0]
                raise self.error(element, f"duplicate acceptor name {name!r}, first defined at line {line}")
            seen.setdefault(name, (element.sourceline, routed))
            if routed:
                acceptors.append(self._acceptor(element, name, url, routers))
        return acceptors

    def _tls(self, element: etree._Element, params: Mapping[str, str]) -> TlsConfig | None:
        """Artemis's TLS acceptor parameters, PEM key stores only."""
        flags = {
            n: self._flag(element, params, n) for n in ("sslEnabled", "needClientAuth", "wantClientAuth")
        }
        if not flags["sslEnabled"]:
            return None
        for kind in ("keyStoreType", "trustStoreType"):
            store_type = params.get(kind, "PEM").strip().upper()
            if store_type != "PEM":
                raise self.error(
                    element,
                    f"{kind} {store_type!r} is not supported: use PEM files "
                    "(convert with: openssl pkcs12 -in store.p12 -nodes -out store.pem)",
                )
        key_store = params.get("keyStorePath", "").strip()
        if not key_store:
            raise self.error(
                element, "sslEnabled=true needs keyStorePath (a PEM file with key and certificate)"
            )
        trust_store = params.get("trustStorePath", "").strip() or None
        try:
            return TlsConfig(
                key_store_path=key_store,
                trust_store_path=trust_store,
                need_client_auth=flags["needClientAuth"],
                want_client_auth=flags["wantClientAuth"],
            )
        except ValueError as exc:
            raise self.error(element, str(exc)) from exc

    def _acceptor(
        self, element: etree._Element, name: str, url: str, routers: Mapping[str, RouterConfig]
    ) -> AcceptorConfig:
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
            params = parse_url_params(parts.query)
        except ValueError as exc:
            raise self.error(element, f"acceptor URL {url!r} is not valid: {_as_reason(str(exc))}") from exc
        if parts.scheme.lower() != "tcp":
            raise self.error(element, f"an acceptor with a router must be a tcp:// URL, got {url!r}")
        if not parts.hostname or port is None:
            raise self.error(element, f"acceptor URL must name host and port, got {url!r}")
        router = params.get("router", "").strip()
        if router not in routers:
            raise self._unknown(element, "connection-router", router, routers)
        mode_text = params.get("mode", AcceptorMode.PROXY.value).strip()
        try:
            mode = AcceptorMode(mode_text.lower())
        except ValueError as exc:
            allowed = ", ".join(m.value for m in AcceptorMode)
            raise self.error(element, f"mode must be one of {allowed}, got {mode_text!r}") from exc
        protocols = tuple(p.strip().upper() for p in params.get("protocols", "").split(",") if p.strip())
        timeout_text = params.get("handshake-timeout", params.get("handshakeTimeout", "10")).strip()
        if not _INTEGER.fullmatch(timeout_text) or int(timeout_text) < 0:
            raise self.error(
                element, f"handshake-timeout must be a whole number of seconds >= 0, got {timeout_text!r}"
            )
        cap_text = params.get("sniffMaxBytes", str(16 * 1024)).strip()
        if not _INTEGER.fullmatch(cap_text):
            raise self.error(element, f"sniffMaxBytes must be an integer, got {cap_text!r}")
        proxy_text = params.get("proxyProtocolEnabled", "false").strip().lower()
        if proxy_text not in ("true", "false"):
            raise self.error(element, f"proxyProtocolEnabled must be true or false, got {proxy_text!r}")
        send_proxy = params.get("sendProxyProtocol", "").strip().lower() or None
        tls = self._tls(element, params)
        require_auth = self._flag(element, params, "requireAuthentication")
        ttl_ms = self._acceptor_ttl(element, params)
        try:
            return AcceptorConfig(
                name=name,
                host=parts.hostname,
                port=port,
                router=router,
                protocols=protocols,
                mode=mode,
                handshake_timeout_ms=int(timeout_text) * 1000,
                sniff_max_bytes=int(cap_text),
                proxy_protocol=proxy_text == "true",
                send_proxy_protocol=send_proxy,
                tls=tls,
                users_file=params.get("usersFile", "").strip() or None,
                roles_file=params.get("rolesFile", "").strip() or None,
                require_authentication=require_auth,
                connection_ttl_ms=ttl_ms,
                params=tuple(params.items()),
            )
        except ValueError as exc:
            raise self.error(element, str(exc)) from exc

    def _flag(self, element: etree._Element, params: Mapping[str, str], name: str) -> bool:
        """A boolean URL parameter, default false, "true"/"false" in any letter case."""
        value = {"true": True, "false": False}.get(params.get(name, "false").strip().lower())
        if value is None:
            raise self.error(element, f"{name} must be true or false, got {params[name]!r}")
        return value

    def _acceptor_ttl(self, element: etree._Element, params: Mapping[str, str]) -> int:
        """`connectionTtl` (Artemis's acceptor spelling) or `connectionTTL` (its client URL's)."""
        given = {n: params[n].strip() for n in ("connectionTtl", "connectionTTL") if n in params}
        if len(set(given.values())) > 1:
            raise self.error(
                element,
                f"connectionTtl {given['connectionTtl']!r} and connectionTTL {given['connectionTTL']!r} "
                "disagree: give one",
            )
        for name, text in given.items():
            if not _is_number("ttl", text):
                raise self.error(element, f"{name} must be -1 (off) or an integer > 0 (ms), got {text!r}")
            return int(text)
        return -1


def _is_routed(url: str) -> bool:
    """Whether an acceptor URL has a `router` parameter; found leniently, as others are not ours."""
    query = url.partition("?")[2]
    return any(
        urllib.parse.unquote(part.partition("=")[0]).strip() == "router" for part in re.split("[;&]", query)
    )
