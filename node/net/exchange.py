"""Peer exchange: the `peers` messages this node sends over its links, and what it keeps of theirs.

On a new link and then every `exchange_interval` (jittered by +-20%), each side sends a `peers`
message: its own signed contact record first, then those of other known peers, at most
`exchange_size` in all. Every record that arrives is verified (signature, network, expiry no further
than `max_contact_ttl` ahead) and then kept in the PeerTable as the exact bytes its node signed, so it
is passed on unchanged. How often one peer may make this node verify a batch is the link's business
(a TokenBucket per link, in peering).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nacl.signing
import trio
from e31.protocol.envelope import check_fresh, sign_message, verify
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import NodeId
from e31.protocol.messages import MAX_CONTACTS, Contact, Peers

from .links import Random
from .peers import MIN_LINK_TTL, PeerSettings, PeerTable
from .transport import ConnectionClosed

log = logging.getLogger("e31.peers")


@dataclass(frozen=True, slots=True)
class Learned:
    """What one `peers` message taught: peers whose stored row is now out of date, and how many are new."""

    changed: tuple[bytes, ...]
    new: int


class PeerExchange:
    def __init__(
        self,
        *,
        identity: nacl.signing.SigningKey,
        network: str,
        table: PeerTable,
        settings: PeerSettings,
        own_contact: Callable[[], bytes | None],
        wall: Callable[[], float],
        rng: Random,
    ) -> None:
        self._identity = identity
        self._local = bytes(identity.verify_key)
        self._network = network
        self._table = table
        self._settings = settings
        self._own_contact = own_contact
        self._wall = wall
        self._rng = rng

    async def run(self, peer: bytes, send: Callable[[bytes], Awaitable[None]]) -> None:
        """Send `peer` a `peers` message now and then every interval, until the link closes."""
        interval = self._settings.exchange_interval
        while True:
            message = self.message_for(peer)
            if message is not None:
                try:
                    await send(message)
                except ConnectionClosed:
                    return
            await trio.sleep(interval * (0.8 + 0.4 * self._rng.random()))

    def message_for(self, recipient: bytes) -> bytes | None:
        """A signed `peers` message for `recipient`; None when there is nothing to share."""
        now_ms = int(self._wall() * 1000)
        own = self._own_contact()
        contacts = [] if own is None else [own]
        limit = min(self._settings.exchange_size, MAX_CONTACTS) - len(contacts)
        contacts += self._table.contacts_to_share(self._rng, now_ms, recipient, limit)
        if not contacts:
            return None
        expires = now_ms + int(max(MIN_LINK_TTL, 2 * self._settings.exchange_interval) * 1000)
        return sign_message(
            Peers(self._network, NodeId(self._local), tuple(contacts), expires), self._identity
        )

    def receive(self, sender: bytes, inbound: bool, message: Peers) -> Learned:
        """Keep the valid records of a `peers` message from `sender` (over an inbound link or not)."""
        now_ms = int(self._wall() * 1000)
        max_ttl = int(self._settings.max_contact_ttl * 1000)
        table = self._table
        changed: list[bytes] = []
        new = 0
        for record in message.contacts:
            try:
                env = verify(record, Contact)
                check_fresh(env, now_ms, network=self._network, max_ttl=max_ttl)
            except ProtocolError as e:
                log.debug("ignoring a contact record from %s: %s", NodeId(sender), e)
                continue
            contact: Contact = env.message
            key = contact.node.raw
            if key == self._local:
                continue
            known = key in table.peers
            previous = table.peers[key].contact_expires if known else 0
            source = "inbound" if key == sender and inbound else "exchange"
            peer = table.learn(
                key, contact.addresses, source, contact=record, contact_expires=contact.expires
            )
            if peer is None:
                continue
            if not known or (key == sender and contact.expires > previous):
                changed.append(key)
            if not known:
                new += 1
        if new:
            log.debug("learned %d peer(s) from %s", new, NodeId(sender))
        return Learned(tuple(changed), new)
