"""The PySpark pipeline over the router's event log: what happened (`analyze`), and what a new
configuration would do (`simulate`, with the router's own engine), plus a generator of synthetic
event files for tests and benchmarks.

Below `router/` in the import direction: it reads the event files' format (`event_format`: the
records' field list, the Parquet schema) and replays keys through `router.core.engine`. PySpark, pandas,
pyarrow and matplotlib are the `pipeline` extra; nothing in `router` imports this package.
"""
