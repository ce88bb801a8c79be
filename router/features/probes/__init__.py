"""Active health: each target is probed in its broker's protocol, and the pool follows.

    checks.py        one probe per broker protocol (TCP, MQTT, STOMP, AMQP 1.0, OpenWire, CORE):
                     does this broker accept a real session now?
    core_session.py  the CORE probe's bytes: what it sends, how it reads the answers (pure)
    counts.py        broker-reported connection counts read over HTTP (`connectionCount=`): each
                     source's request and the parse of its answer (pure)
    service.py       the health-check loop of each router (`serve_health_checks`), feeding
                     `Pool.record_check` (pools/pool.py, where readiness is decided), and the
                     count reads beside it
    status.py        a target's broker count as operators see it: its `broker_count` member of
                     the target's status document and its table in `routerctl status ROUTER`

docs/configuration.md ("check-period", the connector's `probe=`) describes the options.
"""

from __future__ import annotations

from typing import Final

from router.feature import Feature
from router.features.probes.service import start
from router.features.probes.status import broker_count_blocks

__all__ = ["FEATURE"]

FEATURE: Final = Feature(name="probes", in_workers=False, start=start, router_blocks=broker_count_blocks)
