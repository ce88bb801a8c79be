"""One connection router at run time: the kernel the data paths and the services share.

    kernel.py       `RouterRuntime`: accept, decide (waiting when it must), connect-failure
                    plans, lookups, status, reload
    reports.py      `Reports`: where its events go (its subscribers)
    state.py        `RouterState`: what the router's lock guards (config, engine, pool, live
                    connections, history), entered through `RouterRuntime.held()`
    pool.py         `RouterPool`: the pool's changes (probes, discovery, operators, passive
                    health), what they close and wake, its queries and waits
    connections.py  `RouterConnections`: the data paths' registry of proxied connections, and
                    closing them

The features' own slices of a router at run time (the cache's entries, a rebalance's counts, the
TTL checker's sweep, ...) live in their folders (router/features/*/), written against `held()`.
"""

from router.runtime.connections import RouterConnections
from router.runtime.kernel import RouterRuntime, decide
from router.runtime.pool import RouterPool
from router.runtime.reports import Reports
from router.runtime.state import RouterState, SharedResolver

__all__ = [
    "Reports",
    "RouterConnections",
    "RouterPool",
    "RouterRuntime",
    "RouterState",
    "SharedResolver",
    "decide",
]
