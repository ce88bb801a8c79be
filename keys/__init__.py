"""Routing keys: which property of a connection selects its broker.

This package also holds the sans-IO protocol sniffers (MQTT, AMQP 1.0, STOMP, OpenWire, CORE) that
read client ids and user names from handshakes. It imports nothing from `router`, `pools`,
`policies` or `cache`, and never does I/O.
"""

from keys.resolve import (
    INTERNAL_CLIENT_ID_PREFIX as INTERNAL_CLIENT_ID_PREFIX,
)
from keys.resolve import (
    NULL_KEY as NULL_KEY,
)
from keys.resolve import (
    ConnectionFacts as ConnectionFacts,
)
from keys.resolve import (
    KeyType as KeyType,
)
from keys.resolve import (
    is_internal_client_id as is_internal_client_id,
)
from keys.resolve import (
    resolve_key as resolve_key,
)
from keys.sniff import NEED_MORE as NEED_MORE
from keys.sniff import NeedMore as NeedMore
from keys.sniff import Reply as Reply
from keys.sniff import Sniffed as Sniffed
from keys.sniff import Sniffer as Sniffer
from keys.sniff import SniffError as SniffError
from keys.sniff import SniffResult as SniffResult
from keys.sniff import WireProtocol as WireProtocol
