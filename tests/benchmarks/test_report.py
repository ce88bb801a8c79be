"""Figures, ratios and the table: null values carry reasons, ratios say which way is better."""

from __future__ import annotations

import pytest

from benchmarks.report import (
    DEFAULT_GROUPS,
    FAILED,
    GOALS,
    GROUPS,
    NOT_SUPPORTED,
    Figure,
    format_goals,
    format_table,
    format_value,
    goal_results,
    median_figures,
    new_figures,
)


def _figure() -> Figure:
    return Figure(
        name="f", group="rate", title="a figure", unit="conn/s", better="higher",
        paths=("direct", "haproxy", "routerd"),
    )  # fmt: skip


def test_figure_ratio_is_routerd_over_haproxy() -> None:
    figure = _figure()
    figure.set("haproxy", 200.0)
    assert figure.ratio() is None
    figure.set("routerd", 50.0)
    assert figure.ratio() == 0.25


def test_figure_non_positive_value_is_a_failure() -> None:
    figure = _figure()
    figure.set("routerd", 0.0)
    assert figure.values["routerd"] is None
    assert figure.reasons["routerd"].startswith(FAILED)
    assert figure.failures() == ["f/routerd: failed: the measurement gave 0.0"]


def test_figure_unsupported_is_not_a_failure() -> None:
    figure = _figure()
    figure.unsupported("routerd", "no sniffer")
    assert figure.reasons["routerd"] == f"{NOT_SUPPORTED}: no sniffer"
    assert figure.failures() == []
    assert figure.to_json()["values"] == {"direct": None, "haproxy": None, "routerd": None}


def test_figure_rejects_a_path_it_does_not_have() -> None:
    figure = Figure(
        name="m", group="memory", title="m", unit="KiB", better="lower", paths=("haproxy", "routerd")
    )
    with pytest.raises(ValueError, match="no path 'direct'"):
        figure.set("direct", 1.0)


def test_figure_rejects_unknown_group() -> None:
    with pytest.raises(ValueError, match="group"):
        Figure(name="x", group="nope", title="x", unit="s", better="lower", paths=("routerd",))


def test_new_figures_cover_every_group() -> None:
    assert {f.group for f in new_figures().values()} == set(GROUPS)


@pytest.mark.parametrize(
    ("value", "text"),
    [(12793.4, "12,793"), (123.4, "123"), (12.34, "12.3"), (1.234, "1.23"), (0.01234, "0.012")],
)
def test_format_value(value: float, text: str) -> None:
    assert format_value(value) == text


def test_format_table_calls_a_ratio_that_rounds_to_one_equal() -> None:
    figures = new_figures()
    bulk = figures["bulk_8_streams"]
    bulk.set("haproxy", 9.44)
    bulk.set("routerd", 9.43)
    assert format_table(figures).splitlines()[2].endswith("1.00 (equal)")


def test_format_table_marks_nulls_and_direction() -> None:
    figures = new_figures()
    rate = figures["connection_rate"]
    rate.set("direct", 12000.0)
    rate.set("haproxy", 6000.0)
    rate.set("routerd", 1500.0)
    mqtt = figures["mqtt_connect_rate"]
    mqtt.set("direct", 9000.0)
    mqtt.set("haproxy", 5000.0)
    mqtt.unsupported("routerd", "no sniffer")
    memory = figures["memory_per_connection"]
    memory.set("haproxy", 4.0)
    memory.set("routerd", 2.0)
    table = format_table(figures).splitlines()
    assert table[0].split() == ["figure", "unit", "better", "direct", "HAProxy", "routerd", "routerd/HAProxy"]
    rows = {line.split("  ")[0].strip(): line for line in table[2:]}
    assert rows[rate.title].endswith("0.25 (worse)")
    assert rows[memory.title].endswith("0.50 (better)")
    assert " - " in rows[memory.title]  # no direct path for memory
    assert "null [1]" in rows[mqtt.title]
    assert table[-1] == f"[1] routerd: {NOT_SUPPORTED}: no sniffer"
    assert figures["bulk_1_stream"].title not in "\n".join(table)  # not measured, not shown


def _run(rate_haproxy: float, rate_routerd: float, redirect: float) -> dict[str, Figure]:
    figures = new_figures()
    figures["connection_rate"].set("haproxy", rate_haproxy)
    figures["connection_rate"].set("routerd", rate_routerd)
    figures["mqtt5_redirect_rate"].set("routerd", redirect)
    return figures


