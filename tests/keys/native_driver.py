"""The driver that tests/keys/test_native_sanitized.py runs in a process with AddressSanitizer and
UndefinedBehaviorSanitizer: it feeds the C parsers of `keys._native` the fuzz corpora
(fuzz/corpus/mqtt, fuzz/corpus/stomp) cut at every length and random mutations of them with a
fixed seed, and checks each answer against the Python sniffer with `fuzz.targets.check_native_agrees`
(the differential check of the fuzz targets and tests/keys/test_native.py).

Every input is also given to the C parser in a buffer of exactly its size (`parse_exact`), so a read one
byte past its end is a heap-buffer-overflow ASan reports (a `bytes` object keeps a NUL after its
data, which would hide one), and the answer must be the one for the `bytes`.

Usage: `python native_driver.py CORPUS_ROOT MUTATIONS SEED`. It prints the extension's path first
(the test checks it is the sanitized build) and a summary last; any disagreement raises (a
traceback, exit status 1).
"""

from __future__ import annotations

import collections
import ctypes
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fuzz.targets import check_native_agrees
from keys import native

if TYPE_CHECKING:
    from collections.abc import Callable


_LIBC = ctypes.CDLL(None)
_LIBC.malloc.restype = ctypes.c_void_p
_LIBC.malloc.argtypes = (ctypes.c_size_t,)
_LIBC.free.argtypes = (ctypes.c_void_p,)


def parse_exact(parse: Callable[[memoryview], object], data: bytes) -> object:
    """`parse` of a copy of `data` in a buffer of exactly its size from malloc (ASan's, which guards
    its end; small ctypes arrays and Python objects keep bytes after the data)."""
    address = _LIBC.malloc(max(len(data), 1))
    assert address is not None
    try:
        buffer = (ctypes.c_char * len(data)).from_address(address)
        ctypes.memmove(buffer, data, len(data))
        with memoryview(buffer) as view:
            return parse(view)
    finally:
        _LIBC.free(address)


def mutate(data: bytes, rng: random.Random) -> bytes:
    """A few bytes replaced, inserted or deleted, and maybe bytes after them."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randint(0, len(out))
        op = rng.choice(("set", "insert", "delete", "duplicate"))
        if op == "insert":
            out.insert(at, rng.randrange(256))
        elif op == "duplicate":
            out[at:at] = out[at : at + rng.randint(1, 8)]
        elif at < len(out):
            if op == "set":
                out[at] = rng.choice((rng.randrange(256), 0x00, 0x0A, 0x0D, 0x3A, 0x80, 0xFF))
            else:
                del out[at]
    return bytes(out)


def check(data: bytes, *, stomp_frame: bool, outcomes: collections.Counter[str]) -> None:
    module = native.EXTENSION
    assert module is not None
    parse = module.stomp_connect if stomp_frame else module.mqtt_connect
    in_exact = parse_exact(parse, data)  # first: a read past the end is ASan's report, not a disagreement
    check_native_agrees(data, stomp_frame=stomp_frame)
    answer = parse(data)
    if in_exact != answer:
        raise AssertionError(f"an exact-size buffer gives another answer for {data[:64].hex()}")
    outcomes["need more" if answer is None else "refused" if isinstance(answer, int) else "parsed"] += 1


def main(corpus_root: Path, mutations: int, seed: int) -> None:
    module = native.EXTENSION
    assert module is not None, "keys._native is not built"
    print(f"native: {module.__file__}", flush=True)
    rng = random.Random(seed)
    outcomes: collections.Counter[str] = collections.Counter()
    files = 0
    for name, stomp_frame in (("mqtt", False), ("stomp", True)):
        seeds = [path.read_bytes() for path in sorted((corpus_root / name).iterdir())]
        files += len(seeds)
        for data in seeds:
            for cut in range(len(data) + 1):
                check(data[:cut], stomp_frame=stomp_frame, outcomes=outcomes)
        for _ in range(mutations):
            data = mutate(rng.choice(seeds), rng)
            for cut in sorted({len(data), len(data) - 1, len(data) // 2, rng.randint(0, len(data))}):
                if cut >= 0:
                    check(data[:cut], stomp_frame=stomp_frame, outcomes=outcomes)
    summary = ", ".join(f"{kind} {count}" for kind, count in sorted(outcomes.items()))
    print(f"ok: {sum(outcomes.values())} inputs checked ({summary}), {files} corpus files")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
