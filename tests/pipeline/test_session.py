from __future__ import annotations

import os
import sys

import pytest

from pipeline.session import (
    CODEGEN_CACHE,
    CODEGEN_CACHE_ENTRIES,
    LOCAL_GC,
    SPLITS_PER_CORE,
    driver_memory,
    setting,
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
