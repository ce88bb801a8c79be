"""router/datapath/reading.py: read_until_sniffed and the other readers over in-memory streams, with
fake sniffers (no protocol knowledge needed)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from keys import NEED_MORE, NeedMore, Reply, Sniffed, SniffError, SniffResult, WireProtocol
from keys.proxy_protocol import encode_v1
from router.datapath.reading import (
    SniffOutcome,
    SniffProgress,
    read_past_preamble,
    read_proxy_header,
    read_until_sniffed,
)


class LineSniffer:
    """Fake protocol: `HELLO <name>\\n`; detection needs the first byte to be 'H'."""

    name = "line"

    def looks_like(self, prefix: bytes) -> bool:
        return prefix.startswith(b"H")

    def announced_size(self, data: bytes) -> int | None:
        """`HELLO <n>` with digits announces an opening of n bytes (to test the early cap check)."""
        digits = data[6:].split(b" ", 1)[0]
        return int(digits) if data.startswith(b"HELLO ") and digits.isdigit() and b" " in data[6:] else None

    def sniff(self, data: bytes) -> SniffResult:
        if not b"HELLO ".startswith(data[:6]):
            raise SniffError(self.name, f"bad greeting {data[:16]!r}")
        if b"\n" not in data:
            return NEED_MORE
        return Sniffed(protocol=WireProtocol.MQTT, client_id=data[6 : data.index(b"\n")].decode())


class ServerFirstSniffer:
    """Fake server-first protocol: client `A`, server `1`, client `B`, server `2`, client `C<id>;`."""

    name = "serverfirst"

    def looks_like(self, prefix: bytes) -> bool:
        return prefix.startswith(b"A")

    def announced_size(self, data: bytes) -> int | None:
        return None

    def sniff(self, data: bytes) -> SniffResult:
        if data.startswith(b"ABC") and data.endswith(b";"):
            return Sniffed(protocol=WireProtocol.AMQP, client_id=data[3:-1].decode())
        if data.startswith(b"AB"):
            return Reply(b"12")
        if data.startswith(b"A"):
            return Reply(b"1")
        return NEED_MORE


SNIFFERS = (LineSniffer(), ServerFirstSniffer())


def detect(data: bytes) -> LineSniffer | ServerFirstSniffer | NeedMore | None:
    for sniffer in SNIFFERS:
        if sniffer.looks_like(data):
            return sniffer
    return None


async def _sniff_from(*chunks: bytes, max_bytes: int = 1024) -> tuple[SniffOutcome, bytes]:
    """Sniff while a client sends `chunks` one at a time, each after the router has caught up
    (as a server-first client waits for each answer); return the outcome and what we answered."""
    client, server = trio.testing.memory_stream_pair()
    answered = bytearray()
    outcome: SniffOutcome | None = None

    async def sniff() -> None:
        nonlocal outcome
        outcome = await read_until_sniffed(server, detect, max_bytes=max_bytes)

    async def collect_answers() -> None:
        while data := await client.receive_some(1024):
            answered.extend(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sniff)
        nursery.start_soon(collect_answers)
        for chunk in chunks:
            await trio.testing.wait_all_tasks_blocked()
            await client.send_all(chunk)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert outcome is not None, "sniffing did not finish"
    return outcome, bytes(answered)


async def test_read_until_sniffed_byte_by_byte_keeps_raw_bytes() -> None:
    outcome, answered = await _sniff_from(*(bytes([b]) for b in b"HELLO bob\npayload"[:10]))
    assert outcome.sniffed.client_id == "bob"
    assert outcome.raw == b"HELLO bob\n"
    assert (outcome.replied, answered) == (b"", b"")


async def test_read_until_sniffed_keeps_bytes_after_the_handshake_for_replay() -> None:
    outcome, _ = await _sniff_from(b"HELLO bob\nFIRST PAYLOAD")
    assert outcome.raw == b"HELLO bob\nFIRST PAYLOAD"


async def test_read_until_sniffed_pipelined_client_gets_no_reply() -> None:
    """Scenario: everything arrives at once; nothing was answered, so nothing will be dropped."""
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(b"ABCme;")
    outcome = await read_until_sniffed(server, detect)
    assert (outcome.sniffed.client_id, outcome.replied) == ("me", b"")


async def test_read_until_sniffed_answers_server_first_steps_once_each() -> None:
    outcome, answered = await _sniff_from(b"A", b"B", b"Cme;")
    assert outcome.sniffed.client_id == "me"
    assert answered == b"12"  # each reply byte sent exactly once, in order
    assert outcome.replied == b"12"


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        (b"\x00\x01", "detect: unknown protocol, connection starts with 0001"),
        (b"HELP me\n", "line: bad greeting b'HELP me\\n'"),
        (b"HELLO " + b"x" * 100, "line: no complete handshake in the first 64 bytes"),
    ],
)
async def test_read_until_sniffed_errors(chunk: bytes, message: str) -> None:
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(chunk)
    with pytest.raises(SniffError) as info:
        await read_until_sniffed(server, detect, max_bytes=64)
    assert str(info.value) == message


async def test_read_until_sniffed_eof_before_handshake() -> None:
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(b"HELL")
    await client.send_eof()
    with pytest.raises(SniffError, match="line: client closed after 4 bytes, before the handshake"):
        await read_until_sniffed(server, detect)


async def test_read_until_sniffed_stalled_client_hits_caller_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(b"H")
    with pytest.raises(trio.TooSlowError), trio.fail_after(5):
        await read_until_sniffed(server, detect)
    assert trio.current_time() == 5.0


async def test_read_until_sniffed_starts_from_initial_bytes() -> None:
    """Scenario: bytes read behind a PROXY protocol header are the start of the handshake."""
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(b"bob\n")
    outcome = await read_until_sniffed(server, detect, initial=b"HELLO ")
    assert outcome.raw == b"HELLO bob\n"
    assert outcome.sniffed.client_id == "bob"


def _measure_two_lines(data: bytes) -> int | NeedMore:
    """Fake preamble: the target's first two lines."""
    first = data.find(b"\n")
    second = data.find(b"\n", first + 1) if first >= 0 else -1
    return NEED_MORE if second < 0 else second + 1


