"""This node's own contact record: the addresses it accepts connections on, signed and kept fresh.

A node listening on a named host advertises that host and its bound port. A node listening on a
wildcard (0.0.0.0, ::) cannot learn its addresses from the socket, so it advertises the local ends of
its links as its peers reached them: most recent first, loopback last, at most MAX_ADDRESSES. The
record is signed again when those addresses change and once half its life (`contact_ttl`) has passed;
`run()` looks every quarter of that life. Until the listener is bound there is no record.
"""

from __future__ import annotations

from collections.abc import Callable

import nacl.signing
import trio
from e31.protocol.envelope import sign_message
from e31.protocol.ids import NodeId
from e31.protocol.messages import MAX_ADDRESSES, Contact

from .addresses import is_loopback, is_wildcard, join_address


class OwnContact:
    def __init__(
        self,
        *,
        identity: nacl.signing.SigningKey,
        network: str,
        listen_host: str,
        ttl: float,
        wall: Callable[[], float],
    ) -> None:
        """`listen_host` is the configured one (maybe a wildcard); `ttl` the record's life in seconds."""
        self._identity = identity
        self._node = NodeId(bytes(identity.verify_key))
        self._network = network
        self.wildcard = is_wildcard(listen_host)
        self._ttl = ttl
        self._wall = wall
        self._listen: str | None = None
        self._port = 0
        self._observed: list[str] = []
        self._record: bytes | None = None
        self._addresses: tuple[str, ...] = ()
        self._expires = 0
        self.hidden = False
        """The node learned nobody can dial it (node/net/relay.py): it advertises no address."""

    @property
    def listen(self) -> str | None:
        """The bound listen address (port 0 resolved), once `bind` has been called."""
        return self._listen

    @property
    def record(self) -> bytes | None:
        """The signed contact envelope, exactly as sent; None while there is nothing to advertise."""
        return self._record

    def bind(self, host: str, port: int) -> str:
        """The listener is bound at host:port: advertise it. Returns the listen address."""
        self._listen, self._port = join_address(host, port), port
        self.refresh()
        return self._listen

    def observe(self, host: str) -> None:
        """A link's local end is at `host`: for a wildcard listener, one of the addresses to advertise."""
        if not self.wildcard:
            return
        if host in self._observed:
            self._observed.remove(host)
        self._observed.insert(0, host)
        del self._observed[MAX_ADDRESSES:]
        self.refresh()

    def hide(self, hidden: bool) -> None:
        """Stop (True) or start again (False) advertising addresses: a node nobody can dial is
        reached through its relays instead, and an address nobody can dial only costs peers dials."""
        if hidden != self.hidden:
            self.hidden = hidden
            self._addresses, self._record = (), None
            self.refresh()

    def addresses(self) -> tuple[str, ...]:
        if self._listen is None or self.hidden:
            return ()
        if not self.wildcard:
            return (self._listen,)
        hosts = sorted(self._observed, key=is_loopback)  # stable: most recent first within each
        return tuple(join_address(h, self._port) for h in hosts[:MAX_ADDRESSES])

    def refresh(self) -> None:
        """Sign the record again if its addresses changed or half its life has passed."""
        addresses = self.addresses()
        if not addresses:
            return
        now_ms = int(self._wall() * 1000)
        ttl_ms = int(self._ttl * 1000)
        if addresses == self._addresses and self._expires - now_ms > ttl_ms // 2:
            return
        contact = Contact(self._network, self._node, addresses, now_ms + ttl_ms)
        self._record = sign_message(contact, self._identity)
        self._addresses, self._expires = addresses, contact.expires

    async def run(self) -> None:
        while True:
            await trio.sleep(self._ttl / 4)
            self.refresh()
