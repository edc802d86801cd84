"""Python clients for `cslm serve`: a blocking one and an asyncio one (protocol: docs/cslm.md).

    with Client("127.0.0.1", 5555) as lm:
        ids = lm.lookup(["le", "chat"])
        logp, flags = lm.score(ngrams)           # (N, n) ids -> natural-log probs, flags
        logp, flags = lm.score_text(["<s> le chat"])
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Sequence

import numpy as np

from mtcommon.errors import UserError

from . import protocol as P


class ServerError(ConnectionError):
    """An ERROR reply; the server closes the connection after it."""

    def __init__(self, code: int, message: str):
        super().__init__(f"cslm server error {code}: {message}")
        self.code = code


class VocabularyMismatch(ConnectionError):
    """The server's vocabulary is not the one the client expects (another model)."""


def parse_address(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"expected HOST:PORT, got {addr!r}")
    return host or "127.0.0.1", int(port)


def connect(address: str, model_dir: str | None = None, timeout: float | None = 30.0) -> "Client":
    """A Client for `cslm serve` at HOST:PORT.

    With `model_dir`, the server must serve that model's vocabulary (compared by
    checksum in the handshake), so that ids and scores mean what the caller's
    model directory says.
    """
    host, port = parse_address(address)
    expected = None
    if model_dir:
        from . import modeldir

        modeldir.read_config(model_dir)  # a clear error for a directory that is not a CSLM's
        expected = modeldir.load_vocab(model_dir).checksum()
    try:
        return Client(host, port, timeout=timeout, expected_checksum=expected)
    except VocabularyMismatch as e:
        raise VocabularyMismatch(f"cslm: {address} serves a different vocabulary than {model_dir} ({e})") from None


