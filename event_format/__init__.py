"""The routing event log's file format: what routerd's event files hold and how they are written
and read, in one place for routerd's event log, its writer process, the PySpark pipeline and the
fuzz targets (docs/event-log.md).

Layout:

    schema.py    the records (one per kind), the one field list (`FIELDS`) every schema is made
                 from, the `seq` numbers, an event's values as routerd sends them (`VALUE_NAMES`)
    lines.py     JSON lines: a record's line, the same line from an event's values, `JsonLines`
                 (the line writers: `_generated_lines.py`, with `json_text.py`'s pieces)
    parquet.py   Parquet: `ARROW_SCHEMA`, `ParquetFormat`, `write_parquet` (pyarrow: the writer
                 process and the pipeline import it, routerd never does)
    files.py     what the writer asks of a file format (`FileFormat`), and the files' names
    frames.py    the frames routerd sends its writer, and the native records in them
    _native.c    the C extension `event_format._native`: routerd's native recorder (it encodes
                 routerd's events as records, by a program generated from routerd's field table)
                 and the writer's decoder of those records

The package re-exports the schema's names; the other modules are imported by name (the writer's
formats need zstd or pyarrow, the frames the C extension, and `tools/generate.py` must import
the schema without the code it generates from it).

Imports nothing of ours (a leaf, like `tls_sni/`): `router` and `pipeline` import it, never the
other way round (tests/test_layout.py). No trio, no sockets (ruff bans them here).
"""

from event_format.schema import (
    BOOT_SPAN,
    FIELDS,
    KINDS,
    RAW_KEY_CAP,
    VALUE_HEAD,
    VALUE_NAMES,
    CloseRecord,
    DecisionRecord,
    EventValues,
    Field,
    FieldType,
    Record,
    Sequence,
    timestamp,
)

__all__ = [
    "BOOT_SPAN",
    "FIELDS",
    "KINDS",
    "RAW_KEY_CAP",
    "VALUE_HEAD",
    "VALUE_NAMES",
    "CloseRecord",
    "DecisionRecord",
    "EventValues",
    "Field",
    "FieldType",
    "Record",
    "Sequence",
    "timestamp",
]
