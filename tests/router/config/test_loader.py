"""Tests of router/config/loader.py: every rule of the loader, with the exact one-line error it gives."""

from __future__ import annotations

import importlib.resources
import logging
import os
import pickle
import textwrap
from pathlib import Path

import pytest
from lxml import etree

from cache import CacheConfig
from cache.cache import DEFAULT_MAX_ENTRIES
from keys import KeyType
from keys.resolve import DEFAULT_KEY_MAX_LENGTH
from policies import PolicyConfig
from pools import OutlierConfig, PoolConfig, PoolKind
from router.config import SECTIONS, ConfigError, load_config, load_config_text
from router.config.loader import _VALUE_KINDS, MAX_CONFIG_BYTES
from router.config.settings import (
    AcceptorMode,
    Config,
    ConnectionTtlConfig,
    DiscoveryGroupConfig,
    EventFileFormat,
    EventLogConfig,
    RouterConfig,
    ZooKeeperConfig,
)
from router.config.values import ValueKind, is_valid

REPO = Path(__file__).resolve().parents[3]
DATA = Path(__file__).resolve().parents[1] / "data"
MANUAL_EXAMPLE = REPO / "deploy" / "examples" / "artemis-manual.xml"

TARGETS = """\
<connectors>
   <connector name="c1">tcp://127.0.0.1:61617</connector>
   <connector name="c2">tcp://127.0.0.1:61618?nodeId=broker-2</connector>
   <connector name="vm0">vm://0</connector>
</connectors>
<discovery-groups>
   <discovery-group name="dg1"/>
</discovery-groups>
"""
"""Connectors and a discovery group."""

BASE = f"""\
{TARGETS}<cluster-connections>
   <cluster-connection name="cluster1">
      <connector-ref>c1</connector-ref>
      <static-connectors>
         <connector-ref>c1</connector-ref>
         <connector-ref>c2</connector-ref>
      </static-connectors>
   </cluster-connection>
</cluster-connections>
"""
"""TARGETS and a cluster connection: what most router tests refer to."""

STATIC_POOL = "<pool><static-connectors><connector-ref>c1</connector-ref></static-connectors></pool>"
CLUSTER_POOL_KIND = "<cluster-connection>cluster1</cluster-connection>"


def document(body: str, *, namespaces: bool = True) -> str:
    """A broker.xml holding `body` inside `<core>`."""
    body = textwrap.dedent(body)
    if not namespaces:
        return f"<configuration>\n<core>\n{body}</core>\n</configuration>\n"
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<configuration xmlns="urn:activemq">\n'
        '<core xmlns="urn:activemq:core">\n'
        f"{body}"
        "</core>\n"
        "</configuration>\n"
    )


def routers(xml: str, *, extra: str = "") -> str:
    """A broker.xml with BASE, `extra` and `<connection-routers>{xml}</connection-routers>`."""
    return document(f"{BASE}{extra}<connection-routers>\n{textwrap.dedent(xml)}</connection-routers>\n")


def line_of(text: str, marker: str, occurrence: int = 1, *, after: str = "") -> int:
    """The 1-based line of the `occurrence`-th appearance of `marker` in `text` (after `after`)."""
    index = text.index(after) if after else -1
    for _ in range(occurrence):
        index = text.index(marker, index + 1)
    return text.count("\n", 0, index) + 1


