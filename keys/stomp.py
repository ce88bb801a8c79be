"""STOMP 1.0/1.1/1.2 sniffer and the ERROR frame encoder (no I/O here).

The sniffer reads a client's first frame, which must be CONNECT or STOMP (STOMP 1.2 §Connecting),
and returns its `client-id`, `login`, `passcode`, `host` and `accept-version` headers. STOMP is
client-first, so the sniffer never answers (`Reply` is not used). `encode_error` builds the
ERROR frame the router sends when it refuses a STOMP client (SPEC A6: STOMP has no redirect).

Header values of CONNECT and STOMP frames are taken literally, never unescaped. STOMP 1.2
§Value Encoding exempts exactly these frames ("CONNECT and CONNECTED frames do not escape the
carriage return, line feed or colon octets in order to remain backward compatible with STOMP
1.0 clients"), STOMP 1.0 had no escaping at all, and stomp.py 9 sends CONNECT/STOMP headers
unescaped (`Protocol11.send_frame` skips its escaping for them). So `client-id:a\\cb` is the
4-character id `a\\cb`, and a passcode with a backslash is never an error. (Unescaping, as
later frames need, would reject valid 1.0 passcodes and change keys for clients like stomp.py.)

This module does no I/O: no trio, no sockets, no clock, no logging.
"""

from __future__ import annotations

from typing import Final

from keys.sniff import NEED_MORE, NeedMore, Sniffed, SniffError, SniffResult, WireProtocol

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "StompSniffer",
    "encode_connect",
    "encode_error",
    "parse_server_frame",
]

_PROTOCOL: Final = WireProtocol.STOMP.value

_CONNECT_COMMANDS: Final = (b"CONNECT", b"STOMP")
"""The commands that may open a connection (STOMP 1.2 §Connecting; STOMP is 1.2's new name)."""
_CLIENT_COMMANDS: Final = (
    b"SEND",
    b"SUBSCRIBE",
    b"UNSUBSCRIBE",
    b"BEGIN",
    b"COMMIT",
    b"ABORT",
    b"ACK",
    b"NACK",
    b"DISCONNECT",
    *_CONNECT_COMMANDS,
)
"""Every client frame (STOMP 1.2 §Client Frames): while the command line is incomplete we wait
if it may still become one of these, so the error can name the whole command."""

MAX_HEADER_BYTES: Final = 8 * 1024
"""Cap of the command line plus headers of the first frame. The stomp.py CONNECT frames captured
in tests/keys/test_stomp.py are 78-117 bytes; long credentials or tokens fit many times over.
Half the router's 16 KiB sniff cap, so this error (naming the rule) comes first."""
MAX_BODY_BYTES: Final = 8 * 1024
"""Cap of the CONNECT body. CONNECT has no body in practice (STOMP 1.2 defines none); a few
clients send an empty one with `content-length:0`."""

_EOL: Final = b"\n"
_CR: Final = b"\r"
_NUL: Final = b"\x00"
_QUOTE_MAX: Final = 32
"""At most this many bytes of client data go into an error message."""


def _err(reason: str) -> SniffError:
    return SniffError(_PROTOCOL, reason)


def _quote(raw: bytes) -> str:
    """Client bytes as a short readable string for an error message."""
    return repr(raw[:_QUOTE_MAX].decode("utf-8", "replace"))


def _skip_heartbeats(data: bytes) -> int | None:
    """Skip EOLs before the frame (heart-beats, STOMP 1.2 §Heart-beating; `\\r\\n` or `\\n`).

    Returns the offset of the frame's first byte, or None when the data ends inside the EOLs.
    """
    pos = 0
    while pos < len(data):
        byte = data[pos : pos + 1]
        if byte == _EOL:
            pos += 1
        elif byte == _CR:
            if pos + 1 == len(data):
                return None
            if data[pos + 1 : pos + 2] != _EOL:
                raise _err(f"carriage return not followed by line feed before the frame at offset {pos}")
            pos += 2
        else:
            return pos
    return None


