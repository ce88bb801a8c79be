"""The HTML report: self-contained (charts inlined), every client-given value escaped."""

from __future__ import annotations

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs in the pipeline extra

from pipeline.report import render


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
