"""The pipeline's `routerctl` subcommands: `analyze`, `simulate` and `generate-events`.

Each is a `Command` of routerctl's one contract (router/feature.py); routerctl finds them through
the entry point group `connection_router.routerctl` (pyproject.toml: `ROUTERCTL_COMMANDS`), so
`router/` imports nothing of `pipeline/`. This module imports neither PySpark nor numpy at import
time: `routerctl` works without the `pipeline` extra, and a pipeline command without it says how
to install it (one line, exit status 1). A new command is one more `Command` in `COMMANDS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Final

from router.ctl_client import Ctl
from router.ctl_output import ExitCode, Output
from router.feature import Command

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pipeline.ingest import UnreadableFile

__all__ = [
    "COMMANDS",
    "INSTALL_HINT",
    "ROUTERCTL_COMMANDS",
    "add_commands",
    "job_failed",
    "report_unreadable",
    "run",
]

INSTALL_HINT: Final = "install the pipeline extra: pip install 'connection-router[pipeline]'"
EXIT_OK: Final = ExitCode.OK
EXIT_FAILURE: Final = ExitCode.FAILED
EXIT_UNREADABLE: Final = ExitCode.UNREADABLE
"""Every event file named is unreadable (`pipeline.ingest.UnreadableError`): nothing was analyzed.
Some unreadable files among readable ones are set aside, named in summary.json and on stderr, and
the command exits 0."""
SHOWN_UNREADABLE: Final = 10
"""Unreadable files named on stderr, one line each (summary.json names them all)."""
EXIT_STATUS_HELP: Final = (
    "exit status: 0 done (unreadable event files, e.g. cut short, are set aside and named on "
    "stderr and in summary.json); 1 no such input or no event file, or the Spark job failed; "
    "2 a bad option, or (simulate) a configuration that does not load or cannot be simulated as "
    f"asked; {int(EXIT_UNREADABLE)} every event file is unreadable"
)


def _conf(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return name, value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < 0.5:
        raise argparse.ArgumentTypeError(f"must be in [0, 0.5), got {value}")
    return value


def spark_arguments(parser: argparse.ArgumentParser) -> None:
    """`--master` and `--conf`, shared by every Spark command."""
    parser.add_argument(
        "--master",
        default=None,
        metavar="URL",
        help="Spark master (local[2], spark://HOST:7077, k8s://...); default: spark-submit's, else local[*]",
    )
    parser.add_argument(
        "--conf", type=_conf, action="append", default=[], metavar="K=V", help="a Spark setting (repeatable)"
    )


def _analyze_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "events", nargs="+", metavar="EVENTS", help="event files or directories (any Spark path)"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (any Spark path)")
    spark_arguments(parser)
    parser.add_argument("--window-minutes", type=_positive, default=1, help="balance window (default 1)")
    parser.add_argument("--top", type=_positive, default=20, help="rows of top_keys (default 20)")
    parser.add_argument("--no-staging", action="store_true", help="do not stage parsed JSON as Parquet")
    parser.add_argument("--no-report", action="store_true", help="do not write report.html")


def _generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="output directory (local)")
    parser.add_argument("--events", type=_positive, required=True, metavar="N", help="lines to write in all")
    parser.add_argument("--routers", type=_positive, default=4, help="routing processes (default 4)")
    parser.add_argument("--keys", type=_positive, default=10_000, help="distinct keys (default 10000)")
    parser.add_argument("--duplicate-rate", type=_rate, default=0.01, help="default 0.01")
    parser.add_argument("--malformed-rate", type=_rate, default=0.001, help="default 0.001")
    parser.add_argument("--files", type=_positive, default=1, help="files per routing process (default 1)")
    parser.add_argument("--plain", action="store_true", help="write .jsonl, not .jsonl.zst")
    parser.add_argument(
        "--parquet",
        action="store_true",
        help="write Parquet as the router does (its default format; needs --malformed-rate 0)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="random seed: the same seed writes the same files (default 0)"
    )


def report_unreadable(command: str, files: Sequence[UnreadableFile]) -> None:
    """Name unreadable files on stderr, one line each, at most `SHOWN_UNREADABLE`."""
    for unreadable in files[:SHOWN_UNREADABLE]:
        print(f"routerctl {command}: set aside {unreadable.file}: {unreadable.reason}", file=sys.stderr)
    if len(files) > SHOWN_UNREADABLE:
        print(
            f"routerctl {command}: set aside {len(files) - SHOWN_UNREADABLE} more unreadable files "
            "(summary.json names them all)",
            file=sys.stderr,
        )


def job_failed(command: str, exc: Exception) -> int | None:
    """The exit status of a job (`analyze`, `simulate`) that raised `exc`, its one line said on
    stderr (unreadable files named), or None: not a failure of the input or of Spark (re-raise)."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]  # py4j ships no types
    from pyspark.errors import AnalysisException
    from pyspark.errors.exceptions.captured import CapturedException

    from pipeline.ingest import InputError, UnreadableError
    from pipeline.session import spark_failure

    if isinstance(exc, UnreadableError):
        report_unreadable(command, exc.files)
        status, line = EXIT_UNREADABLE, _first_line(exc)
    elif isinstance(exc, (InputError, AnalysisException)):
        status, line = EXIT_FAILURE, _first_line(exc)
    elif isinstance(exc, (Py4JJavaError, CapturedException)):  # a file damaged where no check looks
        status, line = EXIT_FAILURE, spark_failure(exc)
    else:
        return None
    print(f"routerctl {command}: {line}", file=sys.stderr)
    return status


