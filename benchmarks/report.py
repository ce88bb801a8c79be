"""Figures of a benchmark run: values per path, ratios routerd/HAProxy (and routerd/Artemis), the
table and the JSON file.

A figure has a value for each path it applies to (`direct`, `haproxy`, `artemis`, `routerd`). A
value is a positive number, or None with a reason: either `NOT_SUPPORTED` (routerd lacks the
feature, the run goes on) or `FAILED` (something broke; the run exits non-zero). The `artemis`
path (Artemis's own connection router, the `artemis` group) and its column and ratio appear only
in tables that have one of its figures. No I/O here.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "DEFAULT_GROUPS",
    "FAILED",
    "GOALS",
    "GROUPS",
    "NOT_SUPPORTED",
    "PATHS",
    "Better",
    "Figure",
    "Goal",
    "PathName",
    "format_goals",
    "format_table",
    "format_value",
    "goal_results",
    "median_figures",
    "new_figures",
]

PathName = Literal["direct", "haproxy", "artemis", "routerd"]
Better = Literal["higher", "lower"]
PATHS: Final[tuple[PathName, ...]] = ("direct", "haproxy", "artemis", "routerd")
"""Every path a figure may have, in the table's column order."""
_HEADINGS: Final = {"direct": "direct", "haproxy": "HAProxy", "artemis": "Artemis", "routerd": "routerd"}
_BASELINES: Final[tuple[PathName, ...]] = ("haproxy", "artemis")
"""The paths routerd's value is divided by in the table's ratio columns (and the JSON's)."""

NOT_SUPPORTED: Final = "not supported by this routerd yet"
"""The start of the reason of a value routerd cannot produce yet."""
FAILED: Final = "failed"
"""The start of the reason of a value whose measurement broke."""

GROUPS: Final = (
    "memory", "bulk", "rate", "mqtt", "redirect", "latency", "decision", "workers", "instructions",
    "artemis",
)  # fmt: skip
"""Measurement groups, in the order they run (`--only` takes these names). Memory comes first, on
fresh proxies, so that heap grown by earlier runs does not hide the cost of new connections;
instructions runs its own proxies under callgrind, after the timed groups, so that valgrind's load
is on the machine during none of them; artemis comes last, so that its JVMs (stopped at its end)
run beside no other group. workers starts its own second pair of proxies (routerd --workers 2,
HAProxy nbthread 2) after the single-process groups."""
DEFAULT_GROUPS: Final = GROUPS[:-1]
"""The groups of a run without `--only`: all but artemis, which starts three JVMs, needs Java and
the Artemis distribution, and adds about 2 minutes (`--quick`: 20-60 s). The instructions group is
one of them: it adds about 45 s (`--quick`: about 20 s) on 2 shared CPUs."""


