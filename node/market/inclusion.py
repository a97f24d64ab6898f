"""The submitter's side of inclusion proofs: ask executors for the proofs it lacks, and keep the ones
that check out.

An executor places the receipts this node acknowledged in its receipt log and proves them against a
signed tree head, a batch at a time. Each link-up asks it for a page of the proofs still missing (the
next older page each time, then from the newest again, so proofs an executor can never give do not keep
it from being asked for the others). A proof whose entry for a receipt of ours fails is refused whole.
"""

from __future__ import annotations

import logging

from e31.protocol.envelope import VerifiedEnvelope, sign_message, verify
from e31.protocol.errors import Mismatch, ProtocolError
from e31.protocol.ids import Digest, NodeId
from e31.protocol.merkle import verify_entry_inclusion
from e31.protocol.messages import InclusionProof, ProofRequest, TreeHead

from ..store.db import Store, call
from ..store.rows import ReceiptRow
from .context import MarketContext

log = logging.getLogger("e31.submitter")

HEADS_KEPT = 64
"""Verified signed tree heads kept (executors' latest heads)."""
PROOFS_ASKED = 100
"""Missing inclusion proofs asked of an executor each time its link comes up (a page, newest first)."""
PROOF_PAGES_KEPT = 1024
"""Executors whose next page of missing proofs is remembered (the others start again from the newest)."""
PROOF_REQUEST_TTL_MS = 60_000
"""How long such a `proofreq` stays valid."""


class InclusionProofs:
    def __init__(self, ctx: MarketContext) -> None:
        self.ctx = ctx
        self._proofs_asked: dict[bytes, tuple[float, bytes]] = {}
        """Per executor, where the last page of missing proofs asked of it ended (`ask`)."""
        self._heads: dict[bytes, VerifiedEnvelope[TreeHead]] = {}
        """Signed tree heads already verified, by their bytes (HEADS_KEPT, least recently used dropped
        first): an executor proves a batch of receipts against one head."""

    async def ask(self, peer: bytes) -> None:
        """Ask `peer` for the inclusion proofs of its receipts that this node acknowledged but holds no
        proof of."""
        # A page at a time, each link-up the next older one (then from the newest again), so proofs an
        # executor can never give do not keep it from being asked for the others.
        before = self._proofs_asked.pop(peer, None)
        rows = await self.ctx.store.run(Store.acked_without_proof, str(NodeId(peer)), PROOFS_ASKED, before)
        if not rows and before is not None:  # the last page was the oldest, and full: the newest again
            rows = await self.ctx.store.run(Store.acked_without_proof, str(NodeId(peer)), PROOFS_ASKED)
        if len(rows) == PROOFS_ASKED:
            self._proofs_asked[peer] = (rows[-1].delivered or 0.0, rows[-1].digest)
            if len(self._proofs_asked) > PROOF_PAGES_KEPT:
                del self._proofs_asked[next(iter(self._proofs_asked))]
        expires = self.ctx.clock() + PROOF_REQUEST_TTL_MS
        for row in rows:
            ask = ProofRequest(self.ctx.network, self.ctx.node, NodeId(peer), Digest(row.message_id), expires)
            if not await self.ctx.send_to(peer, sign_message(ask, self.ctx.identity)):
                return

    async def take(self, env: VerifiedEnvelope[InclusionProof]) -> None:
        """Keep an executor's proof that receipts of ours are in its log: each entry that checks out
        marks its receipt proven; the proof is kept once, linked to the jobs of those receipts."""
        proof = env.message
        try:
            head = self._heads.pop(proof.treehead, None)
            if head is not None:
                self._heads[proof.treehead] = head  # most recently used last
            else:
                head = verify(proof.treehead, TreeHead)
                self._heads[proof.treehead] = head
                if len(self._heads) > HEADS_KEPT:
                    del self._heads[next(iter(self._heads))]
            if head.signer != proof.executor or head.message.size != proof.tree_size:
                raise Mismatch("the proof's tree head is not the executor's head of that size")
            if head.message.network != self.ctx.network:
                raise Mismatch("the proof's tree head is for another network")
        except ProtocolError as e:
            log.warning("refusing an inclusion proof from %s: %s", proof.executor, e)
            return
        ids = [e.receipt_id.raw for e in proof.entries]
        rows = await self.ctx.store.run(Store.receipts_with_envelopes, ids)
        executor = str(proof.executor)
        proven: list[tuple[ReceiptRow, int]] = []
        for row, raw in rows:
            if row.executor != executor or row.delivered is None:
                continue  # not a receipt of ours from that executor: nothing to check or keep
            entry = proof.entry(Digest(row.digest))
            assert entry is not None  # the rows were asked for by the entries' receipt ids
            try:
                verify_entry_inclusion(
                    raw, entry.leaf_index, proof.tree_size, [h.raw for h in entry.path], head.message.root.raw
                )
            except ProtocolError as e:
                # Refused whole: kept, it would carry a failing entry into every bundle of ours that
                # holds that receipt. Its receipts stay unproven and are asked for again (proofreq).
                log.warning(
                    "refusing an inclusion proof from %s: receipt %s: %s",
                    proof.executor,
                    row.digest.hex()[:12],
                    e,
                )
                return
            proven.append((row, entry.leaf_index))
        if not proven:
            return
        await self.ctx.store.atomically(  # the rows' log indexes mark the receipts as proven here
            call(
                Store.put_shared_envelope,
                env.message_id.raw,
                "proof",
                env.raw,
                self.ctx.now_s(),
                sorted({row.job_id for row, _ in proven}),
            ),
            *(call(Store.set_receipt_log_index, row.digest, index, durable=False) for row, index in proven),
            durable=False,  # lost to a power cut, the proof is asked for again (`proofreq`)
        )
