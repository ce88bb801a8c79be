"""The Spark schema of the event table, generated from the records' one field list
(`event_format.schema.FIELDS`): a field is declared once, for the writer and the reader."""

from __future__ import annotations

from typing import Final

from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from event_format.schema import FIELDS, FieldType

__all__ = ["CORRUPT_COLUMN", "EVENT_SCHEMA", "spark_type"]

CORRUPT_COLUMN: Final = "_corrupt_record"
"""Where Spark's PERMISSIVE JSON reader puts a line it could not read (`READ_SCHEMA` has it)."""

_SPARK_TYPES: Final[dict[FieldType, DataType]] = {
    FieldType.STRING: StringType(),
    FieldType.LONG: LongType(),
    FieldType.DOUBLE: DoubleType(),
    FieldType.BOOLEAN: BooleanType(),
    FieldType.TIMESTAMP: TimestampType(),
}


def spark_type(field_type: FieldType) -> DataType:
    """The Spark type of a record field type."""
    return _SPARK_TYPES[field_type]


EVENT_SCHEMA: Final = StructType([StructField(f.name, spark_type(f.type), nullable=True) for f in FIELDS])
"""Every column of every kind; a column a kind does not have is null on its lines. All nullable:
input files may be malformed (the ingest step sets such lines aside)."""

READ_SCHEMA: Final = StructType([*EVENT_SCHEMA.fields, StructField(CORRUPT_COLUMN, StringType(), True)])
"""`EVENT_SCHEMA` plus the column the JSON reader fills with a line it cannot read."""