def write(tmp_path: Path, text: str, name: str = "router.xml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, text: str) -> Config:
    return load_config(write(tmp_path, text))


def assert_error(
    tmp_path: Path, text: str, marker: str, element: str, reason: str, occurrence: int = 1
) -> ConfigError:
    """Load `text` from a file and check the whole one-line message, line included."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    line = line_of(text, marker, occurrence)
    assert str(info.value) == f"{path}:{line}: <{element}>: {reason}"
    assert (info.value.source, info.value.line, info.value.element, info.value.reason) == (
        str(path),
        line,
        element,
        reason,
    )
    return info.value


# -- ConfigError --


def test_config_error_str_is_one_line_with_file_line_element_and_reason():
    error = ConfigError("router.xml", 42, "quorum-size", "must be > 0, got '-5'")
    assert str(error) == "router.xml:42: <quorum-size>: must be > 0, got '-5'"
    assert isinstance(error, ValueError)


def test_config_error_leaves_out_unknown_line_and_element():
    assert str(ConfigError("router.xml", None, "", "cannot read")) == "router.xml: cannot read"
    assert str(ConfigError("router.xml", 3, "", "not well-formed XML")) == "router.xml:3: not well-formed XML"


def test_config_error_joins_a_multi_line_reason():
    assert str(ConfigError("r.xml", 1, "x", "first\n   second")) == "r.xml:1: <x>: first second"


def test_config_error_pickles_with_its_data():
    error = pickle.loads(pickle.dumps(ConfigError("r.xml", 7, "pool", "bad")))
    assert (error.source, error.line, error.element, error.reason) == ("r.xml", 7, "pool", "bad")


# -- whole documents --


def test_load_config_reads_the_manuals_four_routers(caplog):
    """Scenario: section 6 of the Artemis manual, with its repeated <policy>, loads as the manual says."""
    with caplog.at_level(logging.WARNING, logger="router.config"):
        config = load_config(MANUAL_EXAMPLE)
    local_partition, simple, consistent, evenly = config.routers
    assert local_partition.name == "local-partition"
    assert local_partition.key_type is KeyType.CLIENT_ID
    assert local_partition.key_filter == "^.{3}"
    assert local_partition.local_target_filter == "^FOO.*"
    assert (local_partition.policy, local_partition.pool, local_partition.cache) == (None, None, None)

    assert simple.name == "simple-router"
    assert simple.key_type is KeyType.SOURCE_IP
    assert simple.policy == PolicyConfig(name="FIRST_ELEMENT")
    assert simple.pool is not None
    assert simple.pool.kind is PoolKind.STATIC
    assert simple.pool.static_connectors == ("connector1", "connector2", "connector3")
    assert (simple.pool.check_period_ms, simple.pool.quorum_size, simple.pool.quorum_timeout_ms) == (
        5000,
        1,
        3000,
    )
    assert simple.pool.local_target_enabled is False

    assert consistent.name == "consistent-hash-router"
    assert consistent.key_type is KeyType.USER_NAME
    assert consistent.local_target_filter == "admin"
    assert consistent.policy == PolicyConfig(name="CONSISTENT_HASH")
    assert consistent.pool is not None
    assert consistent.pool.kind is PoolKind.DISCOVERY
    assert consistent.pool.discovery_group == "dg1"
    assert consistent.pool.local_target_enabled is True

    assert evenly.name == "evenly-balance"
    assert evenly.key_type is KeyType.CLIENT_ID
    assert evenly.key_filter == "^.{3}"
    assert evenly.policy == PolicyConfig(name="LEAST_CONNECTIONS")
    assert evenly.pool is not None
    assert evenly.pool.discovery_group == "dg2"
    assert (evenly.pool.username, evenly.pool.password) == ("guest", "guest")

    text = MANUAL_EXAMPLE.read_text(encoding="utf-8")
    first = line_of(text, '<policy name="CONSISTENT_HASH"/>', after="<connection-routers>")
    repeated = line_of(text, '<policy name="CONSISTENT_HASH"/>', 2, after="<connection-routers>")
    assert [r.getMessage() for r in caplog.records] == [
        f"{MANUAL_EXAMPLE}:{repeated}: <policy> is repeated with identical content in "
        f"<connection-router name='consistent-hash-router'> (first at line {first}); using one"
    ]


def test_load_config_reads_the_manual_example_around_the_routers():
    config = load_config(MANUAL_EXAMPLE)
    assert [(c.name, c.host, c.port) for c in config.connectors] == [
        ("connector1", "127.0.0.1", 61617),
        ("connector2", "127.0.0.1", 61618),
        ("connector3", "127.0.0.1", 61619),
    ]
    assert [(a.router, a.host, a.port, a.mode) for a in config.acceptors] == [
        (r.name, "127.0.0.1", 61620 + i, AcceptorMode.PROXY) for i, r in enumerate(config.routers)
    ]
    assert [g.name for g in config.discovery_groups] == ["dg1", "dg2"]
    assert config.source == str(MANUAL_EXAMPLE)


def test_load_config_reads_a_full_artemis_broker_xml():
    """Scenario: a real broker.xml with many unused elements; only the routed acceptor is ours."""
    config = load_config(DATA / "broker.xml")
    [acceptor] = config.acceptors
    assert acceptor.name == "routed"
    assert (acceptor.host, acceptor.port, acceptor.router) == ("0.0.0.0", 61610, "partitioned")
    assert acceptor.protocols == ("CORE", "AMQP", "MQTT")
    assert acceptor.mode is AcceptorMode.AUTO
    assert [c.name for c in config.connectors] == ["artemis", "broker-2", "broker-3"]
    assert config.connector("broker-3").node_id == "b3"
    assert [g.name for g in config.discovery_groups] == ["dg-group1"]
    my_cluster, discovered = config.cluster_connections
    assert my_cluster.connector_ref == "artemis"
    assert my_cluster.static_connectors == ("broker-2", "broker-3")
    assert discovered.discovery_group == "dg-group1"
    [router] = config.routers
    assert router.key_type is KeyType.CLIENT_ID
    assert router.local_connector == "artemis"
    assert router.cache == CacheConfig(persisted=False, timeout_ms=60000)
    assert router.policy == PolicyConfig(name="CONSISTENT_HASH_MODULO", properties=(("MODULO", "3"),))
    assert router.pool is not None
    assert router.pool.kind is PoolKind.CLUSTER
    assert router.pool.cluster_connection == "my-cluster"
    assert (router.pool.check_period_ms, router.pool.quorum_size, router.pool.quorum_timeout_ms) == (
        1000,
        2,
        0,
    )
    assert router.pool.local_target_enabled is True
    assert (router.pool.username, router.pool.password) == ("probe", "probe-secret")


def test_load_config_reads_a_document_without_namespaces(tmp_path):
    config = load(
        tmp_path, document(f"{BASE}<connection-routers>{_router('r')}</connection-routers>", namespaces=False)
    )
    assert [r.name for r in config.routers] == ["r"]
    assert [c.name for c in config.connectors] == ["c1", "c2"]


def test_load_config_reads_a_document_whose_root_is_core(tmp_path):
    routers_xml = f"<connection-routers>{_router('r')}</connection-routers>"
    text = f'<core xmlns="urn:activemq:core">\n{BASE}{routers_xml}\n</core>\n'
    assert [r.name for r in load(tmp_path, text).routers] == ["r"]


def test_load_config_matches_sections_on_local_names_in_any_namespace(tmp_path):
    text = (
        '<a:configuration xmlns:a="urn:activemq" xmlns:c="urn:activemq:core"><c:core>\n'
        '<c:connectors><c:connector name="c1">tcp://h:1</c:connector></c:connectors>\n'
        "</c:core></a:configuration>\n"
    )
    assert [c.name for c in load(tmp_path, text).connectors] == ["c1"]


def test_load_config_reads_an_empty_core(tmp_path):
    config = load(tmp_path, document(""))
    assert (config.connectors, config.acceptors, config.routers) == ((), (), ())


def test_load_config_ignores_elements_the_router_does_not_use(tmp_path):
    """Scenario: values our schema would reject, outside our sections, are none of our business."""
    text = document(
        """\
        <journal-type>NOT-A-JOURNAL</journal-type>
        <check-period>abc</check-period>
        <pool><bogus/></pool>
        <broadcast-groups><broadcast-group name="x"><anything/></broadcast-group></broadcast-groups>
        <connection-routers/>
        """
    )
    assert load(tmp_path, text).routers == ()


def test_load_config_text_reads_str_with_an_encoding_declaration():
    text = (
        '<?xml version="1.0" encoding="ISO-8859-1"?>\n<core><connection-routers>'
        + _router("r")
        + ("</connection-routers>" + BASE + "</core>")
    )
    config = load_config_text(text)
    assert config.source == "<string>"
    assert [r.name for r in config.routers] == ["r"]


def test_load_config_text_reads_bytes_and_names_the_source():
    config = load_config_text(b"<core/>", source="inline.xml")
    assert config.source == "inline.xml"


def test_load_config_reports_a_missing_file(tmp_path):
    path = tmp_path / "missing.xml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: cannot read the configuration file: No such file or directory"
    assert (info.value.line, info.value.element) == (None, "")


CAP_RULE = "the configuration file must be a regular file of at most 16 MiB (16777216 bytes)"


class TestConfigFileCap:
    """Scenario: `--config` names something that is not a configuration file of sane size; the
    loader says so instead of reading without end (`/dev/zero`) or waiting (a FIFO)."""

    def test_load_config_cap_is_16_mib(self):
        assert MAX_CONFIG_BYTES == 16 * 1024 * 1024

    @pytest.mark.parametrize(
        ("make", "kind"),
        [
            pytest.param(lambda tmp: tmp, "a directory", id="directory"),
            pytest.param(lambda _tmp: Path("/dev/zero"), "a character device", id="dev-zero"),
            pytest.param(lambda tmp: _fifo(tmp / "fifo.xml"), "a FIFO", id="fifo"),
        ],
    )
    def test_load_config_refuses_a_file_that_is_not_regular(self, tmp_path, make, kind):
        path = make(tmp_path)
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value) == f"{path}: {CAP_RULE}, got {kind}"
        assert (info.value.line, info.value.element) == (None, "")

    def test_load_config_refuses_a_file_over_the_cap(self, tmp_path):
        path = tmp_path / "huge.xml"
        with path.open("wb") as file:
            file.truncate(MAX_CONFIG_BYTES + 1)  # sparse: no disk used
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value) == f"{path}: {CAP_RULE}, got {MAX_CONFIG_BYTES + 1} bytes"

    def test_load_config_reads_a_file_at_the_cap(self, tmp_path):
        head, tail = b"<core>", b"</core>"
        chunk = b" " * (1024 * 1024 - len(b"<x/>")) + b"<x/>"  # lxml refuses text nodes over 10 MB
        body = chunk * 15
        pad = b" " * (MAX_CONFIG_BYTES - len(head) - len(body) - len(tail))
        path = tmp_path / "big.xml"
        path.write_bytes(head + body + pad + tail)
        assert path.stat().st_size == MAX_CONFIG_BYTES
        assert load_config(path).acceptors == ()


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def test_load_config_reports_the_line_of_an_xml_syntax_error(tmp_path):
    text = document("<connectors>\n<connector name='c1'>tcp://h:1</connector>\n</connecters>\n")
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    line = line_of(text, "</connecters>")
    assert str(info.value) == (
        f"{path}:{line}: not well-formed XML: opening and ending tag mismatch: connectors line {line - 2} "
        "and connecters"
    )


def test_load_config_reports_an_empty_file(tmp_path):
    path = write(tmp_path, "")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}:1: not well-formed XML: document is empty"


@pytest.mark.parametrize("entity", ["SYSTEM 'file:///etc/hostname'", "'tcp://h:1'"])
def test_load_config_rejects_entity_references_in_its_sections(tmp_path, entity):
    """Scenario: entities are never expanded (no file or network access, no entity bombs)."""
    text = (
        f"<!DOCTYPE core [<!ENTITY x {entity}>]>\n"
        "<core><connectors>\n<connector name='c'>&x;</connector>\n</connectors></core>\n"
    )
    assert_error(tmp_path, text, "<connector name", "connector", "entity reference &x; is not supported")


def test_load_config_ignores_entity_references_outside_its_sections(tmp_path):
    text = (
        "<!DOCTYPE core [<!ENTITY x 'data'>]>\n<core><paging-directory>&x;/paging</paging-directory></core>\n"
    )
    assert load(tmp_path, text).routers == ()


def test_load_config_rejects_an_unknown_root_element(tmp_path):
    text = '<beans xmlns="http://www.springframework.org/schema/beans"/>\n'
    assert_error(tmp_path, text, "<beans", "beans", "expected <configuration> or <core> as the root element")


def test_load_config_rejects_a_configuration_without_core(tmp_path):
    text = '<configuration xmlns="urn:activemq">\n<jms/>\n</configuration>\n'
    assert_error(tmp_path, text, "<configuration", "configuration", "has no <core> element")


def test_load_config_rejects_differing_repeated_sections(tmp_path):
    text = document("<connectors/>\n<connectors><connector name='c'>tcp://h:1</connector></connectors>\n")
    first, second = line_of(text, "<connectors"), line_of(text, "<connectors", 2)
    reason = f"given twice in <core> with different content (lines {first} and {second})"
    assert_error(tmp_path, text, "<connectors", "connectors", reason, occurrence=2)


# -- the schema --


def _packaged_schema() -> etree._Element:
    """The XSD as the package ships it (package data, read the way the loader reads it)."""
    return etree.fromstring(
        importlib.resources.files("router.config").joinpath("schema", "connection-router.xsd").read_bytes()
    )


def test_schema_key_types_are_the_key_type_enum():
    schema = _packaged_schema()
    ns = {"xsd": "http://www.w3.org/2001/XMLSchema"}
    values = schema.xpath("//xsd:simpleType[@name='key-type-type']//xsd:enumeration/@value", namespaces=ns)
    assert values == [k.value for k in KeyType]


def test_schema_event_formats_are_the_event_file_format_enum():
    schema = _packaged_schema()
    ns = {"xsd": "http://www.w3.org/2001/XMLSchema"}
    enumeration = "//xsd:simpleType[@name='event-format-type']//xsd:enumeration/@value"
    values = schema.xpath(enumeration, namespaces=ns)
    assert values == [f.value for f in EventFileFormat]
    assert all(is_valid(ValueKind.EVENT_FORMAT, f.value) for f in EventFileFormat)


def test__value_kinds_are_the_schema_types():
    """Scenario: the kind that words a value error is the kind of the XSD type that raised it."""
    types = {
        "positive-long-type": ValueKind.POSITIVE,
        "non-negative-long-type": ValueKind.NON_NEGATIVE,
        "ttl-type": ValueKind.TTL,
        "boolean-type": ValueKind.BOOLEAN,
        "key-type-type": ValueKind.KEY_TYPE,
        "event-format-type": ValueKind.EVENT_FORMAT,
        "name-type": ValueKind.NAME,
    }
    schema = _packaged_schema()
    ns = {"xsd": "http://www.w3.org/2001/XMLSchema"}
    typed = schema.xpath("//xsd:element[@type] | //xsd:attribute[@type]", namespaces=ns)
    in_schema = {node.get("name"): types[node.get("type")] for node in typed if node.get("type") in types}
    assert in_schema == dict(_VALUE_KINDS)


def test_schema_declares_every_section():
    schema = _packaged_schema()
    ns = {"xsd": "http://www.w3.org/2001/XMLSchema"}
    declared = set(schema.xpath("/xsd:schema/xsd:element/@name", namespaces=ns))
    assert set(SECTIONS) <= declared


def test_load_config_schema_errors_give_the_line_in_the_original_file(tmp_path):
    """Scenario: sections validated on their own still report lines of the whole file."""
    padding = "".join(
        f"<address-setting match='a{i}.#'><max-size-bytes>-1</max-size-bytes></address-setting>\n"
        for i in range(40)
    )
    text = routers(
        """\
        <connection-router name="r">
           <pool>
              <quorum-size>-5</quorum-size>
           </pool>
        </connection-router>
        """,
        extra=f"<address-settings>\n{padding}</address-settings>\n",
    )
    error = assert_error(tmp_path, text, "<quorum-size>-5", "quorum-size", "must be > 0, got '-5'")
    assert error.line is not None
    assert error.line > 50


@pytest.mark.parametrize(
    ("router_xml", "marker", "element", "reason"),
    [
        pytest.param(
            '<connection-router name="r"><bogus/></connection-router>',
            "<bogus/>",
            "bogus",
            "not allowed inside <connection-router name='r'>, expected one of <key-type>, <key-filter>, "
            "<local-target-filter>, <local-target-connector-ref>, <key-max-length>, <cache>, <policy>, "
            "<key-transformer>, "
            "<pool>",
            id="unknown-child",
        ),
        pytest.param(
            "<connection-router><key-type>CLIENT_ID</key-type></connection-router>",
            "<connection-router>",
            "connection-router",
            "missing required attribute 'name'",
            id="missing-name",
        ),
        pytest.param(
            '<connection-router name=" "/>',
            '<connection-router name=" "/>',
            "connection-router",
            "attribute 'name' must not be empty, got ''",
            id="blank-name",
        ),
        pytest.param(
            '<connection-router name="r" weight="3"/>',
            '<connection-router name="r" weight="3"/>',
            "connection-router",
            "attribute 'weight' is not allowed",
            id="unknown-attribute",
        ),
        pytest.param(
            '<connection-router name="r"><pool><static-connectors/></pool></connection-router>',
            "<static-connectors/>",
            "static-connectors",
            "missing child element, expected <connector-ref>",
            id="empty-static-connectors",
        ),
        pytest.param(
            '<connection-router name="r"><pool><static-connectors>c1</static-connectors></pool>'
            "</connection-router>",
            "<static-connectors>c1",
            "static-connectors",
            "must hold child elements only, not text",
            id="text-in-static-connectors",
        ),
        pytest.param(
            '<connection-router name="r"><pool><quorum-size><n>1</n></quorum-size></pool>'
            "</connection-router>",
            "<quorum-size>",
            "quorum-size",
            "must hold text only, not child elements",
            id="element-in-quorum-size",
        ),
        pytest.param(
            '<connection-router name="r"><policy><property key="k" value="v"/></policy></connection-router>',
            "<policy>",
            "policy",
            "missing required attribute 'name'",
            id="policy-without-name",
        ),
        pytest.param(
            '<connection-router name="r"><policy name="LEAST_CONNECTIONS"><property key="k"/></policy>'
            "</connection-router>",
            "<property",
            "property",
            "missing required attribute 'value'",
            id="property-without-value",
        ),
        pytest.param(
            '<connection-router name="r"><pool><discovery-group-ref/></pool></connection-router>',
            "<discovery-group-ref/>",
            "discovery-group-ref",
            "missing required attribute 'discovery-group-name'",
            id="discovery-group-ref-without-name",
        ),
    ],
)
def test_load_config_rejects_what_the_schema_forbids(tmp_path, router_xml, marker, element, reason):
    assert_error(tmp_path, routers(router_xml), marker, element, reason)


# -- connectors --


def test_load_config_reads_connectors(tmp_path):
    config = load(tmp_path, routers(""))
    assert [(c.name, c.host, c.port, c.node_id) for c in config.connectors] == [
        ("c1", "127.0.0.1", 61617, "c1"),
        ("c2", "127.0.0.1", 61618, "broker-2"),
    ]


def test_load_config_rejects_duplicate_connector_names(tmp_path):
    text = document(
        """\
        <connectors>
           <connector name="c1">tcp://h:1</connector>
           <connector name="c1">tcp://h:2</connector>
        </connectors>
        """
    )
    first = line_of(text, '<connector name="c1">')
    reason = f"duplicate connector name 'c1', first defined at line {first}"
    assert_error(tmp_path, text, "tcp://h:2", "connector", reason)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("h:1", "connector URL must look like tcp://host:port, got 'h:1'"),
        ("tcp://h", "connector URL must name host and port, got 'tcp://h'"),
        ("tcp://h:99999", "connector URL has an invalid port: 'tcp://h:99999'"),
        ("tcp://h:1?nodeId", "url parameter 'nodeId' has no '=value'"),
        ("tcp://h:1?weight=0", "weight must be an integer 1-1000000, got '0'"),
    ],
)
def test_load_config_rejects_bad_connector_urls(tmp_path, url, reason):
    text = document(f'<connectors>\n<connector name="bad">{url}</connector>\n</connectors>\n')
    assert_error(tmp_path, text, '<connector name="bad">', "connector", reason)


def test_load_config_ignores_connectors_of_other_transports(tmp_path):
    text = document('<connectors><connector name="in-vm">vm://0</connector></connectors>\n')
    assert load(tmp_path, text).connectors == ()


# -- acceptors --


@pytest.mark.parametrize(
    ("url", "host", "port", "protocols", "mode"),
    [
        ("tcp://0.0.0.0:61616?router=r", "0.0.0.0", 61616, (), AcceptorMode.PROXY),
        (
            "tcp://[::1]:5672?router=r;protocols=amqp, mqtt;mode=redirect",
            "::1",
            5672,
            ("AMQP", "MQTT"),
            AcceptorMode.REDIRECT,
        ),
        (
            "tcp://broker.example.com:1883?protocols=MQTT&amp;router=r&amp;mode=auto",
            "broker.example.com",
            1883,
            ("MQTT",),
            AcceptorMode.AUTO,
        ),
        ("tcp://127.0.0.1:0?router=r;protocols=;mode=PROXY", "127.0.0.1", 0, (), AcceptorMode.PROXY),
    ],
)
def test_load_config_reads_routed_acceptors(tmp_path, url, host, port, protocols, mode):
    config = load(
        tmp_path, routers(_router("r"), extra=f'<acceptors><acceptor name="a">{url}</acceptor></acceptors>\n')
    )
    [acceptor] = config.acceptors
    assert (acceptor.name, acceptor.host, acceptor.port, acceptor.router) == ("a", host, port, "r")
    assert (acceptor.protocols, acceptor.mode) == (protocols, mode)
    assert ("router", "r") in acceptor.params


def test_load_config_ignores_acceptors_without_a_router_parameter(tmp_path):
    acceptors = """\
    <acceptors>
       <acceptor name="artemis">tcp://0.0.0.0:61616?protocols=CORE,AMQP;useEpoll=true</acceptor>
       <acceptor name="in-vm">vm://0</acceptor>
       <acceptor name="odd">tcp://0.0.0.0:1?flag;routerless=x</acceptor>
    </acceptors>
    """
    assert load(tmp_path, routers(_router("r"), extra=textwrap.dedent(acceptors))).acceptors == ()


def test_load_config_rejects_an_unknown_acceptor_mode(tmp_path):
    text = routers(
        _router("r"),
        extra='<acceptors>\n<acceptor name="a">tcp://h:1?router=r;mode=fast</acceptor>\n</acceptors>\n',
    )
    assert_error(
        tmp_path,
        text,
        '<acceptor name="a">',
        "acceptor",
        "acceptor 'a': mode must be one of proxy, redirect, auto, got 'fast'",
    )


def test_load_config_rejects_an_acceptor_naming_an_unknown_router(tmp_path):
    text = routers(
        _router("r"), extra='<acceptors>\n<acceptor name="a">tcp://h:1?router=nope</acceptor>\n</acceptors>\n'
    )
    reason = "unknown connection-router 'nope' (defined: 'r')"
    assert_error(tmp_path, text, '<acceptor name="a">', "acceptor", reason)


def test_load_config_rejects_a_routed_acceptor_without_routers(tmp_path):
    text = document('<acceptors>\n<acceptor name="a">tcp://h:1?router=r</acceptor>\n</acceptors>\n')
    assert_error(
        tmp_path, text, '<acceptor name="a">', "acceptor", "unknown connection-router 'r' (defined: none)"
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param("tcp://h:1?router=r", "tcp://h:2?router=r", id="both-routed"),
        pytest.param("tcp://h:1?protocols=CORE", "tcp://h:2?router=r", id="first-plain"),
        pytest.param("tcp://h:1?router=r", "vm://1", id="second-plain"),
    ],
)
def test_load_config_rejects_duplicate_acceptor_names(tmp_path, first, second):
    extra = (
        f'<acceptors>\n<acceptor name="a">{first}</acceptor>\n'
        f'<acceptor name="a">{second}</acceptor>\n</acceptors>\n'
    )
    text = routers(_router("r"), extra=extra)
    reason = f"duplicate acceptor name 'a', first defined at line {line_of(text, first)}"
    assert_error(tmp_path, text, second, "acceptor", reason)


def test_load_config_allows_repeated_names_among_acceptors_it_ignores(tmp_path):
    extra = '<acceptors><acceptor name="a">tcp://h:1</acceptor><acceptor name="a">tcp://h:2</acceptor></acceptors>\n'
    assert load(tmp_path, routers(_router("r"), extra=extra)).acceptors == ()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("vm://0?router=r", "an acceptor with a router must be a tcp:// URL, got 'vm://0?router=r'"),
        ("tcp://h?router=r", "acceptor URL must name host and port, got 'tcp://h?router=r'"),
        (
            "tcp://h:70000?router=r",
            "acceptor URL 'tcp://h:70000?router=r' is not valid: port out of range 0-65535",
        ),
        (
            "tcp://h:1?router=r;flag",
            "acceptor URL 'tcp://h:1?router=r;flag' is not valid: url parameter 'flag' has no '=value'",
        ),
    ],
)
def test_load_config_rejects_bad_routed_acceptor_urls(tmp_path, url, reason):
    text = routers(_router("r"), extra=f'<acceptors>\n<acceptor name="a">{url}</acceptor>\n</acceptors>\n')
    assert_error(tmp_path, text, '<acceptor name="a">', "acceptor", reason)


# -- discovery groups and cluster connections --


def test_load_config_reads_discovery_groups_and_ignores_broadcast_settings(tmp_path):
    text = document(
        """\
        <discovery-groups>
           <discovery-group name="dg1">
              <local-bind-address>0.0.0.0</local-bind-address>
              <group-address>231.7.7.7</group-address>
              <group-port>9876</group-port>
              <refresh-timeout>2500</refresh-timeout>
           </discovery-group>
           <discovery-group name="dg2">
              <jgroups-file>test-jgroups-file_ping.xml</jgroups-file>
              <jgroups-channel>active_broadcast_channel</jgroups-channel>
           </discovery-group>
        </discovery-groups>
        """
    )
    dg1, dg2 = load(tmp_path, text).discovery_groups
    assert (dg1.name, dg1.refresh_timeout_ms) == ("dg1", 2500)
    assert (dg2.name, dg2.refresh_timeout_ms) == ("dg2", 10000)


def test_load_config_rejects_a_negative_refresh_timeout(tmp_path):
    text = document(
        '<discovery-groups>\n<discovery-group name="dg1"><refresh-timeout>-1</refresh-timeout>\n'
        "</discovery-group></discovery-groups>\n"
    )
    assert_error(tmp_path, text, "<refresh-timeout>", "refresh-timeout", "must be >= 0, got '-1'")


def test_load_config_rejects_duplicate_discovery_group_names(tmp_path):
    text = document(
        '<discovery-groups>\n<discovery-group name="d"/>\n<discovery-group name="d"/>\n</discovery-groups>\n'
    )
    reason = (
        f"duplicate discovery-group name 'd', first defined at line {line_of(text, '<discovery-group name')}"
    )
    assert_error(tmp_path, text, '<discovery-group name="d"/>', "discovery-group", reason, occurrence=2)


def test_load_config_reads_zookeeper_discovery_groups(tmp_path):
    text = document(
        """\
        <connectors><connector name="c1">tcp://127.0.0.1:61617</connector></connectors>
        <discovery-groups>
           <discovery-group name="zk">
              <zookeeper connect="10.0.0.1:2181,10.0.0.2:2181" path="/connection-router/fleet"
                         session-timeout="4000"/>
              <refresh-timeout>2500</refresh-timeout>
           </discovery-group>
           <discovery-group name="plain"><zookeeper connect="zk:2181" path="/p"/></discovery-group>
           <discovery-group name="quick">
              <zookeeper connect="zk:2181" path="/q" answer-timeout="500"/></discovery-group>
        </discovery-groups>
        <cluster-connections><cluster-connection name="c-zk">
           <discovery-group-ref discovery-group-name="zk"/></cluster-connection></cluster-connections>
        <connection-routers>
           <connection-router name="by-group"><policy name="FIRST_ELEMENT"/>
              <pool><discovery-group-ref discovery-group-name="zk"/></pool></connection-router>
           <connection-router name="by-cluster"><policy name="FIRST_ELEMENT"/>
              <pool><cluster-connection>c-zk</cluster-connection></pool></connection-router>
           <connection-router name="static"><policy name="FIRST_ELEMENT"/>
              <pool><static-connectors><connector-ref>c1</connector-ref></static-connectors></pool>
           </connection-router>
        </connection-routers>
        """
    )
    config = load(tmp_path, text)
    zk, plain, quick = config.discovery_groups
    assert quick.zookeeper == ZooKeeperConfig(connect="zk:2181", path="/q", answer_timeout_ms=500)
    assert zk.zookeeper == ZooKeeperConfig(
        connect="10.0.0.1:2181,10.0.0.2:2181", path="/connection-router/fleet", session_timeout_ms=4000
    )
    assert zk.refresh_timeout_ms == 2500
    assert plain.zookeeper == ZooKeeperConfig(
        connect="zk:2181", path="/p", session_timeout_ms=10_000, answer_timeout_ms=2000
    )
    assert config.pool_discovery_group(config.router("by-group")) == zk
    assert config.pool_discovery_group(config.router("by-cluster")) == zk
    assert config.pool_discovery_group(config.router("static")) is None


@pytest.mark.parametrize(
    ("zookeeper", "reason"),
    [
        ('<zookeeper path="/x"/>', "missing required attribute 'connect'"),
        ('<zookeeper connect="h:1"/>', "missing required attribute 'path'"),
        ('<zookeeper connect=" " path="/x"/>', "attribute 'connect' must not be empty, got ''"),
        (
            '<zookeeper connect="h:1" path="/x" session-timeout="0"/>',
            "attribute 'session-timeout' must be > 0, got '0'",
        ),
        (
            '<zookeeper connect="h:1" path="/x" session-timeout="2s"/>',
            "attribute 'session-timeout' must be an integer > 0, got '2s'",
        ),
        (
            '<zookeeper connect="h:1" path="/x" answer-timeout="0"/>',
            "attribute 'answer-timeout' must be > 0, got '0'",
        ),
        (
            '<zookeeper connect="h:1" path="/x" answer-timeout="-5"/>',
            "attribute 'answer-timeout' must be > 0, got '-5'",
        ),
        ('<zookeeper connect="h" path="/x"/>', "connect string must be host:port[,host:port…], got 'h'"),
        (
            '<zookeeper connect="h:1/chroot" path="/x"/>',
            "connect string 'h:1/chroot': no chroot suffix here, give the path separately",
        ),
        (
            '<zookeeper connect="h:1" path="fleet"/>',
            "path must be an absolute znode path below /, got 'fleet'",
        ),
        (
            '<zookeeper connect="h:1" path="/fleet/"/>',
            "path must not have empty, '.' or '..' segments or control characters, got '/fleet/'",
        ),
        ('<zookeeper connect="h:1" path="/x" chroot="/y"/>', "attribute 'chroot' is not allowed"),
        ('<zookeeper connect="h:1" path="/x">text</zookeeper>', "must be empty"),
    ],
)
def test_load_config_rejects_bad_zookeeper_elements(tmp_path, zookeeper, reason):
    group = f'<discovery-group name="dg">\n{zookeeper}\n</discovery-group>'
    text = document(f"<discovery-groups>\n{group}</discovery-groups>\n")
    assert_error(tmp_path, text, "<zookeeper", "zookeeper", reason)


def test_load_config_rejects_two_different_zookeeper_elements(tmp_path):
    text = document(
        '<discovery-groups>\n<discovery-group name="dg">\n<zookeeper connect="h:1" path="/a"/>\n'
        '<zookeeper connect="h:1" path="/b"/>\n</discovery-group></discovery-groups>\n'
    )
    first, second = line_of(text, "<zookeeper"), line_of(text, "<zookeeper", 2)
    reason = f"given twice in <discovery-group name='dg'> with different content (lines {first} and {second})"
    assert_error(tmp_path, text, "<zookeeper", "zookeeper", reason, occurrence=2)


def test_load_config_reads_cluster_connections_and_ignores_their_tuning(tmp_path):
    extra = """\
    <cluster-connections>
       <cluster-connection-uri name="uri-cluster" address-ref="x"/>
       <cluster-connection name="discovered">
          <address/>
          <connector-ref>c2</connector-ref>
          <retry-interval>500</retry-interval>
          <message-load-balancing>ON_DEMAND</message-load-balancing>
          <max-hops>1</max-hops>
          <discovery-group-ref discovery-group-name="dg1"/>
       </cluster-connection>
    </cluster-connections>
    """
    text = document(TARGETS + textwrap.dedent(extra))
    [cluster] = load(tmp_path, text).cluster_connections
    assert cluster.name == "discovered"
    assert (cluster.connector_ref, cluster.static_connectors, cluster.discovery_group) == ("c2", (), "dg1")


@pytest.mark.parametrize(
    ("cluster_xml", "marker", "element", "reason"),
    [
        pytest.param(
            "<static-connectors><connector-ref>nope</connector-ref></static-connectors>",
            "<connector-ref>nope",
            "connector-ref",
            "unknown connector 'nope' (defined: 'c1', 'c2', 'vm0')",
            id="static-connector",
        ),
        pytest.param(
            "<connector-ref>nope</connector-ref>",
            "<connector-ref>nope",
            "connector-ref",
            "unknown connector 'nope' (defined: 'c1', 'c2', 'vm0')",
            id="own-connector",
        ),
        pytest.param(
            '<discovery-group-ref discovery-group-name="dg9"/>',
            "<discovery-group-ref",
            "discovery-group-ref",
            "unknown discovery group 'dg9' (defined: 'dg1')",
            id="discovery-group",
        ),
        pytest.param(
            "<static-connectors><connector-ref>c1</connector-ref></static-connectors>"
            '<discovery-group-ref discovery-group-name="dg1"/>',
            '<cluster-connection name="bad">',
            "cluster-connection",
            "has both <static-connectors> and <discovery-group-ref>, expected one",
            id="both-kinds",
        ),
        pytest.param(
            "<static-connectors><connector-ref> </connector-ref></static-connectors>",
            "<connector-ref> </connector-ref>",
            "connector-ref",
            "must not be empty, got ''",
            id="blank-ref",
        ),
    ],
)
def test_load_config_rejects_bad_cluster_connections(tmp_path, cluster_xml, marker, element, reason):
    extra = (
        f'<cluster-connections>\n<cluster-connection name="bad">\n{cluster_xml}\n'
        "</cluster-connection>\n</cluster-connections>\n"
    )
    text = document(TARGETS + extra)
    assert_error(tmp_path, text, marker, element, reason)


def test_load_config_rejects_duplicate_cluster_connection_names(tmp_path):
    text = document(
        '<cluster-connections>\n<cluster-connection name="k"/>\n<cluster-connection name="k"/>\n'
        "</cluster-connections>\n"
    )
    first = line_of(text, "<cluster-connection name")
    reason = f"duplicate cluster-connection name 'k', first defined at line {first}"
    assert_error(tmp_path, text, '<cluster-connection name="k"/>', "cluster-connection", reason, occurrence=2)


# -- connection routers --


def _router(name: str, body: str = "") -> str:
    return f'<connection-router name="{name}">{body}</connection-router>\n'


def test_load_config_gives_router_defaults(tmp_path):
    [router] = load(tmp_path, routers(_router("r"))).routers
    assert router.key_type is KeyType.SOURCE_IP
    assert (router.key_filter, router.local_target_filter, router.local_connector) == (None, None, None)
    assert (router.cache, router.policy, router.pool) == (None, None, None)


@pytest.mark.parametrize("key_type", list(KeyType))
def test_load_config_reads_every_key_type(tmp_path, key_type):
    [router] = load(tmp_path, routers(_router("r", f"<key-type> {key_type.value} </key-type>"))).routers
    assert router.key_type is key_type


def test_load_config_rejects_an_unknown_key_type(tmp_path):
    text = routers(_router("r", "\n<key-type>CLIENTID</key-type>\n"))
    reason = "must be one of CLIENT_ID, SNI_HOST, SOURCE_IP, USER_NAME, ROLE_NAME, got 'CLIENTID'"
    assert_error(tmp_path, text, "<key-type>", "key-type", reason)


@pytest.mark.parametrize("element", ["key-filter", "local-target-filter"])
def test_load_config_rejects_a_filter_re2_cannot_compile(tmp_path, element):
    text = routers(_router("r", f"\n<{element}>^(FOO</{element}>\n"))
    reason = (
        f"{element} '^(FOO' is not a valid regular expression: missing ): ^(FOO (filters are matched by "
        "RE2, in linear time: no backreferences, look-around, possessive quantifiers or atomic groups)"
    )
    assert_error(tmp_path, text, f"<{element}>", element, reason)


@pytest.mark.parametrize("pattern", [r"(a)\1", "(?=a)", "(?!a)b", "a++", "(?>a)"])
def test_load_config_rejects_a_filter_that_needs_backtracking(tmp_path, pattern):
    """Scenario: constructs only a backtracking engine runs are refused at load, naming the pattern
    (a backtracking match of a client's value could stall every connection)."""
    path = write(tmp_path, routers(_router("r", f"\n<key-filter>{pattern}</key-filter>\n")))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.element == "key-filter"
    assert info.value.reason.startswith(f"key-filter {pattern!r} is not a valid regular expression: ")


def test_load_config_reads_filters_trimmed_and_blank_as_none(tmp_path):
    body = "<key-filter>\n   ^[A-Z]{3}\n</key-filter><local-target-filter>  </local-target-filter>"
    [router] = load(tmp_path, routers(_router("r", body))).routers
    assert (router.key_filter, router.local_target_filter) == ("^[A-Z]{3}", None)


def test_load_config_rejects_duplicate_router_names(tmp_path):
    text = routers(_router("r") + _router("r"))
    first = line_of(text, '<connection-router name="r"')
    reason = f"duplicate connection-router name 'r', first defined at line {first}"
    assert_error(tmp_path, text, '<connection-router name="r"', "connection-router", reason, occurrence=2)


def test_load_config_reads_the_local_target_connector(tmp_path):
    [router] = load(
        tmp_path, routers(_router("r", "<local-target-connector-ref>c2</local-target-connector-ref>"))
    ).routers
    assert router.local_connector == "c2"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("nope", "unknown connector 'nope' (defined: 'c1', 'c2', 'vm0')"),
        ("vm0", "connector 'vm0' is a vm:// connector, the router needs tcp://"),
    ],
)
def test_load_config_rejects_a_bad_local_target_connector(tmp_path, name, reason):
    text = routers(_router("r", f"\n<local-target-connector-ref>{name}</local-target-connector-ref>\n"))
    assert_error(tmp_path, text, "<local-target-connector-ref>", "local-target-connector-ref", reason)


