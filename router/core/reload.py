"""What a configuration reload changes: the configuration in force vs the file read again, as one
frozen `ConfigDiff` (pure: no I/O, no clock; router/server.py carries it out).

Rules (docs/operations.md, "Reloading the configuration"):

- **Routers** are matched by name: added, removed, or changed when anything that decides their
  connections differs (key type, filters, local target, key length, policy, cache, pool settings,
  the targets the pool is configured with, or the connection TTL of their acceptors).
- **Targets** of a router's pool are matched by node id: added, removed, or changed when their
  connector differs (address, HA members, parameters). The connections to a removed target, to a
  member address a changed target no longer has, and every connection of a removed router are
  `departed`: their target left the configuration. Nothing else closes a connection.
- **Acceptors** are matched by name: added, removed, or changed when what serves their
  connections differs (the acceptor's URL, the connection TTL in force on it, its router's key
  type, which decides the data path and whether the opening is read).
- **Not in place** (said in the reply, the rest is applied): the event log's settings (kept as
  they are); a persisted or shared cache's settings (the router's cache stays as it is, the rest
  of the router changes); a router's discovery source (its discovery group's `<zookeeper>`, or a
  switch between discovered and configured targets: the whole router is *held*, kept as it runs,
  until a restart). A held router is compared with the configuration it runs with on the next
  reload too, so the reply keeps saying so until the file matches it again or routerd restarts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from router.core.address import Address
from router.core.engine import build_pool

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pools import Target
    from router.config.settings import Config, RouterConfig, ZooKeeperConfig

__all__ = ["ConfigDiff", "Departed", "ReloadError", "RouterChange", "diff_configs"]

NOTHING_CHANGED: Final = "nothing changed"
"""The summary of a reload of the same file."""


class ReloadError(Exception):
    """A reload changed nothing; the message is the one-line reason (a configuration error worded
    as at start, a key store or user store that cannot be read, a port that cannot be bound)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Departed:
    """Connections of a router whose target left the configuration."""

    node_id: str
    addresses: tuple[Address, ...] | None = None
    """Only the connections to these member addresses (a changed connector); None: all of them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterChange:
    """One router present before and after, and what changed in it."""

    name: str
    what: tuple[str, ...]
    """What differs, by element: `key-type`, `key-filter`, `local-target-filter`, `local-target`,
    `key-max-length`, `cache`, `policy`, `pool`, `targets`, `connection-ttl`."""
    targets_added: tuple[str, ...] = ()
    targets_removed: tuple[str, ...] = ()
    targets_changed: tuple[str, ...] = ()
    """Node ids whose connector changed (probed again from unknown)."""
    departed: tuple[Departed, ...] = ()

    def to_json(self) -> dict[str, object]:
        """Its part of the reload's JSON answer."""
        return {
            "name": self.name,
            "what": list(self.what),
            "targets_added": list(self.targets_added),
            "targets_removed": list(self.targets_removed),
            "targets_changed": list(self.targets_changed),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigDiff:
    """What a reload changes (see the module docstring)."""

    config: Config
    """The configuration in force after the reload: the new one, with what is not changed in place
    kept as it was (event log, persisted or shared caches)."""
    held: Mapping[str, Config] = field(default_factory=dict)
    """Router name -> the configuration it keeps running with (its change needs a restart)."""
    routers_added: tuple[str, ...] = ()
    routers_removed: tuple[str, ...] = ()
    routers_changed: tuple[RouterChange, ...] = ()
    acceptors_added: tuple[str, ...] = ()
    acceptors_removed: tuple[str, ...] = ()
    acceptors_changed: tuple[str, ...] = ()
    not_in_place: tuple[str, ...] = ()
    """One sentence per change that needs a restart."""

    @property
    def changed(self) -> bool:
        """Whether anything is applied."""
        return bool(
            self.routers_added
            or self.routers_removed
            or self.routers_changed
            or self.acceptors_added
            or self.acceptors_removed
            or self.acceptors_changed
        )

    def summary(self) -> str:
        """One line for the log: what changed, what needs a restart."""
        parts: list[str] = []
        for what, names in (
            ("routers added", self.routers_added),
            ("routers removed", self.routers_removed),
            ("acceptors added", self.acceptors_added),
            ("acceptors removed", self.acceptors_removed),
            ("acceptors changed", self.acceptors_changed),
        ):
            if names:
                parts.append(f"{what}: {', '.join(names)}")
        for change in self.routers_changed:
            detail = [", ".join(change.what)]
            for what, node_ids in (
                ("targets added", change.targets_added),
                ("targets removed", change.targets_removed),
                ("targets changed", change.targets_changed),
            ):
                if node_ids:
                    detail.append(f"{what}: {', '.join(node_ids)}")
            parts.append(f"router {change.name} changed ({'; '.join(detail)})")
        text = "; ".join(parts) if parts else NOTHING_CHANGED
        if self.not_in_place:
            text += "; not changed in place (restart routerd to apply): " + " ".join(self.not_in_place)
        return text

    def to_json(self) -> dict[str, object]:
        """The reload's JSON answer (`POST /api/v1/reload`, `routerctl reload`)."""
        return {
            "changed": self.changed,
            "summary": self.summary(),
            "routers": {
                "added": list(self.routers_added),
                "removed": list(self.routers_removed),
                "changed": [change.to_json() for change in self.routers_changed],
            },
            "acceptors": {
                "added": list(self.acceptors_added),
                "removed": list(self.acceptors_removed),
                "changed": list(self.acceptors_changed),
            },
            "not_in_place": list(self.not_in_place),
        }


def _targets(config: Config, router: RouterConfig) -> dict[str, Target]:
    """The configured targets of a router's pool by node id (discovered ones are not configured)."""
    pool, _ = build_pool(config, router)
    return {} if pool is None else {t.node_id: t for t in pool.targets}


def _discovery(config: Config, router: RouterConfig) -> tuple[bool, ZooKeeperConfig | None]:
    """Whether the router's pool is fed by a discovery group, and that group's ZooKeeper."""
    group = config.pool_discovery_group(router)
    return group is not None, None if group is None else group.zookeeper


def _cache_io(router: RouterConfig) -> bool:
    """Whether the router's cache is written to a file or shared through ZooKeeper."""
    return router.cache_zookeeper is not None or (router.cache is not None and router.cache.persisted)


def _ttl_settings(config: Config, router: str) -> tuple[object, ...]:
    """What the router's connection-TTL checker runs with: its acceptors' TTLs and the interval."""
    acceptors = config.ttl_acceptors(router)
    return (acceptors, config.connection_ttl.check_interval_ms if acceptors else None)


def _what_changed(old_config: Config, old: RouterConfig, new_config: Config, new: RouterConfig) -> list[str]:
    what: list[str] = []
    for name, before, after in (
        ("key-type", old.key_type, new.key_type),
        ("key-filter", old.key_filter, new.key_filter),
        ("local-target-filter", old.local_target_filter, new.local_target_filter),
        ("local-target", build_pool(old_config, old)[1], build_pool(new_config, new)[1]),
        ("key-max-length", old.key_max_length, new.key_max_length),
        ("cache", (old.cache, old.cache_zookeeper), (new.cache, new.cache_zookeeper)),
        ("policy", old.policy, new.policy),
        ("pool", old.pool, new.pool),
        ("connection-ttl", _ttl_settings(old_config, old.name), _ttl_settings(new_config, new.name)),
    ):
        if before != after:
            what.append(name)
    return what


def _target_changes(
    old: Mapping[str, Target], new: Mapping[str, Target]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[Departed, ...]]:
    """(added, removed, changed node ids, departed connections), node ids in pool order."""
    added = tuple(n for n in new if n not in old)
    removed = tuple(n for n in old if n not in new)
    changed = tuple(n for n in new if n in old and new[n] != old[n])
    departed = [Departed(node_id=n) for n in removed]
    for node_id in changed:
        before, after = old[node_id].connector, new[node_id].connector
        kept = set() if after is None else {(m.host, m.port) for m in after.members}
        gone = () if before is None else tuple(Address(m.host, m.port) for m in before.members)
        gone = tuple(a for a in gone if a not in kept)
        if gone:
            departed.append(Departed(node_id=node_id, addresses=gone))
    return added, removed, changed, tuple(departed)


def _served(config: Config, key_types: Mapping[str, object]) -> dict[str, tuple[object, ...]]:
    """Acceptor name -> what serves its connections: its configuration, the TTL in force on it and
    its router's key type (which picks the data path and whether the opening is read)."""
    ttl = config.connection_ttl
    return {a.name: (a, ttl.ttl_ms(a), key_types.get(a.router)) for a in config.acceptors}


def diff_configs(old: Config, new: Config, *, held: Mapping[str, Config] | None = None) -> ConfigDiff:
    """What reloading `new` over `old` changes.

    Args:
        old: the configuration in force (the last one applied).
        new: the file read again (already validated by the loader).
        held: routers that run with an older configuration than `old` (a change of theirs needed a
            restart): name -> that configuration.

    Returns:
        The diff, with the configuration in force afterwards (`ConfigDiff.config`).
    """
    held = dict(held or {})
    notes: list[str] = []
    event_log = new.event_log
    if new.event_log != old.event_log:
        notes.append("the <event-log> settings (or --event-log) changed: the event log goes on as it was.")
        event_log = old.event_log

    old_routers = {r.name: (held.get(r.name, old), r) for r in old.routers}
    for name, config in held.items():
        if name in old_routers:
            old_routers[name] = (config, config.router(name))
    new_routers: dict[str, RouterConfig] = {}
    still_held: dict[str, Config] = {}
    changes: list[RouterChange] = []
    for router in new.routers:
        if router.name not in old_routers:
            new_routers[router.name] = router
            continue
        before_config, before = old_routers[router.name]
        if _discovery(before_config, before) != _discovery(new, router):
            notes.append(
                f"router {router.name}: its pool's discovery group (<zookeeper>, or discovered "
                "instead of configured targets) changed, so the router runs on as it was."
            )
            still_held[router.name] = before_config
            new_routers[router.name] = router
            continue
        if (_cache_io(before) or _cache_io(router)) and (before.cache, before.cache_zookeeper) != (
            router.cache,
            router.cache_zookeeper,
        ):
            notes.append(
                f"router {router.name}: its persisted or shared <cache> settings changed, so its "
                "cache stays as it was (the rest of the router changes)."
            )
            router = dataclasses.replace(router, cache=before.cache, cache_zookeeper=before.cache_zookeeper)
        new_routers[router.name] = router
        what = _what_changed(before_config, before, new, router)
        added, removed, changed, gone = _target_changes(
            _targets(before_config, before), _targets(new, router)
        )
        if added or removed or changed:
            what.append("targets")
        if what:
            changes.append(
                RouterChange(
                    name=router.name,
                    what=tuple(what),
                    targets_added=added,
                    targets_removed=removed,
                    targets_changed=changed,
                    departed=gone,
                )
            )
    routers_removed = tuple(name for name in old_routers if name not in new_routers)

    config = dataclasses.replace(
        new, event_log=event_log, routers=tuple(new_routers[r.name] for r in new.routers)
    )
    # The key type each acceptor's router runs with, before and after (a held router keeps its own).
    old_key_types = {name: router.key_type for name, (_, router) in old_routers.items()}
    new_key_types = {
        name: (still_held[name].router(name) if name in still_held else router).key_type
        for name, router in new_routers.items()
    }
    old_served, new_served = _served(old, old_key_types), _served(config, new_key_types)
    return ConfigDiff(
        config=config,
        held=still_held,
        routers_added=tuple(name for name in new_routers if name not in old_routers),
        routers_removed=routers_removed,
        routers_changed=tuple(changes),
        acceptors_added=tuple(n for n in new_served if n not in old_served),
        acceptors_removed=tuple(n for n in old_served if n not in new_served),
        acceptors_changed=tuple(n for n in new_served if n in old_served and new_served[n] != old_served[n]),
        not_in_place=tuple(notes),
    )