def _analyze(args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession

    from pipeline.analyze import analyze
    from pipeline.ingest import UnreadableFile
    from pipeline.session import quiet, spark_session

    owned = SparkSession.getActiveSession() is None
    spark = spark_session(args.master, app="routerctl analyze", conf=dict(args.conf))
    if owned:
        quiet(spark)
    try:
        summary = analyze(
            spark,
            args.events,
            args.out,
            window_minutes=args.window_minutes,
            top=args.top,
            stage=not args.no_staging,
            report=not args.no_report,
        )
    except Exception as exc:
        status = job_failed("analyze", exc)
        if status is None:
            raise
        return status
    finally:
        if owned:
            spark.stop()
    unreadable = summary["unreadable_files"]
    assert isinstance(unreadable, list)
    report_unreadable("analyze", [UnreadableFile(**u) for u in unreadable])
    print(
        json.dumps(
            {k: summary[k] for k in ("events", "duplicates_removed", "malformed", "keys", "moved_keys")}
            | {"unreadable_files": len(unreadable)}
        )
    )
    return EXIT_OK


def _generate(args: argparse.Namespace) -> int:
    from pipeline.generate import generate
    from router.config.settings import EventFileFormat

    try:
        truth = generate(
            args.dir,
            args.events,
            routers=args.routers,
            keys=args.keys,
            duplicate_rate=args.duplicate_rate,
            malformed_rate=args.malformed_rate,
            files=args.files,
            compress=not args.plain,
            file_format=EventFileFormat.PARQUET if args.parquet else EventFileFormat.JSONL,
            seed=args.seed,
        )
    except (ValueError, OSError) as exc:
        print(f"routerctl generate-events: {_first_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    print(
        json.dumps(
            {
                "lines": truth.lines,
                "events": truth.events,
                "duplicates": truth.duplicates,
                "malformed": truth.malformed,
            }
        )
    )
    return EXIT_OK


def _simulate_arguments(parser: argparse.ArgumentParser) -> None:
    from pipeline.simulate import arguments

    arguments(parser)
    spark_arguments(parser)


def _simulate(args: argparse.Namespace) -> int:
    from pipeline.simulate import run as simulate

    return simulate(args)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _with_the_extra(main: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace, Ctl], int]:
    """A command's run: a missing pipeline dependency is one line on stderr and status 1, not a
    traceback."""

    def run(args: argparse.Namespace, _ctl: Ctl) -> int:
        try:
            import numpy  # noqa: F401  # the generator's
            import pyspark  # noqa: F401
        except ImportError:
            print(f"routerctl {args.command}: {INSTALL_HINT}", file=sys.stderr)
            return EXIT_FAILURE
        return main(args)

    return run


ROUTERCTL_COMMANDS: Final = (
    Command(
        name="analyze",
        help="analyze event files with Spark: balance, stickiness, refusals, latency",
        description="Remove duplicate events, set malformed records aside, and write Parquet tables, "
        "summary.json and report.html under --out (docs/pipeline.md).",
        arguments=_analyze_arguments,
        run=_with_the_extra(_analyze),
        admin=False,
        epilog=EXIT_STATUS_HELP,
    ),
    Command(
        name="simulate",
        help="replay an event log's keys through a new configuration: which would move, where to",
        description="Replay the distinct keys of the event log through the connection router of the "
        "new configuration with the router's own engine, in Spark, and write which keys and "
        "connections would move, the moves matrix and the new balance (Parquet tables and "
        "summary.json under --out, docs/pipeline.md).",
        arguments=_simulate_arguments,
        run=_with_the_extra(_simulate),
        admin=False,
        epilog=EXIT_STATUS_HELP,
    ),
    Command(
        name="generate-events",
        help="write synthetic event files (and truth.json) for tests and benchmarks",
        description="Zipf keys, several routing processes, a target down for a while, duplicates "
        "and malformed lines at the given rates; deterministic with --seed.",
        arguments=_generate_arguments,
        run=_with_the_extra(_generate),
        admin=False,
        epilog=EXIT_STATUS_HELP,
    ),
)
"""routerctl's pipeline commands (the entry point pyproject.toml names)."""

COMMANDS: Final[dict[str, Command]] = {command.name: command for command in ROUTERCTL_COMMANDS}
"""The pipeline's subcommands by name."""


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add every pipeline subcommand to `routerctl`'s subparsers."""
    for name, command in COMMANDS.items():
        parser = subparsers.add_parser(
            name, help=command.help, description=command.description, epilog=command.epilog
        )
        command.arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run a pipeline subcommand (`args.command` in `COMMANDS`) as routerctl runs it; the exit
    status."""
    return COMMANDS[args.command].run(args, Ctl(args, Output(json_output=False)))
