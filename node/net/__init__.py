"""Links between nodes: the transport (authenticated, encrypted connections), the peer table and its
decisions, the peering service that keeps links to a target degree (dialer, this node's contact record,
peer exchange, persistence of the table), mDNS discovery, and gossip.

Its public names are imported lazily from their modules (node/__init__.py, `lazy_exports`).
"""

from typing import TYPE_CHECKING

from .. import lazy_exports

if TYPE_CHECKING:
    from .addresses import join_address, split_address
    from .discovery import DiscoveryError, run_discovery
    from .gossip import GossipService
    from .peering import LinkListener, PeerService
    from .peers import PeerSettings, PeerTable
    from .transport import Connection, DialFailed, ListenFailed, TransportError, dial, serve

__all__ = [
    "Connection",
    "DialFailed",
    "DiscoveryError",
    "GossipService",
    "LinkListener",
    "ListenFailed",
    "PeerService",
    "PeerSettings",
    "PeerTable",
    "TransportError",
    "dial",
    "join_address",
    "run_discovery",
    "serve",
    "split_address",
]
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Connection": "transport",
        "DialFailed": "transport",
        "DiscoveryError": "discovery",
        "GossipService": "gossip",
        "LinkListener": "peering",
        "ListenFailed": "transport",
        "PeerService": "peering",
        "PeerSettings": "peers",
        "PeerTable": "peers",
        "TransportError": "transport",
        "dial": "transport",
        "join_address": "addresses",
        "run_discovery": "discovery",
        "serve": "transport",
        "split_address": "addresses",
    },
)
