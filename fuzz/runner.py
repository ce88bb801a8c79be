"""The command behind `fuzz/run`: atheris over each target of fuzz/targets.py, one process each.

    fuzz/run [TARGET ...] [--time SECONDS] [--runs N] [--grow-corpus] [--seed N] [--verbose]
    fuzz/run --list

Each target runs in its own child process (`fuzz/run --child TARGET <libFuzzer flags>`): atheris
instruments our packages as the child imports them, and `atheris.Fuzz` ends the process when
libFuzzer is done (or on a finding). The default is CI-sized, `DEFAULT_RUNS` inputs or
`DEFAULT_TIME_S` seconds per target, whichever comes first; `--time` alone runs as long as it
says, `--runs` alone as many inputs as it says. libFuzzer reads the target's seed corpus
(fuzz/corpus/<target>) and writes the inputs it finds new coverage with to a scratch directory,
which `--grow-corpus` merges into the corpus afterwards (keeping only inputs that add coverage).
An input that crashes or hangs a target is written to `fuzz/findings/` (see fuzz/README.md).

Exit status: 0 when every target ran without a finding, 1 when one found something (or its
process failed), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fuzz.targets import Target

__all__ = ["DEFAULT_RUNS", "DEFAULT_TIME_S", "main"]

ROOT: Final = Path(__file__).resolve().parents[1]
RUN: Final = ROOT / "fuzz" / "run"
FINDINGS: Final = ROOT / "fuzz" / "findings"
"""Where libFuzzer writes inputs that crash or hang a target (`-artifact_prefix`); not committed."""

DEFAULT_RUNS: Final = 3000
"""CI-sized: inputs per target. The sniffer targets run 3000 inputs in about a second; see
fuzz/README.md for the measured times."""
DEFAULT_TIME_S: Final = 10
"""CI-sized: seconds per target at most (the config target, a few hundred loads a second, stops here)."""

INPUT_TIMEOUT_S: Final = 20
"""libFuzzer's `-timeout`: one input taking this long is a hang. The slowest input of the slowest
target (a 16 KiB configuration) takes well under a second."""
GRACE_S: Final = 120
"""Wall-clock allowance over `--time` for a child's start, corpus loading and merge; a child still
running after that is killed and reported."""

INSTRUMENTED: Final = ("keys", "tls_sni", "router", "pools", "policies", "cache")
"""The packages atheris instruments for coverage: the parsers, and what the configuration loader
builds (`pools`, `policies`, `cache`)."""

CHILD_ENV: Final = "FUZZ_RUN_CHILD"
"""Names the target in processes libFuzzer starts itself (`run_child`)."""

_RUNS_DONE: Final = re.compile(r"^stat::number_of_executed_units: (\d+)$", re.M)
_ARTIFACT: Final = re.compile(r"Test unit written to (\S+)")
_TAIL_LINES: Final = 60


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """How one target's run went."""

    name: str
    returncode: int
    """The child's exit status (libFuzzer exits 0 when done, non-zero on a finding)."""
    runs: int | None
    """Inputs executed, from libFuzzer's final statistics; None when it printed none."""
    seconds: float
    """Wall-clock time of the child, start-up included."""
    artifact: str | None
    """The input that crashed or hung the target, as libFuzzer saved it."""
    output: str
    """Everything the child printed (libFuzzer's log and, on a finding, the Python traceback)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.runs is not None and self.runs > 0


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="fuzz/run",
        description="Coverage-guided fuzzing (atheris) of the sniffers, the broker-answer parsers, the "
        "PROXY header, the user store and the configuration loader. See fuzz/README.md.",
    )
    parser.add_argument("targets", nargs="*", metavar="TARGET", help="targets to run (default: all)")
    parser.add_argument("--time", type=int, metavar="SECONDS", help="seconds per target")
    parser.add_argument("--runs", type=int, metavar="N", help="inputs per target")
    parser.add_argument(
        "--grow-corpus",
        action="store_true",
        help="merge the new inputs that add coverage into fuzz/corpus/<target>",
    )
    parser.add_argument("--seed", type=int, help="libFuzzer's random seed (default: a new one each run)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print libFuzzer's log as it runs")
    parser.add_argument("--list", action="store_true", help="list the targets and what they check")
    args = parser.parse_args(argv)
    for value, flag in ((args.time, "--time"), (args.runs, "--runs")):
        if value is not None and value <= 0:
            parser.error(f"{flag} must be > 0, got {value}")
    return args


def _limits(args: argparse.Namespace) -> tuple[int, int]:
    """(-runs, -max_total_time) for libFuzzer; -1 and 0 mean no limit."""
    if args.time is None and args.runs is None:
        return DEFAULT_RUNS, DEFAULT_TIME_S
    return (-1 if args.runs is None else args.runs), (0 if args.time is None else args.time)


def _write_dictionary(tokens: list[bytes], path: Path) -> None:
    """A libFuzzer dictionary: one quoted token per line, bytes outside printable ASCII escaped."""

    def quote(token: bytes) -> str:
        return "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\x{b:02x}" for b in token)

    path.write_text("".join(f'"{quote(token)}"\n' for token in tokens))


def _run_child(
    name: str, flags: list[str], *, verbose: bool, timeout_s: float | None
) -> tuple[int, str, float]:
    """Run one child with libFuzzer `flags`, echoing its output with --verbose.

    Returns:
        Its exit status (-9 when it was killed for running too long), its output, its run time.
    """
    command = [sys.executable, str(RUN), "--child", name, *flags]
    started = time.monotonic()
    lines: list[str] = []
    with subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as child:
        watchdog = None
        if timeout_s is not None:
            watchdog = threading.Timer(timeout_s, child.kill)
            watchdog.start()
        try:
            assert child.stdout is not None  # stdout=PIPE
            for line in child.stdout:
                lines.append(line)
                if verbose:
                    print(f"[{name}] {line}", end="", flush=True)
            returncode = child.wait()
        finally:
            if watchdog is not None:
                watchdog.cancel()
    if timeout_s is not None and time.monotonic() - started >= timeout_s and returncode < 0:
        lines.append(f"fuzz/run: killed after {timeout_s:.0f} s\n")
    return returncode, "".join(lines), time.monotonic() - started


def _fuzz_one(name: str, target: Target, args: argparse.Namespace) -> Outcome:
    runs, max_time = _limits(args)
    FINDINGS.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as scratch_dir:
        scratch = Path(scratch_dir)
        new_inputs = scratch / "new"
        new_inputs.mkdir()
        flags = [
            f"-runs={runs}",
            f"-max_total_time={max_time}",
            f"-max_len={target.max_len}",
            f"-timeout={INPUT_TIMEOUT_S}",
            f"-artifact_prefix={FINDINGS}/{name}-",
            "-print_final_stats=1",
        ]
        if args.seed is not None:
            flags.append(f"-seed={args.seed}")
        if target.dictionary is not None:
            dictionary = scratch / f"{name}.dict"
            _write_dictionary(target.dictionary(), dictionary)
            flags.append(f"-dict={dictionary}")
        # The first directory receives the new inputs; the seed corpus is only read.
        flags += [str(new_inputs), str(target.corpus)]
        timeout_s = None if max_time == 0 else max_time + GRACE_S
        returncode, output, seconds = _run_child(name, flags, verbose=args.verbose, timeout_s=timeout_s)
        runs_done = _RUNS_DONE.search(output)
        artifact = _ARTIFACT.search(output)
        outcome = Outcome(
            name=name,
            returncode=returncode,
            runs=int(runs_done[1]) if runs_done else None,
            seconds=seconds,
            artifact=artifact[1] if artifact else None,
            output=output,
        )
        if args.grow_corpus and outcome.ok and any(new_inputs.iterdir()):
            _merge(name, target, new_inputs, verbose=args.verbose)
    return outcome


def _merge(name: str, target: Target, new_inputs: Path, *, verbose: bool) -> None:
    """Add to the seed corpus the new inputs that add coverage to it (libFuzzer's `-merge=1`)."""
    before = sum(1 for _ in target.corpus.iterdir())
    flags = [f"-max_len={target.max_len}", f"-timeout={INPUT_TIMEOUT_S}", "-merge=1"]
    returncode, output, _ = _run_child(
        name, [*flags, str(target.corpus), str(new_inputs)], verbose=verbose, timeout_s=None
    )
    added = sum(1 for _ in target.corpus.iterdir()) - before
    if returncode != 0:
        print(f"fuzz/run: {name}: merging into {target.corpus} failed:\n{_tail(output)}", file=sys.stderr)
    else:
        print(f"fuzz/run: {name}: {added} new inputs added to {target.corpus.relative_to(ROOT)}", flush=True)


def _tail(output: str) -> str:
    return "".join(output.splitlines(keepends=True)[-_TAIL_LINES:])


def _report(outcome: Outcome) -> None:
    if outcome.ok:
        print(f"fuzz/run: {outcome.name}: ok, {outcome.runs} runs in {outcome.seconds:.1f} s", flush=True)
        return
    print(_tail(outcome.output), end="", file=sys.stderr)
    saved = f", input saved as {outcome.artifact}" if outcome.artifact else ""
    print(
        f"fuzz/run: {outcome.name}: FAILED (exit {outcome.returncode}, {outcome.runs} runs){saved}",
        file=sys.stderr,
    )


def run_child(name: str, flags: list[str]) -> None:
    """The child process: instrument our packages, import the targets, and hand over to libFuzzer.

    libFuzzer's `-merge=1` runs its work in more processes: it starts them through the shell as
    its argv[0] followed by libFuzzer flags. So argv[0] is the command line of this script, and the
    target's name goes to them in the environment (`CHILD_ENV`).

    Never returns: `atheris.Fuzz` exits the process.
    """
    import atheris  # only the child needs atheris
    from atheris.import_hook import instrument_imports  # the stubs' __init__ does not re-export it

    os.environ[CHILD_ENV] = name
    logging.disable(logging.CRITICAL)  # the loader warns on repeated elements: noise at this rate
    with instrument_imports(include=list(INSTRUMENTED)):
        from fuzz import targets  # imported here, inside the instrumentation
    atheris.Setup([shlex.join([sys.executable, str(RUN)]), *flags], targets.TARGETS[name].fuzz)
    atheris.Fuzz()


def main(argv: Sequence[str] | None = None) -> int:
    """Run `fuzz/run`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        run_child(argv[1], argv[2:])
        return 1  # not reached: atheris exits
    if child := os.environ.get(CHILD_ENV):  # a process libFuzzer started for a merge
        run_child(child, argv)
        return 1
    args = _parse_args(argv)
    from fuzz.targets import TARGETS  # not at the top: the child imports it instrumented

    if args.list:
        for name, target in TARGETS.items():
            print(f"{name:16} {target.checks}")
        return 0
    unknown = [name for name in args.targets if name not in TARGETS]
    if unknown:
        print(f"fuzz/run: unknown target {', '.join(unknown)}; known: {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    failed = 0
    for name in args.targets or TARGETS:
        outcome = _fuzz_one(name, TARGETS[name], args)
        _report(outcome)
        failed += not outcome.ok
    return 1 if failed else 0