@dataclass(slots=True, kw_only=True)
class Figure:
    """One row of the table."""

    name: str
    """Key in the JSON file."""
    group: str
    """Which measurement produces it (one of `GROUPS`)."""
    title: str
    unit: str
    better: Better
    paths: tuple[PathName, ...]
    """The paths the figure applies to; the others show as "-"."""
    values: dict[str, float | None] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    """Why a value is None."""
    details: dict[str, object] = field(default_factory=dict)
    """Per path: error counts, run lengths, raw numbers."""
    note: str = ""
    """What the table must say about the figure (a numbered note on its title), e.g. that a column
    holds a reference figure measured another way."""

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"group must be one of {GROUPS}, got {self.group!r}")
        if not self.paths or any(p not in PATHS for p in self.paths):
            raise ValueError(f"paths must be a non-empty subset of {PATHS}, got {self.paths!r}")

    def _check_path(self, path: PathName) -> None:
        if path not in self.paths:
            raise ValueError(f"figure {self.name!r} has no path {path!r} (paths: {self.paths})")

    def set(self, path: PathName, value: float, details: dict[str, object] | None = None) -> None:
        """Record a measured value; a value <= 0 is recorded as a failure.

        Raises:
            ValueError: the figure does not apply to `path`.
        """
        self._check_path(path)
        if details is not None:
            self.details[path] = details
        if not value > 0:
            self.fail(path, f"the measurement gave {value!r}")
            return
        self.values[path] = value
        self.reasons.pop(path, None)

    def unsupported(self, path: PathName, why: str) -> None:
        """Record that routerd cannot do this yet (not an error of the run)."""
        self._check_path(path)
        self.values[path] = None
        self.reasons[path] = f"{NOT_SUPPORTED}: {why}"

    def fail(self, path: PathName, why: str) -> None:
        """Record that a measurement broke (the run will exit non-zero)."""
        self._check_path(path)
        self.values[path] = None
        self.reasons[path] = f"{FAILED}: {why}"

    @property
    def measured(self) -> bool:
        """Whether any path has a value or a reason."""
        return bool(self.values)

    def failures(self) -> list[str]:
        """ "name/path: reason" of every failed value."""
        return [f"{self.name}/{p}: {r}" for p, r in self.reasons.items() if r.startswith(FAILED)]

    def ratio(self, baseline: PathName = "haproxy") -> float | None:
        """routerd / `baseline` (HAProxy unless said), when both have a value."""
        bottom, routerd = self.values.get(baseline), self.values.get("routerd")
        if bottom is None or routerd is None:
            return None
        return routerd / bottom

    def to_json(self) -> dict[str, object]:
        """The figure's object in the JSON file (`ratio_routerd_artemis` only for figures with an
        Artemis path)."""
        doc: dict[str, object] = {
            "title": self.title,
            "unit": self.unit,
            "better": self.better,
            "values": {p: self.values.get(p) for p in self.paths},
            "reasons": dict(self.reasons),
        }
        for baseline in _BASELINES:
            if baseline == "haproxy" or baseline in self.paths:
                ratio = self.ratio(baseline)
                doc[f"ratio_routerd_{baseline}"] = None if ratio is None else round(ratio, 4)
        if self.note:
            doc["note"] = self.note
        doc["details"] = dict(self.details)
        return doc


_HAPROXY_REFERENCE: Final = (
    "HAProxy: its proxied short-connection rate (16 B echo, same load client), measured once in the "
    "artemis group as the scale of the redirect rates: HAProxy does not redirect CORE or AMQP"
)
_INSTRUCTIONS: Final = (
    "user-space instructions a second proxy of each kind, run under valgrind's callgrind, executes "
    "per connection: routerd's data-path thread, HAProxy's threads summed"
)
_FIRST_SESSION: Final = (
    "a real Artemis Java client (reconnectAttempts=5) following the redirect, median over the rounds; "
    "direct: the same client straight to a target broker"
)