def test_goals_are_ratios_within_each_run_then_the_median() -> None:
    runs = [_run(100, 40, 90), _run(200, 120, 260), _run(100, 70, 150)]
    results = {r["goal"]: r for r in goal_results(runs)}
    short = results["short-connection rate, routerd/HAProxy"]
    assert short["per_run"] == [0.4, 0.6, 0.7]
    assert short["median"] == 0.6
    assert short["met"] is False  # issue 35: at least HAProxy's rate
    redirect = results["MQTT 5 redirect rate / HAProxy short-connection rate"]
    assert redirect["per_run"] == [0.9, 1.3, 1.5]
    assert redirect["met"] is False  # median 1.3, goal 1.5
    assert results["bulk throughput 1 stream, routerd/HAProxy"]["met"] is None
    assert len(results) == len(GOALS)


def test_goal_not_met_and_not_measured_are_said() -> None:
    text = format_goals(goal_results([_run(100, 20, 50)]))
    assert "short-connection rate, routerd/HAProxy: 0.20 (0.20); goal >= 1: NOT met" in text
    assert "bulk throughput 1 stream, routerd/HAProxy: - (-); goal >= 1.5: not measured" in text


def test_goal_on_an_instruction_count_prints_whole_numbers() -> None:
    figures = new_figures()
    figures["instructions_echo"].set("haproxy", 21_575.0)
    figures["instructions_echo"].set("routerd", 217_546.0)
    figures["instructions_mqtt3"].set("routerd", 29_999.4)
    text = format_goals(goal_results([figures]))
    assert "instructions per echo connection (callgrind): 217,546 (217,546); goal <= 30,000: NOT met" in text
    assert "instructions per MQTT CONNECT (callgrind): 29,999 (29,999); goal <= 30,000: met" in text
    assert "routing decision p99, cache miss (us): - (-); goal <= 50: not measured" in text


def test_median_figures_take_each_path_median_and_keep_reasons() -> None:
    runs = [_run(100, 40, 90), _run(300, 60, 10), _run(200, 50, 30)]
    runs[0]["memory_per_connection"].unsupported("routerd", "no")
    medians = median_figures(runs)
    assert medians["connection_rate"].values == {"haproxy": 200, "routerd": 50}
    assert medians["mqtt5_redirect_rate"].values == {"routerd": 30}
    assert medians["memory_per_connection"].values == {"routerd": None}
    assert medians["memory_per_connection"].reasons["routerd"].startswith(NOT_SUPPORTED)


def test_default_groups_leave_out_artemis() -> None:
    assert tuple(g for g in GROUPS if g != "artemis") == DEFAULT_GROUPS
    assert GROUPS[-1] == "artemis"
    assert "instructions" in DEFAULT_GROUPS


def test_format_table_without_artemis_figures_has_no_artemis_column() -> None:
    figures = new_figures()
    figures["connection_rate"].set("haproxy", 100.0)
    assert "Artemis" not in format_table(figures).splitlines()[0]


def test_format_table_with_artemis_figures_adds_its_column_ratio_and_note() -> None:
    """Scenario: the artemis group's rows: an Artemis column, a ratio routerd/Artemis, the note
    that HAProxy's value is a reference measured another way."""
    figures = new_figures()
    core = figures["artemis_core_redirect_rate"]
    core.set("haproxy", 8000.0)
    core.set("artemis", 4000.0)
    core.set("routerd", 2000.0)
    start = figures["artemis_router_start"]
    start.set("artemis", 10.0)
    start.set("routerd", 2.0)
    table = format_table(figures).splitlines()
    assert table[0].split() == [
        "figure", "unit", "better", "direct", "HAProxy", "Artemis", "routerd",
        "routerd/HAProxy", "routerd/Artemis",
    ]  # fmt: skip
    rows = {line.split("  ")[0].strip(): line for line in table[2:]}
    assert rows[f"{core.title} [1]"].split()[-4:] == ["0.25", "(worse)", "0.50", "(worse)"]
    assert rows[start.title].split()[-4:] == ["2.00", "-", "0.20", "(better)"]
    assert table[-1] == f"[1] {core.note}"
    assert core.to_json()["ratio_routerd_artemis"] == 0.5
    assert "ratio_routerd_artemis" not in figures["connection_rate"].to_json()


def test_goals_compare_routerd_redirects_with_artemis() -> None:
    figures = new_figures()
    for name, artemis, routerd in (
        ("artemis_core_redirect_rate", 4000.0, 2000.0),
        ("artemis_amqp_redirect_rate", 400.0, 2000.0),
    ):
        figures[name].set("artemis", artemis)
        figures[name].set("routerd", routerd)
    results = {r["goal"]: r for r in goal_results([figures])}
    assert results["CORE redirect rate, routerd/Artemis"]["met"] is False
    assert results["AMQP redirect rate, routerd/Artemis"]["median"] == 5.0
    assert results["AMQP redirect rate, routerd/Artemis"]["met"] is True
    assert results["MQTT 5 redirect rate, routerd/Artemis"]["met"] is None
