from __future__ import annotations

import os
import sys

import pytest

from pipeline.session import (
    CODEGEN_CACHE,
    CODEGEN_CACHE_ENTRIES,
    LOCAL_GC,
    SPLITS_PER_CORE,
    _local,
    driver_memory,
    setting,
    spark_failure,
)


def test_session_runs_locally_on_loopback_without_ui(spark):
    assert spark.sparkContext.master == "local[2]"
    assert spark.conf.get("spark.driver.host") == "127.0.0.1"
    assert spark.conf.get("spark.ui.enabled") == "false"
    assert spark.conf.get("spark.driver.memory") == driver_memory()  # this Python started the JVM
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_spark_keeps_the_generated_classes_of_a_whole_job(spark):
    """A static setting: it holds only when given before the session starts, as `spark_session`
    does."""
    assert spark.conf.get(CODEGEN_CACHE) == str(CODEGEN_CACHE_ENTRIES)
    assert CODEGEN_CACHE_ENTRIES > 100  # Spark's default, which one analyze outgrows


def test_files_are_read_in_several_splits_per_core(spark):
    assert spark.conf.get("spark.sql.files.minPartitionNum") == str(SPLITS_PER_CORE * 2)  # local[2]


def test_python_workers_have_pandas(spark):
    # mapInPandas fails in the workers when PYSPARK_PYTHON is not this interpreter
    def double(batches):
        for frame in batches:
            yield frame.assign(id=frame["id"] * 2)

    rows = spark.range(5).mapInPandas(double, "id long").collect()
    assert sorted(r.id for r in rows) == [0, 2, 4, 6, 8]


def test_a_local_jvm_started_here_collects_garbage_for_throughput(spark):
    assert spark.conf.get("spark.driver.extraJavaOptions") == LOCAL_GC
    jvm = spark.sparkContext._jvm
    collectors = {
        bean.getName() for bean in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    }
    assert collectors == {"PS Scavenge", "PS MarkSweep"}  # the parallel collector's two


def test_shuffle_partitions_given_are_kept(spark):
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"  # the fixture's, not 2 per core


def test_a_setting_holds_inside_its_block_and_the_sessions_own_after(spark):
    given, unset = "spark.sql.shuffle.partitions", "spark.sql.files.maxPartitionBytes"
    with setting(spark, given, "7"), setting(spark, unset, "1234"):
        assert (spark.conf.get(given), spark.conf.get(unset)) == ("7", "1234")
    assert spark.conf.get(given) == "2"
    assert spark.conf.get(unset, None) is None  # unset again: Spark's default applies
    with pytest.raises(RuntimeError), setting(spark, given, "9"):
        raise RuntimeError("a failed action")
    assert spark.conf.get(given) == "2"


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        (24 * 2**30, "6144m"),  # the reference machine: a quarter
        (2 * 2**30, "1024m"),  # at least 1 GiB
        (256 * 2**30, "8192m"),  # at most 8 GiB
        (6 * 2**30 + 5, "1536m"),  # whole MiB, rounded down
    ],
)
def test_driver_memory_is_a_quarter_of_the_machine_within_bounds(monkeypatch, memory, expected):
    pages = {"SC_PHYS_PAGES": memory, "SC_PAGE_SIZE": 1}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    assert driver_memory() == expected


def test_driver_memory_without_the_machines_size_is_the_least(monkeypatch):
    def unknown(name: str) -> int:
        raise ValueError(f"unrecognized configuration name {name!r}")

    monkeypatch.setattr(os, "sysconf", unknown)
    assert driver_memory() == "1024m"


@pytest.mark.parametrize(
    ("master", "submitted", "env_master", "local"),
    [
        (None, False, None, True),  # this Python starts the JVM: Spark's default, local[*]
        ("local[2]", False, None, True),
        ("spark://host:7077", False, None, False),
        ("k8s://https://api:6443", False, None, False),
        (None, True, "yarn", False),  # spark-submit --master yarn
        (None, True, "local[4]", True),
        (None, True, None, True),  # spark-submit without a master: local
    ],
)
def test__local_follows_the_master_or_spark_submits(monkeypatch, master, submitted, env_master, local):
    if submitted:
        monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "4040")
    else:
        monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    if env_master is None:
        monkeypatch.delenv("MASTER", raising=False)
    else:
        monkeypatch.setenv("MASTER", env_master)
    assert _local(master) is local


@pytest.mark.parametrize(
    ("message", "line"),
    [
        (
            "An error occurred while calling o73.parquet.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: boom\n"
            "\tat org.apache.spark.scheduler.DAGScheduler.failJob(DAGScheduler.scala:2898)",
            "org.apache.spark.SparkException: Job aborted due to stage failure: boom",
        ),
        ("[PATH_NOT_FOUND]   Path does not exist:\n  file:/x.", "[PATH_NOT_FOUND] Path does not exist:"),
        ("java.lang.OutOfMemoryError: Java heap space", "java.lang.OutOfMemoryError: Java heap space"),
        ("", "RuntimeError"),
    ],
)
def test_spark_failure_is_the_java_exceptions_line(message, line):
    assert spark_failure(RuntimeError(message)) == f"the Spark job failed: {line}"
