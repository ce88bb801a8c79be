"""Connection TTL: proxied connections whose client has been silent too long are closed.

    service.py   the checker of each router with an acceptor under a TTL

Which TTL a connection has is the kernel's (router/core/ttl.py, used by both data paths);
docs/configuration.md ("connection-ttl") describes the options.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.ttl.service import start

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="ttl", start=start)
