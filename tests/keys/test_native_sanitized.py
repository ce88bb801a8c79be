"""keys/_native.c under AddressSanitizer and UndefinedBehaviorSanitizer (STYLE R14): the extension is
built with gcc's sanitizers into a temporary directory, beside a copy of the `keys` package, and
run there in a process with the sanitizers' runtime preloaded (the interpreter itself is not
instrumented): tests/keys/native_driver.py feeds it the fuzz corpora cut at every length and seeded
mutations, and tests/keys/test_native.py (the hypothesis differential tests) runs against it too.
A memory error or undefined behaviour in the C code aborts the process with the sanitizer's report;
a disagreement with the Python sniffers ends it with a traceback or a failed test.

The build and the environment are tests/event_format/test_native_sanitized.py's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.event_format.test_native_sanitized import (
    RUN_TIMEOUT_S,
    SANITIZER_ENV,
    _gcc,
    _runtime,
    assert_sanitizers_quiet,
    build_sanitized_package,
)

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("native_driver.py")
CORPUS = ROOT / "fuzz" / "corpus"
MUTATIONS = 3000
"""Seeded mutations per corpus, besides every prefix of every corpus file: the driver takes about
5 s under ASan on the 2-core development machine, the sanitized test_native.py about 22 s."""
SEED = 35


@pytest.fixture(scope="module")
def sanitized_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a copy of the `keys` package with the extension built with ASan and
    UBSan: what goes first on the sanitized process's path (the rest comes from the tree)."""
    build = tmp_path_factory.mktemp("keys-native-sanitized")
    build_sanitized_package(build, "keys")
    return build


def run_sanitized(build: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Python with ASan preloaded, `build` (the sanitized `keys`) first on its path, then the tree
    (fuzz/, router/, tests/); run from `build`, so `python -m` puts nothing of the tree first."""
    env = os.environ | SANITIZER_ENV
    env["LD_PRELOAD"] = _runtime(_gcc(), "libasan.so")  # libubsan comes as the extension's dependency
    env["PYTHONPATH"] = os.pathsep.join((str(build), str(ROOT)))
    return subprocess.run(
        [sys.executable, *args],
        cwd=build,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


@pytest.mark.integration
def test_native_sanitized_parsers_agree_on_the_corpora_and_mutations(sanitized_build: Path) -> None:
    """Scenario: every prefix of every mqtt and stomp corpus file and 3000 mutations of each, also in
    buffers of exactly their size: no sanitizer report, no disagreement with the Python sniffers."""
    result = run_sanitized(sanitized_build, str(DRIVER), str(CORPUS), str(MUTATIONS), str(SEED))
    assert_sanitizers_quiet(result)
    loaded = re.match(r"native: (.+)\n", result.stdout)
    assert loaded is not None, result.stdout
    assert Path(loaded[1]).is_relative_to(sanitized_build / "keys")  # not the normal build
    summary = re.search(r"^ok: (\d+) inputs checked \((.*)\), (\d+) corpus files$", result.stdout, re.M)
    assert summary is not None, result.stdout
    assert int(summary[1]) > 10_000
    assert {part.rsplit(" ", 1)[0] for part in summary[2].split(", ")} == {"need more", "parsed", "refused"}
    assert int(summary[3]) == sum(1 for name in ("mqtt", "stomp") for _ in (CORPUS / name).iterdir())


@pytest.mark.integration
def test_native_sanitized_differential_tests_pass(sanitized_build: Path) -> None:
    """Scenario: tests/keys/test_native.py (generated and mutated CONNECTs, every prefix) with the
    sanitized extension loaded."""
    result = run_sanitized(
        sanitized_build,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        str(ROOT / "tests" / "keys" / "test_native.py"),
        "-k",
        "not test_native_extension_is_built",  # it asserts the extension of the tree is loaded
    )
    assert_sanitizers_quiet(result)
    assert re.search(r"^\d+ passed", result.stdout, re.M), result.stdout[-3000:]


@pytest.mark.integration
def test_native_sanitized_exact_buffers_catch_a_read_past_their_end(sanitized_build: Path) -> None:
    """Scenario: the negative control of the driver's exact-size buffers: reading one byte past the
    end of one (as a C parser off by one would) is ASan's heap-buffer-overflow. (A small ctypes
    array or a `bytes` would hide it: they keep bytes after the data.)"""
    overread = (
        "import ctypes; from tests.keys.native_driver import parse_exact; "
        "parse_exact(lambda view: ctypes.string_at(ctypes.addressof(ctypes.c_char.from_buffer(view)), "
        "len(view) + 1), b'CONNECT')"
    )
    result = run_sanitized(sanitized_build, "-c", overread)
    assert result.returncode != 0
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in result.stderr, result.stderr[-5000:]
