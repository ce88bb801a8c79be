"""Prometheus metrics of one router process, served on the admin listener at /metrics.

Each server instance has its own `CollectorRegistry` (tests run several in one process). Names
follow Prometheus conventions: `router_` prefix, `_total` for counters, base units.

The values are plain numbers in a `Family` or `Histogram` per metric (router/metric_values.py,
cheaper to update than the client library's objects), which the registry reads when it is scraped
(a collector). The kernel's families are `Metrics`' attributes; a feature's are a `FeatureMetrics`
of its folder, registered by `Metrics.feature`.

State that is read rather than counted (a target's state, the cache's size) is copied into its
families just before a scrape (`sample_when_scraped`). The process's own figures (descriptors,
memory, CPU) come from the client library's `ProcessCollector`, registered in each instance's
registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, TypeVar

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from router.logs import LOG_BURST, LOG_INTERVAL_S, suppressed_log_lines
from router.metric_values import Family, Histogram, MetricKind
from router.storm_metrics import StormMetrics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from prometheus_client.metrics_core import Metric

__all__ = [
    "CONNECT_BUCKETS_S",
    "Family",
    "FeatureMetrics",
    "Histogram",
    "MetricKind",
    "Metrics",
]

CONNECT_BUCKETS_S: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Upper bounds of `router_target_connect_duration_seconds`: from a loopback connect (about 0.1 ms
here) through a LAN's and a WAN's, to the connect deadline (5 s, HAProxy's usual `timeout
connect`)."""