# -- cache --


def test_load_config_enables_the_cache_when_present(tmp_path):
    [router] = load(tmp_path, routers(_router("r", "<cache/>"))).routers
    assert router.cache == CacheConfig(persisted=False, timeout_ms=0)


def test_load_config_reads_cache_settings(tmp_path, caplog):
    text = routers(_router("r", "<cache><timeout>60000</timeout><persisted>False</persisted></cache>"))
    with caplog.at_level(logging.WARNING, logger="router.config"):
        [router] = load(tmp_path, text).routers
    assert router.cache == CacheConfig(persisted=False, timeout_ms=60000)
    assert caplog.records == []


def test_load_config_keeps_a_persisted_cache_beside_the_configuration_by_default(tmp_path, caplog):
    text = routers(_router("r 1", "\n<cache><persisted>true</persisted></cache>"))
    with caplog.at_level(logging.WARNING, logger="router.config"):
        [router] = load(tmp_path, text).routers
    assert router.cache == CacheConfig(persisted=True, file=str(tmp_path / "router-cache-r%201.sqlite"))
    assert caplog.records == []


def test_load_config_reads_a_persisted_cache_file(tmp_path):
    text = routers(_router("r", "<cache><persisted>true</persisted><file>/var/lib/c.sqlite</file></cache>"))
    [router] = load(tmp_path, text).routers
    assert router.cache == CacheConfig(persisted=True, file="/var/lib/c.sqlite")


