"""Tests for router/config/acceptor_params.py: the acceptor URL parameter table, reading an acceptor
by it, and that docs/configuration.md lists the same parameters with the same defaults."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from router.config.acceptor_params import (
    ACCEPTOR_PARAMS,
    AcceptorParam,
    ParamKind,
    acceptor_config,
    acceptor_files,
)
from router.config.settings import DEFAULT_MAX_SNIFF_BYTES, AcceptorConfig, AcceptorMode

REPO = Path(__file__).resolve().parents[3]
CONFIGURATION_MD = REPO / "docs" / "configuration.md"


def build(**params: str) -> AcceptorConfig:
    return acceptor_config(name="a", host="127.0.0.1", port=1883, params={"router": "r", **params})


def docs_table() -> dict[tuple[str, ...], str | None]:
    """The "Acceptor parameters" table of docs/configuration.md: spellings -> default (the first
    `code` of the default cell; None for "—")."""
    text = CONFIGURATION_MD.read_text(encoding="utf-8")
    section = text.split("### Acceptor parameters\n", 1)[1].split("\n#", 1)[0]
    rows: dict[tuple[str, ...], str | None] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        names_cell, default_cell = (cell.strip() for cell in line.strip("|").split(" | ")[:2])
        default = re.search(r"`([^`]*)`", default_cell)
        rows[tuple(re.findall(r"`([^`]+)`", names_cell))] = None if default is None else default[1]
    return rows


class TestTable:
    def test_table_spellings_are_unique(self):
        names = [name for param in ACCEPTOR_PARAMS for name in param.names]
        assert len(names) == len(set(names))

    def test_table_lists_every_parameter_the_router_reads(self):
        assert {p.name for p in ACCEPTOR_PARAMS} == {
            "router",
            "protocols",
            "mode",
            "handshake-timeout",
            "sniffMaxBytes",
            "proxyProtocolEnabled",
            "sendProxyProtocol",
            "sslEnabled",
            "keyStorePath",
            "keyStoreType",
            "trustStorePath",
            "trustStoreType",
            "needClientAuth",
            "wantClientAuth",
            "usersFile",
            "rolesFile",
            "requireAuthentication",
            "connectionTtl",
            "connectionsAllowed",
            "connectionsAllowedPerSource",
            "connectionRate",
            "connectionBurst",
            "fastPath",
        }

    def test_table_defaults_come_from_the_dataclass_fields(self):
        defaults = {p.name: p.default for p in ACCEPTOR_PARAMS}
        assert defaults["handshake-timeout"] == "10"  # AcceptorConfig.handshake_timeout_ms = 10_000
        assert defaults["sniffMaxBytes"] == str(DEFAULT_MAX_SNIFF_BYTES)
        assert defaults["mode"] == AcceptorMode.PROXY.value
        assert defaults["connectionTtl"] == "-1"
        assert defaults["fastPath"] == "true"
        assert (defaults["needClientAuth"], defaults["sslEnabled"], defaults["keyStoreType"]) == (
            "false",
            "false",
            "PEM",
        )
        assert (defaults["router"], defaults["protocols"], defaults["keyStorePath"]) == (None, None, None)

    def test_table_defaults_read_back_as_the_field_defaults(self):
        """Scenario: a URL that gives every default explicitly builds the same acceptor as one
        that gives none, so `default` is how the field's default is written."""
        explicit = {p.name: p.default for p in ACCEPTOR_PARAMS if p.default is not None}
        given = build(**explicit)
        assert dataclasses.replace(given, params=()) == dataclasses.replace(build(), params=())

    def test_table_meanings_are_one_line(self):
        assert all(p.meaning and "\n" not in p.meaning for p in ACCEPTOR_PARAMS)

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"field": "no_such_field"}, "AcceptorConfig has no field 'no_such_field'"),
            ({"field": "tls.nope"}, "TlsConfig has no field 'nope'"),
            ({"field": "x.y"}, "field 'x.y' must be an AcceptorConfig field or tls.<TlsConfig field>"),
            ({}, "give either field (its default is the parameter's) or unset"),
            ({"field": "fast_path", "unset": "true"}, "give either field"),
        ],
    )
    def test_acceptor_param_rejects_a_bad_entry(self, kwargs, message):
        with pytest.raises(ValueError, match=re.escape(message)):
            AcceptorParam(names=("p",), kind=ParamKind.FLAG, meaning="m", **kwargs)


class TestDocs:
    def test_docs_table_lists_the_same_parameters_and_defaults(self):
        """Scenario: docs/configuration.md "Acceptor parameters" and ACCEPTOR_PARAMS cannot drift."""
        assert docs_table() == {p.names: p.default for p in ACCEPTOR_PARAMS}

    def test_docs_table_is_in_table_order(self):
        assert list(docs_table()) == [p.names for p in ACCEPTOR_PARAMS]


