"""Where a router's events go: its subscribers (log lines and metrics from the start, the event
log and tests when they subscribe), called in the reporting thread."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.core.events import Event, Subscriber
    from router.reports import MetricUpdates

__all__ = ["Reports"]


class Reports:
    """Where a router's events go: call it with an event and every subscriber gets it (in the
    reporting thread); `subscribe` adds one (the event log, tests)."""

    __slots__ = ("_subscribers", "subscribed", "updates")

    def __init__(self, *subscribers: Subscriber, updates: MetricUpdates | None = None) -> None:
        """Args:
        subscribers: the first subscribers (the log lines).
        updates: the metrics, a subscriber too: the data paths update them without making an
            event that only they would read (an `Accepted`, a proxied `Decided`) while no other
            subscriber was added (`subscribed`).
        """
        first: tuple[Subscriber, ...] = subscribers
        if updates is not None:
            first = (*first, updates)
        self._subscribers = first
        self.updates = updates
        self.subscribed = False
        """Whether a subscriber besides the first ones was added (the event log, a test): every
        event must then be made (the native core's lean connections make none of theirs)."""

    def __call__(self, event: Event) -> None:
        """Hand an event to every subscriber (log lines, metrics, ...)."""
        for subscriber in self._subscribers:
            subscriber(event)

    def subscribe(self, subscriber: Subscriber) -> None:
        """Have `subscriber` receive every event from now on."""
        self._subscribers = (*self._subscribers, subscriber)
        self.subscribed = True
