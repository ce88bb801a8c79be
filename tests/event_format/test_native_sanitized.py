"""event_format/_native.c under AddressSanitizer and UndefinedBehaviorSanitizer (STYLE R14): the
extension is built with gcc's sanitizers into a temporary directory, and
tests/event_format/native_driver.py runs every entry point of it there, against the Python
reference, in a process with the sanitizers' runtime preloaded (the interpreter itself is not
instrumented). A memory error or undefined behaviour in the C code aborts that process with the
sanitizer's report; a disagreement with the reference ends it with a traceback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("native_driver.py")
CORPUS = ROOT / "fuzz" / "corpus" / "event_frames"
MUTATIONS = 2000
"""Random mutations of valid records the driver decodes (about 1.2 s of its 5 s under ASan on the
2-core development machine), besides every truncation of the fuzz corpus and the edges of records."""
SEED = 31
SANITIZE = (
    "-fsanitize=address,undefined",
    "-fno-omit-frame-pointer",
    "-fno-sanitize-recover=undefined",  # UBSan's first report ends the process, like ASan's
    "-g",
    "-O1",
)
SANITIZER_ENV = {
    # CPython frees little of what it allocates at exit, so LeakSanitizer would report the
    # interpreter's own memory on every run: leaks are not checked here.
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    # Python objects (the bytes the decoder reads, the ring's strings) from malloc, which ASan
    # guards, instead of pymalloc's arenas, where a read past an object lands in its neighbour.
    "PYTHONMALLOC": "malloc",
}
RUN_TIMEOUT_S = 300


def _gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is not installed: run ./run-tests, which installs it")
    return gcc


def _runtime(gcc: str, library: str) -> str:
    """The path of one of gcc's sanitizer runtimes (libasan8, libubsan1: gcc's dependencies)."""
    path = subprocess.run(
        [gcc, f"-print-file-name={library}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not Path(path).is_absolute():  # gcc echoes the bare name of a library it does not have
        pytest.fail(f"gcc has no {library}: install gcc's runtime package for it (Debian: libasan8)")
    return path


def build_sanitized_package(build: Path, package: str, module: str = "_native") -> None:
    """Copy the package `package` into the directory `build` and build its extension `module` (a
    path in the package without `.c`: "_native", "datapath/_core") there with ASan and UBSan
    (`SANITIZE`, warnings as errors as setup.py builds it): `build` then goes first on a sanitized
    process's path."""
    gcc = _gcc()
    target = build / package
    shutil.copytree(
        ROOT / package, target, ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.c", "*.h")
    )
    extension = target / f"{module}{sysconfig.get_config_var('EXT_SUFFIX')}"
    result = subprocess.run(
        [
            gcc,
            *SANITIZE,
            "-Wall",
            "-Werror",  # as setup.py builds it
            "-shared",
            "-fPIC",
            f"-I{sysconfig.get_paths()['include']}",
            str(ROOT / package / f"{module}.c"),
            "-o",
            str(extension),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    built = extension.read_bytes()
    assert b"__asan_report_load" in built  # instrumented: every load checked
    assert b"__ubsan_handle_" in built


@pytest.fixture(scope="session")
def sanitized_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a copy of the `event_format` package with the extension built with
    ASan and UBSan: what goes first on the driver's PYTHONPATH."""
    build = tmp_path_factory.mktemp("native-sanitized")
    build_sanitized_package(build, "event_format")
    return build


def run_sanitized(build: Path, gcc: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Python with the sanitizers' runtime preloaded (ASan must come first: the interpreter is not
    built with it) and `build` first on its path."""
    env = os.environ | SANITIZER_ENV
    env["LD_PRELOAD"] = _runtime(gcc, "libasan.so")  # libubsan comes as the extension's dependency
    env["PYTHONPATH"] = str(build)
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )


def assert_sanitizers_quiet(result: subprocess.CompletedProcess[str]) -> None:
    assert "ERROR: AddressSanitizer" not in result.stderr, result.stderr[-20000:]
    assert "runtime error:" not in result.stderr, result.stderr[-20000:]
    assert result.returncode == 0, result.stderr[-20000:]


@pytest.mark.integration
def test_native_sanitized_every_entry_point_agrees_with_the_python_reference(sanitized_build: Path) -> None:
    """Scenario: the driver records, takes, resizes and decodes through the sanitized extension:
    valid events against the Python recorder's values, boundary inputs, errors, the fuzz corpus
    cut at every length and 2000 mutations; no sanitizer report, no disagreement."""
    result = run_sanitized(sanitized_build, _gcc(), str(DRIVER), str(CORPUS), str(MUTATIONS), str(SEED))
    assert_sanitizers_quiet(result)
    loaded = re.match(r"native: (.+)\n", result.stdout)
    assert loaded is not None, result.stdout
    assert Path(loaded[1]).is_relative_to(sanitized_build / "event_format")  # not the normal build
    summary = re.search(
        r"^ok: (\d+) records checked, .* decoded (\d+), refused (\d+), (\d+) corpus", result.stdout, re.M
    )
    assert summary is not None, result.stdout
    records, decoded, refused, files = map(int, summary.groups())
    assert records > 1000
    assert decoded > 100  # mutations that still decode, and ones that are refused
    assert refused > 1000
    assert files == len(list(CORPUS.iterdir()))


@pytest.mark.integration
def test_native_sanitized_process_reports_a_read_past_a_python_buffer(sanitized_build: Path) -> None:
    """Scenario: in the driver's environment, a read one byte past a buffer Python allocated is an
    ASan report and ends the process: the check above can see one."""
    overread = (
        "import ctypes; buffer = (ctypes.c_char * 64)(); "
        "ctypes.string_at(ctypes.addressof(buffer), 65)"  # ASan's memcpy interceptor checks this
    )
    result = run_sanitized(sanitized_build, _gcc(), "-c", overread)
    assert result.returncode != 0
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in result.stderr, result.stderr[-5000:]
