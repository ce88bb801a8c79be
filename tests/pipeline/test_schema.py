from __future__ import annotations

import pytest
from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, TimestampType

from event_format.schema import FIELDS, FieldType
from pipeline.schema import CORRUPT_COLUMN, EVENT_SCHEMA, READ_SCHEMA, spark_type


def test_schema_has_every_record_field_once_in_order():
    assert [f.name for f in EVENT_SCHEMA.fields] == [f.name for f in FIELDS]
    assert EVENT_SCHEMA["seq"].dataType == LongType()
    assert EVENT_SCHEMA["ts"].dataType == TimestampType()
    assert EVENT_SCHEMA["key"].dataType == StringType()


def test_read_schema_adds_the_corrupt_record_column():
    assert READ_SCHEMA.fieldNames() == [*EVENT_SCHEMA.fieldNames(), CORRUPT_COLUMN]


@pytest.mark.parametrize(
    ("field_type", "expected"),
    [
        (FieldType.STRING, StringType()),
        (FieldType.LONG, LongType()),
        (FieldType.DOUBLE, DoubleType()),
        (FieldType.BOOLEAN, BooleanType()),
        (FieldType.TIMESTAMP, TimestampType()),
    ],
)
def test_spark_type_of_each_field_type(field_type, expected):
    assert spark_type(field_type) == expected


def test_spark_type_covers_every_field_type():
    assert {spark_type(t).typeName() for t in FieldType} == {
        "string",
        "long",
        "double",
        "boolean",
        "timestamp",
    }


def test_event_schema_is_every_fields_type_and_nullable():
    """Every column may be null: a kind leaves out the other kind's columns, and a malformed line
    may lack any (ingest sets it aside)."""
    assert [(f.dataType, f.nullable) for f in EVENT_SCHEMA.fields] == [
        (spark_type(f.type), True) for f in FIELDS
    ]
    assert READ_SCHEMA[CORRUPT_COLUMN].dataType == StringType()
