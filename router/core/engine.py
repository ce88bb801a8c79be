"""The routing engine: one connection router's decision workflow (SPEC A1), pure and clock-free.

No I/O and no clock here (the caller passes `now`). `begin` runs the workflow as far as it can
without waiting: it returns the decision, or `QuorumWait` when step 7 must wait for the pool's
quorum; the wait itself is the runtime's (router/runtime/pool.py), which then calls `finish`.
`routerctl route` uses `route` / `lookup`, which never wait.

Workflow of one decision (SPEC A1):
  0. internal router client id -> local target
  1-2. raw key, key filter, NULL                         (`keys.resolve_key`)
  3. policy key transform                                (`transform`)
  4. local-target filter -> local target                 (`early`)
  5. no pool or no policy -> REFUSED_USE_ANOTHER         (`early`)
  6. cache hit on a ready target -> that target          (`early`)
  7. ready targets of the pool, quorum                   (caller)
  8. policy pick -> cache it, OK                         (`select`)
  9. nothing -> REFUSED_UNAVAILABLE                      (`select`)
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeAlias

from cache import TargetCache
from keys import NULL_KEY, KeyType, is_internal_client_id, resolve_key
from keys.resolve import canonical_ip, known_canonical_ip, resolve_value
from policies import make_policy
from pools import Pool, PoolKind, Target
from router.config.settings import compile_filter
from router.core.records import quick_init

if TYPE_CHECKING:
    from collections.abc import Sequence

    from keys import ConnectionFacts
    from keys.filter import KeyFilter
    from policies import ConnectionCountSource, Policy, SlowStartSource
    from pools import Connector
    from router.config.settings import Config, RouterConfig

__all__ = [
    "DecisionReason",
    "QuorumWait",
    "RouteDecision",
    "RouteStatus",
    "RoutingEngine",
    "SharedCacheWait",
    "Wait",
    "build_pool",
]


class RouteStatus(enum.Enum):
    """Outcome of a routing decision, named as Artemis names them."""

    OK = "OK"
    REFUSED_USE_ANOTHER = "REFUSED_USE_ANOTHER"
    """Rejected for good: go elsewhere (no pool or policy, local target unavailable)."""
    REFUSED_UNAVAILABLE = "REFUSED_UNAVAILABLE"
    """The pool is not ready yet; possibly transient."""


class DecisionReason(enum.Enum):
    """Which workflow step decided, or which rule turned a decision into a refusal: the `reason=`
    of log lines (the values are what they print)."""

    INTERNAL_CLIENT_ID = "internal client id"
    """Step 0: a router-to-router probe goes to the local target."""
    LOCAL_TARGET_FILTER = "local-target-filter"
    """Step 4: the key fully matches the local-target filter."""
    NO_POOL_OR_POLICY = "no pool or no policy"
    """Step 5: REFUSED_USE_ANOTHER."""
    CACHE = "cache"
    """Step 6: a cached node id that is ready."""
    POLICY = "policy"
    """Step 8: the policy's pick."""
    NO_READY_TARGET = "no ready target"
    """Step 9, nothing to pick from (below quorum, or no target ready)."""
    POLICY_SELECTS_NONE = "policy selects no target"
    """Step 9, the policy picked nothing (CONSISTENT_HASH_MODULO never picks)."""
    ROUTING_TIMED_OUT = "routing timed out"
    """The quorum wait outlasted the routing deadline (the runtime's rule)."""
    NO_LOCAL_CONNECTOR = "the decision is the local target and no <local-target-connector-ref> is configured"
    """An OK decision for a local target that cannot be reached (the plan's rule)."""
    REDISPATCH = "redispatch"
    """The connect to the first pick failed: the policy's pick among the other ready targets
    (`RoutingEngine.redispatch`, HAProxy's `option redispatch`)."""
    CONNECT_FAILED = "connect failed"
    """The connect to the chosen target failed and there was no other to try."""
    QUEUE_FULL = "queue full"
    """The chosen target is at its `maxConnections` or `connectRate` and its queue is full (the
    target's gate, router/runtime/gates.py)."""
    QUEUE_TIMEOUT = "queue timeout"
    """The connection waited the chosen target's `queueTimeout` for a slot or a connect token."""


