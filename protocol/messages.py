"""The signed message kinds of e31: one frozen dataclass per kind, a registry, and a closed union.

Each class's fields, in declaration order, are the msgpack array that forms an envelope's body.
The first field of every message is the network name; `issuer` (see Message) is the key that
must sign it; messages that live on the network for a while name their expiry. docs/protocol.md
lists every kind with its fields and types.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

from .blobs import CHUNK_SIZE, MAX_CHUNKS, PUSH_MAX
from .codec import MAX_FRAME
from .errors import InvalidMessage
from .ids import DIGEST_SIZE, Digest, NodeId
from .jobs import NONCE_SIZE, JobManifest
from .receipts import MAX_ACKED, Ack, UsageReceipt
from .relay import (
    Circuit,
    Dialback,
    Dialed,
    Observed,
    RelayClose,
    RelayCredit,
    RelayData,
    Reserve,
    Reserved,
    Via,
)
from .schema import (
    BY_RAW,
    NETWORK,
    REGISTRY,
    TIME,
    U16,
    U32,
    Bin,
    Hash,
    Key,
    Message,
    OneOf,
    Opt,
    Record,
    Seq,
    Sub,
    Text,
    UInt,
    find_sorted,
    message,
    record,
    w,
)

MAX_ADDRESSES = 8
ADDRESS_MAX = 261
MAX_CONTACTS = 32
CONTACT_MAX = 4096
MAX_PROFILES = 16
REASON_TEXT_MAX = 256
DECLINE_REASONS = ("busy", "no_profile", "limits", "deadline", "expired", "policy", "other")
CANCEL_REASONS = ("withdrawn", "done", "deadline", "other")
RELEASE_REASONS = ("unknown", "failed", "deadline", "lease", "other", "withdrawn")
MAX_PROOF_HASHES = 64
MAX_PROOF_ENTRIES = 256
"""Receipts placed by one `proof` (a path of 64 hashes each at most: about 560 KiB, inside a frame)."""
TREEHEAD_MAX = 512
MAX_SET = 64
"""Jobs in one offer, and items in one bid or decline."""
MAX_HELD = 256
"""Blobs one bid may say its executor holds already (`Bid.held`)."""
MAX_PUSHED = 16
"""Small outputs carried in one `result`."""
RECEIPT_MAX = MAX_FRAME - 4096
"""The largest receipt envelope a `result` carries (the rest of the frame holds the result's own
fields; an executor adds small outputs only while the whole still fits in a frame)."""


_IPV6_CHARS = frozenset("0123456789abcdefABCDEF:.")


def check_address(addr: str) -> str | None:
    """Why `addr` is not "host:port" (an IPv6 host in brackets), or None if it is."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or port != str(int(port)):
        return f"address {addr!r} is not host:port"
    if not 1 <= int(port) <= 65535:
        return f"address {addr!r} has a port outside 1..65535"
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3 or not set(host[1:-1]) <= _IPV6_CHARS:
            return f"address {addr!r} has a malformed IPv6 host"
    elif not all(c.isascii() and (c.isalnum() or c in "-.") for c in host):
        return f"address {addr!r} has a host that is neither a name nor an address"
    return None


NONCE = Bin(NONCE_SIZE, NONCE_SIZE)
ADDRESS = Text(ADDRESS_MAX, min_len=3, rule=check_address, label="host:port")


@message("ping", issuer="sender", expiry="expires")
@dataclass(frozen=True, slots=True)
class Ping(Message):
    network: str = field(metadata=w(NETWORK))
    sender: NodeId = field(metadata=w(Key()))
    nonce: bytes = field(metadata=w(NONCE))
    expires: int = field(metadata=w(TIME))


@message("pong", issuer="sender", expiry="expires")
@dataclass(frozen=True, slots=True)
class Pong(Message):
    """The answer to a ping, echoing its nonce."""

    network: str = field(metadata=w(NETWORK))
    sender: NodeId = field(metadata=w(Key()))
    nonce: bytes = field(metadata=w(NONCE))
    expires: int = field(metadata=w(TIME))


@message("contact", issuer="node", expiry="expires")
@dataclass(frozen=True, slots=True)
class Contact(Message):
    """A node's own signed statement of where it can be reached."""

    network: str = field(metadata=w(NETWORK))
    node: NodeId = field(metadata=w(Key()))
    addresses: tuple[str, ...] = field(metadata=w(Seq(ADDRESS, MAX_ADDRESSES, min_items=1)))
    expires: int = field(metadata=w(TIME))


