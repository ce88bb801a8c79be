"""The one configuration loader: a `broker.xml`-shaped document in, a checked `Config` out (SPEC A8).

This module reads and validates; each package owns its section's type (`pools.Connector`,
`pools.PoolConfig`, `policies.PolicyConfig`, `cache.CacheConfig`, and the `router.config.settings`
dataclasses), and their constructors keep the value rules. No I/O besides reading the file (at
most `MAX_CONFIG_BYTES`) and checking that the files acceptors name can be read.
`routerd`, `routerctl` and the tests all load configuration through `load_config`.

How a document is read:

1. Read the file, a regular file of at most `MAX_CONFIG_BYTES`, and parse it with lxml (no entity
   expansion, no network). File and syntax errors are `ConfigError`s.
2. Find `<core>`: the root itself, or the child of a `<configuration>` root (a real `broker.xml`).
3. Take the direct children of `<core>` named in `SECTIONS`, matching on local names, and strip
   their namespaces in place (line numbers survive); everything else in `<core>` is ignored.
4. Validate each section element against `router/config/schema/connection-router.xsd` (structure and
   simple types), translating libxml2's first error into a one-line `ConfigError`.
5. Build the dataclasses and check what the schema cannot: URLs, regular expressions, policy
   names and properties, one pool kind, duplicate names and children, cross references. What
   the schema has checked is converted, not checked again; only the values a document gives are
   passed, so every default is the dataclass's. Acceptor URL parameters, which no schema covers,
   are read by their table (`router.config.acceptor_params`); the files an acceptor reads at
   start (key store, trust store, user store) must be readable regular files.

Value errors are worded by kind (`router.config.values`), the same words the dataclasses use.

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
import stat
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from lxml import etree

from cache import CacheConfig
from keys import KeyType
from policies import PolicyConfig
from pools import LOCAL_NODE_ID, Connector, OutlierConfig, PoolConfig, PoolKind, parse_url_params
from router.config import values
from router.config.acceptor_params import acceptor_config, acceptor_files
from router.config.passwords import resolve_password
from router.config.settings import (
    AcceptorConfig,
    ClusterConnectionConfig,
    Config,
    ConnectionTtlConfig,
    DiscoveryGroupConfig,
    EventFileFormat,
    EventLogConfig,
    RouterConfig,
    ZooKeeperConfig,
    compile_filter,
)
from router.config.values import ValueKind

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Iterator, Mapping

__all__ = ["MAX_CONFIG_BYTES", "SECTIONS", "ConfigError", "load_config", "load_config_text"]

logger = logging.getLogger(__name__)

SECTIONS: Final = (
    "connectors",
    "acceptors",
    "discovery-groups",
    "cluster-connections",
    "connection-routers",
    "connection-ttl-override",
    "connection-ttl-check-interval",
    "event-log",
)
"""The children of `<core>` the router reads; all others are ignored."""

MAX_CONFIG_BYTES: Final = 16 * 1024 * 1024
"""Size cap of a configuration file (16 MiB). A complete Artemis `broker.xml` is tens of KB; the
cap keeps a `--config` naming something endless (`/dev/zero`) or huge from filling the memory."""

_FILE_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)
"""What a file that is not a regular file is, for messages."""

_SCHEMA_RESOURCE: Final = "connection-router.xsd"

_VALUE_KINDS: Final[Mapping[str, ValueKind]] = {
    "check-period": ValueKind.POSITIVE,
    "quorum-size": ValueKind.POSITIVE,
    "quorum-timeout": ValueKind.NON_NEGATIVE,
    "timeout": ValueKind.NON_NEGATIVE,
    "refresh-timeout": ValueKind.NON_NEGATIVE,
    "connection-ttl-override": ValueKind.TTL,
    "connection-ttl-check-interval": ValueKind.POSITIVE,
    "persisted": ValueKind.BOOLEAN,
    "local-target-enabled": ValueKind.BOOLEAN,
    "enabled": ValueKind.BOOLEAN,
    "consecutive-failures": ValueKind.POSITIVE,
    "window": ValueKind.POSITIVE,
    "base-ejection-time": ValueKind.POSITIVE,
    "max-ejection-time": ValueKind.POSITIVE,
    "max-ejected-percent": ValueKind.NON_NEGATIVE,
    "allow-direct-connections-only": ValueKind.BOOLEAN,
    "key-type": ValueKind.KEY_TYPE,
    "name": ValueKind.NAME,
    "key": ValueKind.NAME,
    "discovery-group-name": ValueKind.NAME,
    "connector-ref": ValueKind.NAME,
    "cluster-connection": ValueKind.NAME,
    "local-target-connector-ref": ValueKind.NAME,
    "key-max-length": ValueKind.POSITIVE,
    "max-entries": ValueKind.POSITIVE,
    "env": ValueKind.NAME,
    "file": ValueKind.NAME,
    "session-timeout": ValueKind.POSITIVE,
    "answer-timeout": ValueKind.POSITIVE,
    "connect": ValueKind.NAME,
    "path": ValueKind.NAME,
    "directory": ValueKind.NAME,
    "router-id": ValueKind.NAME,
    "ring-size": ValueKind.POSITIVE,
    "rotate-size": ValueKind.POSITIVE,
    "rotate-interval": ValueKind.POSITIVE,
    "flush-interval": ValueKind.POSITIVE,
    "max-size": ValueKind.POSITIVE,
    "compress": ValueKind.BOOLEAN,
    "format": ValueKind.EVENT_FORMAT,
}
"""Element or attribute name -> the kind of the simple type the XSD gives it, for wording value
errors and converting values."""

_FIELDS: Final[Mapping[str, str]] = {
    "check-period": "check_period_ms",
    "quorum-size": "quorum_size",
    "quorum-timeout": "quorum_timeout_ms",
    "local-target-enabled": "local_target_enabled",
    "enabled": "enabled",
    "consecutive-failures": "consecutive_failures",
    "window": "window_ms",
    "base-ejection-time": "base_ejection_ms",
    "max-ejection-time": "max_ejection_ms",
    "max-ejected-percent": "max_ejected_percent",
    "persisted": "persisted",
    "timeout": "timeout_ms",
    "refresh-timeout": "refresh_timeout_ms",
    "session-timeout": "session_timeout_ms",
    "answer-timeout": "answer_timeout_ms",
    "key-type": "key_type",
    "key-max-length": "key_max_length",
    "max-entries": "max_entries",
    "connection-ttl-override": "override_ms",
    "connection-ttl-check-interval": "check_interval_ms",
    "directory": "directory",
    "router-id": "router_id",
    "ring-size": "ring_size",
    "rotate-size": "rotate_size",
    "rotate-interval": "rotate_interval_ms",
    "flush-interval": "flush_interval_ms",
    "max-size": "max_size",
    "compress": "compress",
    "format": "format",
    "file": "file",
}
"""Simple element or attribute -> the field it sets on its section's dataclass (`PoolConfig`,
`CacheConfig`, `DiscoveryGroupConfig`, `ZooKeeperConfig`, `RouterConfig`, `ConnectionTtlConfig`,
`EventLogConfig`;
each name occurs in one section only). An absent one is not passed: the field's default applies."""

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
        ConfigError: the file cannot be read, is not a regular file of at most
            `MAX_CONFIG_BYTES`, is not well-formed XML, or holds a bad value.
    """
    source = os.fspath(path)
    rule = (
        "the configuration file must be a regular file of at most "
        f"{MAX_CONFIG_BYTES // (1024 * 1024)} MiB ({MAX_CONFIG_BYTES} bytes)"
    )
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                raise ConfigError(source, None, "", f"{rule}, got {_file_kind(status.st_mode)}")
            with open(fd, "rb", closefd=False) as file:
                data = file.read(MAX_CONFIG_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        reason = f"cannot read the configuration file: {exc.strerror or exc}"
        raise ConfigError(source, None, "", reason) from exc
    if len(data) > MAX_CONFIG_BYTES:
        size = max(status.st_size, len(data))
        got = f"{size} bytes" if size > MAX_CONFIG_BYTES else f"more than {MAX_CONFIG_BYTES} bytes"
        raise ConfigError(source, None, "", f"{rule}, got {got}")
    return load_config_text(data, source=source)


def _file_kind(mode: int) -> str:
    return next((kind for test, kind in _FILE_KINDS if test(mode)), "not a regular file")


def _unreadable(path: str) -> str | None:
    """Why a file an acceptor names cannot be read at start, or None when it can."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return str(exc.strerror or exc)
    try:
        mode = os.fstat(fd).st_mode
    finally:
        os.close(fd)
    return None if stat.S_ISREG(mode) else f"it is {_file_kind(mode)}, not a regular file"


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