def test_load_config_reads_a_shared_cache(tmp_path):
    shared = '<zookeeper connect="127.0.0.1:2181,127.0.0.2:2181" path="/cr/cache" session-timeout="4000"/>'
    text = routers(_router("r", f"<cache><timeout>1000</timeout>{shared}</cache>"))
    [router] = load(tmp_path, text).routers
    assert router.cache == CacheConfig(timeout_ms=1000)
    assert router.cache_zookeeper == ZooKeeperConfig(
        connect="127.0.0.1:2181,127.0.0.2:2181", path="/cr/cache", session_timeout_ms=4000
    )


def test_load_config_rejects_a_shared_cache_without_timeout(tmp_path):
    text = routers(_router("r", '\n<cache><zookeeper connect="127.0.0.1:2181" path="/c"/></cache>'))
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"a shared cache \(<zookeeper> in <cache>\) needs a <timeout> > 0"):
        load_config(path)


def test_load_config_rejects_a_bad_shared_cache_path(tmp_path):
    text = routers(
        _router(
            "r", '\n<cache><timeout>1</timeout><zookeeper connect="127.0.0.1:2181" path="cache"/></cache>'
        )
    )
    assert_error(
        tmp_path, text, "<zookeeper", "zookeeper", "path must be an absolute znode path below /, got 'cache'"
    )


