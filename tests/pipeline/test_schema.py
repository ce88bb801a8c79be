from __future__ import annotations

from pyspark.sql.types import LongType, StringType, TimestampType

from event_format.schema import FIELDS
from pipeline.schema import CORRUPT_COLUMN, EVENT_SCHEMA, READ_SCHEMA


def test_schema_has_every_record_field_once_in_order():
    assert [f.name for f in EVENT_SCHEMA.fields] == [f.name for f in FIELDS]
    assert EVENT_SCHEMA["seq"].dataType == LongType()
    assert EVENT_SCHEMA["ts"].dataType == TimestampType()
    assert EVENT_SCHEMA["key"].dataType == StringType()


def test_read_schema_adds_the_corrupt_record_column():
    assert READ_SCHEMA.fieldNames() == [*EVENT_SCHEMA.fieldNames(), CORRUPT_COLUMN]
