"""ZooKeeper discovery as operators use it: registering a broker in a discovery group.

    commands.py  `routerctl register`

A pool's discovery in routerd (router/services/discovery.py) moves here next.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.discovery.commands import COMMANDS

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="discovery", commands=COMMANDS)