def test_load_config_rejects_a_cache_file_without_persistence(tmp_path):
    text = routers(_router("r", "\n<cache><file>c.sqlite</file></cache>"))
    assert_error(
        tmp_path,
        text,
        "<cache>",
        "cache",
        "file 'c.sqlite' is only for a persisted cache (<persisted>true</persisted>)",
    )


@pytest.mark.parametrize(
    ("body", "element", "reason"),
    [
        ("<timeout>-1</timeout>", "timeout", "must be >= 0, got '-1'"),
        ("<timeout>1m</timeout>", "timeout", "must be an integer >= 0, got '1m'"),
        ("<persisted>yes</persisted>", "persisted", "must be true or false, got 'yes'"),
        ("<max-entries>0</max-entries>", "max-entries", "must be > 0, got '0'"),
    ],
)
def test_load_config_rejects_bad_cache_values(tmp_path, body, element, reason):
    text = routers(_router("r", f"\n<cache>{body}</cache>"))
    assert_error(tmp_path, text, f"<{element}>", element, reason)


def test_load_config_reads_the_bounds_on_keys_and_cache_entries(tmp_path):
    """Scenario: our <key-max-length> and <cache><max-entries> (hardening finding 4); defaults
    otherwise."""
    text = routers(
        _router("r", "<key-max-length>64</key-max-length><cache><max-entries>500</max-entries></cache>")
        + _router("d", "<cache/>")
    )
    bounded, default = load(tmp_path, text).routers
    assert (bounded.key_max_length, bounded.cache) == (64, CacheConfig(max_entries=500))
    assert (default.key_max_length, default.cache) == (
        DEFAULT_KEY_MAX_LENGTH,
        CacheConfig(max_entries=DEFAULT_MAX_ENTRIES),
    )


def test_load_config_rejects_a_key_max_length_of_zero(tmp_path):
    text = routers(_router("r", "\n<key-max-length>0</key-max-length>"))
    assert_error(tmp_path, text, "<key-max-length>", "key-max-length", "must be > 0, got '0'")


# -- policy and key-transformer --


def test_load_config_reads_policy_properties(tmp_path):
    body = '<policy name="LEAST_CONNECTIONS"><property key="CONNECTION_COUNT_THRESHOLD" value="10"/></policy>'
    [router] = load(tmp_path, routers(_router("r", body))).routers
    assert router.policy == PolicyConfig(
        name="LEAST_CONNECTIONS", properties=(("CONNECTION_COUNT_THRESHOLD", "10"),)
    )


def test_load_config_reads_the_ketama_ring_and_load_factor(tmp_path):
    body = (
        '<policy name="CONSISTENT_HASH"><property key="RING" value="KETAMA"/>'
        '<property key="LOAD_FACTOR" value="1.25"/></policy>'
    )
    [router] = load(tmp_path, routers(_router("r", body))).routers
    assert router.policy == PolicyConfig(
        name="CONSISTENT_HASH", properties=(("RING", "KETAMA"), ("LOAD_FACTOR", "1.25"))
    )
    assert router.policy.keyed is False


def test_load_config_accepts_the_manuals_lower_case_modulo(tmp_path):
    body = '<policy name="CONSISTENT_HASH_MODULO"><property key="modulo" value="3"/></policy>'
    [router] = load(tmp_path, routers(_router("r", body))).routers
    assert router.policy == PolicyConfig(name="CONSISTENT_HASH_MODULO", properties=(("modulo", "3"),))


@pytest.mark.parametrize(
    ("policy_xml", "reason"),
    [
        pytest.param(
            '<policy name="RANDOM"/>',
            "unknown policy 'RANDOM', expected one of ['CONSISTENT_HASH', 'CONSISTENT_HASH_MODULO', "
            "'FIRST_ELEMENT', 'LEAST_CONNECTIONS', 'ROUND_ROBIN']",
            id="unknown-name",
        ),
        pytest.param(
            '<policy name="CONSISTENT_HASH_MODULO"/>',
            "CONSISTENT_HASH_MODULO needs property MODULO (a positive integer)",
            id="modulo-missing",
        ),
        pytest.param(
            '<policy name="CONSISTENT_HASH_MODULO"><property key="MODULO" value="0"/></policy>',
            "MODULO must be a positive integer, got '0'",
            id="modulo-zero",
        ),
        pytest.param(
            '<policy name="ROUND_ROBIN"><property key="SEED" value="1"/></policy>',
            "policy ROUND_ROBIN has no property 'SEED' (accepted: none)",
            id="unknown-property",
        ),
        pytest.param(
            '<policy name="CONSISTENT_HASH"><property key="RING" value="MAGLEV"/></policy>',
            "RING must be one of ARTEMIS, KETAMA, got 'MAGLEV'",
            id="ring-unknown",
        ),
        pytest.param(
            '<policy name="CONSISTENT_HASH"><property key="LOAD_FACTOR" value="1.25"/></policy>',
            "LOAD_FACTOR needs RING=KETAMA (got RING='ARTEMIS'): LOAD_FACTOR='1.25'",
            id="load-factor-without-ketama",
        ),
        pytest.param(
            '<policy name="CONSISTENT_HASH"><property key="RING" value="KETAMA"/>'
            '<property key="LOAD_FACTOR" value="125"/></policy>',
            "LOAD_FACTOR must be a decimal number > 1 and <= 10 (1.25: a target takes at most 25 % "
            "more than its share), got '125'",
            id="load-factor-as-a-percentage",
        ),
    ],
)
def test_load_config_rejects_bad_policies(tmp_path, policy_xml, reason):
    text = routers(_router("r", f"\n{policy_xml}\n"))
    assert_error(tmp_path, text, "<policy", "policy", reason)


def test_load_config_rejects_a_property_given_twice_with_different_values(tmp_path):
    body = (
        '\n<policy name="CONSISTENT_HASH_MODULO">\n<property key="MODULO" value="3"/>\n'
        '<property key="MODULO" value="4"/>\n</policy>\n'
    )
    text = routers(_router("r", body))
    first, second = line_of(text, 'value="3"'), line_of(text, 'value="4"')
    reason = f"property 'MODULO' given twice with different values (lines {first} and {second})"
    assert_error(tmp_path, text, 'value="4"', "property", reason)


def test_load_config_takes_a_deprecated_key_transformer_as_the_policy(tmp_path, caplog):
    body = '\n<key-transformer name="CONSISTENT_HASH_MODULO">\n<property key="modulo" value="3"/>\n'
    body += "</key-transformer>"
    text = routers(_router("r", body))
    with caplog.at_level(logging.WARNING, logger="router.config"):
        [router] = load(tmp_path, text).routers
    assert router.policy == PolicyConfig(name="CONSISTENT_HASH_MODULO", properties=(("modulo", "3"),))
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'router.xml'}:{line_of(text, '<key-transformer')}: connection-router 'r': "
        "<key-transformer> is deprecated, use <policy>"
    ]


def test_load_config_prefers_the_policy_to_a_key_transformer(tmp_path, caplog):
    body = (
        '\n<key-transformer name="CONSISTENT_HASH_MODULO">\n<property key="MODULO" value="3"/>\n'
        '</key-transformer>\n<policy name="ROUND_ROBIN"/>'
    )
    text = routers(_router("r", body))
    with caplog.at_level(logging.WARNING, logger="router.config"):
        [router] = load(tmp_path, text).routers
    assert router.policy == PolicyConfig(name="ROUND_ROBIN")
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'router.xml'}:{line_of(text, '<key-transformer')}: connection-router 'r': "
        "<key-transformer> is deprecated, use <policy>; ignoring it because the router also has a <policy>"
    ]


def test_load_config_rejects_a_bad_key_transformer(tmp_path):
    text = routers(_router("r", '\n<key-transformer name="CONSISTENT_HASH_MODULO"/>\n'))
    reason = "CONSISTENT_HASH_MODULO needs property MODULO (a positive integer)"
    assert_error(tmp_path, text, "<key-transformer", "key-transformer", reason)


# -- pool --


def test_load_config_gives_pool_defaults(tmp_path):
    [router] = load(tmp_path, routers(_router("r", STATIC_POOL))).routers
    assert router.pool is not None
    assert (router.pool.username, router.pool.password) == (None, None)
    assert (router.pool.check_period_ms, router.pool.quorum_size, router.pool.quorum_timeout_ms) == (
        5000,
        1,
        3000,
    )
    assert router.pool.local_target_enabled is False


def test_load_config_leaves_absent_values_to_the_dataclass_defaults(tmp_path):
    """Scenario: the loader passes only what the document gives, so each default is stated once,
    on its dataclass."""
    zookeeper = '<discovery-group name="zk"><zookeeper connect="h:2181" path="/p"/></discovery-group>'
    text = routers(_router("r", STATIC_POOL + "<cache/>")).replace('<discovery-group name="dg1"/>', zookeeper)
    config = load(tmp_path, text)
    [router] = config.routers
    assert router.pool == PoolConfig(kind=PoolKind.STATIC, static_connectors=("c1",))
    assert router.cache == CacheConfig()
    assert router.key_type is RouterConfig(name="r").key_type
    group = config.discovery_group("zk")
    assert group == DiscoveryGroupConfig(name="zk", zookeeper=ZooKeeperConfig(connect="h:2181", path="/p"))
    assert config.connection_ttl == ConnectionTtlConfig()