@message("peers", issuer="sender", expiry="expires")
@dataclass(frozen=True, slots=True)
class Peers(Message):
    """Peer exchange: contact envelopes (kind `contact`, each signed by the node it describes).

    The records stay raw bytes here: the receiver verifies each with
    `verify(record, expect=Contact)` after dropping ones it has already seen.
    """

    network: str = field(metadata=w(NETWORK))
    sender: NodeId = field(metadata=w(Key()))
    contacts: tuple[bytes, ...] = field(metadata=w(Seq(Bin(CONTACT_MAX, min_len=1), MAX_CONTACTS)))
    expires: int = field(metadata=w(TIME))


@message("capacity", issuer="node", expiry="expires")
@dataclass(frozen=True, slots=True)
class Capacity(Message):
    """What a node can spare now: cores, memory, the execution profiles it runs, its queue."""

    network: str = field(metadata=w(NETWORK))
    node: NodeId = field(metadata=w(Key()))
    expires: int = field(metadata=w(TIME))
    cores: int = field(metadata=w(UInt(U16)))
    memory_bytes: int = field(metadata=w(UInt()))
    profiles: tuple[Digest, ...] = field(metadata=w(Seq(Hash(), MAX_PROFILES, min_items=1, order_key=BY_RAW)))
    queue_length: int = field(metadata=w(UInt(U32)))
    fuel_rate: int = field(metadata=w(UInt()))
    """Fuel per second of compute one core delivers (an estimate, for the submitter's planning)."""


BY_JOB = operator.attrgetter("job_id.raw")
"""Order of the jobs in an offer and of the items of a bid: by job id bytes."""


@message("offer", issuer="submitter", expiry="expires")
@dataclass(frozen=True, slots=True)
class Offer(Message):
    """Jobs offered to the network: one to MAX_SET manifests of one submitter in one signed message, so a
    sweep costs one gossiped message (and one answer from each node) per set instead of per job. Each
    job keeps its own id, deadline and limits; the offer's `expires` is not part of any job id, so a job
    can be offered again, alone or with others."""

    network: str = field(metadata=w(NETWORK))
    expires: int = field(metadata=w(TIME))
    submitter: NodeId = field(metadata=w(Key()))
    manifests: tuple[JobManifest, ...] = field(
        metadata=w(Seq(Sub(JobManifest), MAX_SET, min_items=1, order_key=BY_JOB))
    )

    def _validate(self) -> None:
        for manifest in self.manifests:
            if manifest.submitter != self.submitter:
                raise InvalidMessage("Offer: a manifest names another submitter")

    def manifest(self, job_id: Digest) -> JobManifest | None:
        """The offered job with this id, if the offer holds it."""
        return find_sorted(self.manifests, job_id.raw, BY_JOB)


@record
@dataclass(frozen=True, slots=True)
class BidItem(Record):
    """One job of a bid: when the executor expects to start and to finish it."""

    job_id: Digest = field(metadata=w(Hash()))
    expected_start: int = field(metadata=w(TIME))
    expected_finish: int = field(metadata=w(TIME))

    def _validate(self) -> None:
        if self.expected_finish < self.expected_start:
            raise InvalidMessage("BidItem: expected_finish is before expected_start")


@message("bid", issuer="executor", expiry="expires")
@dataclass(frozen=True, slots=True)
class Bid(Message):
    """An executor's promise to start and finish each of the jobs it names, of one offer, by the given
    times. There is no price. `held`: roots of the blobs of those jobs (module, inputs, stdin) that the
    executor holds already, so it fetches none of them: a claim the submitter uses only to break ties."""

    network: str = field(metadata=w(NETWORK))
    offer_id: Digest = field(metadata=w(Hash()))
    executor: NodeId = field(metadata=w(Key()))
    expires: int = field(metadata=w(TIME))
    items: tuple[BidItem, ...] = field(metadata=w(Seq(Sub(BidItem), MAX_SET, min_items=1, order_key=BY_JOB)))
    held: tuple[Digest, ...] = field(default=(), metadata=w(Seq(Hash(), MAX_HELD, order_key=BY_RAW)))

    def item(self, job_id: Digest) -> BidItem | None:
        """The bid's terms for this job, if it bids for it."""
        return find_sorted(self.items, job_id.raw, BY_JOB)


