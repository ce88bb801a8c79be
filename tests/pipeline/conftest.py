"""One real local SparkSession for the whole test session (starting one takes 3-9 s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pipeline.session import spark_session

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session(
        "local[2]", app="connection-router-tests", conf={"spark.sql.shuffle.partitions": "2"}
    )
    yield session
    session.stop()
