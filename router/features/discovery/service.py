"""ZooKeeper discovery: a pool's members are the ephemeral znodes under a discovery group's path.

Two sides, both trio tasks around a kazoo client (router/services/zookeeper.py):

- `serve_discovery` (routerd) reads the children of the group's path and their data, with watches,
  and feeds each complete reading into `pools.Membership`; the diff becomes
  `RouterPool.add_target` / `remove_target`, and the probes start or stop their loops. Readiness
  stays with the probes: a member is routed to once its probe succeeds. `Discovery`, the
  feature's service, runs it for each router whose pool has a ZooKeeper discovery group.
- `serve_registration` (`routerctl register`) creates one member's ephemeral znode, keeps it while
  it runs (creating it again after a session expiry), and deletes it on shutdown.

When to read, and what to log about the session and the readings, is decided by the pure table in
`router/core/discovery_session.py`; `serve_discovery` only waits, reads, applies the membership
diff and logs the notes. Any watch firing, and every (re)connection, makes it read everything
again, which also covers events missed while disconnected. While ZooKeeper is unreachable the pool
keeps its last membership and the probes go on; each session transition is logged once.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, assert_never

import trio

from pools import Membership, znode_name
from router.core.discovery_session import (
    CannotRead,
    DiscoveryState,
    Note,
    Read,
    ReadFailed,
    Session,
    Signal,
    Step,
)
from router.feature import Service
from router.services.zookeeper import (
    CLOSE_TIMEOUT_S,
    DiscoveryClient,
    Inbox,
    NodeExistsError,
    SessionWatch,
    ZooKeeper,
    ZooKeeperError,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pools import Member, MembershipDiff
    from router.config.settings import Config, ZooKeeperConfig
    from router.feature import Kernel
    from router.runtime import RouterRuntime

__all__ = ["Discovery", "RegistrationError", "serve_discovery", "serve_registration", "start"]

log = logging.getLogger("router.discovery")


class RegistrationError(Exception):
    """`routerctl register` cannot register, or lost its registration; the message is for people."""


_Item = Session | Signal
"""What kazoo's threads hand to the trio task (a session change, or `Signal.WATCH_FIRED`)."""


async def _close(client: DiscoveryClient) -> None:
    # Shielded: a router that is being cancelled must still end its session (and kazoo's threads),
    # but only for a bounded time.
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
        await client.aclose()


def _apply(runtime: RouterRuntime, diff: MembershipDiff, where: str) -> None:
    """Feed one membership diff into the router: removals first, so a node id can move."""
    for rejected in diff.rejected:
        log.warning(
            "router=%s %s/%s: ignoring this member: %s", runtime.name, where, rejected.znode, rejected.reason
        )
    for member in diff.removed:
        runtime.pool.remove_target(member.node_id)
    for old, new in diff.updated:
        log.info(
            "router=%s target=%s re-registered: %s -> %s",
            runtime.name,
            new.node_id,
            old.describe(),
            new.describe(),
        )
        runtime.pool.remove_target(old.node_id)
    for member in (*(new for _, new in diff.updated), *diff.added):
        runtime.pool.add_target(member.target())