def _line(data: bytes, start: int, end: int) -> bytes:
    """The line data[start:end] without the CR of a `\\r\\n` EOL (STOMP 1.2 §Augmented BNF)."""
    line = data[start:end]
    return line[:-1] if line.endswith(_CR) else line


def _decode(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _err(f"{what} is not valid utf-8: {raw[:_QUOTE_MAX]!r}") from None


class StompSniffer:
    """Sniffs a STOMP client's CONNECT or STOMP frame (STOMP 1.0, 1.1, 1.2)."""

    name = _PROTOCOL

    def looks_like(self, prefix: bytes) -> bool:
        """Whether `prefix` may start a CONNECT or STOMP frame, after optional EOLs. Never raises.

        Other client commands do not count: a connection that starts with SEND is not sniffed
        as STOMP (the stomp sniffer, if chosen by configuration, names it in its error).
        """
        rest = prefix.lstrip(b"\r\n")
        for command in _CONNECT_COMMANDS:
            after = rest[len(command) : len(command) + 1]
            if command.startswith(rest[: len(command)]) and after in (b"", _CR, _EOL):
                return True
        return False

    def announced_size(self, data: bytes) -> int | None:
        """None: a STOMP frame does not say its length up front (keys.sniff.Sniffer)."""
        return None

    def sniff(self, data: bytes) -> SniffResult:
        """Parse the client's first frame.

        Args:
            data: every byte the client sent so far.

        Returns:
            NEED_MORE until the frame's terminating NUL has arrived, then `Sniffed` with
            client_id = `client-id`, user_name = `login`, password = `passcode`, hostname =
            `host` and protocol_version = `accept-version` (default "1.0"). The first of
            repeated headers wins (STOMP 1.2 §Repeated Header Entries).

        Raises:
            SniffError: the first command is not CONNECT or STOMP; a header line has no colon
                or is not UTF-8; the header section exceeds 8 KiB; a bad content-length; a
                body over 8 KiB or not terminated by NUL; a stray CR before the frame.
        """
        start = _skip_heartbeats(data)
        if start is None:
            return NEED_MORE
        line_end = data.find(_EOL, start)
        if line_end < 0:
            partial = data[start:].rstrip(_CR)
            if not any(command.startswith(partial) for command in _CLIENT_COMMANDS):
                raise _err(f"first frame must be CONNECT or STOMP, got {_quote(partial)}")
            return NEED_MORE
        command = _line(data, start, line_end)
        if command not in _CONNECT_COMMANDS:
            raise _err(f"first frame must be CONNECT or STOMP, got {_quote(command)}")
        headers: dict[str, str] = {}
        pos = line_end + 1
        while True:
            line_end = data.find(_EOL, pos, start + MAX_HEADER_BYTES)
            if line_end < 0:
                if len(data) - start >= MAX_HEADER_BYTES:
                    raise _err(f"header section exceeds {MAX_HEADER_BYTES} bytes")
                return NEED_MORE
            line = _line(data, pos, line_end)
            pos = line_end + 1
            if not line:
                break
            name, colon, value = line.partition(b":")
            if not colon:
                raise _err(f"header line without a colon: {_quote(line)}")
            # The first occurrence wins (STOMP 1.2 §Repeated Header Entries); values are
            # literal in CONNECT/STOMP (see the module docstring).
            headers.setdefault(_decode(name, "header name"), _decode(value, "header value"))
        if not self._body_complete(data, pos, headers.get("content-length")):
            return NEED_MORE
        return Sniffed(
            protocol=WireProtocol.STOMP,
            client_id=headers.get("client-id"),
            user_name=headers.get("login"),
            password=headers.get("passcode"),
            hostname=headers.get("host"),
            protocol_version=headers.get("accept-version", "1.0"),
        )

    @staticmethod
    def _body_complete(data: bytes, body_start: int, content_length: str | None) -> bool:
        """Whether the body and its NUL have arrived (STOMP 1.2 §Body; §Header content-length)."""
        if content_length is None:
            if data.find(_NUL, body_start, body_start + MAX_BODY_BYTES + 1) >= 0:
                return True
            if len(data) - body_start > MAX_BODY_BYTES:
                raise _err(f"body exceeds {MAX_BODY_BYTES} bytes without a terminating NUL")
            return False
        if not content_length.isascii() or not content_length.isdigit():
            raise _err(f"content-length must be a decimal number of octets, got {content_length[:32]!r}")
        # Leading zeros dropped first: int() of thousands of digits raises its own ValueError
        # (the interpreter's int_max_str_digits), and a value that long is over the limit anyway.
        significant = content_length.lstrip("0")
        if len(significant) > len(str(MAX_BODY_BYTES)):
            raise _err(f"content-length {significant[:16]}... exceeds the {MAX_BODY_BYTES}-byte body limit")
        length = int(significant or "0")
        if length > MAX_BODY_BYTES:
            raise _err(f"content-length {length} exceeds the {MAX_BODY_BYTES}-byte body limit")
        end = body_start + length
        if len(data) <= end:
            return False
        if data[end : end + 1] != _NUL:
            raise _err(f"body of content-length {length} is not followed by NUL, got {data[end : end + 1]!r}")
        return True


_ESCAPES: Final = (("\\", "\\\\"), ("\r", "\\r"), ("\n", "\\n"), (":", "\\c"))
"""STOMP 1.2 §Value Encoding; the backslash first, so escapes are not escaped twice."""


def encode_error(message: str, *, detail: str = "") -> bytes:
    """An ERROR frame (STOMP 1.2 §ERROR) for a client the router refuses.

    The `message` header is escaped as 1.1/1.2 require for frames other than CONNECT/CONNECTED;
    a 1.0 client would show the escapes literally, which matters only for a message with a
    colon, backslash or line break (the router's messages have none).

    Args:
        message: the short description, sent as the `message` header.
        detail: the longer text, sent as the body (UTF-8, `content-type:text/plain`).

    Returns:
        The frame, NUL included.
    """
    escaped = message
    for char, escape in _ESCAPES:
        escaped = escaped.replace(char, escape)
    body = detail.encode("utf-8")
    head = f"ERROR\nmessage:{escaped}\ncontent-type:text/plain\ncontent-length:{len(body)}\n\n".encode()
    return head + body + _NUL


def encode_connect(host: str, *, login: str | None = None, passcode: str | None = None) -> bytes:
    """A STOMP CONNECT frame (STOMP 1.2 §CONNECT), as the router's health probe sends.

    CONNECT headers are not escaped (STOMP 1.2 exempts CONNECT); values must not hold line breaks.

    Raises:
        ValueError: a value with a line break or NUL.
    """
    headers = [("accept-version", "1.0,1.1,1.2"), ("host", host)]
    if login is not None:
        headers.append(("login", login))
    if passcode is not None:
        headers.append(("passcode", passcode))
    for name, value in headers:
        if any(c in value for c in "\r\n\x00"):
            raise ValueError(f"stomp header {name} must not contain line breaks or NUL")
    lines = "".join(f"{name}:{value}\n" for name, value in headers)
    return b"CONNECT\n" + lines.encode("utf-8") + b"\n" + _NUL


def parse_server_frame(data: bytes) -> tuple[str, dict[str, str]] | NeedMore:
    """The command and headers of the first frame a server sends (CONNECTED or ERROR).

    Raises:
        SniffError: no frame end within MAX_HEADER_BYTES.
    """
    start = _skip_heartbeats(data)
    if start is None:
        return NEED_MORE
    end = data.find(b"\n\n", start)
    crlf = data.find(b"\r\n\r\n", start)
    if end < 0 or (0 <= crlf < end):
        end = crlf
    if end < 0:
        if len(data) - start > MAX_HEADER_BYTES:
            raise _err(f"server frame head longer than {MAX_HEADER_BYTES} bytes")
        return NEED_MORE
    lines = data[start:end].decode("utf-8", "replace").replace("\r\n", "\n").split("\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name, value)
    return lines[0], headers
