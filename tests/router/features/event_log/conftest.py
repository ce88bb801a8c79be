"""Helpers of the event log's tests (and of event_format's and the pipeline's): reading its
finished files in either format."""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import zstandard

if TYPE_CHECKING:
    from pathlib import Path


def records_in(path: Path) -> list[dict[str, object]]:
    """The events of a finished file of either format, as the JSON lines say them (`ts` a string)."""
    if path.name.endswith(".parquet"):
        rows: list[dict[str, object]] = pq.read_table(path).to_pylist()
        for row in rows:
            ts = row["ts"]
            assert isinstance(ts, datetime.datetime)
            row["ts"] = ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return rows
    data = path.read_bytes()
    if path.suffix == ".zst":
        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return [json.loads(line) for line in data.decode().splitlines()]


def finished(directory: Path) -> list[Path]:
    """The finished event files in `directory`, by name."""
    return sorted(p for p in directory.iterdir() if p.name.startswith("events-"))


def all_records(directory: Path) -> list[dict[str, object]]:
    """Every event of every finished file in `directory`, file by file."""
    return [record for path in finished(directory) for record in records_in(path)]