class Client:
    """One blocking connection; one request in flight at a time. Not shared between threads."""

    def __init__(self, host: str = "127.0.0.1", port: int = 5555, timeout: float | None = 30.0,
                 expected_checksum: str | None = None):
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise ConnectionError(f"cslm: cannot connect to {host}:{port}: {e}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.where = f"{host}:{port}"
        self.timeout = timeout
        self.next_id = 1
        try:
            reply = self._request(P.HELLO, P.encode_hello(), P.HELLO | P.REPLY, max_length=P.HELLO_REPLY.size)
            self.info = P.decode_hello_reply(reply)
        except (P.ProtocolError, ConnectionError) as e:
            self.close()
            if isinstance(e, ServerError):
                raise
            raise ConnectionError(f"cslm: {self.where} is not a cslm server, or speaks another protocol ({e})") from None
        if expected_checksum and expected_checksum != self.info["checksum"]:
            self.close()
            raise VocabularyMismatch(f"cslm: {self.where} serves vocabulary {self.info['checksum']}, "
                                     f"expected {expected_checksum}")
        self.order = self.info["order"]

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except socket.timeout:
                self.close()
                raise ConnectionError(f"cslm: no reply from {self.where} within {self.timeout} s") from None
            if not chunk:
                raise ConnectionError(f"cslm: {self.where} closed the connection")
            buf += chunk
        return bytes(buf)

    def _request(self, type_: int, payload: bytes, expect: int, max_length: int | None = None) -> bytes:
        rid = self.next_id
        self.next_id = (self.next_id % 0xFFFFFFFF) + 1
        self.sock.sendall(P.frame(type_, rid, payload))
        while True:
            length, rtype, got = P.parse_header(self._recv(P.HEADER_SIZE))
            if max_length is not None and (rtype not in (expect, P.ERROR)
                                           or length > (max_length if rtype == expect else 1 << 16)):
                raise P.ProtocolError(P.E_MALFORMED, f"unexpected reply: type 0x{rtype:02x}, {length} bytes")
            body = self._recv(length)
            if rtype == P.ERROR:
                self.close()
                raise ServerError(*P.decode_error(body))
            if got == rid:
                if rtype != expect:
                    raise ConnectionError(f"cslm: unexpected reply type 0x{rtype:02x}")
                return body

    def score(self, ngrams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, n) word ids, predicted word last -> (N,) float32 ln P, (N,) uint8 flags."""
        ngrams = np.asarray(ngrams)
        if len(ngrams) == 0:
            return np.empty(0, np.float32), np.zeros(0, np.uint8)
        return P.decode_scores(self._request(P.SCORE, P.encode_score(ngrams), P.SCORES))

    def score_text(self, ngrams: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """N-grams as space-separated words."""
        if not ngrams:
            return np.empty(0, np.float32), np.zeros(0, np.uint8)
        return P.decode_scores(self._request(P.SCORE_TEXT, P.encode_score_text(list(ngrams)), P.SCORES))

    def lookup(self, words: Sequence[str]) -> np.ndarray:
        if not words:
            return np.zeros(0, np.int64)
        return P.decode_ids(self._request(P.LOOKUP, P.encode_lookup(list(words)), P.LOOKUP | P.REPLY))

    def vocabulary(self) -> list[str]:
        return P.decode_vocab(self._request(P.VOCAB, b"", P.VOCAB | P.REPLY))

    def stats(self) -> dict:
        return json.loads(self._request(P.STATS, b"", P.STATS | P.REPLY))


class AsyncClient:
    """One asyncio connection with any number of requests in flight (replies matched by id)."""

    def __init__(self):
        self.pending: dict[int, asyncio.Future] = {}
        self.next_id = 1
        self.info: dict = {}

    @classmethod
    async def connect(cls, host: str = "127.0.0.1", port: int = 5555) -> "AsyncClient":
        self = cls()
        self.reader, self.writer = await asyncio.open_connection(host, port)
        self.reader_task = asyncio.create_task(self._read_loop())
        self.info = P.decode_hello_reply(await self._request(P.HELLO, P.encode_hello()))
        return self

    async def _read_loop(self) -> None:
        try:
            while True:
                length, rtype, rid = P.parse_header(await self.reader.readexactly(P.HEADER_SIZE))
                body = await self.reader.readexactly(length)
                if rtype == P.ERROR:
                    err = ServerError(*P.decode_error(body))
                    for f in self.pending.values():
                        if not f.done():
                            f.set_exception(err)
                    return
                fut = self.pending.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(body)
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            for f in self.pending.values():
                if not f.done():
                    f.set_exception(ConnectionError(f"cslm: connection lost ({e})"))

    async def _request(self, type_: int, payload: bytes) -> bytes:
        rid = self.next_id
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        self.writer.write(P.frame(type_, rid, payload))
        await self.writer.drain()
        return await fut

    async def score(self, ngrams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return P.decode_scores(await self._request(P.SCORE, P.encode_score(ngrams)))

    async def stats(self) -> dict:
        return json.loads(await self._request(P.STATS, b""))

    async def close(self) -> None:
        self.reader_task.cancel()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, asyncio.CancelledError):
            pass


class RemoteBackend:
    """The Backend of cslm.apply over a server connection (`Client`), sending ids as the C++ client does.

    The server's vocabulary is read once; words become ids here and go as SCORE requests, padded to the
    model's order as the server would pad them. In back-off mode only the server can score a word outside
    the shortlist, from its text: those n-grams go again as SCORE_TEXT, and their answers replace the
    [UNK] class's.
    """

    def __init__(self, client: Client, max_ngrams: int = 100_000):
        from mtcommon.vocab import Vocabulary

        self.client, self.order = client, client.order
        words = client.vocabulary()
        self.vocab = Vocabulary(words, unk=words[client.info["unk_id"]])
        self.bos_id, self.eos_id = client.info["bos_id"], client.info["eos_id"]
        self.backoff = client.info["mode"] == "backoff"
        # n-grams per request: within the server's frame limit
        self.max_ngrams = max(1, min(max_ngrams, (client.info["max_frame_bytes"] - 8) // (4 * self.order)))

    def _rows(self, ngrams) -> np.ndarray:
        rows = np.full((len(ngrams), self.order), self.bos_id, np.int32)
        for i, g in enumerate(ngrams):
            if not 1 <= len(g) <= self.order:
                raise ValueError(f"n-gram {i + 1} has {len(g)} words; allowed 1..{self.order}")
            rows[i, self.order - len(g) :] = self.vocab.encode(g)
        return rows

    def _score(self, rows: np.ndarray, grams) -> tuple[np.ndarray, np.ndarray]:
        """Padded id rows (and, in back-off mode, the word n-grams they came from) -> scores, flags."""
        if not len(rows):
            return np.empty(0, np.float32), np.zeros(0, np.uint8)
        parts = [self.client.score(rows[i : i + self.max_ngrams]) for i in range(0, len(rows), self.max_ngrams)]
        logp, flags = (np.concatenate(p) for p in zip(*parts))
        if self.backoff:
            unknown = np.flatnonzero(flags & P.UNKNOWN)
            for i in range(0, len(unknown), self.max_ngrams):
                at = unknown[i : i + self.max_ngrams]
                logp[at], flags[at] = self.client.score_text([" ".join(grams(j)) for j in at])
        return logp, flags

    def score_words(self, ngrams):
        return self._score(self._rows(ngrams), lambda j: ngrams[j])

    def score_sentences(self, sentences):
        from mtcommon.vocab import BOS, EOS

        from .ngrams import sentence_ngrams

        sentences = [list(s) for s in sentences]
        rows = [sentence_ngrams(self.vocab.encode(s), self.order, self.bos_id, self.eos_id) for s in sentences]
        starts = np.cumsum([0] + [len(r) for r in rows])

        def gram(j):  # the words of n-gram j, for back-off
            k = int(np.searchsorted(starts, j, side="right")) - 1
            return sentence_ngrams(sentences[k], self.order, BOS, EOS)[j - starts[k]]

        logp, flags = self._score(np.concatenate(rows) if rows else np.zeros((0, self.order), np.int32), gram)
        return [(logp[a:b], flags[a:b]) for a, b in zip(starts[:-1], starts[1:])]