def test_load_config_reads_pool_settings(tmp_path):
    pool = """\
    <pool>
       <quorum-timeout>0</quorum-timeout>
       <username>probe</username>
       <password>s3cret</password>
       <check-period> 1000 </check-period>
       <quorum-size>2</quorum-size>
       <local-target-enabled>TRUE</local-target-enabled>
       <static-connectors>
          <connector-ref>c2</connector-ref>
          <connector-ref>c1</connector-ref>
       </static-connectors>
    </pool>
    """
    [router] = load(tmp_path, routers(_router("r", textwrap.dedent(pool)))).routers
    assert router.pool is not None
    assert router.pool.static_connectors == ("c2", "c1")
    assert (router.pool.username, router.pool.password) == ("probe", "s3cret")
    assert (router.pool.check_period_ms, router.pool.quorum_size, router.pool.quorum_timeout_ms) == (
        1000,
        2,
        0,
    )
    assert router.pool.local_target_enabled is True


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("False", False), ("1", True), ("0", False)])
def test_load_config_reads_booleans(tmp_path, text, expected):
    body = f"<pool><local-target-enabled>{text}</local-target-enabled>{CLUSTER_POOL_KIND}</pool>"
    [router] = load(tmp_path, routers(_router("r", body))).routers
    assert router.pool is not None
    assert router.pool.local_target_enabled is expected


def test_load_config_reads_discovery_and_cluster_pools(tmp_path):
    text = routers(
        _router("d", '<pool><discovery-group-ref discovery-group-name="dg1"/></pool>')
        + _router("k", f"<pool>{CLUSTER_POOL_KIND}</pool>")
    )
    discovery, cluster = load(tmp_path, text).routers
    assert discovery.pool is not None
    assert (discovery.pool.kind, discovery.pool.discovery_group) == (PoolKind.DISCOVERY, "dg1")
    assert cluster.pool is not None
    assert (cluster.pool.kind, cluster.pool.cluster_connection) == (PoolKind.CLUSTER, "cluster1")


@pytest.mark.parametrize(
    ("element", "value", "reason"),
    [
        ("check-period", "0", "must be > 0, got '0'"),
        ("check-period", "abc", "must be an integer > 0, got 'abc'"),
        ("check-period", "1.5", "must be an integer > 0, got '1.5'"),
        ("quorum-size", "-5", "must be > 0, got '-5'"),
        ("quorum-size", "0", "must be > 0, got '0'"),
        ("quorum-size", "", "must be an integer > 0, got ''"),
        ("quorum-timeout", "-1", "must be >= 0, got '-1'"),
        ("quorum-timeout", "3s", "must be an integer >= 0, got '3s'"),
        (
            "quorum-timeout",
            "99999999999999999999",
            "must be at most 9223372036854775807, got '99999999999999999999'",
        ),
        ("local-target-enabled", "yes", "must be true or false, got 'yes'"),
    ],
)
def test_load_config_rejects_bad_pool_values(tmp_path, element, value, reason):
    text = routers(
        _router(
            "r",
            f"<pool>\n<{element}>{value}</{element}>\n{CLUSTER_POOL_KIND}</pool>",
        )
    )
    assert_error(tmp_path, text, f"<{element}>", element, reason)


def test_load_config_rejects_zero_quorum_size(tmp_path):
    text = routers(
        _router(
            "r",
            f"<pool>\n<quorum-size>0</quorum-size>\n{CLUSTER_POOL_KIND}</pool>",
        )
    )
    assert_error(tmp_path, text, "<quorum-size>", "quorum-size", "must be > 0, got '0'")


@pytest.mark.parametrize(
    ("pool_body", "got"),
    [
        pytest.param("<username>u</username>", "[]", id="none"),
        pytest.param(
            "<cluster-connection>cluster1</cluster-connection>"
            "<static-connectors><connector-ref>c1</connector-ref></static-connectors>",
            "['static-connectors', 'cluster-connection']",
            id="two",
        ),
    ],
)
def test_load_config_rejects_a_pool_without_exactly_one_kind(tmp_path, pool_body, got):
    text = routers(_router("r", f"\n<pool>{pool_body}</pool>"))
    reason = (
        f"a pool needs exactly one of static-connectors, discovery-group-ref, cluster-connection, got {got}"
    )
    assert_error(tmp_path, text, "<pool>", "pool", reason)


@pytest.mark.parametrize(
    ("pool_body", "marker", "element", "reason"),
    [
        pytest.param(
            "<static-connectors><connector-ref>c1</connector-ref>\n<connector-ref>c9</connector-ref></static-connectors>",
            "<connector-ref>c9",
            "connector-ref",
            "unknown connector 'c9' (defined: 'c1', 'c2', 'vm0')",
            id="static-connector",
        ),
        pytest.param(
            "<static-connectors>\n<connector-ref>vm0</connector-ref></static-connectors>",
            "<connector-ref>vm0",
            "connector-ref",
            "connector 'vm0' is a vm:// connector, the router needs tcp://",
            id="static-vm-connector",
        ),
        pytest.param(
            '\n<discovery-group-ref discovery-group-name="dg9"/>',
            "<discovery-group-ref",
            "discovery-group-ref",
            "unknown discovery group 'dg9' (defined: 'dg1')",
            id="discovery-group",
        ),
        pytest.param(
            "\n<cluster-connection>cluster9</cluster-connection>",
            "<cluster-connection>cluster9",
            "cluster-connection",
            "unknown cluster connection 'cluster9' (defined: 'cluster1')",
            id="cluster-connection",
        ),
    ],
)
def test_load_config_rejects_unknown_pool_references(tmp_path, pool_body, marker, element, reason):
    text = routers(_router("r", f"<pool>{pool_body}</pool>"))
    assert_error(tmp_path, text, marker, element, reason)


def test_load_config_rejects_a_cluster_pool_over_vm_connectors(tmp_path):
    clusters = (
        '<cluster-connections><cluster-connection name="vmcluster"><static-connectors>'
        "<connector-ref>vm0</connector-ref></static-connectors></cluster-connection></cluster-connections>\n"
    )
    pool = "<pool>\n<cluster-connection>vmcluster</cluster-connection></pool>"
    text = document(f"{TARGETS}{clusters}<connection-routers>{_router('r', pool)}</connection-routers>\n")
    reason = "cluster connection 'vmcluster' uses vm:// connector 'vm0', the router needs tcp://"
    assert_error(tmp_path, text, "<cluster-connection>vmcluster", "cluster-connection", reason)


# -- repeated children --


@pytest.mark.parametrize(
    ("body", "element", "parent"),
    [
        pytest.param(
            f'\n<policy name="ROUND_ROBIN"/>\n{STATIC_POOL}\n<policy name="ROUND_ROBIN"/>\n',
            "policy",
            "<connection-router name='r'>",
            id="policy",
        ),
        pytest.param(
            f"\n<pool><quorum-size>2</quorum-size>\n<quorum-size> 2 </quorum-size>{CLUSTER_POOL_KIND}</pool>",
            "quorum-size",
            "<pool>",
            id="pool-child",
        ),
    ],
)
def test_load_config_merges_identical_repeated_children_with_one_warning(
    tmp_path, caplog, body, element, parent
):
    text = routers(_router("r", body))
    with caplog.at_level(logging.WARNING, logger="router.config"):
        load(tmp_path, text)
    first, second = line_of(text, f"<{element}"), line_of(text, f"<{element}", 2)
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'router.xml'}:{second}: <{element}> is repeated with identical content in {parent} "
        f"(first at line {first}); using one"
    ]


def test_load_config_warns_once_for_three_identical_copies(tmp_path, caplog):
    body = '\n<policy name="ROUND_ROBIN"/>\n<policy name="ROUND_ROBIN"/>\n<policy name="ROUND_ROBIN"/>\n'
    with caplog.at_level(logging.WARNING, logger="router.config"):
        [router] = load(tmp_path, routers(_router("r", body))).routers
    assert router.policy == PolicyConfig(name="ROUND_ROBIN")
    assert len(caplog.records) == 1


@pytest.mark.parametrize(
    ("body", "element", "parent"),
    [
        pytest.param(
            '\n<policy name="ROUND_ROBIN"/>\n<policy name="FIRST_ELEMENT"/>\n',
            "policy",
            "<connection-router name='r'>",
            id="policy",
        ),
        pytest.param(
            "\n<key-filter>^a</key-filter>\n<key-filter>^b</key-filter>\n",
            "key-filter",
            "<connection-router name='r'>",
            id="key-filter",
        ),
        pytest.param(
            f"\n<pool><quorum-size>2</quorum-size>\n<quorum-size>3</quorum-size>{CLUSTER_POOL_KIND}</pool>",
            "quorum-size",
            "<pool>",
            id="pool-child",
        ),
        pytest.param(
            "\n<cache><timeout>1</timeout>\n<timeout>2</timeout></cache>",
            "timeout",
            "<cache>",
            id="cache-child",
        ),
    ],
)
def test_load_config_rejects_differing_repeated_children(tmp_path, body, element, parent):
    text = routers(_router("r", body))
    first, second = line_of(text, f"<{element}"), line_of(text, f"<{element}", 2)
    reason = f"given twice in {parent} with different content (lines {first} and {second})"
    assert_error(tmp_path, text, f"<{element}", element, reason, occurrence=2)


# -- passwords --


def test_load_config_masks_the_pool_password_in_errors(tmp_path):
    pool = f"<pool><password>hunter2</password>\n<quorum-size>hunter2</quorum-size>{CLUSTER_POOL_KIND}</pool>"
    text = routers(_router("r", f"\n{pool}"))
    assert_error(tmp_path, text, "<quorum-size>", "quorum-size", "must be an integer > 0, got '***'")


def test_load_config_logs_no_password(tmp_path, caplog):
    """Scenario: a repeated pool is logged; the pool's password is not."""
    pool = f"<pool><username>u</username><password>hunter2</password>{CLUSTER_POOL_KIND}</pool>"
    text = routers(_router("r", f"\n{pool}\n{pool}"))
    with caplog.at_level(logging.DEBUG):
        config = load(tmp_path, text)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert "hunter2" not in caplog.text
    assert "hunter2" not in repr(config)


@pytest.mark.parametrize(
    ("section", "element", "reason"),
    [
        pytest.param(
            '<connectors>\n<connector name="c">tcp://h?trustStorePassword=t0pSecret</connector>\n</connectors>',
            "connector",
            "connector URL must name host and port, got 'tcp://h?trustStorePassword=***'",
            id="connector",
        ),
        pytest.param(
            '<acceptors>\n<acceptor name="a">tcp://h:1?router=r;keyStorePassword=t0pSecret;mode=x</acceptor>\n</acceptors>',
            "acceptor",
            "acceptor 'a': mode must be one of proxy, redirect, auto, got 'x'",
            id="acceptor-mode",
        ),
        pytest.param(
            '<acceptors>\n<acceptor name="a">tcp://h?router=r;keyStorePassword=t0pSecret</acceptor>\n</acceptors>',
            "acceptor",
            "acceptor URL must name host and port, got 'tcp://h?router=r;keyStorePassword=***'",
            id="acceptor-url",
        ),
    ],
)
def test_load_config_masks_password_url_parameters(tmp_path, section, element, reason):
    text = document(f"{section}\n<connection-routers>{_router('r')}</connection-routers>\n")
    error = assert_error(tmp_path, text, "t0pSecret", element, reason)
    assert "t0pSecret" not in str(error)