_SOURCE_IP: Final = KeyType.SOURCE_IP
_CLIENT_ID: Final = KeyType.CLIENT_ID
_USER_NAME: Final = KeyType.USER_NAME
_BY_CACHE: Final = DecisionReason.CACHE
_BY_POLICY: Final = DecisionReason.POLICY
"""Enum members the plain decisions (`plain_key`, `plain`) use, looked up once: in Python 3.11 an
enum class's attribute goes through `EnumType.__getattr__`'s hook, some 300-700 instructions a
lookup (callgrind), which every connection would pay."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class QuorumWait:
    """Step 7 must wait: the pool has fewer ready targets than its quorum and the router allows a
    `quorum-timeout`. Wait up to `timeout_s` for the pool to change, then `RoutingEngine.finish`."""

    key: str
    """The key after filter and transform."""
    timeout_s: float
    """`quorum-timeout` in seconds (> 0)."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class SharedCacheWait:
    """Step 6 of a router whose cache is shared through ZooKeeper found no usable entry in its own
    copy: ask the shared cache for the key (the runtime's), then `RoutingEngine.after_shared`."""

    key: str
    """The key after filter and transform."""


Wait: TypeAlias = QuorumWait | SharedCacheWait
"""What `RoutingEngine.begin` returns when the decision needs to wait (the runtime waits)."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RouteDecision:
    """What the engine decided for one key."""

    key: str
    """The key after filter and transform (`NULL` when missing)."""
    status: RouteStatus
    target: Target | None = None
    """The chosen target when status is OK."""
    connector: Connector | None = None
    """Where to reach the chosen target now: the active member of its HA pair (just the target's
    connector when it is not a pair; the primary when not given); None when not OK or for a local
    target without connector."""
    reason: DecisionReason
    """Which workflow step decided."""

    def __post_init__(self) -> None:
        if (self.status is RouteStatus.OK) != (self.target is not None):
            raise ValueError(f"a decision has a target exactly when OK, got {self.status.value}")
        if self.connector is None and self.target is not None and self.target.connector is not None:
            object.__setattr__(self, "connector", self.target.connector.members[0])  # frozen: set once

    def to_json(self) -> dict[str, str | bool | None]:
        """The JSON object of `routerctl route` and the admin lookup API."""
        target = self.target
        connector = None if self.connector is None else self.connector.url
        return {
            "key": self.key,
            "status": self.status.value,
            "node_id": None if target is None else target.node_id,
            "local": target is not None and target.local,
            "connector": connector,
        }


def build_pool(config: Config, router: RouterConfig) -> tuple[Pool | None, Target]:
    """The pool of a router, in pool order, and its local target.

    Static pools take their connectors in order; cluster pools take the cluster connection's static
    connectors; discovery pools start empty (members arrive from discovery).

    Returns:
        (the pool or None when the router has none, the local target).
    """
    local_connector = config.connector(router.local_connector) if router.local_connector is not None else None
    local = Target.local_target(local_connector)
    pool_config = router.pool
    if pool_config is None:
        return None, local
    targets: list[Target] = [local] if pool_config.local_target_enabled else []
    names: Sequence[str] = ()
    if pool_config.kind is PoolKind.STATIC:
        names = pool_config.static_connectors
    elif pool_config.kind is PoolKind.CLUSTER:
        assert pool_config.cluster_connection is not None
        names = config.cluster_connection(pool_config.cluster_connection).static_connectors
    targets.extend(Target.remote(config.connector(name)) for name in names)
    return Pool(router.name, pool_config.quorum_size, targets, pool_config.outlier_detection), local


class RoutingEngine:
    """One connection router's decision state: filters, policy, cache and pool."""

    def __init__(
        self,
        config: RouterConfig,
        pool: Pool | None,
        local_target: Target,
        *,
        round_robin_start: int | None = None,
        counts: ConnectionCountSource | None = None,
        slow_start: SlowStartSource | None = None,
    ) -> None:
        """Build the engine of one router.

        Args:
            config: the router's configuration.
            pool: its pool (shared with the health checker), or None.
            local_target: what a local decision returns.
            round_robin_start: first round-robin position (tests); random when None.
            counts: connection counts for LEAST_CONNECTIONS.
            slow_start: the slow-start shares of targets that became ready again (the policies'
                weights ramp with them).
        """
        self.config = config
        self.name = config.name
        self.pool = pool
        self.local_target = local_target
        self.policy: Policy | None = (
            make_policy(
                config.policy, round_robin_start=round_robin_start, counts=counts, slow_start=slow_start
            )
            if config.policy is not None
            else None
        )
        self.cache = (
            TargetCache(config.cache, track_use=config.cache_zookeeper is not None)
            if config.cache is not None
            else None
        )
        self.shared = config.cache_zookeeper is not None
        """Whether the cache is shared through ZooKeeper: `begin` asks for it on a miss."""
        self._key_filter = compile_filter(config.key_filter, "key-filter")
        self._local_filter = compile_filter(config.local_target_filter, "local-target-filter")

    # -- run-time filters (SPEC A7: readable and changeable; blank disables) --

    @property
    def key_filter(self) -> str | None:
        """The key filter's pattern, or None when disabled."""
        return None if self._key_filter is None else self._key_filter.pattern

    @key_filter.setter
    def key_filter(self, pattern: str | None) -> None:
        self._key_filter = compile_filter(pattern, "key-filter")

    @property
    def local_target_filter(self) -> str | None:
        """The local-target filter's pattern, or None when disabled."""
        return None if self._local_filter is None else self._local_filter.pattern

    @local_target_filter.setter
    def local_target_filter(self, pattern: str | None) -> None:
        self._local_filter = compile_filter(pattern, "local-target-filter")

    def set_filters(self, **patterns: str | None) -> None:
        """Change the run-time filters named (`key_filter`, `local_target_filter`; blank or None
        disables one): all of them or none.

        Raises:
            ValueError: an expression that does not compile, or an unknown filter (nothing changed).
        """
        rules = {"key_filter": "key-filter", "local_target_filter": "local-target-filter"}
        unknown = sorted(set(patterns) - set(rules))
        if unknown:
            raise ValueError(f"no such filter: {', '.join(unknown)} (filters: {', '.join(rules)})")
        compiled = {name: compile_filter(pattern, rules[name]) for name, pattern in patterns.items()}
        self._key_filter = compiled.get("key_filter", self._key_filter)
        self._local_filter = compiled.get("local_target_filter", self._local_filter)

    @property
    def compiled_key_filter(self) -> KeyFilter | None:
        """The compiled key filter (for `keys.resolve_key`)."""
        return self._key_filter

    # -- workflow steps --

    def is_internal(self, facts: ConnectionFacts) -> bool:
        """Step 0: a router-to-router probe, always routed to the local target."""
        return is_internal_client_id(facts.client_id)

    def local_decision(self, key: str, reason: DecisionReason) -> RouteDecision:
        """An OK decision for the local target."""
        return self._ok(key, self.local_target, reason)

    def _ok(self, key: str, target: Target, reason: DecisionReason) -> RouteDecision:
        """An OK decision, reaching the target through its active member."""
        return RouteDecision(
            key=key, status=RouteStatus.OK, target=target, connector=self._reach(target), reason=reason
        )

    def _reach(self, target: Target) -> Connector | None:
        """Where a decided target is reached: its active member (the primary when not known)."""
        connector = target.connector
        if connector is not None and connector.backups and self.pool is not None:
            try:
                member = self.pool.active_member(target.node_id)
            except KeyError:  # a local target outside the pool is not probed: its primary
                member = None
            connector = connector.members[member or 0]
        return connector

    def connection_key(self, facts: ConnectionFacts) -> str:
        """Steps 1-3: the key of a connection after filter and transform."""
        config = self.config
        return self.transform(resolve_key(config.key_type, self._key_filter, facts, config.key_max_length))

    def plain_key(
        self, source_ip: str, client_id: str | None = None, user_name: str | None = None
    ) -> str | None:
        """Steps 0-3 for a connection known by its source address, client id and user name alone
        (the native path's, with no user the router authenticated): its key, the same as
        `connection_key` of its facts, for key types SOURCE_IP, CLIENT_ID and USER_NAME; None for
        other key types and for an internal client id (`begin` decides those)."""
        if client_id is not None and is_internal_client_id(client_id):
            return None
        config = self.config
        key_type = config.key_type
        if key_type is _SOURCE_IP:
            value: str | None = known_canonical_ip(source_ip) or canonical_ip(source_ip)
        elif key_type is _CLIENT_ID:
            value = client_id
        elif key_type is _USER_NAME:
            value = user_name
        else:
            return None
        key = resolve_value(value, self._key_filter, config.key_max_length)
        policy = self.policy
        if policy is None or not policy.TRANSFORMS or key == NULL_KEY:  # `transform`, not called
            return key
        return policy.transform_key(key)

    def plain(self, key: str, now: float) -> tuple[Target, Connector | None, DecisionReason] | None:
        """`begin`'s decision for a transformed key (`plain_key`) in plain values when it is a
        target, from the cache or from the policy (the native path's lean connections: no
        `RouteDecision` made): the target, where it is reached and the reason, with the same
        changes as `begin` (the entry refreshed or written, the hit or miss counted, the policy's
        position moved). None, with nothing changed or counted, when `begin` decides otherwise or
        not at once: a local filter that takes the key, no pool or policy, a pinned key, a miss of a
        cache shared through ZooKeeper, no target open to new connections."""
        cache, pool, policy = self.cache, self.pool, self.policy
        if pool is None or policy is None:
            return None
        if self._local_filter is not None and self._local_filter.matches_whole(key):
            return None
        if cache is not None:
            node_id = cache.fresh(key, now)
            if node_id is not None:
                target = pool.ready_target(node_id)
                if target is not None:
                    cache.touch(key, node_id, now)  # as `begin`'s `get`
                    return target, self._reach(target), _BY_CACHE
            if self.shared or cache.is_pinned(key):
                return None
        targets = pool.routing_targets()
        if not targets:
            return None
        chosen = policy.select(targets, key)  # None only for no target, or a policy without state
        if chosen is None:
            return None
        if cache is not None:
            cache.get(key, now)  # as `begin`'s step 6: the miss counted, an expired entry gone
            if not cache.OTHER_WRITERS:
                cache.put(key, chosen.node_id, now)
            elif (node_id := cache.claim(key, chosen.node_id, now, self._takes)) != chosen.node_id:
                other = pool.ready_target(node_id)
                if other is not None:
                    return other, self._reach(other), _BY_CACHE  # another worker's choice
        return chosen, self._reach(chosen), _BY_POLICY

    def transform(self, key: str) -> str:
        """Step 3: the policy's key transform; `NULL` is never transformed."""
        policy = self.policy
        if policy is None or not policy.TRANSFORMS or key == NULL_KEY:
            return key
        return policy.transform_key(key)

    def early(self, key: str, now: float, *, dry_run: bool = False) -> RouteDecision | None:
        """Steps 4-6: local filter, missing pool/policy, cache hit; None means ask the pool. A dry
        run reads the cache without refreshing the entry."""
        if self._local_filter is not None and self._local_filter.matches_whole(key):
            return self.local_decision(key, DecisionReason.LOCAL_TARGET_FILTER)
        if self.pool is None or self.policy is None:
            return RouteDecision(
                key=key, status=RouteStatus.REFUSED_USE_ANOTHER, reason=DecisionReason.NO_POOL_OR_POLICY
            )
        if self.cache is not None:
            if dry_run:
                entry = self.cache.entry(key, now)
                node_id = None if entry is None else entry.node_id
            else:
                node_id = self.cache.get(key, now)
            if node_id is not None:
                target = self.pool.ready_target(node_id)
                if target is not None:
                    return self._ok(key, target, DecisionReason.CACHE)
        return None

    def select(
        self, key: str, targets: Sequence[Target], now: float, *, dry_run: bool = False
    ) -> RouteDecision:
        """Steps 8-9: the policy's pick among the ready targets (empty below quorum). A dry run
        picks on a copy of the policy (no round-robin move) and caches nothing."""
        assert self.policy is not None, "select() follows early(), which refuses without a policy"
        target = (copy.copy(self.policy) if dry_run else self.policy).select(targets, key)
        if target is None:
            reason = DecisionReason.NO_READY_TARGET if not targets else DecisionReason.POLICY_SELECTS_NONE
            return RouteDecision(key=key, status=RouteStatus.REFUSED_UNAVAILABLE, reason=reason)
        if self.cache is not None and not dry_run:
            if not self.cache.OTHER_WRITERS:
                self.cache.put(key, target.node_id, now)
            elif (node_id := self.cache.claim(key, target.node_id, now, self._takes)) != target.node_id:
                other = self._pool_target(node_id)
                if other is not None:
                    return self._ok(key, other, DecisionReason.CACHE)  # another worker's choice
        return self._ok(key, target, DecisionReason.POLICY)

    def _takes(self, node_id: str) -> bool:
        """Whether the target with this node id takes a key from the cache now (ready, open)."""
        return self._pool_target(node_id) is not None

    def _pool_target(self, node_id: str) -> Target | None:
        """The pool's ready target with this node id, as a cache hit takes it."""
        return None if self.pool is None else self.pool.ready_target(node_id)

    def decide(self, key: str, now: float, *, dry_run: bool = False) -> RouteDecision:
        """Steps 4-9 for a transformed key, taking the pool's targets as they are (no quorum wait);
        a dry run changes nothing (see `early` and `select`)."""
        decision = self.early(key, now, dry_run=dry_run)
        if decision is not None:
            return decision
        assert self.pool is not None, "early() refuses when there is no pool"
        return self.select(key, self.pool.routing_targets(), now, dry_run=dry_run)

    def redispatch(self, key: str, reason: DecisionReason, failed: str, now: float) -> RouteDecision:
        """After the connect to target `failed` failed (it died between two probes): the policy's
        pick among the other ready targets, cached in place of the failed one; REFUSED_UNAVAILABLE
        when there is none, or when the pool did not choose the target (the local target).

        Args:
            key: the connection's key.
            reason: how the failed target was chosen.
            failed: its node id.
            now: the current time (cache expiry).
        """
        if reason in (DecisionReason.CACHE, DecisionReason.POLICY) and (
            moved := self._other(key, failed, now)
        ):
            return moved
        return RouteDecision(
            key=key, status=RouteStatus.REFUSED_UNAVAILABLE, reason=DecisionReason.CONNECT_FAILED
        )

    def elsewhere(self, key: str, reason: DecisionReason, held: str, now: float) -> RouteDecision | None:
        """A connection its target's gate held back (a full queue, the queue timeout): the policy's
        pick among the other ready targets, cached in place of the held one, when the key may go
        elsewhere; None when it waits for its own target (a hash policy, a cache hit: the key is
        pinned there) or there is no other ready target.

        Args:
            key: the connection's key.
            reason: how the held target was chosen (only a POLICY pick may move).
            held: its node id.
            now: the current time (cache expiry).
        """
        if reason is not DecisionReason.POLICY or self.policy is None or self.policy.STICKY:
            return None
        return self._other(key, held, now)

    def _other(self, key: str, leaving: str, now: float) -> RouteDecision | None:
        """The policy's pick among the ready targets other than `leaving`, cached for the key
        (REDISPATCH); None when there is none (or no pool)."""
        if self.pool is None:
            return None
        targets = [t for t in self.pool.routing_targets() if t.node_id != leaving]
        decision = self.select(key, targets, now)
        return None if decision.target is None else self._ok(key, decision.target, DecisionReason.REDISPATCH)

    def relocate(self, key: str, leaving: str | None, now: float, *, to: str | None = None) -> RouteDecision:
        """Where the key of a connection the router moves goes now (router/features/moves/):
        `to` when it is given and open to new connections, else the policy's pick among the
        targets open to new connections other than `leaving`; cached in place of the entry it
        had, so the client that comes back through the router lands there.

        Args:
            key: the connection's key (transformed, as routed).
            leaving: the node id the connection is moved off (None: any target will do).
            now: the current time (cache expiry).
            to: the node id a rebalance chose, if any.
        """
        if self.pool is None or self.policy is None:
            return RouteDecision(
                key=key, status=RouteStatus.REFUSED_USE_ANOTHER, reason=DecisionReason.NO_POOL_OR_POLICY
            )
        if to is not None and (target := self.pool.ready_target(to)) is not None:
            if self.cache is not None:
                self.cache.put(key, target.node_id, now)
            return self._ok(key, target, DecisionReason.POLICY)
        targets = [t for t in self.pool.routing_targets() if t.node_id != leaving]
        return self.select(key, targets, now)

    def lookup(self, key: str, now: float) -> RouteDecision:
        """The management lookup (SPEC A7): the workflow from step 3, without waiting for quorum."""
        return self.decide(self.transform(key), now)

    def peek(self, key: str, now: float) -> RouteDecision:
        """The management lookup as a dry run: what `lookup` would answer now, changing nothing (no
        cache write or refresh, no round-robin move)."""
        return self.decide(self.transform(key), now, dry_run=True)

    def route(self, facts: ConnectionFacts, now: float) -> RouteDecision:
        """The whole workflow for a connection (steps 0-9), without waiting for quorum."""
        if self.is_internal(facts):
            return self.local_decision(self.connection_key(facts), DecisionReason.INTERNAL_CLIENT_ID)
        return self.decide(self.connection_key(facts), now)

    def begin(self, facts: ConnectionFacts, now: float) -> RouteDecision | Wait:
        """The workflow for a connection as far as it goes without waiting: the decision,
        `SharedCacheWait` when a shared cache must be asked (then `after_shared`), or `QuorumWait`
        when step 7 must wait for the quorum (then `finish` once it holds or the wait is over).
        Nothing is cached and no round-robin position moves before the final `select`."""
        key = self.connection_key(facts)
        if self.is_internal(facts):
            return self.local_decision(key, DecisionReason.INTERNAL_CLIENT_ID)
        decision = self.early(key, now)
        if decision is not None:
            return decision
        if self.shared:
            return SharedCacheWait(key=key)
        return self._from_pool(key, now)

    def _from_pool(self, key: str, now: float) -> RouteDecision | QuorumWait:
        """Steps 7-9: the policy's pick, or `QuorumWait` when the quorum must be waited for."""
        pool = self.pool
        assert pool is not None, "early() refuses when there is no pool"
        timeout_ms = 0 if self.config.pool is None else self.config.pool.quorum_timeout_ms
        targets = pool.routing_targets()
        if not targets and timeout_ms > 0 and pool.ready_count() < pool.quorum_size:
            return QuorumWait(key=key, timeout_s=timeout_ms / 1000)
        return self.select(key, targets, now)

    def after_shared(
        self, wait: SharedCacheWait, node_id: str | None, now: float
    ) -> RouteDecision | QuorumWait:
        """Step 6 with the shared cache's answer (`node_id`, None: no entry, or ZooKeeper did not
        answer): the router's own entry when a decision for the key meanwhile made one, else the
        answer's target when that is ready (copied into the router's own cache), else steps 7-9 as
        without a shared cache."""
        assert self.cache is not None, "only a cache is shared"
        own = self.cache.get(wait.key, now)
        if own is not None and (decision := self.adopt(wait.key, own, now)) is not None:
            return decision
        if node_id is not None:
            decision = self.adopt(wait.key, node_id, now)
            if decision is not None:
                return decision
        return self._from_pool(wait.key, now)

    def adopt(self, key: str, node_id: str, now: float) -> RouteDecision | None:
        """Take another router's choice for a key from the shared cache: cached here too and
        decided (reason `cache`) when its target is ready; None when it is not."""
        assert self.cache is not None, "only a shared cache adopts"
        assert self.pool is not None, "early() refuses when there is no pool"
        target = self.pool.ready_target(node_id)
        if target is None:
            return None
        self.cache.put(key, node_id, now)
        return self._ok(key, target, DecisionReason.CACHE)

    def finish(self, wait: QuorumWait, now: float) -> RouteDecision:
        """Steps 8-9 after a quorum wait (whether or not the quorum came)."""
        assert self.pool is not None, "only a router with a pool waits for its quorum"
        return self.select(wait.key, self.pool.routing_targets(), now)
