"""The cslm wire protocol, version 1 (specified in docs/cslm.md): frame layout and codecs.

Shared by the server and the Python client; the C++ client in cslm/cpp/
implements the same layout. All integers little-endian.
"""

from __future__ import annotations

import struct

import numpy as np

VERSION = 1
MAGIC = b"CSLM"
HEADER = struct.Struct("<IBBHI")  # payload length, type, flags, reserved, request id
HEADER_SIZE = HEADER.size  # 12
HELLO_REPLY = struct.Struct("<4sHHIIIIIB3x32s")  # 64 bytes
DEFAULT_MAX_FRAME = 16 << 20

HELLO, SCORE, SCORE_TEXT, LOOKUP, VOCAB, STATS = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06
REPLY = 0x80
SCORES = SCORE | REPLY
ERROR = 0x7F
REQUEST_TYPES = {HELLO, SCORE, SCORE_TEXT, LOOKUP, VOCAB, STATS}

# ERROR codes
E_MALFORMED, E_VERSION, E_TOO_LARGE, E_BAD_REQUEST, E_NO_HANDSHAKE, E_UNKNOWN_TYPE, E_SHUTTING_DOWN, E_INTERNAL = range(1, 9)
E_BUSY = 9  # at the connection limit with every connection busy: try again later (a new connection)
MODES = {"unk": 0, "backoff": 1}
UNKNOWN, BACKOFF = 1, 2  # per-n-gram flags in SCORES: outside the shortlist; value from the back-off model


