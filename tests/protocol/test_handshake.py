"""The transport handshake, run between two in-memory state machines."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pytest
from e31.protocol import handshake
from e31.protocol.codec import encode_frame, pack, unpack
from e31.protocol.errors import (
    DecodeError,
    FrameTooLarge,
    HandshakeFailed,
    LocalProtocolError,
    NonCanonical,
    ProtocolError,
    WrongNetwork,
)
from e31.protocol.handshake import (
    MAX_HANDSHAKE_FRAME,
    HandshakeResult,
    Initiator,
    Responder,
    State,
    network_tag,
)
from e31.protocol.session import Session
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey


def key(n: int) -> SigningKey:
    return SigningKey(hashlib.sha256(b"identity %d" % n).digest())


def secret(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


ALICE, BOB, MALLORY = key(1), key(2), key(3)


def pub(k: SigningKey) -> bytes:
    return bytes(k.verify_key)


@dataclass
class Run:
    ini: Initiator
    resp: Responder
    m1: bytes
    m2: bytes
    m3: bytes


def run(tag: str = "", network: str = "main", resp_network: str = "main", expect: bytes | None = None) -> Run:
    ini = Initiator(ALICE, network, secret("i" + tag), expect=expect)
    resp = Responder(BOB, resp_network, secret("r" + tag))
    m1 = ini.initiate()
    m2 = resp.receive_data(m1)
    m3 = ini.receive_data(m2)
    assert resp.receive_data(m3) == b""
    return Run(ini, resp, m1, m2, m3)


def payload(frame: bytes) -> bytes:
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    return frame[4:]


def test_a_handshake_authenticates_both_sides_and_agrees_on_keys() -> None:
    r = run()
    assert r.ini.done and r.resp.done
    a, b = r.ini.result, r.resp.result
    assert isinstance(a, HandshakeResult)
    assert a.peer_key == pub(BOB) and b.peer_key == pub(ALICE)
    assert a.send_key == b.recv_key and a.recv_key == b.send_key and a.send_key != a.recv_key
    assert a.transcript_hash == b.transcript_hash and len(a.transcript_hash) == 32
    assert a.initiator and not b.initiator
    assert r.ini.unused_data == r.resp.unused_data == b""
    assert len(r.m1) <= MAX_HANDSHAKE_FRAME and len(r.m2) <= MAX_HANDSHAKE_FRAME
    assert a.send_key.hex() not in repr(a) and a.recv_key.hex() not in repr(a)


def test_fresh_ephemerals_give_fresh_keys_and_same_inputs_give_same_bytes() -> None:
    one, two, again = run("1"), run("2"), run("1")
    assert one.ini.result.send_key != two.ini.result.send_key
    assert one.ini.result.transcript_hash != two.ini.result.transcript_hash
    assert (one.m1, one.m2, one.m3) == (again.m1, again.m2, again.m3)
    assert one.ini.result == again.ini.result


def test_identities_travel_encrypted() -> None:
    r = run()
    wire = r.m1 + r.m2 + r.m3
    for k in (ALICE, BOB):
        assert pub(k) not in wire


def test_the_message_shapes() -> None:
    r = run()
    version, tag, e_i = unpack(payload(r.m1))
    assert (version, tag, len(e_i)) == (handshake.VERSION, network_tag("main"), 32)
    e_r, sealed2 = unpack(payload(r.m2))
    assert len(e_r) == 32 and len(sealed2) == 1 + (2 + 32) + (2 + 64) + 16  # [key, signature] + tag
    (sealed3,) = unpack(payload(r.m3))
    assert len(sealed3) == len(sealed2)


def test_pinning_the_right_responder_succeeds() -> None:
    r = run(expect=pub(BOB))
    assert r.ini.result.peer_key == pub(BOB)


def test_pinning_the_wrong_responder_fails_before_the_initiator_reveals_itself() -> None:
    ini = Initiator(ALICE, "main", secret("i"), expect=pub(MALLORY))
    resp = Responder(BOB, "main", secret("r"))
    m2 = resp.receive_data(ini.initiate())
    with pytest.raises(HandshakeFailed, match="pinned"):
        ini.receive_data(m2)
    assert ini.state is State.FAILED and not ini.done
    with pytest.raises(HandshakeFailed):
        ini.receive_data(b"")


def test_the_responder_refuses_another_network() -> None:
    ini = Initiator(ALICE, "testnet", secret("i"))
    resp = Responder(BOB, "main", secret("r"))
    with pytest.raises(WrongNetwork):
        resp.receive_data(ini.initiate())
    assert resp.state is State.FAILED


def test_a_rewritten_network_tag_still_never_completes() -> None:
    # An attacker rewrites the tag so that a responder on "main" answers a "testnet" initiator: the
    # network name is in both transcripts, so the initiator cannot open the reply.
    ini = Initiator(ALICE, "testnet", secret("i"))
    resp = Responder(BOB, "main", secret("r"))
    version, _, e_i = unpack(payload(ini.initiate()))
    m2 = resp.receive_data(encode_frame(pack([version, network_tag("main"), e_i])))
    with pytest.raises(HandshakeFailed):
        ini.receive_data(m2)


@pytest.mark.parametrize("version", [1, 2, 4])
def test_another_version_is_refused(version: int) -> None:
    """Version 1 nodes (which cannot read `results` carriers), version 2 ones (which cannot read
    `assigns` sets) and later ones do not link with us."""
    ini = Initiator(ALICE, "main", secret("i"))
    _, tag, e_i = unpack(payload(ini.initiate()))
    resp = Responder(BOB, "main", secret("r"))
    with pytest.raises(HandshakeFailed, match=f"version {version}; we speak 3"):
        resp.receive_data(encode_frame(pack([version, tag, e_i])))


def _forged_proof(monkeypatch: pytest.MonkeyPatch, claimed: SigningKey, signer: SigningKey) -> None:
    """Make the next identity proof claim `claimed`'s key but carry `signer`'s signature."""

    def forged(identity: SigningKey, label: bytes, transcript: bytes) -> bytes:
        return pack([pub(claimed), signer.sign(label + transcript).signature])

    monkeypatch.setattr(handshake, "_identity_proof", forged)


def test_a_responder_proof_signed_by_another_key_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    ini = Initiator(ALICE, "main", secret("i"))
    resp = Responder(MALLORY, "main", secret("r"))
    m1 = ini.initiate()
    _forged_proof(monkeypatch, claimed=BOB, signer=MALLORY)
    m2 = resp.receive_data(m1)
    monkeypatch.undo()
    with pytest.raises(HandshakeFailed, match="responder's identity signature"):
        ini.receive_data(m2)


def test_an_initiator_proof_signed_by_another_key_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    ini = Initiator(MALLORY, "main", secret("i"))
    resp = Responder(BOB, "main", secret("r"))
    m2 = resp.receive_data(ini.initiate())
    _forged_proof(monkeypatch, claimed=ALICE, signer=MALLORY)
    m3 = ini.receive_data(m2)
    monkeypatch.undo()
    with pytest.raises(HandshakeFailed, match="initiator's identity signature"):
        resp.receive_data(m3)


def test_a_signature_from_the_other_role_does_not_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # The initiator signs with the responder's label: a signature is bound to its role.
    ini = Initiator(ALICE, "main", secret("i"))
    resp = Responder(BOB, "main", secret("r"))
    m2 = resp.receive_data(ini.initiate())
    real = handshake._identity_proof
    monkeypatch.setattr(
        handshake, "_identity_proof", lambda ident, label, t: real(ident, handshake._SIG_RESPONDER, t)
    )
    m3 = ini.receive_data(m2)
    monkeypatch.undo()
    with pytest.raises(HandshakeFailed):
        resp.receive_data(m3)


def test_replayed_handshake_messages_fail() -> None:
    old = run("old")
    # An old message 2 offered to a new initiator.
    ini = Initiator(ALICE, "main", secret("i new"))
    ini.initiate()
    with pytest.raises(HandshakeFailed):
        ini.receive_data(old.m2)
    # An old message 1 and then the old message 3 replayed to a new responder.
    resp = Responder(BOB, "main", secret("r new"))
    assert resp.receive_data(old.m1) != old.m2
    with pytest.raises(HandshakeFailed):
        resp.receive_data(old.m3)
    assert not resp.done


def test_a_swapped_ephemeral_in_message_2_fails() -> None:
    ini = Initiator(ALICE, "main", secret("i"))
    resp = Responder(BOB, "main", secret("r"))
    _, sealed = unpack(payload(resp.receive_data(ini.initiate())))
    attacker = Responder(MALLORY, "main", secret("m"))
    with pytest.raises(HandshakeFailed):
        ini.receive_data(encode_frame(pack([attacker._public, sealed])))


def test_a_low_order_ephemeral_key_fails() -> None:
    resp = Responder(BOB, "main", secret("r"))
    with pytest.raises(HandshakeFailed, match="low-order"):
        resp.receive_data(encode_frame(pack([handshake.VERSION, network_tag("main"), bytes(32)])))


@pytest.mark.parametrize("which", ["m1", "m2", "m3"])
def test_every_single_byte_change_breaks_the_handshake(which: str) -> None:
    clean = run()
    frame = getattr(clean, which)
    for pos in range(4, len(frame)):
        mutated = frame[:pos] + bytes([frame[pos] ^ 0x40]) + frame[pos + 1 :]
        ini = Initiator(ALICE, "main", secret("i"))
        resp = Responder(BOB, "main", secret("r"))
        with pytest.raises(ProtocolError):
            m1 = ini.initiate()
            m2 = resp.receive_data(mutated if which == "m1" else m1)
            m3 = ini.receive_data(mutated if which == "m2" else m2)
            resp.receive_data(mutated if which == "m3" else m3)
        assert not (ini.done and resp.done)


@pytest.mark.parametrize("which", ["m1", "m2", "m3"])
def test_truncated_messages_fail(which: str) -> None:
    clean = run()
    body = payload(getattr(clean, which))
    for cut in range(len(body)):
        ini = Initiator(ALICE, "main", secret("i"))
        resp = Responder(BOB, "main", secret("r"))
        with pytest.raises(ProtocolError):
            m1 = ini.initiate()
            m2 = resp.receive_data(encode_frame(body[:cut]) if which == "m1" else m1)
            m3 = ini.receive_data(encode_frame(body[:cut]) if which == "m2" else m2)
            resp.receive_data(encode_frame(body[:cut]) if which == "m3" else m3)


def test_a_half_frame_just_waits() -> None:
    ini = Initiator(ALICE, "main", secret("i"))
    resp = Responder(BOB, "main", secret("r"))
    m1 = ini.initiate()
    out = b"".join(resp.receive_data(m1[i : i + 1]) for i in range(len(m1)))
    m3 = b"".join(ini.receive_data(out[i : i + 3]) for i in range(0, len(out), 3))
    assert ini.done and not resp.done
    for i in range(len(m3)):
        resp.receive_data(m3[i : i + 1])
    assert resp.done and resp.result.peer_key == pub(ALICE)


def test_an_oversized_or_malformed_frame_fails() -> None:
    resp = Responder(BOB, "main", secret("r"))
    with pytest.raises(FrameTooLarge):
        resp.receive_data((MAX_HANDSHAKE_FRAME + 1).to_bytes(4, "big"))
    resp = Responder(BOB, "main", secret("r"))
    with pytest.raises(DecodeError):
        resp.receive_data(encode_frame(b"\xc1"))
    resp = Responder(BOB, "main", secret("r"))
    with pytest.raises(NonCanonical):  # the version as a 2-byte uint: not the minimal encoding
        resp.receive_data(encode_frame(b"\x93\xcd\x00\x01" + pack(network_tag("main")) + pack(bytes(32))))
    resp = Responder(BOB, "main", secret("r"))
    with pytest.raises(HandshakeFailed, match="field 0"):
        resp.receive_data(encode_frame(pack([True, network_tag("main"), bytes(32)])))
    resp = Responder(BOB, "main", secret("r"))
    with pytest.raises(HandshakeFailed, match="3 fields"):
        resp.receive_data(encode_frame(pack({"version": 1})))


def test_session_bytes_sent_with_message_3_are_handed_over() -> None:
    ini = Initiator(ALICE, "main", secret("i"))
    resp = Responder(BOB, "main", secret("r"))
    m3 = ini.receive_data(resp.receive_data(ini.initiate()))
    early = encode_frame(b"x" * 5000) + b"\x00\x00"
    resp.receive_data(m3 + early)
    assert resp.done and resp.unused_data == early


def test_wrong_use_is_a_local_error() -> None:
    ini = Initiator(ALICE, "main", secret("i"))
    with pytest.raises(LocalProtocolError):
        ini.receive_data(b"\x00")
    with pytest.raises(LocalProtocolError):
        _ = ini.result
    ini.initiate()
    with pytest.raises(LocalProtocolError):
        ini.initiate()
    with pytest.raises(LocalProtocolError):
        ini.receive_data("text")  # type: ignore[arg-type]
    r = run()
    with pytest.raises(LocalProtocolError) as e:
        r.resp.receive_data(b"more")
    assert not e.value.remote
    for bad in (
        lambda: Initiator(ALICE, "main", b"short"),
        lambda: Initiator(ALICE, "", secret("i")),
        lambda: Initiator(pub(ALICE), "main", secret("i")),  # type: ignore[arg-type]
        lambda: Initiator(ALICE, "main", secret("i"), expect=b"x"),
        lambda: Responder(ALICE, 7, secret("r")),  # type: ignore[arg-type]
    ):
        with pytest.raises(LocalProtocolError):
            bad()


def _fed(machine: Initiator | Responder, data: bytes) -> None:
    try:
        machine.receive_data(data)
    except ProtocolError:
        assert machine.state is State.FAILED


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=700), framed=st.booleans())
def test_arbitrary_bytes_in_every_state_raise_only_protocol_errors(data: bytes, framed: bool) -> None:
    blob = encode_frame(data[:MAX_HANDSHAKE_FRAME]) if framed else data
    resp = Responder(BOB, "main", secret("r"))
    _fed(resp, blob)  # awaiting message 1
    ini = Initiator(ALICE, "main", secret("i"))
    m1 = ini.initiate()
    _fed(ini, blob)  # awaiting message 2
    resp = Responder(BOB, "main", secret("r"))
    resp.receive_data(m1)
    _fed(resp, blob)  # awaiting message 3
    assert not resp.done


@settings(max_examples=100, deadline=None)
@given(
    fields=st.lists(
        st.one_of(st.binary(max_size=70), st.integers(-5, 5), st.text(max_size=5), st.none(), st.booleans()),
        max_size=4,
    )
)
def test_well_formed_frames_of_wrong_content_fail(fields: list[object]) -> None:
    frame = encode_frame(pack(fields))
    resp = Responder(BOB, "main", secret("r"))
    ini = Initiator(ALICE, "main", secret("i"))
    resp2 = Responder(BOB, "main", secret("r"))
    resp2.receive_data(ini.initiate())
    for machine in (resp, ini, resp2):
        with pytest.raises(ProtocolError):
            machine.receive_data(frame)


# The vector printed in docs/protocol.md §11.9: an independent implementation must
# produce these bytes from these inputs.
VECTOR = {
    "m1": "000000369303c410fc95eff13c582f22a3f02e19a76e2abfc4207b4e909bbe7ffe44c465a220037d608ee3"
    "5897d31ef972f07f74892cb0f73f13",
    "m2": "0000009a92c4200faa684ed28867b97f4a6a2dee5df8ce974e76b7018e3f22a1c4cf2678570f20c475ef52"
    "655bbe1aeb48970390e8d27ecfbf0831d0efc6c2382a83a3d1abf50eb7b2a227844f99f783246ce783b5f7"
    "cf691e960ff2440a9dea01fbc433ddcb2651406a80e258bb9efa07eb0db06122a20e5feaf533f6bc7278b1"
    "73f16a4a4229fa9af40913ebb575382720f034afc6d20e8c86b89e7b07",
    "m3": "0000007891c47511ccf04e310a8d6cfb94d7d123cd1509cea6cb5faed3e13d0629b8a7a4171a7f8f059541"
    "b97d4dd5716237c622e0d2e6c44f477618ccbddc9c533bd820fb8e95921048e311e1ac3f36e7602ade1c1b"
    "3aecd9bfe125b0fc4e95d996d7185bc79f209a5900e63d7fabe76995dfafd80ac676236d0c9c",
    "transcript": "926abcbc38f296e208d82c4d55ad7931f38eb1a8adb7d851ae696dea26748f42",
    "i2r": "51a6f7d2f92aa9405c539ac7f5c28321e4da9770716ff7a40d0b9bbc788b1d31",
    "r2i": "c11c9052dc65c766c835a6350949776e44e4d1f0e306ff44400a0b58b8efe942",
    "hello": "00000015f2383be2e87b814b7ae77457f2b77b34cd32c792fb",
}


def test_the_documented_vector() -> None:
    ini = Initiator(SigningKey(b"\x01" * 32), "main", b"\x11" * 32)
    resp = Responder(SigningKey(b"\x02" * 32), "main", b"\x22" * 32)
    m1 = ini.initiate()
    m2 = resp.receive_data(m1)
    m3 = ini.receive_data(m2)
    resp.receive_data(m3)
    assert (m1.hex(), m2.hex(), m3.hex()) == (VECTOR["m1"], VECTOR["m2"], VECTOR["m3"])
    for side in (ini.result, resp.result):
        assert side.transcript_hash.hex() == VECTOR["transcript"]
    assert (ini.result.send_key.hex(), ini.result.recv_key.hex()) == (VECTOR["i2r"], VECTOR["r2i"])
    assert (resp.result.recv_key.hex(), resp.result.send_key.hex()) == (VECTOR["i2r"], VECTOR["r2i"])
    assert Session(ini.result).encrypt(b"hello").hex() == VECTOR["hello"]


# The network notice of docs/protocol.md §11.6, for network `main`.
NOTICE_MAIN = "000000079200a46d61696e"


def test_nodes_of_two_networks_exchange_network_notices_and_name_both() -> None:
    from e31.protocol.errors import NetworkMismatch
    from e31.protocol.handshake import network_notice, read_network_notice

    assert network_notice("main").hex() == NOTICE_MAIN
    ini = Initiator(ALICE, "lab", secret("i"))
    resp = Responder(BOB, "main", secret("r"))
    with pytest.raises(NetworkMismatch) as at_responder:
        resp.receive_data(ini.initiate())
    assert (at_responder.value.ours, at_responder.value.theirs) == ("main", None)
    assert at_responder.value.notice.hex() == NOTICE_MAIN
    with pytest.raises(NetworkMismatch) as at_initiator:
        ini.receive_data(at_responder.value.notice)
    assert (at_initiator.value.ours, at_initiator.value.theirs) == ("lab", "main")
    reply = at_initiator.value.notice
    assert read_network_notice(reply[:5]) is None  # not whole yet
    assert read_network_notice(reply) == "lab"
    for machine in (ini, resp):  # both machines are dead afterwards
        with pytest.raises(HandshakeFailed):
            machine.receive_data(b"\x00")


@pytest.mark.parametrize(
    "payload",
    [
        pack([0, ""]),
        pack([0, "UPPER"]),
        pack([0, "x" * 33]),
        pack([0, b"main"]),
        pack([1, "main"]),
        pack([0]),
    ],
)
def test_a_bad_network_notice_is_a_failed_handshake(payload: bytes) -> None:
    from e31.protocol.handshake import read_network_notice

    ini = Initiator(ALICE, "lab", secret("i"))
    ini.initiate()
    with pytest.raises(ProtocolError):
        ini.receive_data(encode_frame(payload))
    with pytest.raises(ProtocolError):
        read_network_notice(encode_frame(payload))


def test_a_notice_naming_our_own_network_is_a_lie() -> None:
    from e31.protocol.handshake import network_notice

    ini = Initiator(ALICE, "main", secret("i"))
    ini.initiate()
    with pytest.raises(HandshakeFailed, match="ours"):
        ini.receive_data(network_notice("main"))