@message("decline", issuer="executor", expiry="expires")
@dataclass(frozen=True, slots=True)
class Decline(Message):
    """An executor's refusal of jobs of one offer, all for the same reason."""

    network: str = field(metadata=w(NETWORK))
    job_ids: tuple[Digest, ...] = field(metadata=w(Seq(Hash(), MAX_SET, min_items=1, order_key=BY_RAW)))
    offer_id: Digest = field(metadata=w(Hash()))
    executor: NodeId = field(metadata=w(Key()))
    expires: int = field(metadata=w(TIME))
    reason: str = field(metadata=w(OneOf(*DECLINE_REASONS)))
    text: str = field(metadata=w(Text(REASON_TEXT_MAX)))


@message("assign", issuer="submitter", expiry="lease_expires")
@dataclass(frozen=True, slots=True)
class Assign(Message):
    """The submitter gives attempt `attempt` of a job to one executor until the lease expires."""

    network: str = field(metadata=w(NETWORK))
    job_id: Digest = field(metadata=w(Hash()))
    bid_id: Digest = field(metadata=w(Hash()))
    submitter: NodeId = field(metadata=w(Key()))
    executor: NodeId = field(metadata=w(Key()))
    attempt: int = field(metadata=w(UInt(U32, minimum=1)))
    lease_expires: int = field(metadata=w(TIME))


@message("award", issuer="submitter")
@dataclass(frozen=True, slots=True)
class Award(Message):
    """The submitter's choice among the bids for one offer, told to one bidder: of the jobs its bid
    (`bid_id`) named, the submitter means to assign it `job_ids` (none: it won nothing) and none of
    the others, so the executor stops holding room for those at once (a late assignment of one is
    still a valid assignment while the bid lives)."""

    network: str = field(metadata=w(NETWORK))
    bid_id: Digest = field(metadata=w(Hash()))
    submitter: NodeId = field(metadata=w(Key()))
    executor: NodeId = field(metadata=w(Key()))
    job_ids: tuple[Digest, ...] = field(metadata=w(Seq(Hash(), MAX_SET, order_key=BY_RAW)))


@message("blobreq", issuer="requester", expiry="expires")
@dataclass(frozen=True, slots=True)
class BlobRequest(Message):
    """Ask for chunk `index` of a blob, or (index nil) for its chunk list."""

    network: str = field(metadata=w(NETWORK))
    requester: NodeId = field(metadata=w(Key()))
    blob: Digest = field(metadata=w(Hash()))
    index: int | None = field(metadata=w(Opt(UInt(MAX_CHUNKS - 1))))
    expires: int = field(metadata=w(TIME))


@message("blobchunk", issuer="sender")
@dataclass(frozen=True, slots=True)
class BlobChunk(Message):
    """Chunk `index` of a blob, or (index nil) its chunk list. Check it with blobs.ChunkList."""

    network: str = field(metadata=w(NETWORK))
    sender: NodeId = field(metadata=w(Key()))
    blob: Digest = field(metadata=w(Hash()))
    index: int | None = field(metadata=w(Opt(UInt(MAX_CHUNKS - 1))))
    data: bytes = field(metadata=w(Bin(max(CHUNK_SIZE, MAX_CHUNKS * DIGEST_SIZE))))

    def _validate(self) -> None:
        if self.index is None:
            if len(self.data) % DIGEST_SIZE:
                raise InvalidMessage("BlobChunk: a chunk list is a whole number of digests")
        elif len(self.data) > CHUNK_SIZE:
            raise InvalidMessage(f"BlobChunk: a chunk is at most {CHUNK_SIZE} bytes")


@message("result", issuer="executor")
@dataclass(frozen=True, slots=True)
class Result(Message):
    """The executor delivers a finished job: its signed usage receipt whole (`receipt`, a complete
    `receipt` envelope of the same job, assignment and executor), until when the outputs the receipt
    names can be fetched, and the bytes of its small outputs (`outputs`, each of one chunk of at most
    PUSH_MAX bytes and hashing to a BlobRef the receipt names), so the submitter need not ask for them.
    protocol/results.py opens one."""

    network: str = field(metadata=w(NETWORK))
    job_id: Digest = field(metadata=w(Hash()))
    assignment_id: Digest = field(metadata=w(Hash()))
    executor: NodeId = field(metadata=w(Key()))
    receipt: bytes = field(metadata=w(Bin(RECEIPT_MAX, min_len=1)))
    available_until: int = field(metadata=w(TIME))
    outputs: tuple[bytes, ...] = field(metadata=w(Seq(Bin(PUSH_MAX, min_len=1), MAX_PUSHED)))


MAX_RESULTS = 64
"""Finished jobs in one `results` carrier."""