class ProtocolError(Exception):
    """A frame or request the peer should not have sent; `code` is the ERROR code to answer with."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def frame(type_: int, request_id: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), type_, 0, 0, request_id) + payload


def parse_header(data: bytes) -> tuple[int, int, int]:
    """-> (payload length, type, request id)."""
    length, type_, _flags, _reserved, request_id = HEADER.unpack(data)
    return length, type_, request_id


# -- payload codecs -----------------------------------------------------------
def encode_hello() -> bytes:
    return MAGIC + struct.pack("<HH", VERSION, 0)


def check_hello(payload: bytes) -> None:
    if len(payload) != 8:
        raise ProtocolError(E_MALFORMED, f"HELLO payload must be 8 bytes, got {len(payload)}")
    if payload[:4] != MAGIC:
        raise ProtocolError(E_VERSION, "HELLO lacks the 'CSLM' magic")
    (version,) = struct.unpack_from("<H", payload, 4)
    if version != VERSION:
        raise ProtocolError(E_VERSION, f"protocol version {version} not supported (server speaks {VERSION})")


def encode_hello_reply(order: int, vocab_size: int, bos: int, eos: int, unk: int, max_frame: int, mode: str,
                       checksum_hex: str) -> bytes:
    return HELLO_REPLY.pack(MAGIC, VERSION, order, vocab_size, bos, eos, unk, max_frame, MODES[mode],
                            bytes.fromhex(checksum_hex))


def decode_hello_reply(payload: bytes) -> dict:
    if len(payload) != HELLO_REPLY.size:
        raise ProtocolError(E_MALFORMED, f"HELLO reply must be {HELLO_REPLY.size} bytes, got {len(payload)}")
    magic, version, order, vocab, bos, eos, unk, max_frame, mode, checksum = HELLO_REPLY.unpack(payload)
    if magic != MAGIC:
        raise ProtocolError(E_VERSION, "not a cslm server (bad magic)")
    return dict(version=version, order=order, vocab_size=vocab, bos_id=bos, eos_id=eos, unk_id=unk,
                max_frame_bytes=max_frame, mode={v: k for k, v in MODES.items()}.get(mode, str(mode)),
                checksum=checksum.hex())


def encode_score(ngrams: np.ndarray) -> bytes:
    ngrams = np.asarray(ngrams)
    if ngrams.ndim != 2:
        raise ValueError("n-grams must be a 2-D (count, n) array")
    return struct.pack("<II", *ngrams.shape) + np.ascontiguousarray(ngrams, dtype="<u4").tobytes()


def decode_score(payload: bytes, order: int, vocab_size: int) -> np.ndarray:
    if len(payload) < 8:
        raise ProtocolError(E_MALFORMED, "SCORE payload shorter than its 8-byte count/n prefix")
    count, n = struct.unpack_from("<II", payload)
    if not 1 <= n <= order:
        raise ProtocolError(E_BAD_REQUEST, f"n = {n} outside 1..{order}")
    if len(payload) != 8 + 4 * count * n:
        raise ProtocolError(E_MALFORMED, f"SCORE payload is {len(payload)} bytes; {count} x {n} ids need {8 + 4 * count * n}")
    ids = np.frombuffer(payload, dtype="<u4", offset=8).reshape(count, n)
    if count and int(ids.max()) >= vocab_size:
        raise ProtocolError(E_BAD_REQUEST, f"word id {int(ids.max())} outside the vocabulary (size {vocab_size})")
    # every id below the vocabulary's size, so below 2**31: the payload read as int32 in place, not copied
    # (a view of the payload, alive as long as the rows)
    return ids.view("<i4")


def encode_lines(items: list[str]) -> bytes:
    """A count-prefixed list of newline-free strings (the payload of SCORE_TEXT, LOOKUP, VOCAB replies)."""
    for s in items:
        if "\n" in s:
            raise ValueError(f"text item contains a newline: {s!r}")
    return struct.pack("<I", len(items)) + "\n".join(items).encode("utf-8")


def decode_lines(payload: bytes, what: str) -> list[str]:
    """The inverse of `encode_lines`; `what` names the frame in errors."""
    if len(payload) < 4:
        raise ProtocolError(E_MALFORMED, f"{what} payload shorter than its 4-byte count")
    (count,) = struct.unpack_from("<I", payload)
    try:
        text = payload[4:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(E_MALFORMED, f"{what} text is not UTF-8 ({e.reason} at byte {e.start + 4})") from None
    items = text.split("\n") if count else []
    if len(items) != count or (count == 0 and text):
        raise ProtocolError(E_MALFORMED, f"{what} announces {count} items but carries {len(items)}")
    return items


def encode_score_text(ngrams: list[str]) -> bytes:
    return encode_lines(ngrams)


def decode_score_text(payload: bytes, order: int) -> list[list[str]]:
    grams = [line.split(" ") for line in decode_lines(payload, "SCORE_TEXT")]
    for i, g in enumerate(grams):
        if not 1 <= len(g) <= order or "" in g:
            raise ProtocolError(E_BAD_REQUEST, f"text n-gram {i + 1} must be 1..{order} words separated by single spaces")
    return grams


def scores_frame(request_id: int, logp: np.ndarray, flags: np.ndarray) -> bytearray:
    """A whole SCORES frame (header, count, float32 scores, uint8 flags) built in one buffer: the scores and
    flags are copied once, into their place, where joining their encodings made three copies of a reply."""
    count = len(logp)
    at = HEADER_SIZE + 4
    buf = bytearray(at + 5 * count)
    HEADER.pack_into(buf, 0, 4 + 5 * count, SCORES, 0, 0, request_id)
    struct.pack_into("<I", buf, HEADER_SIZE, count)
    np.frombuffer(buf, "<f4", count, at)[:] = logp
    np.frombuffer(buf, np.uint8, count, at + 4 * count)[:] = flags
    return buf


# The leading bytes of a SCORE / SCORE_TEXT payload that give its n-gram count (`held_bytes`)
COUNT_PREFIX = {SCORE: 8, SCORE_TEXT: 4}


def held_bytes(type_: int, length: int, prefix: bytes, order: int) -> int:
    """Bytes a request of `length` payload bytes holds in the server until its reply is taken: the payload, and
    for SCORE and SCORE_TEXT what answering it makes: the scores and flags (5 bytes an n-gram), the SCORES
    frame built from them (`scores_frame`: 5 more, and its head), and a text request's padded rows (4 bytes a
    word of the `order`). `prefix`: the payload's first COUNT_PREFIX[type_] bytes (fewer if it is shorter).
    A count the length cannot carry is bounded by what it can; the payload's decoding rejects it."""
    if type_ not in COUNT_PREFIX or len(prefix) < COUNT_PREFIX[type_]:
        return length
    (count,) = struct.unpack_from("<I", prefix)
    if type_ == SCORE:  # 8 + 4 * count * n bytes, n >= 1
        return length + 10 * min(count, (length - 8) // 4) + HEADER_SIZE + 4
    per_gram = 10 + 4 * order  # count items, joined by count - 1 newlines after the 4-byte count
    return length + per_gram * min(count, length - 3) + HEADER_SIZE + 4


def encode_scores(logp: np.ndarray, flags: np.ndarray) -> bytes:
    """The payload of a SCORES frame (`scores_frame` without its header)."""
    return bytes(memoryview(scores_frame(0, logp, flags))[HEADER_SIZE:])


def decode_scores(payload: bytes) -> tuple[np.ndarray, np.ndarray]:
    (count,) = struct.unpack_from("<I", payload)
    if len(payload) != 4 + 5 * count:
        raise ProtocolError(E_MALFORMED, "SCORES reply of the wrong size")
    logp = np.frombuffer(payload, dtype="<f4", count=count, offset=4).astype(np.float32)
    flags = np.frombuffer(payload, dtype=np.uint8, count=count, offset=4 + 4 * count).copy()
    return logp, flags


def encode_lookup(words: list[str]) -> bytes:
    return encode_lines(words)


def decode_lookup(payload: bytes) -> list[str]:
    return decode_lines(payload, "LOOKUP")


def encode_vocab(words: list[str]) -> bytes:
    return encode_lines(words)


def decode_vocab(payload: bytes) -> list[str]:
    return decode_lines(payload, "VOCAB")


def encode_ids(ids: list[int]) -> bytes:
    return struct.pack("<I", len(ids)) + np.asarray(ids, dtype="<u4").tobytes()


def decode_ids(payload: bytes) -> np.ndarray:
    (count,) = struct.unpack_from("<I", payload)
    if len(payload) != 4 + 4 * count:
        raise ProtocolError(E_MALFORMED, "IDS reply of the wrong size")
    return np.frombuffer(payload, dtype="<u4", offset=4).astype(np.int64)


def encode_error(code: int, message: str) -> bytes:
    return struct.pack("<I", code) + message.encode("utf-8")


def decode_error(payload: bytes) -> tuple[int, str]:
    code = struct.unpack_from("<I", payload)[0] if len(payload) >= 4 else 0
    return code, payload[4:].decode("utf-8", "replace")