def _value(kind: ValueKind, text: str) -> int | bool | KeyType | EventFileFormat | str:
    """The value of schema-valid text of a simple type (xsd:boolean also has 1 and 0)."""
    match kind:
        case ValueKind.BOOLEAN:
            return text.lower() in ("true", "1")
        case ValueKind.KEY_TYPE:
            return KeyType(text)
        case ValueKind.EVENT_FORMAT:
            return EventFileFormat(text)
        case ValueKind.NAME:
            return text
        case _:
            return int(text)


def _given(
    items: Iterable[tuple[str, str]],
) -> Iterator[tuple[str, int | bool | KeyType | EventFileFormat | str]]:
    """(field, value) for each of `items`, (element or attribute name, schema-valid text), that
    sets a field (`_FIELDS`).

    The caller collects them in a `dict[str, Any]` and passes it as keyword arguments: Any,
    because each value has its own field's type, which the dataclass checks on construction.
    """
    for name, text in items:
        if (field := _FIELDS.get(name)) is not None:
            yield field, _value(_VALUE_KINDS[name], text.strip())


def _texts(children: Mapping[str, etree._Element]) -> Iterator[tuple[str, str]]:
    return ((tag, _text(child)) for tag, child in children.items())


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
        ttl_fields: dict[str, Any] = dict(_given(_texts(sections)))  # Any: see _given
        event_log = None
        if (element := sections.get("event-log")) is not None:
            event_log = self._event_log(element)
        return Config(
            source=self.source,
            connectors=tuple(self.connectors.values()),
            acceptors=tuple(acceptors),
            routers=tuple(routers.values()),
            discovery_groups=tuple(self.discovery_groups.values()),
            cluster_connections=tuple(self.cluster_connections.values()),
            connection_ttl=ConnectionTtlConfig(**ttl_fields),
            event_log=event_log,
        )

    def _event_log(self, element: etree._Element) -> EventLogConfig:
        fields: dict[str, Any] = dict(_given(_texts(self._unique_children(element))))  # Any: see _given
        if "directory" not in fields:
            raise self.error(element, "needs a <directory>: where the event files go")
        try:
            return EventLogConfig(**fields)
        except ValueError as exc:
            raise self.error(element, str(exc)) from exc

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
            reason = values.reason(kind, raw.strip())
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

    # -- names (the schema has checked that they are not empty) --

    @staticmethod
    def _name(element: etree._Element, attribute: str = "name") -> str:
        return (element.get(attribute) or "").strip()

    @staticmethod
    def _ref(element: etree._Element) -> str:
        return _text(element)

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
            zookeeper = children.get("zookeeper")
            fields: dict[str, Any] = dict(_given(_texts(children)))  # Any: see _given
            self.discovery_groups[name] = DiscoveryGroupConfig(
                name=name, zookeeper=None if zookeeper is None else self._zookeeper(zookeeper), **fields
            )

    def _zookeeper(self, element: etree._Element) -> ZooKeeperConfig:
        """Our `<zookeeper connect= path= session-timeout= answer-timeout=/>` (the schema checked
        the attributes' presence and the timeouts' type)."""
        fields: dict[str, Any] = dict(_given(element.attrib.items()))  # Any: see _given
        try:
            return ZooKeeperConfig(
                connect=(element.get("connect") or "").strip(),
                path=(element.get("path") or "").strip(),
                **fields,
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
        fields: dict[str, Any] = dict(_given(_texts(children)))  # Any: see _given
        local_connector = None
        if (ref := children.get("local-target-connector-ref")) is not None:
            local_connector = self._ref(ref)
            self._connector_ref(ref, local_connector, tcp_only=True)
        cache = cache_zookeeper = None
        if (cache_element := children.get("cache")) is not None:
            cache = self._cache(cache_element, name)
            if (shared := self._unique_children(cache_element).get("zookeeper")) is not None:
                cache_zookeeper = self._zookeeper(shared)
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
                key_filter=key_filter,
                local_target_filter=local_target_filter,
                local_connector=local_connector,
                cache=cache,
                cache_zookeeper=cache_zookeeper,
                policy=policy,
                pool=pool,
                **fields,
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
        fields: dict[str, Any] = dict(_given(_texts(children)))  # Any: see _given
        if fields.get("persisted") and "file" not in fields:
            fields["file"] = default_cache_file(self.source, router)
        try:
            return CacheConfig(**fields)
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
        fields: dict[str, Any] = dict(_given(_texts(children)))  # Any: see _given
        outlier_element = children.get("outlier-detection")
        if outlier_element is not None:
            outlier: dict[str, Any] = dict(_given(_texts(self._unique_children(outlier_element))))
            try:
                fields["outlier_detection"] = OutlierConfig(**outlier)
            except ValueError as exc:
                raise self.error(outlier_element, str(exc)) from exc
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
                **fields,
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
        try:
            acceptor = acceptor_config(name=name, host=parts.hostname, port=port, params=params)
        except ValueError as exc:
            raise self.error(element, str(exc)) from exc
        if acceptor.router not in routers:
            raise self._unknown(element, "connection-router", acceptor.router, routers)
        for param, path in acceptor_files(acceptor):
            if (why := _unreadable(path)) is not None:
                where = "" if os.path.isabs(path) else f" (relative to the working directory {os.getcwd()!r})"
                raise self.error(element, f"acceptor {name!r}: {param} {path!r}{where} cannot be read: {why}")
        return acceptor


def default_cache_file(source: str, router: str) -> str:
    """Where a persisted cache without `<file>` is kept: beside the configuration file, named after
    it and the router (`broker.xml`, router `r1` -> `broker-cache-r1.sqlite`)."""
    path = Path(source)
    return str(path.with_name(f"{path.stem}-cache-{urllib.parse.quote(router, safe='')}.sqlite"))


def _is_routed(url: str) -> bool:
    """Whether an acceptor URL has a `router` parameter; found leniently, as others are not ours."""
    query = url.partition("?")[2]
    return any(
        urllib.parse.unquote(part.partition("=")[0]).strip() == "router" for part in re.split("[;&]", query)
    )
