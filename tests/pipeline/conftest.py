"""One real local SparkSession for the whole test session (starting one takes 3-9 s), and an event
log with damaged files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest

from pipeline.generate import generate
from pipeline.session import spark_session
from router.config.settings import EventFileFormat

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pyspark.sql import SparkSession


@dataclass(frozen=True, slots=True)
class DamagedLog:
    """A Parquet log from the router's writer (4 files, no duplicates) with one file cut short in
    shipping and a `.jsonl.zst` whose zstd stream is cut short."""

    log: Path
    intact: int
    """The events in the intact files."""
    damaged: list[str]
    """The damaged files' names."""


def damaged_log(tmp_path: Path) -> DamagedLog:
    """Write a `DamagedLog` under `tmp_path` (`log/`; the JSON-lines log it took a file from is in
    `json/`)."""
    log = tmp_path / "log"
    generate(
        log,
        2000,
        routers=2,
        files=2,
        keys=100,
        duplicate_rate=0,
        malformed_rate=0,
        file_format=EventFileFormat.PARQUET,
    )
    files = sorted(log.glob("*.parquet"))
    files[0].write_bytes(files[0].read_bytes()[: files[0].stat().st_size // 2])
    generate(tmp_path / "json", 500, routers=1, keys=50, duplicate_rate=0, malformed_rate=0)
    (zst,) = (tmp_path / "json").glob("*.jsonl.zst")
    (log / "events-rtr-z-0000.jsonl.zst").write_bytes(zst.read_bytes()[:-40])
    intact = sum(pq.ParquetFile(f).metadata.num_rows for f in files[1:])
    return DamagedLog(log=log, intact=intact, damaged=[files[0].name, "events-rtr-z-0000.jsonl.zst"])


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session(
        "local[2]", app="connection-router-tests", conf={"spark.sql.shuffle.partitions": "2"}
    )
    yield session
    session.stop()
