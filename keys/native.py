"""The C parsers of the MQTT and STOMP CONNECT (keys/_native.c), behind the sniffer contract.

`keys._native` is an optional C extension (setup.py): `mqtt_connect(buf)` and
`stomp_connect(buf)` parse an opening into plain values (a tuple of str, int and None), None
when more bytes are needed, or an int: a refusal's class (`MQTT_ERR_*`, `STOMP_ERR_*`) or
`DEFER`. The Python sniffers (keys/mqtt.py, keys/stomp.py) are the reference: the C gives the
same fields, the same NEED_MORE and refuses the same inputs (tests/keys/test_native.py,
`fuzz/run mqtt_native stomp_native`, and the same under ASan/UBSan).

`NativeMqttSniffer` and `NativeStompSniffer` are `Sniffer`s whose `sniff` returns exactly what the
Python sniffer returns: the C result mapped to `Sniffed`, and on a refusal (rare) or a deferral
the Python sniffer's own answer, so a `SniffError` carries the same reason and the same `answer`
bytes (the MQTT CONNACK 0x01). Without the extension they are the Python sniffers' answers
throughout; `NATIVE` says which. Nothing is deferred today (`DEFER` stays for a rule too costly
to port). keys/detect.py's `SNIFFERS` are these two, so both data paths parse MQTT and STOMP
openings in C.

No I/O, no state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypeAlias

from keys.mqtt import MqttSniffer
from keys.sniff import NEED_MORE, Sniffed, WireProtocol
from keys.stomp import StompSniffer

if TYPE_CHECKING:
    from types import ModuleType

    from keys.sniff import SniffResult

try:
    from keys import _native  # type: ignore[attr-defined]  # the C extension has no stubs
except ImportError:  # built without a C compiler: the Python sniffers alone
    _native = None

__all__ = [
    "EXTENSION",
    "MQTT_REFUSALS",
    "NATIVE",
    "STOMP_REFUSALS",
    "MqttConnect",
    "NativeMqttSniffer",
    "NativeStompSniffer",
    "mqtt_sniffed",
]

EXTENSION: Final[ModuleType | None] = _native
"""The C extension itself, None when it is not built: its `mqtt_connect` and `stomp_connect` are
the plain-value parsers for the native data path (and what the differential tests compare)."""
NATIVE: Final = EXTENSION is not None
"""Whether the C extension `keys._native` is built; without it the sniffers here are Python's."""

_MQTT_VERSIONS: Final = {3: "3.1", 4: "3.1.1", 5: "5"}
"""`mqtt_connect`'s protocol level -> `Sniffed.protocol_version` (keys.mqtt.PROTOCOL_LEVELS)."""

_STOMP_DEFAULT_VERSION: Final = "1.0"
"""`accept-version` when a client sends none (keys/stomp.py; STOMP 1.2 §Protocol Negotiation)."""


MQTT_REFUSALS: Final = {
    1: r"^first byte must be 0x10",
    2: r"exceeds 4 bytes$",
    3: r"overruns the packet",
    4: r"^protocol name length|^unknown protocol name",
    5: r"^protocol level \d+ does not go with protocol name",
    6: r"^reserved connect flag|^will qos|^password flag without user name flag",
    7: r"is not valid UTF-8|contains U\+0000",
    8: r"^extra bytes after the connect payload",
}
"""`mqtt_connect`'s refusal codes (`_native.MQTT_ERR_*`, keys/_native.c) -> a pattern of the
reasons `MqttSniffer.sniff` gives for the same inputs (what the differential tests check)."""

STOMP_REFUSALS: Final = {
    1: r"^first frame must be CONNECT or STOMP",
    2: r"^carriage return not followed by line feed",
    3: r"^header section exceeds",
    4: r"^header line without a colon",
    5: r"^header (name|value) is not valid utf-8",
    6: r"^content-length must be a decimal number|^content-length \d+(\.\.\.)? exceeds",
    7: r"^body exceeds|is not followed by NUL",
}
"""`stomp_connect`'s refusal codes (`_native.STOMP_ERR_*`) -> a pattern of `StompSniffer.sniff`'s
reasons for the same inputs."""


MqttConnect: TypeAlias = tuple[int, str | None, str | None, str | None, int, int]
"""What `mqtt_connect` gives for a valid CONNECT: (protocol level, client id, user name, password,
keep-alive seconds, bytes it takes)."""


def mqtt_sniffed(connect: MqttConnect) -> Sniffed:
    """What `MqttSniffer.sniff` reveals of a CONNECT that `mqtt_connect` parsed."""
    level, client_id, user_name, password, keepalive_s, _consumed = connect
    return Sniffed(
        protocol=WireProtocol.MQTT,
        client_id=client_id,
        user_name=user_name,
        password=password,
        protocol_version=_MQTT_VERSIONS[level],
        keepalive_s=keepalive_s,
    )


class NativeMqttSniffer(MqttSniffer):
    """`MqttSniffer` whose `sniff` parses in C; `looks_like` and `announced_size` are Python's."""

    def sniff(self, data: bytes) -> SniffResult:
        """Parse the CONNECT packet at the start of `data`, as `MqttSniffer.sniff` does.

        Args:
            data: every byte the client has sent so far.

        Returns:
            NEED_MORE, or the same `Sniffed` as `MqttSniffer.sniff`.

        Raises:
            SniffError: the bytes are not a valid CONNECT (`MqttSniffer.sniff`'s own error).
        """
        if _native is None:
            return super().sniff(data)
        result = _native.mqtt_connect(data)
        if result is None:
            return NEED_MORE
        if isinstance(result, int):  # a refusal: Python's reason and CONNACK
            return super().sniff(data)
        return mqtt_sniffed(result)


class NativeStompSniffer(StompSniffer):
    """`StompSniffer` whose `sniff` parses in C; `looks_like` and `announced_size` are Python's."""

    def sniff(self, data: bytes) -> SniffResult:
        """Parse the client's first frame, as `StompSniffer.sniff` does.

        Args:
            data: every byte the client has sent so far.

        Returns:
            NEED_MORE, or the same `Sniffed` as `StompSniffer.sniff`.

        Raises:
            SniffError: the first frame is not a valid CONNECT or STOMP (`StompSniffer.sniff`'s
                own error).
        """
        if _native is None:
            return super().sniff(data)
        result = _native.stomp_connect(data)
        if result is None:
            return NEED_MORE
        if isinstance(result, int):  # a refusal or DEFER: Python's answer
            return super().sniff(data)
        client_id, login, passcode, host, accept_version, _consumed = result
        return Sniffed(
            protocol=WireProtocol.STOMP,
            client_id=client_id,
            user_name=login,
            password=passcode,
            hostname=host,
            protocol_version=_STOMP_DEFAULT_VERSION if accept_version is None else accept_version,
        )