@record
@dataclass(frozen=True, slots=True)
class ResultEntry(Record):
    """One finished job in a `results` carrier: the fields of a `result` less those the carrier holds
    once for all (`network`, `executor`). `receipt` is the job's complete `receipt` envelope, signed on
    its own, and carried as opaque bytes: the carrier's signature adds nothing to it."""

    job_id: Digest = field(metadata=w(Hash()))
    assignment_id: Digest = field(metadata=w(Hash()))
    receipt: bytes = field(metadata=w(Bin(RECEIPT_MAX, min_len=1)))
    available_until: int = field(metadata=w(TIME))
    outputs: tuple[bytes, ...] = field(metadata=w(Seq(Bin(PUSH_MAX, min_len=1), MAX_PUSHED)))


BY_ENTRY = operator.attrgetter("assignment_id.raw", "job_id.raw")
"""Order of the entries of a `results` carrier: by assignment id, then job id (bytes)."""


@message("results", issuer="executor")
@dataclass(frozen=True, slots=True)
class Results(Message):
    """The executor delivers the jobs that finished close together in one message: one entry per
    job, each the fields of a `result`. Each entry is taken or refused on its own (protocol/results.py
    opens them), so one bad receipt does not keep the others out."""

    network: str = field(metadata=w(NETWORK))
    executor: NodeId = field(metadata=w(Key()))
    entries: tuple[ResultEntry, ...] = field(
        metadata=w(Seq(Sub(ResultEntry), MAX_RESULTS, min_items=1, order_key=BY_ENTRY))
    )

    def result(self, entry: ResultEntry) -> Result:
        """The entry as the `result` it stands for (not signed: the carrier was)."""
        return Result(
            self.network,
            entry.job_id,
            entry.assignment_id,
            self.executor,
            entry.receipt,
            entry.available_until,
            entry.outputs,
        )


@message("accepted", issuer="executor")
@dataclass(frozen=True, slots=True)
class Accepted(Message):
    """The executor holds every blob of an assigned job and has queued it: the hand-off. From here the
    job needs its submitter online only to collect the result."""

    network: str = field(metadata=w(NETWORK))
    job_id: Digest = field(metadata=w(Hash()))
    assignment_id: Digest = field(metadata=w(Hash()))
    executor: NodeId = field(metadata=w(Key()))


@message("release", issuer="executor")
@dataclass(frozen=True, slots=True)
class Release(Message):
    """The executor gives an assignment back unfinished, so its submitter offers the job again at once
    instead of waiting out the lease: `unknown`, it holds no bid or job for that assignment (it
    restarted before storing it); `failed`, it cannot run it (its blobs cannot be fetched, its sandbox
    refuses it); `deadline`, it could no longer finish in time; `lease`, the lease ran out while the
    node was stopped; `withdrawn`, its submitter withdrew the assignment (a `withdraw`) before the job
    started here."""

    network: str = field(metadata=w(NETWORK))
    job_id: Digest = field(metadata=w(Hash()))
    assignment_id: Digest = field(metadata=w(Hash()))
    executor: NodeId = field(metadata=w(Key()))
    reason: str = field(metadata=w(OneOf(*RELEASE_REASONS)))
    text: str = field(metadata=w(Text(REASON_TEXT_MAX)))


@message("cancel", issuer="submitter", expiry="expires")
@dataclass(frozen=True, slots=True)
class Cancel(Message):
    network: str = field(metadata=w(NETWORK))
    job_id: Digest = field(metadata=w(Hash()))
    submitter: NodeId = field(metadata=w(Key()))
    expires: int = field(metadata=w(TIME))
    reason: str = field(metadata=w(OneOf(*CANCEL_REASONS)))
    text: str = field(metadata=w(Text(REASON_TEXT_MAX)))


@message("withdraw", issuer="submitter", expiry="expires")
@dataclass(frozen=True, slots=True)
class Withdraw(Message):
    """The submitter takes one assignment (`assignment_id`, the `assign` message id) back from its
    executor, to run the job elsewhere: the executor drops the job if it has not started it and
    answers `release` (reason `withdrawn`); a job already started runs on and its result comes as
    usual. Unlike `cancel`, it withdraws this assignment only: the job lives on."""

    network: str = field(metadata=w(NETWORK))
    job_id: Digest = field(metadata=w(Hash()))
    assignment_id: Digest = field(metadata=w(Hash()))
    submitter: NodeId = field(metadata=w(Key()))
    expires: int = field(metadata=w(TIME))
    text: str = field(metadata=w(Text(REASON_TEXT_MAX)))