def new_figures() -> dict[str, Figure]:
    """Every figure of the benchmark, in table order, without values."""
    all3: tuple[PathName, ...] = ("direct", "haproxy", "routerd")
    proxies: tuple[PathName, ...] = ("haproxy", "routerd")
    routers: tuple[PathName, ...] = ("artemis", "routerd")
    redirectors: tuple[PathName, ...] = ("haproxy", "artemis", "routerd")
    rows = [
        Figure(name="memory_per_connection", group="memory", title="memory per idle proxied connection",
               unit="KiB", better="lower", paths=proxies),
        Figure(name="memory_rss_before", group="memory", title="RSS before the idle connections",
               unit="MiB", better="lower", paths=proxies),
        Figure(name="bulk_1_stream", group="bulk", title="bulk throughput, 1 stream (iperf3)",
               unit="Gbit/s", better="higher", paths=all3),
        Figure(name="bulk_8_streams", group="bulk", title="bulk throughput, 8 streams (iperf3)",
               unit="Gbit/s", better="higher", paths=all3),
        Figure(name="connection_rate", group="rate", title="short connections, 16 B echo, 50 parallel",
               unit="conn/s", better="higher", paths=all3),
        Figure(name="connection_cpu", group="rate", title="proxy CPU per short connection",
               unit="us", better="lower", paths=proxies),
        Figure(name="mqtt_connect_rate", group="mqtt", title="MQTT 3.1.1 CONNECT->CONNACK, key CLIENT_ID",
               unit="conn/s", better="higher", paths=all3),
        Figure(name="mqtt5_redirect_rate", group="redirect", title="MQTT 5 CONNECT->CONNACK 0x9C (redirect)",
               unit="conn/s", better="higher", paths=proxies),
        Figure(name="rtt_p50", group="latency", title="ping-pong round trip, p50",
               unit="us", better="lower", paths=all3),
        Figure(name="rtt_p99", group="latency", title="ping-pong round trip, p99",
               unit="us", better="lower", paths=all3),
        Figure(name="added_latency_p50", group="latency", title="added latency vs direct, p50",
               unit="us", better="lower", paths=proxies),
        Figure(name="added_latency_p99", group="latency", title="added latency vs direct, p99",
               unit="us", better="lower", paths=proxies),
        Figure(name="decision_miss_p50", group="decision", title="routing decision, cache miss, p50",
               unit="us", better="lower", paths=("routerd",)),
        Figure(name="decision_miss_p99", group="decision", title="routing decision, cache miss, p99",
               unit="us", better="lower", paths=("routerd",)),
        Figure(name="decision_hit_p50", group="decision", title="routing decision, cache hit, p50",
               unit="us", better="lower", paths=("routerd",)),
        Figure(name="decision_hit_p99", group="decision", title="routing decision, cache hit, p99",
               unit="us", better="lower", paths=("routerd",)),
        Figure(name="connection_rate_workers", group="workers",
               title="short connections, 16 B echo: routerd --workers 2, HAProxy nbthread 2",
               unit="conn/s", better="higher", paths=proxies),
        Figure(name="connection_cpu_workers", group="workers",
               title="proxy CPU per short connection, 2 workers / 2 threads", unit="us", better="lower",
               paths=proxies),
        Figure(name="instructions_echo", group="instructions",
               title="instructions per short connection, 16 B echo (callgrind)", unit="instr",
               better="lower", paths=proxies, note=_INSTRUCTIONS),
        Figure(name="instructions_mqtt3", group="instructions",
               title="instructions per MQTT 3.1.1 CONNECT->CONNACK (callgrind)", unit="instr",
               better="lower", paths=proxies, note=_INSTRUCTIONS),
        Figure(name="artemis_core_redirect_rate", group="artemis",
               title="CORE redirect: Java opening -> DISCONNECT_V3 + 222", unit="conn/s", better="higher",
               paths=redirectors, note=_HAPROXY_REFERENCE),
        Figure(name="artemis_amqp_redirect_rate", group="artemis",
               title="AMQP redirect: SASL PLAIN + Open -> Close redirect", unit="conn/s", better="higher",
               paths=redirectors, note=_HAPROXY_REFERENCE),
        Figure(name="artemis_mqtt5_redirect_rate", group="artemis",
               title="MQTT 5 redirect: CONNECT -> CONNACK 0x9C", unit="conn/s", better="higher",
               paths=redirectors, note=_HAPROXY_REFERENCE),
        Figure(name="artemis_core_redirect_cpu", group="artemis", title="router CPU per CORE redirect",
               unit="us", better="lower", paths=routers),
        Figure(name="artemis_amqp_redirect_cpu", group="artemis", title="router CPU per AMQP redirect",
               unit="us", better="lower", paths=routers),
        Figure(name="artemis_mqtt5_redirect_cpu", group="artemis", title="router CPU per MQTT 5 redirect",
               unit="us", better="lower", paths=routers),
        Figure(name="artemis_first_session", group="artemis",
               title="Java CORE client: createConnection -> started session", unit="ms", better="lower",
               paths=("direct", "artemis", "routerd"), note=_FIRST_SESSION),
        Figure(name="artemis_router_start", group="artemis", title="router start -> its first CORE redirect",
               unit="s", better="lower", paths=routers),
        Figure(name="artemis_router_rss", group="artemis", title="router RSS after the redirects",
               unit="MiB", better="lower", paths=routers),
    ]  # fmt: skip
    return {f.name: f for f in rows}


def format_value(value: float) -> str:
    """Three significant digits or so, with thousands separators for big numbers."""
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 0.1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _ratio_text(figure: Figure, baseline: PathName) -> str:
    ratio = figure.ratio(baseline)
    if ratio is None:
        return "-"
    if round(ratio, 2) == 1:
        return f"{ratio:.2f} (equal)"
    good = ratio > 1 if figure.better == "higher" else ratio < 1
    return f"{ratio:.2f} ({'better' if good else 'worse'})"


