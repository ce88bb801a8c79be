"""A router's sticky cache shared through ZooKeeper (`<cache><zookeeper connect=… path=…/></cache>`).

    znodes.py    pure: a key's znode, an entry's data, when to extend one
    service.py   one router's side of the shared cache (`SharedCache`: misses, claims, watches,
                 extensions, sweeps, reconciling) and the feature's service (`SharedCaches`)
    metrics.py   `router_cache_shared_*`

The cache itself (cache/) and its use in routing (router/core/engine.py) are the kernel's; so
is the ZooKeeper client (router/services/zookeeper.py), which discovery uses too.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.shared_cache.metrics import SharedCacheMetrics
from router.features.shared_cache.service import start

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="shared_cache", in_workers=False, metrics=SharedCacheMetrics, start=start)