class TestAcceptorConfig:
    def test_acceptor_config_defaults_are_the_dataclass_defaults(self):
        acceptor = build()
        assert acceptor == AcceptorConfig(
            name="a", host="127.0.0.1", port=1883, router="r", params=(("router", "r"),)
        )

    def test_acceptor_config_reads_every_kind(self):
        acceptor = build(
            protocols=" mqtt, ,amqp ",
            mode="Redirect",
            handshakeTimeout="3",
            sniffMaxBytes="4096",
            proxyProtocolEnabled="TRUE",
            sendProxyProtocol="V2",
            usersFile=" users.properties ",
            rolesFile="roles.properties",
            requireAuthentication="true",
            connectionTTL="1500",
            fastPath="false",
            useEpoll="true",
        )
        assert acceptor.protocols == ("MQTT", "AMQP")
        assert acceptor.mode is AcceptorMode.REDIRECT
        assert (acceptor.handshake_timeout_ms, acceptor.sniff_max_bytes) == (3000, 4096)
        assert (acceptor.proxy_protocol, acceptor.send_proxy_protocol) == (True, "v2")
        assert (acceptor.users_file, acceptor.roles_file) == ("users.properties", "roles.properties")
        assert acceptor.require_authentication is True
        assert acceptor.connection_ttl_ms == 1500
        assert acceptor.fast_path is False
        assert ("useEpoll", "true") in acceptor.params  # unknown parameters are kept

    def test_acceptor_config_tls_termination(self):
        acceptor = build(
            sslEnabled="true",
            keyStorePath="k.pem",
            keyStoreType="pem",
            wantClientAuth="true",
            trustStorePath="ca.pem",
        )
        assert acceptor.tls is not None
        assert (acceptor.tls.key_store_path, acceptor.tls.trust_store_path) == ("k.pem", "ca.pem")
        assert (acceptor.tls.need_client_auth, acceptor.tls.want_client_auth) == (False, True)

    def test_acceptor_config_tls_parameters_without_ssl_enabled_are_unused(self):
        assert build(keyStorePath="k.pem", keyStoreType="JKS").tls is None

    @pytest.mark.parametrize(
        ("params", "message"),
        [
            (
                {"handshake-timeout": "5", "handshakeTimeout": "6"},
                "handshake-timeout '5' and handshakeTimeout '6' disagree: give one",
            ),
            ({"fastPath": "yes"}, "fastPath must be true or false, got 'yes'"),
            ({"mode": " fast "}, "mode must be one of proxy, redirect, auto, got 'fast'"),
            (
                {"protocols": "MQTT,FOO"},
                "acceptor 'a': protocols: each name must be one of AMQP, CORE, HORNETQ, MQTT, OPENWIRE, "
                "STOMP, got 'FOO' in 'MQTT,FOO'",
            ),
            ({"sendProxyProtocol": "v3"}, "acceptor 'a': sendProxyProtocol must be v1 or v2, got 'v3'"),
            ({"connectionBurst": "5"}, "connectionBurst needs connectionRate, got connectionBurst=5"),
            ({"connectionRate": "0"}, "connectionRate must be -1 (off) or > 0, got '0'"),
            ({"connectionRate": "fast"}, "connectionRate must be"),
            (
                {"sslEnabled": "true", "trustStoreType": "jks", "keyStorePath": "k"},
                "trustStoreType 'JKS' is not supported",
            ),
        ],
    )
    def test_acceptor_config_rejects(self, params, message):
        with pytest.raises(ValueError, match=re.escape(message)):
            build(**params)

    def test_acceptor_config_accept_burst_defaults_to_a_tenth_of_the_rate(self):
        assert build().accept_burst == 0
        assert build(connectionRate="1000").accept_burst == 100
        assert build(connectionRate="5").accept_burst == 1
        assert build(connectionRate="5", connectionBurst="20").accept_burst == 20

    def test_acceptor_config_agreeing_spellings_are_one_value(self):
        assert build(**{"handshake-timeout": "5", "handshakeTimeout": " 5"}).handshake_timeout_ms == 5000

    def test_acceptor_config_needs_router(self):
        with pytest.raises(ValueError, match=r"^acceptor 'a': router is required$"):
            acceptor_config(name="a", host="h", port=1, params={})


class TestAcceptorFiles:
    def test_acceptor_files_lists_the_files_read_at_start(self):
        acceptor = build(
            sslEnabled="true",
            keyStorePath="k.pem",
            trustStorePath="ca.pem",
            usersFile="u.properties",
            rolesFile="r.properties",
        )
        assert list(acceptor_files(acceptor)) == [
            ("keyStorePath", "k.pem"),
            ("trustStorePath", "ca.pem"),
            ("usersFile", "u.properties"),
            ("rolesFile", "r.properties"),
        ]

    def test_acceptor_files_without_tls_or_user_store_is_empty(self):
        assert list(acceptor_files(build(keyStorePath="k.pem"))) == []
