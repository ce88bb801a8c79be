"""Worker processes: state that must be one for all of them.

    _zone.c   the shared zone: one shared memory region with the sticky cache (exact LRU,
              expire-after-access, pins), the ROUND_ROBIN positions and the node ids
    zone.py   the zone seen from Python: `ZoneCache` (a `TargetCache` in the zone) and `join_zone`,
              which makes a router's engine decide with the zone's cache and position

This is the first part of `routerd --workers N` (issue 35): the processes themselves, each with its
own `SO_REUSEPORT` listeners and the C core, and a supervisor keeping the admin API, probes and the
event-log writer, come next; until then the folder brings no service and no `FEATURE`.
docs/operations.md ("Worker processes") says what is built and what is not.
"""