@message("treehead", issuer="executor")
@dataclass(frozen=True, slots=True)
class TreeHead(Message):
    """An executor's signed statement of its receipt log: size and RFC 9162 root hash at a time."""

    network: str = field(metadata=w(NETWORK))
    executor: NodeId = field(metadata=w(Key()))
    size: int = field(metadata=w(UInt()))
    root: Digest = field(metadata=w(Hash()))
    timestamp: int = field(metadata=w(TIME))


@message("proofreq", issuer="requester", expiry="expires")
@dataclass(frozen=True, slots=True)
class ProofRequest(Message):
    """Ask an executor for the inclusion proof of one of its receipts (named by message id)."""

    network: str = field(metadata=w(NETWORK))
    requester: NodeId = field(metadata=w(Key()))
    executor: NodeId = field(metadata=w(Key()))
    receipt_id: Digest = field(metadata=w(Hash()))
    expires: int = field(metadata=w(TIME))


@record
@dataclass(frozen=True, slots=True)
class ProofEntry(Record):
    """Where one receipt (named by message id) sits in a log: its leaf index and RFC 9162 inclusion path,
    leaf side first."""

    receipt_id: Digest = field(metadata=w(Hash()))
    leaf_index: int = field(metadata=w(UInt()))
    path: tuple[Digest, ...] = field(metadata=w(Seq(Hash(), MAX_PROOF_HASHES)))


BY_RECEIPT = operator.attrgetter("receipt_id.raw")
"""Order of the entries of a proof: by receipt id bytes."""


@message("proof", issuer="executor")
@dataclass(frozen=True, slots=True)
class InclusionProof(Message):
    """Where receipts sit in their executor's log: each entry places one receipt in the tree of
    `tree_size` leaves whose signed head (a complete `treehead` envelope, same executor and size)
    travels in `treehead`. One proof answers a batch of receipts under one head."""

    network: str = field(metadata=w(NETWORK))
    executor: NodeId = field(metadata=w(Key()))
    tree_size: int = field(metadata=w(UInt(minimum=1)))
    treehead: bytes = field(metadata=w(Bin(TREEHEAD_MAX, min_len=1)))
    entries: tuple[ProofEntry, ...] = field(
        metadata=w(Seq(Sub(ProofEntry), MAX_PROOF_ENTRIES, min_items=1, order_key=BY_RECEIPT))
    )

    def _validate(self) -> None:
        if any(e.leaf_index >= self.tree_size for e in self.entries):
            raise InvalidMessage("InclusionProof: a leaf_index is not below tree_size")

    def entry(self, receipt_id: Digest) -> ProofEntry | None:
        """The entry placing this receipt, if the proof has one."""
        return find_sorted(self.entries, receipt_id.raw, BY_RECEIPT)


AnyMessage = (
    Ping
    | Pong
    | Contact
    | Peers
    | Capacity
    | Offer
    | Bid
    | Decline
    | Assign
    | Award
    | BlobRequest
    | BlobChunk
    | Result
    | Results
    | UsageReceipt
    | Ack
    | Accepted
    | Release
    | Cancel
    | Withdraw
    | TreeHead
    | ProofRequest
    | InclusionProof
    | Observed
    | Dialback
    | Dialed
    | Reserve
    | Reserved
    | Circuit
    | RelayData
    | RelayCredit
    | RelayClose
    | Via
)
"""The closed union of every message kind."""

KINDS: tuple[str, ...] = tuple(REGISTRY)

__all__ = [
    "BY_ENTRY",
    "BY_JOB",
    "CANCEL_REASONS",
    "DECLINE_REASONS",
    "MAX_ACKED",
    "MAX_PROOF_ENTRIES",
    "MAX_PUSHED",
    "MAX_RESULTS",
    "MAX_SET",
    "RECEIPT_MAX",
    "REGISTRY",
    "RELEASE_REASONS",
    "Accepted",
    "Ack",
    "AnyMessage",
    "Assign",
    "Award",
    "Bid",
    "BidItem",
    "BlobChunk",
    "BlobRequest",
    "Cancel",
    "Capacity",
    "Contact",
    "Decline",
    "InclusionProof",
    "Message",
    "Offer",
    "Peers",
    "Ping",
    "Pong",
    "ProofEntry",
    "ProofRequest",
    "Release",
    "Result",
    "ResultEntry",
    "Results",
    "TreeHead",
    "UsageReceipt",
    "Withdraw",
    "check_address",
]
