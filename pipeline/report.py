"""The HTML report of `routerctl analyze`: one self-contained file a person opens in a browser.

Charts are matplotlib PNGs inlined as base64 (no JavaScript, nothing fetched: it opens offline, in
a mail or as a CI artifact; research §6). Everything is drawn from the small aggregate tables that
`pipeline.analyze` wrote (`SMALL`), never from events. Keys come from clients: every table cell and
summary value is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import TYPE_CHECKING, Final

from pipeline.ingest import write_text

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs in the pipeline extra
    from matplotlib.axes import Axes
    from pyspark.sql import SparkSession

__all__ = ["REPORT_TABLES", "render", "write_report"]

REPORT_TABLES: Final = (
    "per_router",
    "per_target",
    "refusals",
    "moves_by_cause",
    "top_keys",
    "latency",
    "latency_hist",
    "per_minute",
    "balance",
    "close_reasons",
    "quarantine_counts",
)
"""The aggregate tables the report reads (each at most a few thousand rows)."""

_STYLE: Final = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
th { background: #eee; }
img { max-width: 100%; }
"""


def _png(draw: Callable[[Axes], None], *, width: float = 9.0, height: float = 3.5) -> str:
    """An `<img>` of one chart, drawn without pyplot (no global state, no display)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=96, layout="constrained")
    draw(figure.subplots())
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return f'<img alt="" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode("ascii")}">'


def _table(frame: pd.DataFrame | None, *, rows: int = 50) -> str:
    if frame is None or frame.empty:
        return "<p>(none)</p>"
    return str(frame.head(rows).to_html(index=False, escape=True, float_format=lambda v: f"{v:.3g}"))


def _charts(frames: Mapping[str, pd.DataFrame]) -> list[tuple[str, str]]:
    charts: list[tuple[str, str]] = []
    per_target = frames.get("per_target")
    if per_target is not None and not per_target.empty:

        def targets(ax: Axes) -> None:
            data = per_target.sort_values(["router", "node_id"])
            labels = [f"{r}/{n}" for r, n in zip(data["router"], data["node_id"], strict=True)]
            ax.bar(range(len(data)), data["decisions"], color="#4878a8")
            ax.set_xticks(range(len(data)), labels, rotation=90, fontsize=7)
            ax.set_ylabel("OK decisions")

        charts.append(("OK decisions per target", _png(targets, height=4.0)))
    per_minute = frames.get("per_minute")
    if per_minute is not None and not per_minute.empty:
        ordered = per_minute.sort_values("minute")

        def series(column: str, label: str) -> Callable[[Axes], None]:
            def draw(ax: Axes) -> None:
                for router, rows in ordered.groupby("router"):
                    ax.plot(rows["minute"], rows[column], label=str(router))
                ax.set_ylabel(label)
                ax.legend(fontsize=7)

            return draw

        charts.append(("Decisions per minute", _png(series("decisions", "decisions"))))
        charts.append(("Refusals per minute", _png(series("refused", "refused"))))
        charts.append(
            ("Decision latency p99 per minute (µs, bucket upper bound)", _png(series("p99_us", "µs")))
        )
    balance = frames.get("balance")
    if balance is not None and not balance.empty:
        ordered_balance = balance.sort_values("window_start")

        def cv(ax: Axes) -> None:
            for router, rows in ordered_balance.groupby("router"):
                ax.plot(rows["window_start"], rows["cv"], label=str(router))
            ax.set_ylabel("coefficient of variation")
            ax.legend(fontsize=7)

        charts.append(("Balance per window (CV of OK decisions over targets)", _png(cv)))
    hist = frames.get("latency_hist")
    if hist is not None and not hist.empty:
        whole = hist[hist["router"] == "*"].sort_values("bucket")

        def latency(ax: Axes) -> None:
            ax.bar(range(len(whole)), whole["decisions"], color="#6a9f58")
            ax.set_xticks(range(len(whole)), [f"{v:g}" for v in whole["upper_us"]], rotation=90, fontsize=7)
            ax.set_xlabel("µs (bucket upper bound)")
            ax.set_ylabel("decisions")

        charts.append(("Decision latency histogram (log2, 4 buckets per octave)", _png(latency)))
    return charts


def render(summary: Mapping[str, object], frames: Mapping[str, pd.DataFrame]) -> str:
    """The report's HTML.

    Args:
        summary: what `summary.json` holds.
        frames: aggregate tables by name (`REPORT_TABLES`; a missing one is left out).
    """
    unreadable = summary.get("unreadable_files") or []
    assert isinstance(unreadable, list)
    head = [
        ("events (after dedup)", summary.get("events")),
        ("duplicates removed", summary.get("duplicates_removed")),
        ("malformed (quarantined)", summary.get("malformed")),
        ("unreadable files (set aside)", len(unreadable)),
        ("decisions", summary.get("decisions")),
        ("connections closed", summary.get("connections")),
        ("keys", summary.get("keys")),
        ("moved keys", summary.get("moved_keys")),
        ("cache hit ratio", summary.get("cache_hit_ratio")),
        ("NULL-key rate", summary.get("null_key_rate")),
        ("decisions by status", summary.get("decisions_by_status")),
        ("moves by cause", summary.get("moves_by_cause")),
        ("latency (µs)", summary.get("latency_us")),
    ]
    rows = "".join(
        f"<tr><th>{html.escape(name)}</th><td>{html.escape(_value(value))}</td></tr>" for name, value in head
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Routing event log report</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Routing event log report</h1>",
        f"<table>{rows}</table>",
    ]
    for title, image in _charts(frames):
        parts.append(f"<h2>{html.escape(title)}</h2>{image}")
    sections = (
        ("Per connection router", "per_router"),
        ("Per target", "per_target"),
        ("Refusals", "refusals"),
        ("Moves by cause", "moves_by_cause"),
        ("Top keys", "top_keys"),
        ("Decision latency percentiles (µs, bucket upper bounds)", "latency"),
        ("Close reasons", "close_reasons"),
        ("Quarantine", "quarantine_counts"),
    )
    for title, name in sections:
        parts.append(f"<h2>{html.escape(title)}</h2>{_table(frames.get(name))}")
    parts.append(f"<h2>Unreadable files (set aside whole)</h2>{_unreadable(unreadable)}")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _unreadable(files: list[object]) -> str:
    """The unreadable files, each with its reason (every one: the input's files are few)."""
    if not files:
        return "<p>(none)</p>"
    rows = "".join(
        f"<tr><td>{html.escape(str(f['file']))}</td><td>{html.escape(str(f['reason']))}</td></tr>"
        for f in files
        if isinstance(f, dict)
    )
    return f"<table><tr><th>file</th><th>reason</th></tr>{rows}</table>"


def _value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else str(value)


def write_report(spark: SparkSession, out: str, summary: Mapping[str, object]) -> None:
    """Read the aggregate tables under `out`, render the report, write `out/report.html` (to
    redraw a report; `analyze` renders from the tables it already holds)."""
    frames: dict[str, pd.DataFrame] = {}
    for name in REPORT_TABLES:
        frames[name] = spark.read.parquet(f"{out}/{name}").toPandas()
    write_text(spark, f"{out}/report.html", render(summary, frames))
