"""The event log's admin API resource (docs/admin-api.yaml):

GET  /api/v1/event-log   the event log: router id, ring size and use, counts
PUT  /api/v1/event-log   JSON {"ring_size": N}: resize the ring (takes effect as it drains;
                         nothing in it is lost)
"""

from __future__ import annotations

from typing import Final

from router.feature import Call, HttpError, Response, Route, json_object, json_response
from router.features.event_log.service import EventLogService

__all__ = ["ROUTES"]


def _event_log(call: Call) -> Response:
    """GET: the event log's status; PUT `{"ring_size": N}`: resize its ring."""
    service = call.optional(EventLogService)
    event_log = None if service is None else service.event_log
    if event_log is None:
        raise HttpError(404, "the event log is off (<event-log> or routerd --event-log DIR turns it on)")
    if call.method == "GET":
        return json_response(200, event_log.status())
    document = json_object(call.body)
    size = document.get("ring_size")
    if set(document) != {"ring_size"} or not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise HttpError(400, f'body must be {{"ring_size": N}} with an integer N >= 1, got {document!r}')
    event_log.resize(size)
    return json_response(200, event_log.status())


ROUTES: Final = tuple(
    Route(method=method, template="/api/v1/event-log", handler=_event_log) for method in ("GET", "PUT")
)
"""The feature's admin API routes."""