DUPLICATE_NODE_IDS = """<core>
  <connectors>
    <connector name="a">tcp://127.0.0.1:61617?nodeId=same</connector>
    <connector name="b">tcp://127.0.0.1:61618?nodeId=same</connector>
    <connector name="local">tcp://127.0.0.1:61619</connector>
  </connectors>
  <connection-routers>
    <connection-router name="r">
      <policy name="FIRST_ELEMENT"/>
      <pool>
        <static-connectors><connector-ref>a</connector-ref><connector-ref>b</connector-ref></static-connectors>
      </pool>
    </connection-router>
    <connection-router name="l">
      <local-target-connector-ref>local</local-target-connector-ref>
      <policy name="FIRST_ELEMENT"/>
      <pool>
        <local-target-enabled>true</local-target-enabled>
        <static-connectors><connector-ref>local</connector-ref></static-connectors>
      </pool>
    </connection-router>
  </connection-routers>
</core>
"""


def test_load_config_rejects_duplicate_node_ids_in_a_pool() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(DUPLICATE_NODE_IDS, source="dup.xml")
    assert str(info.value) == (
        "dup.xml:10: <pool>: node id 'same' of connector 'b' is already the node id of connector 'a' "
        "in this pool; node ids must be unique (set nodeId=… on the connector URL)"
    )


def test_load_config_rejects_local_target_that_is_also_a_pool_member() -> None:
    text = DUPLICATE_NODE_IDS.replace(
        '?nodeId=same</connector>\n    <connector name="b">tcp://127.0.0.1:61618?nodeId=same',
        '?nodeId=one</connector>\n    <connector name="b">tcp://127.0.0.1:61618?nodeId=two',
    )
    with pytest.raises(ConfigError) as info:
        load_config_text(text, source="dup.xml")
    assert str(info.value) == (
        "dup.xml:17: <pool>: node id 'local' of connector 'local' is already the node id of the local "
        "target in this pool; node ids must be unique (set nodeId=… on the connector URL)"
    )


def _acceptor_doc(params: str) -> str:
    return f"""<core>
  <acceptors><acceptor name="a">tcp://127.0.0.1:61616?router=r;{params}</acceptor></acceptors>
  <connection-routers><connection-router name="r"/></connection-routers>
</core>"""


def test_load_config_acceptor_handshake_and_proxy_protocol_parameters() -> None:
    config = load_config_text(
        _acceptor_doc("handshake-timeout=3;sniffMaxBytes=4096;proxyProtocolEnabled=true;sendProxyProtocol=v2")
    )
    (acceptor,) = config.acceptors
    assert acceptor.handshake_timeout_ms == 3000
    assert acceptor.sniff_max_bytes == 4096
    assert acceptor.proxy_protocol is True
    assert acceptor.send_proxy_protocol == "v2"


