"""router/core/stream_filter.py: a CORE broker's topology packets dropped in any chunking, and the
broker's answers to a replayed opening measured."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys import NEED_MORE, SniffError
from router.core.stream_filter import TOPOLOGY_PACKETS, TopologyFilter, core_target_preamble


def packet(kind: int, channel: int, body: bytes = b"") -> bytes:
    return (
        (9 + len(body)).to_bytes(4, "big")
        + kind.to_bytes(1, "big", signed=True)
        + channel.to_bytes(8, "big")
        + body
    )


PING = packet(10, 0, (60000).to_bytes(8, "big"))
TOPOLOGY_V4 = packet(-17, 0, b"\x00" * 40)
SESSION_RESP = packet(31, 1, (136).to_bytes(4, "big"))
MESSAGE = packet(75, 11, b"m" * 300)

_packets = st.one_of(
    st.sampled_from(sorted(TOPOLOGY_PACKETS)).flatmap(
        lambda kc: st.binary(max_size=64).map(lambda body: packet(kc[0], kc[1], body))
    ),
    st.tuples(st.integers(-128, 127), st.integers(0, 20), st.binary(max_size=64))
    .filter(lambda t: (t[0], t[1]) not in TOPOLOGY_PACKETS)
    .map(lambda t: packet(*t)),
)


@given(st.lists(_packets, max_size=12), st.lists(st.integers(0, 2000), max_size=8))
def test_topology_packets_are_dropped_whatever_the_chunking(packets: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(packets)
    kept = b"".join(
        p
        for p in packets
        if (p[4] - 256 if p[4] > 127 else p[4], int.from_bytes(p[5:13], "big")) not in TOPOLOGY_PACKETS
    )
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    sift = TopologyFilter()
    out = b"".join(bytes(sift.feed(stream[a:b])) for a, b in itertools.pairwise(points))
    assert out == kept
    assert not sift.lost


def test_a_message_passes_byte_for_byte_and_topology_between_two_is_dropped() -> None:
    sift = TopologyFilter()
    stream = MESSAGE + TOPOLOGY_V4 + MESSAGE
    assert b"".join(bytes(sift.feed(stream[i : i + 1])) for i in range(len(stream))) == MESSAGE + MESSAGE
    assert sift.dropped == 1


def test_bytes_that_are_not_core_end_the_filtering() -> None:
    sift = TopologyFilter()
    garbage = b"\x00\x00\x00\x01" + b"x" * 20 + TOPOLOGY_V4
    assert sift.feed(garbage) == garbage
    assert sift.lost
    assert sift.feed(TOPOLOGY_V4) == TOPOLOGY_V4


def test_the_preamble_is_the_answers_to_the_replayed_opening() -> None:
    answers = PING + TOPOLOGY_V4
    assert core_target_preamble(answers + SESSION_RESP + MESSAGE) == len(answers)
    assert core_target_preamble(answers) is NEED_MORE  # the first other packet's header is awaited
    assert core_target_preamble(answers + SESSION_RESP[:12]) is NEED_MORE
    assert core_target_preamble(SESSION_RESP) == 0


def test_every_prefix_of_the_preamble_needs_more() -> None:
    answers = PING + TOPOLOGY_V4 + packet(-5, 1, b"\xff")
    for end in range(len(answers) + 13):
        assert core_target_preamble((answers + SESSION_RESP)[:end]) is NEED_MORE


def test_a_length_shorter_than_a_header_is_an_error() -> None:
    with pytest.raises(SniffError, match="length 3, shorter than its header"):
        core_target_preamble(b"\x00\x00\x00\x03" + b"\x00" * 9)
