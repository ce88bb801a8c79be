"""The SparkSession of the pipeline's jobs, set up so a fresh machine and a cluster both work.

Measured pitfalls (docs/pipeline.md): without `SPARK_LOCAL_IP` the driver binds the first
non-loopback interface; without `PYSPARK_PYTHON` the Python workers are whatever `python3` is on
the PATH (no pandas: mapInPandas fails); the UI opens a port. The master is never hard-coded:
`--master URL` when given, else what `spark-submit` says, else Spark's own default, `local[*]`.
When this Python starts the JVM itself (not under `spark-submit`), the driver gets
`driver_memory()` unless `spark.driver.memory` is given (Spark's 1 GiB was ≈13 % slower, research
§2.3).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from pyspark.sql import SparkSession

__all__ = [
    "CODEGEN_CACHE",
    "CODEGEN_CACHE_ENTRIES",
    "DEFAULT_CONF",
    "LOCAL_GC",
    "SHUFFLES_PER_CORE",
    "SHUFFLE_PARTITIONS",
    "SPLITS_PER_CORE",
    "driver_memory",
    "quiet",
    "setting",
    "spark_failure",
    "spark_session",
]

MIN_SPLITS: Final = "spark.sql.files.minPartitionNum"
CODEGEN_CACHE: Final = "spark.sql.codegen.cache.maxEntries"
CODEGEN_CACHE_ENTRIES: Final = 1000
"""Generated classes Spark keeps (`CODEGEN_CACHE`; Spark's default: 100). One `analyze` generates
more than 100 (15 tables, each a few stages, each task's projections and orderings), so with 100
Spark compiled the same code again and again, and the JIT compiled the new classes again: on
10 M events from Parquet, local[2], the JIT's threads took 14-20 CPU-s of each warm run and a
warm run took 36.6-40.7 s; with 500 or more, 5-8 CPU-s and 27.1-29.2 s. A cold run (one
`routerctl analyze`, a JVM of its own) is about the same either way."""
DEFAULT_CONF: Final[Mapping[str, str]] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    CODEGEN_CACHE: str(CODEGEN_CACHE_ENTRIES),
}
"""Settings of every job; `conf` arguments and `spark-submit --conf` come on top."""
SHUFFLE_PARTITIONS: Final = "spark.sql.shuffle.partitions"
SHUFFLES_PER_CORE: Final = 2
"""Shuffles write this many partitions per core (`SHUFFLE_PARTITIONS`, unless given): on 2 cores
4 took 63-65 s for 10 M events from Parquet where Spark's 200 took 86 s and 8 took 68-72 s
(research §2.3 found 4 best too); on a cluster it grows with the cores."""
LOCAL_JVM_OPTIONS: Final = "spark.driver.extraJavaOptions"
LOCAL_GC: Final = "-XX:+UseParallelGC"
"""The collector of a JVM started here in local mode (unless `LOCAL_JVM_OPTIONS` is given): a batch
job wants throughput, not G1's short pauses; 10 M events from Parquet took 7 s less (68 s against
75 s, research machine)."""
DRIVER_MEMORY_SHARE: Final = 4
"""The driver's heap is 1/4 of the machine's memory (6 GiB on the 24 GiB reference machine, the
research's setting), within `DRIVER_MEMORY_MIB`."""
DRIVER_MEMORY_MIB: Final = (1024, 8192)
SPLITS_PER_CORE: Final = 4
"""Input files are read in at least this many splits per core (`MIN_SPLITS`, unless given): with
Spark's default, one per core, the 150 MB of staged Parquet of 10 M events were read in 3 tasks on
2 cores, so one core idled through a third of every scan."""


def driver_memory() -> str:
    """The default `spark.driver.memory` when the JVM starts here (in local mode the driver runs
    the tasks): a quarter of the physical memory, 1-8 GiB, e.g. `6144m`."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # no such name on this platform
        total = 0
    low, high = DRIVER_MEMORY_MIB
    return f"{min(high, max(low, total // DRIVER_MEMORY_SHARE // 2**20))}m"


def _local(master: str | None) -> bool:
    """Whether the driver runs the executors itself (then it binds loopback only)."""
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this Python
    if master is None:
        return not under_submit or os.environ.get("MASTER", "local").startswith("local")
    return master.startswith("local")


def spark_session(
    master: str | None = None, *, app: str = "connection-router", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """The session of a job (an existing one is reused).

    Args:
        master: a Spark master URL (`local[2]`, `spark://host:7077`, `k8s://…`); None: the one
            `spark-submit` was given, else `local[*]`.
        app: the application name.
        conf: more Spark settings.
    """
    local = _local(master)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # heavy; only jobs need it

    builder = SparkSession.builder.appName(app)
    if master is not None:
        builder = builder.master(master)
    settings = dict(DEFAULT_CONF)
    starts_jvm = "PYSPARK_GATEWAY_PORT" not in os.environ  # else spark-submit started it, sized
    if starts_jvm and "SPARK_DRIVER_MEMORY" not in os.environ:
        settings["spark.driver.memory"] = driver_memory()
    if local:
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        if starts_jvm:
            settings[LOCAL_JVM_OPTIONS] = LOCAL_GC
    settings.update(conf or {})
    for name, value in settings.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    cores = spark.sparkContext.defaultParallelism
    if spark.conf.get(MIN_SPLITS, None) is None:
        spark.conf.set(MIN_SPLITS, str(SPLITS_PER_CORE * cores))
    if not spark.sparkContext.getConf().contains(SHUFFLE_PARTITIONS):  # Spark's default: 200
        spark.conf.set(SHUFFLE_PARTITIONS, str(SHUFFLES_PER_CORE * cores))
    return spark


@contextmanager
def setting(spark: SparkSession, name: str, value: str) -> Iterator[None]:
    """A runtime SQL setting for the actions inside the block, then the session's own again."""
    before = spark.conf.get(name, None)
    spark.conf.set(name, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(name)
        else:
            spark.conf.set(name, before)


QUIET_LOG_LEVEL: Final = "FATAL"
"""Spark's log level under `routerctl` (Spark's default: WARN): a failed task is an ERROR with a
Java stack trace of some 200 lines; the command says what went wrong in one line instead."""


def quiet(spark: SparkSession) -> None:
    """Keep Spark's own log (its stack traces) out of the terminal of a command (`QUIET_LOG_LEVEL`)."""
    spark.sparkContext.setLogLevel(QUIET_LOG_LEVEL)


def spark_failure(exc: BaseException) -> str:
    """A failed Spark job as one line: the Java exception's message, without its stack trace."""
    text = str(exc).strip()
    for line in text.splitlines():  # a Py4JJavaError starts "An error occurred while calling ..."
        if "Exception:" in line or "Error:" in line:
            text = line.lstrip(": ")  # a Py4JJavaError's second line is ": <Java exception>"
            break
    first = " ".join(text.splitlines()[0].split()) if text else type(exc).__name__
    return f"the Spark job failed: {first}"
