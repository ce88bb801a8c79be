"""ZooKeeper discovery: a pool's members are the brokers registered in a discovery group.

    service.py   `serve_discovery`, each router's members read from ZooKeeper (`Discovery`, the
                 feature's service), and `serve_registration`, one broker's registration
    commands.py  `routerctl register`

The ZooKeeper client and its session's state are the kernel's (router/services/zookeeper.py,
which the shared cache uses too); the session's table is router/core/discovery_session.py.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.discovery.commands import COMMANDS
from router.features.discovery.service import start

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="discovery", in_workers=False, commands=COMMANDS, start=start)