def test_load_config_acceptor_defaults_for_handshake_parameters() -> None:
    (acceptor,) = load_config_text(_acceptor_doc("mode=proxy")).acceptors
    assert (acceptor.handshake_timeout_ms, acceptor.sniff_max_bytes) == (10_000, 16 * 1024)
    assert (acceptor.proxy_protocol, acceptor.send_proxy_protocol) == (False, None)


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ("handshake-timeout=-1", "handshake-timeout must be >= 0, got '-1'"),
        ("handshakeTimeout=soon", "handshakeTimeout must be an integer >= 0, got 'soon'"),
        ("sniffMaxBytes=big", "sniffMaxBytes must be an integer 64-1048576, got 'big'"),
        ("sniffMaxBytes=10", "sniffMaxBytes must be 64-1048576, got '10'"),
        ("proxyProtocolEnabled=yes", "proxyProtocolEnabled must be true or false, got 'yes'"),
        ("sendProxyProtocol=v3", "sendProxyProtocol must be v1 or v2, got 'v3'"),
    ],
)
def test_load_config_rejects_bad_acceptor_handshake_parameters(params: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(_acceptor_doc(params), source="a.xml")
    assert str(info.value) == f"a.xml:2: <acceptor>: acceptor 'a': {reason}"


def test_load_config_acceptor_fast_path_parameter() -> None:
    assert load_config_text(_acceptor_doc("mode=proxy")).acceptors[0].fast_path is True
    (acceptor,) = load_config_text(_acceptor_doc("fastPath=FALSE")).acceptors
    assert acceptor.fast_path is False
    assert ("fastPath", "FALSE") in acceptor.params  # the raw parameters stay as given
    with pytest.raises(ConfigError) as info:
        load_config_text(_acceptor_doc("fastPath=no"), source="a.xml")
    assert str(info.value) == "a.xml:2: <acceptor>: acceptor 'a': fastPath must be true or false, got 'no'"


def test_load_config_rejects_disagreeing_handshake_timeout_spellings() -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(_acceptor_doc("handshake-timeout=3;handshakeTimeout=4"), source="a.xml")
    assert str(info.value) == (
        "a.xml:2: <acceptor>: acceptor 'a': handshake-timeout '3' and handshakeTimeout '4' disagree: give one"
    )


def test_load_config_acceptor_tls_termination_parameters(tmp_path: Path) -> None:
    key_store, trust_store = tmp_path / "router.pem", tmp_path / "ca.pem"
    key_store.write_text("(a PEM key store; the loader only checks that it can be read)")
    trust_store.write_text("(a PEM CA bundle)")
    (acceptor,) = load_config_text(
        _acceptor_doc(
            f"sslEnabled=true;keyStorePath={key_store};keyStoreType=PEM;trustStorePath={trust_store};"
            "needClientAuth=true"
        )
    ).acceptors
    assert acceptor.tls is not None
    assert (acceptor.tls.key_store_path, acceptor.tls.trust_store_path) == (str(key_store), str(trust_store))
    assert acceptor.tls.need_client_auth is True
    assert load_config_text(_acceptor_doc("mode=proxy")).acceptors[0].tls is None


class TestAcceptorFiles:
    """Scenario: a file an acceptor reads at start (key store, trust store, user store) is missing
    or not a file; the loader says which acceptor, parameter, path and line, before routerd starts."""

    @pytest.fixture
    def files(self, tmp_path: Path) -> dict[str, Path]:
        paths = {
            "key": tmp_path / "router.pem",
            "ca": tmp_path / "ca.pem",
            "users": tmp_path / "users.properties",
            "roles": tmp_path / "roles.properties",
        }
        for path in paths.values():
            path.write_text("x\n")
        return paths

    def _params(self, files: dict[str, Path], **replace: str) -> str:
        paths = {what: str(path) for what, path in files.items()} | replace
        return (
            f"sslEnabled=true;keyStorePath={paths['key']};trustStorePath={paths['ca']};wantClientAuth=true;"
            f"usersFile={paths['users']};rolesFile={paths['roles']}"
        )

    def test_load_config_accepts_readable_files(self, files: dict[str, Path]) -> None:
        (acceptor,) = load_config_text(_acceptor_doc(self._params(files))).acceptors
        assert acceptor.users_file == str(files["users"])

    @pytest.mark.parametrize(
        ("what", "param"),
        [("key", "keyStorePath"), ("ca", "trustStorePath"), ("users", "usersFile"), ("roles", "rolesFile")],
    )
    def test_load_config_rejects_a_missing_file(
        self, tmp_path: Path, files: dict[str, Path], what: str, param: str
    ) -> None:
        missing = str(tmp_path / "missing.pem")
        with pytest.raises(ConfigError) as info:
            load_config_text(_acceptor_doc(self._params(files, **{what: missing})), source="a.xml")
        assert str(info.value) == (
            f"a.xml:2: <acceptor>: acceptor 'a': {param} {missing!r} cannot be read: "
            "No such file or directory"
        )

    def test_load_config_rejects_a_directory_or_fifo(self, tmp_path: Path, files: dict[str, Path]) -> None:
        with pytest.raises(ConfigError) as info:
            load_config_text(_acceptor_doc(self._params(files, key=str(tmp_path))), source="a.xml")
        assert str(info.value) == (
            f"a.xml:2: <acceptor>: acceptor 'a': keyStorePath {str(tmp_path)!r} cannot be read: "
            "it is a directory, not a regular file"
        )
        fifo = _fifo(tmp_path / "fifo.pem")
        with pytest.raises(ConfigError, match="it is a FIFO, not a regular file"):
            load_config_text(_acceptor_doc(self._params(files, ca=str(fifo))), source="a.xml")

    def test_load_config_names_the_working_directory_of_a_relative_path(
        self, tmp_path: Path, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.chdir(tmp_path)
        assert load_config_text(_acceptor_doc(self._params(files, key="router.pem"))).acceptors
        with pytest.raises(ConfigError) as info:
            load_config_text(_acceptor_doc(self._params(files, key="nope.pem")), source="a.xml")
        assert str(info.value) == (
            f"a.xml:2: <acceptor>: acceptor 'a': keyStorePath 'nope.pem' (relative to the working "
            f"directory {str(tmp_path)!r}) cannot be read: No such file or directory"
        )

    def test_load_config_checks_no_file_of_tls_parameters_without_ssl_enabled(self) -> None:
        """Scenario: without sslEnabled=true the key store is not used, so it is not read either."""
        (acceptor,) = load_config_text(_acceptor_doc("keyStorePath=/nonexistent/k.pem")).acceptors
        assert acceptor.tls is None


@pytest.mark.parametrize(
    ("protocols", "expected"),
    [
        ("MQTT", ("MQTT",)),
        ("core,AMQP,stomp,HORNETQ,MQTT,openwire", ("CORE", "AMQP", "STOMP", "HORNETQ", "MQTT", "OPENWIRE")),
        (" mqtt , ,amqp ", ("MQTT", "AMQP")),
        ("", ()),
    ],
)
def test_load_config_acceptor_protocols(protocols: str, expected: tuple[str, ...]) -> None:
    (acceptor,) = load_config_text(_acceptor_doc(f"protocols={protocols}")).acceptors
    assert acceptor.protocols == expected


def test_load_config_rejects_an_unknown_acceptor_protocol() -> None:
    """Scenario: a typo in `protocols` would make the acceptor refuse that protocol's clients."""
    with pytest.raises(ConfigError) as info:
        load_config_text(_acceptor_doc("protocols=MQTT,FOO"), source="a.xml")
    assert str(info.value) == (
        "a.xml:2: <acceptor>: acceptor 'a': protocols: each name must be one of AMQP, CORE, HORNETQ, "
        "MQTT, OPENWIRE, STOMP, got 'FOO' in 'MQTT,FOO'"
    )


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ("sslEnabled=yes", "sslEnabled must be true or false, got 'yes'"),
        ("sslEnabled=true", "sslEnabled=true needs keyStorePath (a PEM file with key and certificate)"),
        (
            "sslEnabled=true;keyStorePath=k.jks;keyStoreType=JKS",
            "keyStoreType 'JKS' is not supported: use PEM files "
            "(convert with: openssl pkcs12 -in store.p12 -nodes -out store.pem)",
        ),
        (
            "sslEnabled=true;keyStorePath=k.pem;needClientAuth=true",
            "needClientAuth/wantClientAuth need trustStorePath (the CA of client certificates)",
        ),
    ],
)
def test_load_config_rejects_bad_tls_parameters(params: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(_acceptor_doc(params), source="a.xml")
    assert str(info.value) == f"a.xml:2: <acceptor>: acceptor 'a': {reason}"


def test_load_config_connector_probe_kind() -> None:
    doc = '<core><connectors><connector name="c">tcp://127.0.0.1:1883?probe=mqtt</connector></connectors></core>'
    (connector,) = load_config_text(doc).connectors
    assert connector.param_map["probe"] == "mqtt"
    with pytest.raises(ConfigError) as info:
        load_config_text(doc.replace("probe=mqtt", "probe=ping"), source="p.xml")
    expected = "p.xml:1: <connector>: probe must be one of tcp, mqtt, stomp, amqp, openwire, core, got 'ping'"
    assert str(info.value) == expected


# -- connection TTL: acceptor connectionTtl, <core> connection-ttl-override and -check-interval --


@pytest.mark.parametrize(
    ("params", "ttl_ms"),
    [
        pytest.param("mode=proxy", -1, id="default-none"),
        pytest.param("connectionTtl=1500", 1500, id="artemis-acceptor-spelling"),
        pytest.param("connectionTTL=60000", 60000, id="artemis-client-url-spelling"),
        pytest.param("connectionTtl=1500;connectionTTL= 1500", 1500, id="both-agreeing"),
        pytest.param("connectionTtl=-1", -1, id="off"),
    ],
)
def test_load_config_acceptor_connection_ttl(params: str, ttl_ms: int) -> None:
    (acceptor,) = load_config_text(_acceptor_doc(params)).acceptors
    assert acceptor.connection_ttl_ms == ttl_ms


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ("connectionTtl=0", "connectionTtl must be -1 (off) or > 0, got '0'"),
        ("connectionTtl=-5", "connectionTtl must be -1 (off) or > 0, got '-5'"),
        ("connectionTTL=1m", "connectionTTL must be -1 (off) or an integer > 0, got '1m'"),
        (
            "connectionTtl=99999999999999999999",
            "connectionTtl must be at most 9223372036854775807, got '99999999999999999999'",
        ),
        (
            "connectionTtl=1500;connectionTTL=2000",
            "connectionTtl '1500' and connectionTTL '2000' disagree: give one",
        ),
    ],
)
def test_load_config_rejects_bad_acceptor_connection_ttl(params: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(_acceptor_doc(params), source="a.xml")
    assert str(info.value) == f"a.xml:2: <acceptor>: acceptor 'a': {reason}"


def _ttl_doc(core: str, params: str = "connectionTtl=1500") -> str:
    return f"""<configuration>
<core>
  <journal-type>NIO</journal-type>
{core}
  <acceptors><acceptor name="a">tcp://127.0.0.1:61616?router=r;{params}</acceptor></acceptors>
  <connection-routers><connection-router name="r"/></connection-routers>
</core>
</configuration>"""


def test_load_config_connection_ttl_defaults_are_artemis_defaults() -> None:
    config = load_config_text(_ttl_doc(""))
    assert (config.connection_ttl.override_ms, config.connection_ttl.check_interval_ms) == (-1, 2000)
    assert config.connection_ttl.ttl_ms(config.acceptors[0]) == 1500


def test_load_config_reads_connection_ttl_override_and_check_interval() -> None:
    """Scenario: Artemis's two <core> elements, namespaced as in a real broker.xml; the override
    replaces every acceptor's own TTL, and applies to acceptors without one."""
    core = (
        '<connection-ttl-override xmlns="urn:activemq:core"> 30000 </connection-ttl-override>\n'
        "<connection-ttl-check-interval>500</connection-ttl-check-interval>"
    )
    config = load_config_text(_ttl_doc(core))
    assert (config.connection_ttl.override_ms, config.connection_ttl.check_interval_ms) == (30000, 500)
    assert config.acceptors[0].connection_ttl_ms == 1500  # the acceptor's own value is kept…
    assert config.connection_ttl.ttl_ms(config.acceptors[0]) == 30000  # …and overridden
    config = load_config_text(_ttl_doc(core, params="mode=proxy"))
    assert config.connection_ttl.ttl_ms(config.acceptors[0]) == 30000


def test_load_config_connection_ttl_override_minus_one_is_off() -> None:
    config = load_config_text(_ttl_doc("<connection-ttl-override>-1</connection-ttl-override>"))
    assert config.connection_ttl.ttl_ms(config.acceptors[0]) == 1500


@pytest.mark.parametrize(
    ("core", "element", "reason"),
    [
        (
            "<connection-ttl-override>0</connection-ttl-override>",
            "connection-ttl-override",
            "must be -1 (off) or > 0, got '0'",
        ),
        (
            "<connection-ttl-override>-2</connection-ttl-override>",
            "connection-ttl-override",
            "must be -1 (off) or > 0, got '-2'",
        ),
        (
            "<connection-ttl-override>1 min</connection-ttl-override>",
            "connection-ttl-override",
            "must be -1 (off) or an integer > 0, got '1 min'",
        ),
        (
            "<connection-ttl-override>99999999999999999999</connection-ttl-override>",
            "connection-ttl-override",
            "must be at most 9223372036854775807, got '99999999999999999999'",
        ),
        (
            "<connection-ttl-override><value>1</value></connection-ttl-override>",
            "connection-ttl-override",
            "must hold text only, not child elements",
        ),
        (
            "<connection-ttl-check-interval>0</connection-ttl-check-interval>",
            "connection-ttl-check-interval",
            "must be > 0, got '0'",
        ),
        (
            "<connection-ttl-check-interval>2s</connection-ttl-check-interval>",
            "connection-ttl-check-interval",
            "must be an integer > 0, got '2s'",
        ),
    ],
)
def test_load_config_rejects_bad_connection_ttl_elements(core: str, element: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_text(_ttl_doc(core), source="b.xml")
    assert str(info.value) == f"b.xml:4: <{element}>: {reason}"


def test_load_config_rejects_differing_repeats_of_connection_ttl_elements() -> None:
    core = (
        "<connection-ttl-check-interval>500</connection-ttl-check-interval>\n"
        "<connection-ttl-check-interval>600</connection-ttl-check-interval>"
    )
    with pytest.raises(ConfigError) as info:
        load_config_text(_ttl_doc(core), source="b.xml")
    assert str(info.value) == (
        "b.xml:5: <connection-ttl-check-interval>: given twice in <core> with different content "
        "(lines 4 and 5)"
    )


# -- our <event-log> --


def test_load_config_reads_the_event_log_in_any_order_with_defaults(tmp_path):
    config = load(
        tmp_path,
        document(
            f"{BASE}<event-log>\n"
            "  <compress>false</compress>\n"
            "  <directory> /var/log/router/events </directory>\n"
            "  <ring-size>1024</ring-size>\n"
            "  <format>jsonl</format>\n"
            "</event-log>\n"
        ),
    )
    assert config.event_log == EventLogConfig(
        directory="/var/log/router/events", ring_size=1024, compress=False, format=EventFileFormat.JSONL
    )
    assert config.event_log.rotate_size == 64 * 1024 * 1024  # the dataclass's default
    defaults = load(tmp_path, document(f"{BASE}<event-log><directory>/x</directory></event-log>\n"))
    assert defaults.event_log is not None
    assert defaults.event_log.format is EventFileFormat.PARQUET
    assert load(tmp_path, document(BASE)).event_log is None


def test_load_config_event_log_errors(tmp_path):
    text = document(
        f"{BASE}<event-log>\n  <directory>/x</directory>\n  <ring-size>0</ring-size>\n</event-log>\n"
    )
    assert_error(tmp_path, text, "<ring-size>", "ring-size", "must be > 0, got '0'")
    text = document(f"{BASE}<event-log>\n  <directory>/x</directory>\n  <format>csv</format>\n</event-log>\n")
    assert_error(tmp_path, text, "<format>", "format", "must be parquet or jsonl, got 'csv'")
    text = document(f"{BASE}<event-log>\n  <ring-size>5</ring-size>\n</event-log>\n")
    assert_error(tmp_path, text, "<event-log>", "event-log", "needs a <directory>: where the event files go")


def _outlier_pool(children: str) -> str:
    return routers(
        f"""\
        <connection-router name="r">
           <pool><static-connectors><connector-ref>c1</connector-ref></static-connectors>
              <outlier-detection>{children}</outlier-detection>
           </pool>
        </connection-router>
        """
    )


def test_load_config_outlier_detection_defaults_and_values(tmp_path):
    config = load(tmp_path, routers(f'<connection-router name="r">{STATIC_POOL}</connection-router>'))
    pool = config.routers[0].pool
    assert pool is not None
    assert pool.outlier_detection == OutlierConfig()
    text = _outlier_pool(
        "<enabled>false</enabled><consecutive-failures>3</consecutive-failures><window>500</window>"
        "<base-ejection-time>1000</base-ejection-time><max-ejection-time>4000</max-ejection-time>"
        "<max-ejected-percent>50</max-ejected-percent>"
    )
    pool = load(tmp_path, text).routers[0].pool
    assert pool is not None
    assert pool.outlier_detection == OutlierConfig(
        enabled=False,
        consecutive_failures=3,
        window_ms=500,
        base_ejection_ms=1000,
        max_ejection_ms=4000,
        max_ejected_percent=50,
    )


def test_load_config_outlier_detection_rejects_unknown_child_and_bad_values(tmp_path):
    with pytest.raises(ConfigError, match="bogus"):
        load(tmp_path, _outlier_pool("<bogus>1</bogus>"))
    with pytest.raises(ConfigError, match=r"consecutive-failures.*must be > 0, got '0'"):
        load(tmp_path, _outlier_pool("<consecutive-failures>0</consecutive-failures>"))
    with pytest.raises(
        ConfigError, match=r"<outlier-detection>: max-ejected-percent must be in 0\.\.100, got 101"
    ):
        load(tmp_path, _outlier_pool("<max-ejected-percent>101</max-ejected-percent>"))
    with pytest.raises(ConfigError, match="max-ejection-time must be >= base-ejection-time"):
        load(
            tmp_path,
            _outlier_pool(
                "<base-ejection-time>5000</base-ejection-time><max-ejection-time>10</max-ejection-time>"
            ),
        )