async def test_read_past_preamble_drops_it_and_keeps_the_rest() -> None:
    broker, upstream = trio.testing.memory_stream_pair()
    for chunk in (b"mech", b"anisms\nok\nBROKER", b"-DATA"):
        await broker.send_all(chunk)
    rest = await read_past_preamble(upstream, _measure_two_lines, protocol="fake")
    assert rest == b"BROKER-DATA"[: len(rest)]
    assert rest.startswith(b"BROKER")


async def test_read_past_preamble_eof_is_an_error() -> None:
    broker, upstream = trio.testing.memory_stream_pair()
    await broker.send_all(b"mechanisms\n")
    await broker.send_eof()
    with pytest.raises(SniffError, match="fake: target closed after 11 bytes of its opening"):
        await read_past_preamble(upstream, _measure_two_lines, protocol="fake")


async def test_read_proxy_header_returns_header_and_following_bytes() -> None:
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(encode_v1("203.0.113.7", 4242, "127.0.0.1", 61616) + b"HELLO")
    header, rest = await read_proxy_header(server)
    assert (header.source_ip, header.source_port) == ("203.0.113.7", 4242)
    assert rest == b"HELLO"


async def test_read_proxy_header_missing_header_is_an_error() -> None:
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(b"\x10\x20 an MQTT CONNECT without the header")
    with pytest.raises(SniffError, match="proxy: missing PROXY protocol header"):
        await read_proxy_header(server)


async def test_read_until_sniffed_reports_progress_for_timeout_logs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(b"HEL")
    progress = SniffProgress()
    with trio.move_on_after(2):
        await read_until_sniffed(server, detect, progress=progress)
    assert (progress.protocol, progress.bytes_read) == ("line", 3)