class _SuppressedLogLines(Family):
    """`router_log_lines_suppressed_total`: the process's count of rate-limited log lines, kept by
    router/logs.py and read when scraped (a count only goes up, so it is copied, not added)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(
            MetricKind.COUNTER,
            "router_log_lines_suppressed_total",
            "Log lines of WARNING and above not written because more lines of the same message "
            f"came within the interval than its burst allows ({LOG_BURST} in {LOG_INTERVAL_S:g} s; "
            "one summary line per message and interval says how many), by logger.",
            ("logger",),
        )

    def collect(self) -> Metric:
        """The counts as they are now."""
        for logger, count in suppressed_log_lines().items():
            with self._lock:
                if (logger,) not in self._values:
                    self._first((logger,))
                self._values[(logger,)] = float(count)
        return super().collect()


class FeatureMetrics:
    """A feature's metric families (its folder's metrics.py): each attribute that is a `Family` or a
    `Histogram` is one, registered by `Metrics.feature`."""


def _families_of(owner: object) -> Iterator[Family | Histogram]:
    return (value for value in vars(owner).values() if isinstance(value, Family | Histogram))


_F = TypeVar("_F", bound=FeatureMetrics)


class Metrics:
    """The kernel's metric families, and each feature's once registered (`feature`)."""

    def __init__(self) -> None:
        self.log_lines_suppressed = _SuppressedLogLines()
        self.connections_accepted = Family(
            MetricKind.COUNTER,
            "router_connections_accepted_total",
            "Client connections accepted, by acceptor and router.",
            ("acceptor", "router"),
        )
        self.decisions = Family(
            MetricKind.COUNTER,
            "router_routing_decisions_total",
            "Outcomes of routed client connections as the client gets them, by router and status "
            "(OK, REFUSED_USE_ANOTHER, REFUSED_UNAVAILABLE).",
            ("router", "status"),
        )
        self.lookups = Family(
            MetricKind.COUNTER,
            "router_lookups_total",
            "Management-API lookups (GET .../target?key=), by router and status.",
            ("router", "status"),
        )
        self.target_ready = Family(
            MetricKind.GAUGE,
            "router_target_ready",
            "1 while a pool target is ready (its last probe succeeded), else 0.",
            ("router", "node_id"),
        )
        self.target_state = Family(
            MetricKind.GAUGE,
            "router_target_state",
            "1 for a target's state, 0 for the others (read when scraped): up (ready, open to new "
            "connections), down (not ready, or not probed yet), drain (ready, administrative state "
            "drain: no new connections) or maint (administrative state maint: not probed).",
            ("router", "node_id", "state"),
        )
        self.target_check_duration = Family(
            MetricKind.GAUGE,
            "router_target_check_duration_seconds",
            "How long a target's last health probe took (of any member of an HA pair; a probe "
            "without an answer counts its deadline; read when scraped).",
            ("router", "node_id"),
        )
        self.target_last_change = Family(
            MetricKind.GAUGE,
            "router_target_last_change_timestamp_seconds",
            "When a target's state (router_target_state) last changed, in seconds since the epoch; "
            "when the router started or the target joined until then (read when scraped).",
            ("router", "node_id"),
        )
        self.check_failures = Family(
            MetricKind.COUNTER,
            "router_target_check_failures_total",
            "Failed health probes of a target (of any member of an HA pair) since it joined the pool "
            "(HAProxy's chkfail; read when scraped).",
            ("router", "node_id"),
        )
        self.down_seconds = Family(
            MetricKind.COUNTER,
            "router_target_down_seconds_total",
            "Seconds a target has been down (router_target_state down) since it joined the pool, its "
            "current spell included (HAProxy's downtime; read when scraped).",
            ("router", "node_id"),
        )
        self.pool_active = Family(
            MetricKind.GAUGE,
            "router_pool_active",
            "1 while the router's pool has its quorum of ready targets, else 0.",
            ("router",),
        )
        self.pool_open_targets = Family(
            MetricKind.GAUGE,
            "router_pool_open_targets",
            "Targets of the router's pool that take a new client now: up (ready, not drained, in "
            "maintenance or ejected) and not at a full limit. 0 with the quorum held: every new "
            "client is refused (read when scraped).",
            ("router",),
        )
        self.active_connections = Family(
            MetricKind.GAUGE,
            "router_proxied_connections",
            "Proxied connections open now, by router and target.",
            ("router", "node_id"),
        )
        self.router_closes = Family(
            MetricKind.COUNTER,
            "router_proxied_connections_closed_total",
            "Proxied connections the router closed itself, by router and reason: connection_ttl "
            "(no bytes from the client within the connection TTL), target_not_ready (the "
            "target's probe failed), failover (the HA-pair member it went to is no longer the "
            "active one), shutdown (moved by a shutdown, or still open when its grace period "
            "ended), evacuated (moved by an evacuation, a rebalance, or a reload that removed "
            "their target) or target_removed (a reload removed their target or router, and they "
            "were closed at once).",
            ("router", "reason"),
        )
        self.connect_failures = Family(
            MetricKind.COUNTER,
            "router_target_connect_failures_total",
            "Routed connections whose connect to the chosen target failed, by reason: refused, "
            "timeout, unreachable, reset, local_shortage (this host ran short of descriptors, "
            "memory or ports), closed_by_router (closed while connecting) or other.",
            ("router", "node_id", "reason"),
        )
        self.outlier_failures = Family(
            MetricKind.COUNTER,
            "router_target_outlier_failures_total",
            "Proxied connections that passive health counted against their target's broker, by "
            "router and reason: broker_closed_early (closed or reset without a byte soon after "
            "the connect) or broker_refused (its protocol's refusal, such as an MQTT CONNACK "
            "with an error code).",
            ("router", "reason"),
        )
        self.ejections = Family(
            MetricKind.COUNTER,
            "router_target_ejections_total",
            "Times passive health (outlier detection) ejected a target, by router and target.",
            ("router", "node_id"),
        )
        self.connect_duration = Histogram(
            "router_target_connect_duration_seconds",
            "How long connects to a target took, from the routing decision (or the failed connect "
            "before a redispatch) to the open connection; its _count is the connections a target "
            "got.",
            ("router", "node_id"),
            CONNECT_BUCKETS_S,
        )
        self.refusals = Family(
            MetricKind.COUNTER,
            "router_routing_refusals_total",
            "Routed client connections the router refused (or closed) instead of connecting them, "
            "by router and reason: no_ready_target, policy_selects_none, no_pool_or_policy, "
            "routing_timed_out, no_local_connector, connect_failed (the connect failed and no "
            "other target was tried), queue_full or queue_timeout (the target's maxConnections "
            "or connectRate held it back: its queue was full, or it waited queueTimeout).",
            ("router", "reason"),
        )
        self.proxied_bytes = Family(
            MetricKind.COUNTER,
            "router_proxied_bytes_total",
            "Bytes relayed, open connections' included (read at each scrape), by router and target; "
            "direction is client_to_target or target_to_client.",
            ("router", "node_id", "direction"),
        )
        self.auth_failures = Family(
            MetricKind.COUNTER,
            "router_authentication_failures_total",
            "Clients refused because the router's user store did not accept their credentials.",
            ("acceptor",),
        )
        self.client_errors = Family(
            MetricKind.COUNTER,
            "router_client_errors_total",
            "Client connections closed during their opening: bad bytes, over the byte cap, or the "
            "handshake deadline; reason is the protocol that rejected it, 'timeout', or 'tls' (a failed "
            "TLS handshake).",
            ("acceptor", "reason"),
        )
        self.connections_refused = Family(
            MetricKind.COUNTER,
            "router_connections_refused_total",
            "Client connections closed at accept because a limit was reached, by acceptor and reason: "
            "descriptor_budget (the process's share of file descriptors for clients), acceptor_limit "
            "(connectionsAllowed) or source_limit (connectionsAllowedPerSource).",
            ("acceptor", "reason"),
        )
        self.admin_auth_failures = Family(
            MetricKind.COUNTER,
            "router_admin_auth_failures_total",
            "Admin API requests refused 401: no token, or a token that is none of --admin-tokens "
            "(past a few from one address in a minute, that address's requests are slowed).",
            (),
        )
        self.admin_connections_displaced = Family(
            MetricKind.COUNTER,
            "router_admin_connections_displaced_total",
            "Admin API connections closed before their request was read, to make room for a new "
            "connection (the admin API's connection limit, or its limit per address).",
            (),
        )
        self.connection_budget = Family(
            MetricKind.GAUGE,
            "router_client_connection_budget",
            "Client connections the process serves at most at once: its file-descriptor limit, less "
            "a reserve for probes, the admin API and the process, over two descriptors a connection.",
            (),
        )
        self.reload_successful = Family(
            MetricKind.GAUGE,
            "router_config_last_reload_successful",
            "1 when the last configuration reload (SIGHUP, POST /api/v1/reload, routerctl reload) "
            "was applied, 0 when the file was refused and nothing changed (1 from the start until "
            "a reload is tried).",
            (),
        )
        self.reload_timestamp = Family(
            MetricKind.GAUGE,
            "router_config_last_reload_success_timestamp_seconds",
            "When the configuration in force was loaded: the start, or the last reload that was "
            "applied, in seconds since the epoch.",
            (),
        )
        self.build_info = Family(
            MetricKind.GAUGE,
            "router_build_info",
            "Always 1: the version of routerd and of the Python running it, as labels.",
            ("version", "python_version"),
        )
        self.client_connections = Family(
            MetricKind.GAUGE,
            "router_client_connections",
            "Client connections the process serves now, counted against "
            "router_client_connection_budget (read when scraped).",
            (),
        )
        self.redispatches = Family(
            MetricKind.COUNTER,
            "router_connect_redispatches_total",
            "Routed connections whose connect failed and that were sent to another ready target "
            "instead (HAProxy's redispatch), by router.",
            ("router",),
        )
        self.cache_entries = Family(
            MetricKind.GAUGE,
            "router_cache_entries",
            "Entries in the router's key -> target cache (read when scraped).",
            ("router",),
        )
        self.cache_evictions = Family(
            MetricKind.COUNTER,
            "router_cache_evictions_total",
            "Cache entries evicted, least recently used first, to stay within <max-entries>.",
            ("router",),
        )
        self.cache_lookups = Family(
            MetricKind.COUNTER,
            "router_cache_lookups_total",
            "Cache lookups of routing decisions and management lookups, by result: hit (an entry or "
            "a pin, used when its target is ready) or miss (read when scraped).",
            ("router", "result"),
        )
        self.zookeeper_state = Family(
            MetricKind.GAUGE,
            "router_zookeeper_state",
            "1 for the state of a router's ZooKeeper session, 0 for the others, by use (discovery: "
            "its pool's members; shared_cache: its cache): connecting (not connected yet since the "
            "start), connected (and answering), suspended (the connection dropped, or no answer "
            "within the answer timeout) or lost (the session expired, or nothing was heard for the "
            "session timeout).",
            ("router", "use", "state"),
        )
        self.zookeeper_last_change = Family(
            MetricKind.GAUGE,
            "router_zookeeper_state_last_change_timestamp_seconds",
            "When a router's ZooKeeper session (router_zookeeper_state) last changed state, in "
            "seconds since the epoch; when its client started until then.",
            ("router", "use"),
        )
        self.storm = StormMetrics()
        """The storm protection's families (router/storm_metrics.py)."""
        self._families: list[Family | Histogram] = [*_families_of(self), *_families_of(self.storm)]
        self._features: dict[type[FeatureMetrics], FeatureMetrics] = {}
        self._samplers: list[Callable[[], None]] = []
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)  # a collector: anything with collect()
        # process_open_fds, process_max_fds, process_resident_memory_bytes, process_cpu_seconds_total,
        # process_start_time_seconds, ...: read from /proc/self when scraped (none without /proc).
        ProcessCollector(registry=self.registry)

    def feature(self, kind: type[_F]) -> _F:
        """A feature's families (router/feature.py): made and registered on the first call, the same
        object on every later one."""
        families = self._features.get(kind)
        if families is None:
            families = self._features[kind] = kind()
            self._families.extend(_families_of(families))
        assert isinstance(families, kind)
        return families

    def sample_when_scraped(self, sampler: Callable[[], None]) -> Callable[[], None]:
        """Have `sampler` update families from state that is read, not counted (a cache's size),
        before each scrape; what it returns takes the sampler off again (a router a reload removed)."""
        self._samplers.append(sampler)
        return lambda: self._samplers.remove(sampler)

    def collect(self) -> Iterator[Metric]:
        """Every family, for the registry (the collector protocol)."""
        for sampler in self._samplers:
            sampler()
        for family in self._families:
            yield family.collect()

    def sample(self) -> None:
        """Run the samplers (what a scrape runs first): the families then hold every count."""
        for sampler in self._samplers:
            sampler()

    def family(self, name: str) -> Family | Histogram | None:
        """The family exposed under `name`, if any."""
        return next((f for f in self._families if f.name == name), None)

    def exposition(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)
