"""The HTML report: self-contained (charts inlined), every client-given value escaped."""

from __future__ import annotations

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs in the pipeline extra
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from pyspark.errors import AnalysisException

from pipeline import report
from pipeline.report import REPORT_TABLES, _charts, _table, _value, render, write_report


def test_render_inlines_charts_and_escapes_keys():
    minute = pd.to_datetime(["2026-11-18T11:00:00Z", "2026-11-18T11:01:00Z"])
    frames = {
        "per_target": pd.DataFrame({"router": ["cr", "cr"], "node_id": ["n1", "n2"], "decisions": [3, 1]}),
        "per_minute": pd.DataFrame(
            {
                "minute": minute,
                "router": ["cr", "cr"],
                "decisions": [2, 2],
                "refused": [0, 1],
                "p99_us": [10.0, 20.0],
            }
        ),
        "balance": pd.DataFrame({"window_start": minute, "router": ["cr", "cr"], "cv": [0.1, 0.5]}),
        "latency_hist": pd.DataFrame(
            {"router": ["*"], "bucket": [26], "upper_us": [107.6], "decisions": [4]}
        ),
        "top_keys": pd.DataFrame({"router": ["cr"], "key": ["<script>alert(1)</script>"], "decisions": [4]}),
    }
    page = render({"events": 4, "moves_by_cause": {"policy": 1}, "cache_hit_ratio": 0.25}, frames)
    assert page.startswith("<!DOCTYPE html>")
    assert page.count('<img alt="" src="data:image/png;base64,') == 6
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "http://" not in page
    assert "https://" not in page
    assert "<td>0.25</td>" in page
    assert "(none)" in page  # a table that is missing (refusals) is shown as empty


def test_render_names_unreadable_files_escaped():
    summary = {
        "unreadable_files": [
            {
                "file": "file:/logs/<a>.parquet",
                "reason": "parquet: no magic number at the end (cut short, or not a Parquet file)",
            }
        ]
    }
    page = render(summary, {})
    assert "<tr><th>unreadable files (set aside)</th><td>1</td></tr>" in page
    assert "<td>file:/logs/&lt;a&gt;.parquet</td><td>parquet: no magic number at the end" in page
    assert "<h2>Unreadable files (set aside whole)</h2><p>(none)</p>" in render({}, {})


def test_render_without_tables_draws_no_chart_and_shows_each_section_empty():
    page = render({}, {})
    assert "<img" not in page
    for title in (
        "Per connection router",
        "Per target",
        "Refusals",
        "Moves by cause",
        "Top keys",
        "Quarantine",
    ):
        assert f"<h2>{title}</h2><p>(none)</p>" in page
    assert page.endswith("</body></html>\n")


def test__charts_leaves_out_empty_tables():
    empty = {name: pd.DataFrame() for name in ("per_target", "per_minute", "balance", "latency_hist")}
    assert _charts(empty) == []
    one = {"per_target": pd.DataFrame({"router": ["cr"], "node_id": ["n1"], "decisions": [1]})}
    assert [title for title, _ in _charts(one)] == ["OK decisions per target"]


def test__charts_latency_histogram_is_every_routers():
    """Scenario: the histogram is drawn from the rows of router `*` only, in bucket order."""
    hist = pd.DataFrame(
        {
            "router": ["cr", "*", "*"],
            "bucket": [1, 30, 2],
            "upper_us": [1.2, 190.3, 1.4],
            "decisions": [5, 2, 9],
        }
    )
    drawn: list[list[float]] = []
    real = report._png

    def spy(draw, **kwargs):
        axes = Figure().subplots()
        draw(axes)
        drawn.append([bar.get_height() for bar in axes.patches if isinstance(bar, Rectangle)])
        return real(draw, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report, "_png", spy)
        (chart,) = _charts({"latency_hist": hist})
    assert chart[0].startswith("Decision latency histogram")
    assert drawn == [[9, 2]]


def test__table_shows_at_most_its_rows_with_three_digits():
    frame = pd.DataFrame({"key": [f"k{i}" for i in range(60)], "share": [1 / 3] * 60})
    page = _table(frame)
    assert page.count("<tr") == 1 + 50  # the header and the first 50 rows
    assert "<td>0.333</td>" in page
    assert "k49" in page
    assert "k50" not in page
    assert _table(frame, rows=2).count("<tr") == 3
    assert _table(None) == _table(pd.DataFrame()) == "<p>(none)</p>"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.123456, "0.1235"),
        (1234567.0, "1.235e+06"),
        ({"b": 1, "a": 2}, '{"a": 2, "b": 1}'),
        (None, ""),
        (7, "7"),
        ("x<y", "x<y"),  # escaped by render, not here
    ],
)
def test__value(value, shown):
    assert _value(value) == shown


def test_render_summary_values_are_escaped():
    page = render({"decisions_by_status": {"<b>": 1}, "keys": 3}, {})
    assert "<tr><th>keys</th><td>3</td></tr>" in page
    assert "&lt;b&gt;" in page
    assert "<b>" not in page


def test_write_report_reads_the_tables_it_names(spark, tmp_path):
    """Scenario: the aggregate tables as `analyze` writes them (Parquet directories under --out):
    `write_report` reads each of `REPORT_TABLES` and writes report.html beside them."""
    out = tmp_path / "out"
    charted = {"per_target", "per_minute", "balance", "latency_hist"}  # no rows: no chart to draw
    frames = {
        name: pd.DataFrame({"router": [] if name in charted else ["cr"], "n": [] if name in charted else [1]})
        for name in REPORT_TABLES
    }
    frames["top_keys"] = pd.DataFrame({"router": ["cr"], "key": ["<k>"], "decisions": [4]})
    for name, frame in frames.items():
        (out / name).mkdir(parents=True)
        frame.to_parquet(out / name / "part-0.parquet")
    write_report(spark, str(out), {"events": 4})
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "<tr><th>events (after dedup)</th><td>4</td></tr>" in page
    assert "&lt;k&gt;" in page
    (out / "refusals" / "part-0.parquet").unlink()
    (out / "refusals").rmdir()
    with pytest.raises(AnalysisException, match="PATH_NOT_FOUND"):
        write_report(spark, str(out), {})