def format_table(figures: dict[str, Figure]) -> str:
    """The table of the measured figures, with numbered notes for every value that is None and
    for every figure with a `note`.

    Columns: figure, unit, which direction is better, direct, HAProxy, routerd, and the ratio
    routerd/HAProxy with whether that ratio means routerd did better or worse (or "equal" when it
    rounds to 1.00). When a measured figure has an Artemis path, an Artemis column comes before
    routerd and a ratio routerd/Artemis after routerd/HAProxy.
    """
    shown = [f for f in figures.values() if f.measured]
    artemis = any("artemis" in f.paths for f in shown)
    paths = [p for p in PATHS if p != "artemis" or artemis]
    baselines = [b for b in _BASELINES if b != "artemis" or artemis]
    header = ["figure", "unit", "better", *(_HEADINGS[p] for p in paths)]
    header += [f"routerd/{_HEADINGS[b]}" for b in baselines]
    rows: list[list[str]] = []
    notes: list[str] = []

    def mark(note: str) -> str:
        if note not in notes:
            notes.append(note)
        return f"[{notes.index(note) + 1}]"

    for figure in shown:
        title = f"{figure.title} {mark(figure.note)}" if figure.note else figure.title
        cells = [title, figure.unit, figure.better]
        for path in paths:
            if path not in figure.paths:
                cells.append("-")
                continue
            value = figure.values.get(path)
            if value is not None:
                cells.append(format_value(value))
                continue
            reason = figure.reasons.get(path, "not measured")
            cells.append(f"null {mark(f'{_HEADINGS[path]}: {reason}')}")
        cells += [_ratio_text(figure, b) for b in baselines]
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    numeric = range(3, len(header))

    def line(cells: list[str]) -> str:
        out = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    text = [line(header), "  ".join("-" * w for w in widths)]
    text += [line(r) for r in rows]
    text += [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    return "\n".join(text)


@dataclass(frozen=True, slots=True, kw_only=True)
class Goal:
    """A goal of the fast data path (issue 5): a ratio (or an absolute routerd value) and its bound."""

    title: str
    numerator: tuple[str, PathName]
    """(figure name, path) of the value compared."""
    denominator: tuple[str, PathName] | None
    """(figure name, path) it is divided by; None compares the numerator itself."""
    bound: float
    at_least: bool
    """Whether the value must be >= bound (else <= bound)."""

    def value(self, figures: dict[str, Figure]) -> float | None:
        """The goal's value in one run, or None when a figure it needs was not measured."""
        top = figures[self.numerator[0]].values.get(self.numerator[1])
        if top is None:
            return None
        if self.denominator is None:
            return top
        bottom = figures[self.denominator[0]].values.get(self.denominator[1])
        return None if bottom is None else top / bottom

    def met(self, value: float) -> bool:
        """Whether `value` reaches the bound."""
        return value >= self.bound if self.at_least else value <= self.bound


GOALS: Final = (
    Goal(title="bulk throughput 1 stream, routerd/HAProxy", numerator=("bulk_1_stream", "routerd"),
         denominator=("bulk_1_stream", "haproxy"), bound=1.5, at_least=True),
    Goal(title="bulk throughput 8 streams, routerd/HAProxy", numerator=("bulk_8_streams", "routerd"),
         denominator=("bulk_8_streams", "haproxy"), bound=1.5, at_least=True),
    Goal(title="short-connection rate, routerd/HAProxy", numerator=("connection_rate", "routerd"),
         denominator=("connection_rate", "haproxy"), bound=1.0, at_least=True),
    Goal(title="CPU per short connection, routerd/HAProxy", numerator=("connection_cpu", "routerd"),
         denominator=("connection_cpu", "haproxy"), bound=1.0, at_least=False),
    Goal(title="MQTT CONNECT rate by client id, routerd/HAProxy", numerator=("mqtt_connect_rate", "routerd"),
         denominator=("mqtt_connect_rate", "haproxy"), bound=1.0, at_least=True),
    Goal(title="MQTT 5 redirect rate / HAProxy short-connection rate",
         numerator=("mqtt5_redirect_rate", "routerd"), denominator=("connection_rate", "haproxy"),
         bound=1.5, at_least=True),
    Goal(title="added latency p99, routerd/HAProxy", numerator=("added_latency_p99", "routerd"),
         denominator=("added_latency_p99", "haproxy"), bound=1.0, at_least=False),
    Goal(title="idle memory per connection, routerd/HAProxy", numerator=("memory_per_connection", "routerd"),
         denominator=("memory_per_connection", "haproxy"), bound=0.5, at_least=False),
    Goal(title="short-connection rate, routerd --workers 2 / HAProxy nbthread 2",
         numerator=("connection_rate_workers", "routerd"), denominator=("connection_rate_workers", "haproxy"),
         bound=1.0, at_least=True),
    Goal(title="short-connection rate, routerd --workers 2 / --workers 1",
         numerator=("connection_rate_workers", "routerd"), denominator=("connection_rate", "routerd"),
         bound=1.7, at_least=True),
    Goal(title="routing decision p99, cache miss (us)", numerator=("decision_miss_p99", "routerd"),
         denominator=None, bound=50.0, at_least=False),
    Goal(title="routing decision p99, cache hit (us)", numerator=("decision_hit_p99", "routerd"),
         denominator=None, bound=50.0, at_least=False),
    Goal(title="instructions per echo connection (callgrind)", numerator=("instructions_echo", "routerd"),
         denominator=None, bound=30_000, at_least=False),
    Goal(title="instructions per MQTT CONNECT (callgrind)", numerator=("instructions_mqtt3", "routerd"),
         denominator=None, bound=30_000, at_least=False),
    Goal(title="CORE redirect rate, routerd/Artemis", numerator=("artemis_core_redirect_rate", "routerd"),
         denominator=("artemis_core_redirect_rate", "artemis"), bound=1.0, at_least=True),
    Goal(title="AMQP redirect rate, routerd/Artemis", numerator=("artemis_amqp_redirect_rate", "routerd"),
         denominator=("artemis_amqp_redirect_rate", "artemis"), bound=1.0, at_least=True),
    Goal(title="MQTT 5 redirect rate, routerd/Artemis", numerator=("artemis_mqtt5_redirect_rate", "routerd"),
         denominator=("artemis_mqtt5_redirect_rate", "artemis"), bound=1.0, at_least=True),
)  # fmt: skip
"""The per-core goals of issue 35 (a native data path: at least HAProxy's rate and CPU per
connection, 1.5x its bulk throughput, at most half its idle memory, at most 30,000 user-space
instructions per connection), issue 5's decision times, and routerd's redirect rate at least
Artemis's own router's (issue 32), each computed within one run (ratios of figures of the same
run)."""


def goal_results(runs: list[dict[str, Figure]]) -> list[dict[str, object]]:
    """Each goal's value per run and the median over the runs that measured it, and whether the
    median meets the bound (None when no run measured it)."""
    results: list[dict[str, object]] = []
    for goal in GOALS:
        values = [goal.value(figures) for figures in runs]
        measured = [v for v in values if v is not None]
        median = statistics.median(measured) if measured else None
        results.append(
            {
                "goal": goal.title,
                "bound": f"{'>=' if goal.at_least else '<='} {goal.bound:,g}",
                "per_run": [None if v is None else round(v, 4) for v in values],
                "median": None if median is None else round(median, 4),
                "met": None if median is None else goal.met(median),
            }
        )
    return results


def format_goals(results: list[dict[str, object]]) -> str:
    """The goals as lines: value per run, median, bound, met or not."""
    lines = ["goal (median over runs; ratios within each run)"]
    for result in results:
        per_run = result["per_run"]
        assert isinstance(per_run, list)
        runs = ", ".join("-" if v is None else _goal_value(v) for v in per_run)
        median = result["median"]
        assert median is None or isinstance(median, int | float)
        met = result["met"]
        verdict = "not measured" if met is None else "met" if met else "NOT met"
        shown = "-" if median is None else _goal_value(median)
        lines.append(f"  {result['goal']}: {shown} ({runs}); goal {result['bound']}: {verdict}")
    return "\n".join(lines)


def _goal_value(value: float) -> str:
    """A goal's value: two decimals (ratios, microseconds), or whole with thousands separators from
    1,000 up (instruction counts)."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.2f}"


def median_figures(runs: list[dict[str, Figure]]) -> dict[str, Figure]:
    """Figures whose values are the medians over the runs of each path's measured values (a
    path measured in no run keeps the first run's reason)."""
    medians = new_figures()
    for name, figure in medians.items():
        for path in figure.paths:
            values = [v for r in runs if (v := r[name].values.get(path)) is not None]
            if values:
                figure.values[path] = statistics.median(values)
            else:
                reason = next((r[name].reasons[path] for r in runs if path in r[name].reasons), None)
                if reason is not None:
                    figure.values[path] = None
                    figure.reasons[path] = reason
    return medians
