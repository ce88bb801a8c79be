"""router/core/plan.py: what each decision becomes on the wire, for every protocol and acceptor mode,
without sockets. Openings are produced by the real sniffers from real client bytes (a server-first
client that waits for each answer, or one that sends everything at once)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from keys import ConnectionFacts, KeyType, Reply, Sniffed, WireProtocol, amqp, mqtt, openwire, stomp
from keys.detect import make_detector
from keys.proxy_protocol import encode_v1, encode_v2
from pools import Connector, Target
from router.config.settings import AcceptorConfig, AcceptorMode, TlsConfig
from router.core import answers
from router.core.address import Address
from router.core.engine import DecisionReason, QuorumWait, RouteDecision, RouteStatus
from router.core.events import ConnectionRef, Decided, Mode
from router.core.opening import SniffBuffer
from router.core.plan import (
    HandOver,
    HandOverReason,
    Opening,
    Proxy,
    Redirect,
    Refuse,
    after_connect_failed,
    decided,
    fast_path_serves,
    for_fast_path,
    must_sniff,
    not_authorized_answer,
    plan,
)
from tests.keys.test_mqtt import connect_packet
from tests.keys.test_tls import TLS13_HELLO

if TYPE_CHECKING:
    from typing import Any

SOURCE = Address("127.0.0.2", 40000)
LOCAL = Address("127.0.0.1", 61616)
CONNECTOR = Connector.from_url("c", "tcp://127.0.0.1:61617?nodeId=node-b")
TARGET = Target.remote(CONNECTOR)
LOCAL_NO_CONNECTOR = Target.local_target(None)


def opened(*chunks: bytes) -> Opening:
    """The opening a client sending `chunks` (each after the router's answer so far) gives."""
    buffer = SniffBuffer(make_detector(()))
    result: Sniffed | bytes = b""
    for chunk in chunks:
        buffer.feed(chunk)
        result = buffer.step()
    assert isinstance(result, Sniffed), f"not a complete opening: {result!r}"
    return Opening(source=SOURCE, local=LOCAL, raw=buffer.raw, sniffed=result, replied=buffer.replied)


def _sasl_plain() -> bytes:
    return amqp.encode_sasl_init("PLAIN", amqp.sasl_plain_response("alice", "pw"))


def _openwire_client() -> tuple[bytes, bytes]:
    info = openwire.encode_connection_info(
        command_id=1, connection_id="ID:c-1", client_id="c-1", user_name=None, password=None, version=12
    )
    return openwire.encode_wire_format_info(), info


OPENINGS: dict[str, Opening] = {
    "mqtt311": opened(mqtt.encode_connect("dev-1")),
    "mqtt5": opened(connect_packet(level=5, client_id=b"dev-1")),
    "amqp-sasl": opened(amqp.SASL_HEADER, _sasl_plain(), amqp.AMQP_HEADER + amqp.encode_open("c-1")),
    "amqp-sasl-pipelined": opened(
        amqp.SASL_HEADER + _sasl_plain() + amqp.AMQP_HEADER + amqp.encode_open("c-1")
    ),
    "stomp": opened(stomp.encode_connect("broker", login="u", passcode="p")),
    "openwire": opened(*_openwire_client()),
    "openwire-pipelined": opened(b"".join(_openwire_client())),
    "tls": opened(TLS13_HELLO),
    "unread": Opening(source=SOURCE, local=LOCAL),
}


def _acceptor(mode: AcceptorMode = AcceptorMode.PROXY, **changes: Any) -> AcceptorConfig:
    return AcceptorConfig(name="a", host="127.0.0.1", port=1, router="r", mode=mode, **changes)


def _ok(target: Target = TARGET, reason: DecisionReason = DecisionReason.POLICY) -> RouteDecision:
    return RouteDecision(key="k", status=RouteStatus.OK, target=target, reason=reason)


def _refused(status: RouteStatus) -> RouteDecision:
    return RouteDecision(key="k", status=status, reason=DecisionReason.NO_READY_TARGET)


def test_openings_are_what_their_names_say() -> None:
    assert {name: (o.sniffed and o.sniffed.protocol, bool(o.replied)) for name, o in OPENINGS.items()} == {
        "mqtt311": (WireProtocol.MQTT, False),
        "mqtt5": (WireProtocol.MQTT, False),
        "amqp-sasl": (WireProtocol.AMQP, True),
        "amqp-sasl-pipelined": (WireProtocol.AMQP, False),
        "stomp": (WireProtocol.STOMP, False),
        "openwire": (WireProtocol.OPENWIRE, True),
        "openwire-pipelined": (WireProtocol.OPENWIRE, False),
        "tls": (WireProtocol.TLS, False),
        "unread": (None, False),
    }


class TestRefusals:
    @pytest.mark.parametrize("mode", list(AcceptorMode))
    @pytest.mark.parametrize("name", list(OPENINGS))
    @pytest.mark.parametrize("status", [RouteStatus.REFUSED_USE_ANOTHER, RouteStatus.REFUSED_UNAVAILABLE])
    def test_a_refused_decision_is_the_protocols_refusal_after_what_it_is_owed(
        self, mode: AcceptorMode, name: str, status: RouteStatus
    ) -> None:
        opening = OPENINGS[name]
        action = plan(_acceptor(mode), "r", opening, _refused(status))
        assert isinstance(action, Refuse)
        assert (action.key, action.status, action.reason) == ("k", status, DecisionReason.NO_READY_TARGET)
        sniffed = opening.sniffed
        said = b"" if sniffed is None else answers.refusal(sniffed, status, "r")
        owed = (
            b""
            if sniffed is None or not said
            else answers.owed_opening(sniffed, opening.raw, opening.replied)
        )
        assert action.answer == owed + said

    @pytest.mark.parametrize("mode", list(AcceptorMode))
    @pytest.mark.parametrize("name", list(OPENINGS))
    def test_an_ok_decision_for_a_local_target_without_connector_is_use_another(
        self, mode: AcceptorMode, name: str
    ) -> None:
        decision = _ok(LOCAL_NO_CONNECTOR, DecisionReason.LOCAL_TARGET_FILTER)
        action = plan(_acceptor(mode), "r", OPENINGS[name], decision)
        assert isinstance(action, Refuse)
        assert (action.status, action.reason) == (
            RouteStatus.REFUSED_USE_ANOTHER,
            DecisionReason.NO_LOCAL_CONNECTOR,
        )

    def test_refusals_in_the_clients_protocol(self) -> None:
        """Scenario: the exact bytes of a few refusals (SPEC A6)."""
        unavailable = _refused(RouteStatus.REFUSED_UNAVAILABLE)
        mqtt5 = plan(_acceptor(), "r", OPENINGS["mqtt5"], unavailable)
        assert isinstance(mqtt5, Refuse)
        assert mqtt5.answer == mqtt.encode_connack(mqtt.MQTT_V5_SERVER_UNAVAILABLE, protocol_level=5)
        amqp_refusal = plan(_acceptor(), "r", OPENINGS["amqp-sasl"], unavailable)
        assert isinstance(amqp_refusal, Refuse)
        # SASL was answered while sniffing; the AMQP header the client sent with its Open is owed.
        assert amqp_refusal.answer == amqp.AMQP_HEADER + amqp.refusal_frames("r", unavailable=True)
        openwire_refusal = plan(_acceptor(), "r", OPENINGS["openwire"], unavailable)
        assert isinstance(openwire_refusal, Refuse)
        assert openwire_refusal.answer == b""  # closing is the answer


class TestRedirects:
    @pytest.mark.parametrize("name", [n for n in OPENINGS if n != "unread"])
    def test_redirect_mode_redirects_every_protocol_that_was_read(self, name: str) -> None:
        opening = OPENINGS[name]
        action = plan(_acceptor(AcceptorMode.REDIRECT), "r", opening, _ok())
        assert isinstance(action, Redirect)
        assert (action.key, action.reason, action.target, action.connector) == (
            "k",
            DecisionReason.POLICY,
            TARGET,
            CONNECTOR,
        )
        assert opening.sniffed is not None
        said = answers.redirect(opening.sniffed, opening.raw, CONNECTOR, "r")
        owed = answers.owed_opening(opening.sniffed, opening.raw, opening.replied) if said else b""
        assert action.answer == owed + said

    @pytest.mark.parametrize(
        ("name", "redirected"),
        [
            ("mqtt311", False),
            ("mqtt5", True),
            ("amqp-sasl", True),
            ("amqp-sasl-pipelined", True),
            ("stomp", False),
            ("openwire", True),
            ("openwire-pipelined", True),
            ("tls", False),
            ("unread", False),
        ],
    )
    def test_auto_mode_redirects_the_clients_that_can_follow(self, name: str, redirected: bool) -> None:
        action = plan(_acceptor(AcceptorMode.AUTO), "r", OPENINGS[name], _ok())
        assert isinstance(action, Redirect if redirected else Proxy)

    def test_mqtt5_redirect_names_the_connector(self) -> None:
        action = plan(_acceptor(AcceptorMode.REDIRECT), "r", OPENINGS["mqtt5"], _ok())
        assert isinstance(action, Redirect)
        assert action.answer == mqtt.encode_connack(
            mqtt.MQTT_V5_USE_ANOTHER_SERVER, protocol_level=5, server_reference="127.0.0.1:61617"
        )

    def test_a_pipelined_openwire_client_gets_the_echo_before_the_redirect(self) -> None:
        opening = OPENINGS["openwire-pipelined"]
        action = plan(_acceptor(AcceptorMode.REDIRECT), "r", opening, _ok())
        assert isinstance(action, Redirect)
        echo = openwire.OpenWireSniffer().sniff(openwire.encode_wire_format_info())
        assert isinstance(echo, Reply)
        assert action.answer.startswith(echo.to_client)


class TestProxy:
    @pytest.mark.parametrize("name", list(OPENINGS))
    def test_proxy_mode_replays_what_the_client_sent(self, name: str) -> None:
        opening = OPENINGS[name]
        action = plan(_acceptor(), "r", opening, _ok())
        assert isinstance(action, Proxy)
        assert (action.key, action.reason, action.target, action.connector, action.replay) == (
            "k",
            DecisionReason.POLICY,
            TARGET,
            CONNECTOR,
            opening.raw,
        )

    @pytest.mark.parametrize(
        ("name", "drops_target_opening"),
        [
            ("mqtt311", False),
            ("mqtt5", False),
            ("amqp-sasl", True),
            ("amqp-sasl-pipelined", False),
            ("stomp", False),
            ("openwire", True),
            ("openwire-pipelined", False),
            ("tls", False),
            ("unread", False),
        ],
    )
    def test_the_targets_opening_is_dropped_only_when_the_router_answered_the_clients(
        self, name: str, drops_target_opening: bool
    ) -> None:
        """Scenario: when the router answered a server-first opening itself, the target's answer to the
        replay is read and dropped, and the client gets what it is still owed of ours; when it
        answered nothing, the target's own opening reaches the client unchanged."""
        opening = OPENINGS[name]
        action = plan(_acceptor(), "r", opening, _ok())
        assert isinstance(action, Proxy)
        assert (action.preamble is not None) is drops_target_opening
        if not drops_target_opening:
            assert (action.owed, action.if_rejected) == (b"", b"")

    def test_amqp_client_told_sasl_ok_hears_not_authorized_when_the_target_rejects(self) -> None:
        opening = OPENINGS["amqp-sasl"]
        action = plan(_acceptor(), "r", opening, _ok())
        assert isinstance(action, Proxy)
        assert opening.sniffed is not None
        assert action.owed == amqp.AMQP_HEADER  # SASL was answered while sniffing, the AMQP header not
        assert action.if_rejected == amqp.AMQP_HEADER + answers.not_authorized(opening.sniffed, "r")
        openwire_action = plan(_acceptor(), "r", OPENINGS["openwire"], _ok())
        assert isinstance(openwire_action, Proxy)
        assert openwire_action.if_rejected == b""  # OpenWire: closing is the answer

    @pytest.mark.parametrize(("version", "encode"), [("v1", encode_v1), ("v2", encode_v2)])
    def test_a_proxy_protocol_header_goes_first_naming_the_original_ends(
        self, version: str, encode: Any
    ) -> None:
        opening = dataclasses.replace(OPENINGS["mqtt311"], source=Address("10.0.0.9", 5555))
        action = plan(_acceptor(send_proxy_protocol=version), "r", opening, _ok())
        assert isinstance(action, Proxy)
        assert action.replay == encode("10.0.0.9", 5555, "127.0.0.1", 61616) + opening.raw


class TestAfterConnectFailed:
    """A failed connect: the redispatch goes on as a Proxy, its absence is the protocol's refusal."""

    @pytest.mark.parametrize("mode", [AcceptorMode.PROXY, AcceptorMode.AUTO])
    def test_a_redispatch_is_proxied_again(self, mode: AcceptorMode) -> None:
        opening = OPENINGS["mqtt311"]
        again = after_connect_failed(_acceptor(mode), "r", opening, _ok(reason=DecisionReason.REDISPATCH))
        assert isinstance(again, Proxy)
        assert (again.target, again.replay, again.reason) == (TARGET, opening.raw, DecisionReason.REDISPATCH)

    def test_no_other_target_is_the_refusal_unavailable(self) -> None:
        refused = after_connect_failed(
            _acceptor(), "r", OPENINGS["mqtt5"], _refused(RouteStatus.REFUSED_UNAVAILABLE)
        )
        assert isinstance(refused, Refuse)
        assert refused.answer == mqtt.encode_connack(mqtt.MQTT_V5_SERVER_UNAVAILABLE, protocol_level=5)


class TestFastPath:
    def test_what_needs_no_wait_is_carried_out_by_the_fast_path(self) -> None:
        for name in ("mqtt5", "stomp", "unread", "amqp-sasl-pipelined"):
            action = plan(_acceptor(), "r", OPENINGS[name], _ok())
            assert for_fast_path(action) is action
        refuse = plan(_acceptor(), "r", OPENINGS["mqtt5"], _refused(RouteStatus.REFUSED_UNAVAILABLE))
        assert for_fast_path(refuse) is refuse

    def test_a_quorum_wait_a_server_first_replay_and_a_host_name_are_handed_over(self) -> None:
        wait = QuorumWait(key="k", timeout_s=3.0)
        assert for_fast_path(wait) == HandOver(reason=HandOverReason.QUORUM_WAIT, then=wait)
        replay = plan(_acceptor(), "r", OPENINGS["amqp-sasl"], _ok())
        assert isinstance(replay, Proxy)
        assert for_fast_path(replay) == HandOver(reason=HandOverReason.TARGET_OPENING, then=replay)
        by_name = Target.remote(Connector.from_url("n", "tcp://broker.example:1883"))
        named = plan(_acceptor(), "r", OPENINGS["mqtt5"], _ok(by_name))
        assert isinstance(named, Proxy)
        assert for_fast_path(named) == HandOver(reason=HandOverReason.NAME_LOOKUP, then=named)

    @pytest.mark.parametrize(
        "key_type", [KeyType.SOURCE_IP, KeyType.CLIENT_ID, KeyType.USER_NAME, KeyType.SNI_HOST]
    )
    def test_plain_acceptors_take_the_fast_path(self, key_type: KeyType) -> None:
        assert fast_path_serves(_acceptor(), key_type, -1)

    @pytest.mark.parametrize(
        "change",
        [
            {"fast_path": False},
            {"proxy_protocol": True},
            {"send_proxy_protocol": "v2"},
            {"require_authentication": True, "users_file": "u.properties", "roles_file": "r.properties"},
            {"users_file": "u.properties", "roles_file": "r.properties"},
            {"tls": TlsConfig(key_store_path="k.pem")},
        ],
    )
    def test_what_the_fast_path_does_not_do_stays_on_the_trio_side(self, change: dict[str, Any]) -> None:
        assert not fast_path_serves(_acceptor(**change), KeyType.SOURCE_IP, -1)

    def test_role_name_and_connection_ttl_stay_on_the_trio_side(self) -> None:
        assert not fast_path_serves(_acceptor(), KeyType.ROLE_NAME, -1)
        assert not fast_path_serves(_acceptor(), KeyType.SOURCE_IP, 60_000)


class TestMustSniff:
    @pytest.mark.parametrize(
        ("key_type", "terminated", "certificate_user", "sniff"),
        [
            (KeyType.SOURCE_IP, False, False, False),
            (KeyType.CLIENT_ID, False, False, True),
            (KeyType.CLIENT_ID, True, True, True),
            (KeyType.SNI_HOST, False, False, True),  # passthrough: the ClientHello is the opening
            (KeyType.SNI_HOST, True, False, False),  # terminated: SNI is known
            (KeyType.USER_NAME, False, False, True),
            (KeyType.USER_NAME, True, True, False),  # the certificate names the user
            (KeyType.ROLE_NAME, True, False, True),
            (KeyType.ROLE_NAME, True, True, False),
        ],
    )
    def test_proxy_mode_reads_the_opening_only_when_the_key_needs_it(
        self, key_type: KeyType, terminated: bool, certificate_user: bool, sniff: bool
    ) -> None:
        acceptor = _acceptor()
        assert (
            must_sniff(acceptor, key_type, terminated=terminated, certificate_user=certificate_user) is sniff
        )

    @pytest.mark.parametrize("mode", [AcceptorMode.REDIRECT, AcceptorMode.AUTO])
    def test_redirect_and_auto_always_read_it(self, mode: AcceptorMode) -> None:
        assert must_sniff(_acceptor(mode), KeyType.SOURCE_IP)

    def test_required_authentication_always_reads_it(self) -> None:
        acceptor = _acceptor(require_authentication=True, users_file="u", roles_file="r")
        assert must_sniff(acceptor, KeyType.SOURCE_IP, certificate_user=True)


FACTS = ConnectionFacts(source_ip="127.0.0.2", client_id="c1")


class TestReports:
    CONN = ConnectionRef(id=7, router="r", acceptor="a", peer=SOURCE)

    def test_decided_of_each_action(self) -> None:
        opening = OPENINGS["mqtt5"]
        proxy = plan(_acceptor(), "r", opening, _ok(reason=DecisionReason.CACHE))
        redirect = plan(_acceptor(AcceptorMode.REDIRECT), "r", opening, _ok())
        refuse = plan(_acceptor(), "r", opening, _refused(RouteStatus.REFUSED_UNAVAILABLE))

        def expected(status: RouteStatus, reason: DecisionReason, mode: Mode, node_id: str | None) -> Decided:
            return Decided(
                conn=self.CONN,
                key="k",
                status=status,
                reason=reason,
                mode=mode,
                node_id=node_id,
                protocol=WireProtocol.MQTT,
                facts=FACTS,
                source=SOURCE,
                latency_s=0.25,
            )

        def report(action: Refuse | Redirect | Proxy) -> Decided:
            return decided(self.CONN, opening, action, facts=FACTS, latency_s=0.25)

        ok = RouteStatus.OK
        assert report(proxy) == expected(ok, DecisionReason.CACHE, Mode.PROXY, "node-b")
        assert report(redirect) == expected(ok, DecisionReason.POLICY, Mode.REDIRECT, "node-b")
        unavailable, none_ready = RouteStatus.REFUSED_UNAVAILABLE, DecisionReason.NO_READY_TARGET
        assert report(refuse) == expected(unavailable, none_ready, Mode.REFUSE, None)

    def test_not_authorized_answer_per_protocol(self) -> None:
        mqtt5 = OPENINGS["mqtt5"]
        assert not_authorized_answer("r", mqtt5) == mqtt.encode_connack(
            mqtt.MQTT_V5_NOT_AUTHORIZED, protocol_level=5
        )
        assert not_authorized_answer("r", OPENINGS["openwire"]) == b""
        assert not_authorized_answer("r", OPENINGS["unread"]) == b""