async def serve_discovery(
    runtime: RouterRuntime,
    zookeeper: ZooKeeperConfig,
    *,
    client: DiscoveryClient | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep a router's pool equal to the members registered under a ZooKeeper path, until cancelled.

    Args:
        runtime: the router whose pool is fed (a discovery or cluster pool).
        zookeeper: the discovery group's ensemble, path and session timeout.
        client: the (not yet started) client to use; by default a `ZooKeeper` for `zookeeper`.
        task_status: started once the client is connecting (the router does not wait for
            ZooKeeper: the pool fills when it answers).
    """
    assert runtime.config.pool is not None, "only a router with a pool discovers targets"
    membership = Membership(
        reserved={
            t.node_id: "the local target" if t.local else "a configured target"
            for t in runtime.pool.targets()
        }
    )
    inbox = Inbox[_Item]()
    client = ZooKeeper(zookeeper.connect, zookeeper.session_timeout_ms) if client is None else client
    # The table hears of the session from the watch: kazoo's reports, and a frozen server.
    watch = SessionWatch(runtime, "discovery", zookeeper, client, inbox.post, inbox.post)
    where = watch.where
    client.on_session(watch.post)
    client.on_change(lambda: watch.post_watch(Signal.WATCH_FIRED))
    try:
        async with trio.open_nursery() as nursery:
            client.start()
            nursery.start_soon(watch.serve)
            log.info("router=%s discovering members at %s", runtime.name, where)
            task_status.started()
            # ZooKeeper gets one session timeout to answer at start (the router serves meanwhile,
            # without members); the table says once whether it did not.
            no_answer_at = trio.current_time() + zookeeper.session_timeout_ms / 1000
            state = DiscoveryState()
            while True:
                batch: list[_Item] = [Signal.NO_ANSWER]  # unless something comes before the deadline
                with trio.move_on_at(no_answer_at if state.awaiting_answer else math.inf):
                    batch = await inbox.next_batch()
                for item in batch:
                    state = _log_step(runtime, state.handle(item), membership, where)
                if not state.reading_due:
                    continue
                try:
                    documents = await client.read_members(zookeeper.path)
                except ZooKeeperError as exc:
                    state = _log_step(runtime, state.handle(ReadFailed(message=str(exc))), membership, where)
                    continue
                outcome = Read.PATH_MISSING if documents is None else Read.MEMBERS
                state = _log_step(runtime, state.handle(outcome), membership, where)
                _apply(runtime, membership.update(documents or {}), where)
    finally:
        await _close(client)


def _log_step(runtime: RouterRuntime, step: Step, membership: Membership, where: str) -> DiscoveryState:
    """Log the step's note, if any (the words operators and docs/operations.md know); return its state."""
    note = step.note
    match note:
        case None:
            pass
        case Note.CONNECTED:
            log.info("router=%s connected to %s: reading the members", runtime.name, where)
        case Note.CONNECTED_AGAIN:
            log.info("router=%s connected to %s: reading the members again", runtime.name, where)
        case Note.CONNECTION_LOST:
            log.warning(
                "router=%s lost the connection to %s: keeping the last %d member(s) and "
                "probing them until it is back",
                runtime.name,
                where,
                len(membership.members),
            )
        case Note.SESSION_LOST:
            log.warning(
                "router=%s session with %s expired or closed: keeping the last %d member(s) "
                "until a new session reads them again",
                runtime.name,
                where,
                len(membership.members),
            )
        case Note.NO_ANSWER:
            log.warning(
                "router=%s %s does not answer: no discovered targets until it does", runtime.name, where
            )
        case Note.PATH_MISSING:
            log.warning("router=%s %s does not exist: no members until it is created", runtime.name, where)
        case CannotRead(message=message):
            # The next session change or watch event triggers another reading.
            log.warning("router=%s cannot read the members at %s: %s", runtime.name, where, message)
        case _:
            assert_never(note)
    return step.state


async def serve_registration(
    zookeeper: ZooKeeperConfig,
    member: Member,
    *,
    connect_timeout_s: float,
    client: ZooKeeper | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Register `member` under the path until cancelled, then deregister (delete the znode).

    After a session expiry (ZooKeeper was unreachable for longer than the session timeout) the
    ephemeral znode is gone; it is created again as soon as a new session is connected.

    Args:
        zookeeper: the ensemble, the path and the session timeout.
        member: what to register; the znode is named after its node id (`pools.znode_name`).
        connect_timeout_s: how long to wait for ZooKeeper at start, and for each creation.
        client: the (not yet started) client to use; by default one for `zookeeper`.
        task_status: started with the znode's path once it exists.

    Raises:
        RegistrationError: ZooKeeper does not answer in time at start, the node id is registered
            already, or the znode was taken by another registration after a session expiry.
    """
    client = ZooKeeper(zookeeper.connect, zookeeper.session_timeout_ms) if client is None else client
    registration = _Registration(client, zookeeper, member, connect_timeout_s)
    inbox = Inbox[_Item]()
    client.on_session(inbox.post)
    try:
        client.start()
        with trio.move_on_after(connect_timeout_s):
            while Session.CONNECTED not in await inbox.next_batch():
                pass
            registration.connected = True
        if not registration.connected:
            raise RegistrationError(f"cannot reach {registration.where} within {connect_timeout_s:g} s")
        await registration.register()
        task_status.started(registration.znode)
        while True:
            for item in await inbox.next_batch():
                if isinstance(item, Session):
                    await registration.follow(item)
    finally:
        # Shielded: deregister even when cancelled (that is how we are stopped).
        with trio.CancelScope(shield=True):
            await registration.deregister()
            await _close(client)


class _Registration:
    """One member's znode and what is known of it: whether the session is connected and whether
    the znode exists. `follow` says what a session change means for it."""

    def __init__(
        self, client: ZooKeeper, zookeeper: ZooKeeperConfig, member: Member, timeout_s: float
    ) -> None:
        self.client = client
        self.member = member
        self.znode = f"{zookeeper.path}/{znode_name(member.node_id)}"
        self.where = f"zookeeper {zookeeper.connect}"
        self.timeout_s = timeout_s
        self.connected = False
        self.registered = False
        """Whether our znode exists (as far as we know)."""

    async def register(self, *, again: bool = False) -> None:
        """Create the znode (raises RegistrationError, see `serve_registration`)."""
        await _create(self.client, self.znode, self.member, self.where, self.timeout_s)
        self.registered = True
        if again:
            log.info("registered node id %r as %s again", self.member.node_id, self.znode)
        else:
            log.info(
                "registered node id %r as %s at %s: %s",
                self.member.node_id,
                self.znode,
                self.where,
                self.member.describe(),
            )

    async def follow(self, session: Session) -> None:
        """A session change: the znode outlives a lost connection, not a lost session; a new
        session creates it again."""
        match session:
            case Session.SUSPENDED:
                self.connected = False
                log.warning(
                    "lost the connection to %s: %s stays registered while the session lives",
                    self.where,
                    self.znode,
                )
            case Session.LOST:
                self.connected = self.registered = False
                log.warning(
                    "session with %s expired: %s is gone; registering again when connected",
                    self.where,
                    self.znode,
                )
            case Session.CONNECTED:
                self.connected = True
                log.info("connected to %s again", self.where)
                if not self.registered:
                    await self.register(again=True)
            case _:
                assert_never(session)

    async def deregister(self) -> None:
        """Delete our znode, bounded: never hang on an unreachable ZooKeeper (closing the session
        removes the znode too, and failing that it goes when the session expires)."""
        if not (self.registered and self.connected):
            return
        with trio.move_on_after(CLOSE_TIMEOUT_S):
            try:
                if await trio.to_thread.run_sync(self.client.delete_own, self.znode, abandon_on_cancel=True):
                    log.info("deregistered node id %r (%s deleted)", self.member.node_id, self.znode)
            except ZooKeeperError as exc:
                log.warning("could not delete %s (%s): it goes when the session ends", self.znode, exc)


async def _create(client: ZooKeeper, znode: str, member: Member, where: str, timeout_s: float) -> None:
    try:
        with trio.fail_after(timeout_s):
            await trio.to_thread.run_sync(
                client.create_ephemeral, znode, member.to_document(), abandon_on_cancel=True
            )
    except NodeExistsError:
        raise RegistrationError(
            f"node id {member.node_id!r} is registered already: {znode} exists at {where} (another "
            "routerctl register, or a session that has not expired yet)"
        ) from None
    except ZooKeeperError as exc:
        raise RegistrationError(f"cannot create {znode} at {where}: {exc}") from None
    except trio.TooSlowError:
        raise RegistrationError(
            f"cannot create {znode}: {where} did not answer within {timeout_s:g} s"
        ) from None


class Discovery(Service):
    """The feature's service: each router whose pool has a ZooKeeper discovery group keeps its
    members equal to the group's (a task that runs until the router goes: a reload that changes
    the router keeps the members it found)."""

    def __init__(self, config: Callable[[], Config]) -> None:
        self._config = config

    async def serve_router_data(
        self, runtime: RouterRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        group = self._config().pool_discovery_group(runtime.config)
        if group is None or group.zookeeper is None:
            task_status.started()
            return
        await serve_discovery(runtime, group.zookeeper, task_status=task_status)


def start(kernel: Kernel) -> Discovery:
    """The feature's service for one routerd."""
    return Discovery(kernel.config)
