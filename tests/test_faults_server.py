"""`cslm serve` under hostile or careless clients: stalled frames, floods, SIGTERM, a broken model, a busy
port; and the replies byte for byte against the engine. Bounded in time and count: a tiny model, small
frames, a gate that holds the engine where a test needs requests to pile up."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from cslm import protocol as P
from cslm.client import Client, ServerError
from mtcommon.errors import UserError
from mtcommon.finite import check_finite

from test_cslm import cslm_corpus, cslm_model, engine, unigram_arpa  # noqa: F401 (shared session fixtures)
from test_cslm_server import ServerThread, random_ngrams, raw_connection, read_frame, start_server_process

# more rows than the batcher scores on the event loop's own thread: a gated batch holds the worker, not the loop
ROWS = 100


class GatedEngine:
    """The engine, with `score_rows` held until `gate` is set, and every batch's rows recorded."""

    def __init__(self, engine, nonfinite: bool = False):  # noqa: F811
        self.engine, self.nonfinite = engine, nonfinite
        self.gate = threading.Event()
        self.gate.set()
        self.batches: list[np.ndarray] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def score_rows(self, rows):
        self.batches.append(rows.copy())
        assert self.gate.wait(30)
        logp, flags = self.engine.score_rows(rows)
        if self.nonfinite:  # what a model with broken weights gives: the engine's own check refuses it
            logp = logp.copy()
            logp[::2] = np.nan
            check_finite(logp, self.engine.name, f"in a request of {len(logp)} n-grams")
        return logp, flags


def stats(port) -> dict:
    with Client("127.0.0.1", port, timeout=10) as c:
        return c.stats()


def wait_for(predicate, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def score_requests(port) -> int:
    return stats(port)["requests_by_type"].get("score", 0)


# -- replies, byte for byte ------------------------------------------------------------------------------------
def test_replies_are_the_engines_byte_for_byte(engine):  # noqa: F811
    s = ServerThread(engine, cache_size=0)
    try:
        sock = raw_connection(s.port, hello=False)
        sock.sendall(P.frame(P.HELLO, 1, P.encode_hello()))
        v = engine.vocab
        assert read_frame(sock) == (P.HELLO | P.REPLY, 1, P.encode_hello_reply(
            engine.order, len(v), engine.bos_id, engine.eos_id, engine.unk_id, P.DEFAULT_MAX_FRAME, "unk",
            v.checksum()))
        for rid, n in ((2, 1), (3, 4), (4, 7)):
            grams = random_ngrams(engine, 300, n, seed=rid)
            sock.sendall(P.frame(P.SCORE, rid, P.encode_score(grams)))
            assert read_frame(sock) == (P.SCORES, rid, P.encode_scores(*engine.score_ids(grams)))
        text = [["w0"], ["<s>", "w1", "never-seen"], ["w3", "w4", "w5", "w6", "w7", "w8", "w9"]]
        sock.sendall(P.frame(P.SCORE_TEXT, 5, P.encode_score_text([" ".join(g) for g in text])))
        assert read_frame(sock) == (P.SCORES, 5, P.encode_scores(*engine.score_words(text)))
        sock.sendall(P.frame(P.LOOKUP, 6, P.encode_lookup(["w1", "never-seen"])))
        assert read_frame(sock) == (P.LOOKUP | P.REPLY, 6, P.encode_ids(v.encode(["w1", "never-seen"])))
        sock.sendall(P.frame(P.VOCAB, 7))
        assert read_frame(sock) == (P.VOCAB | P.REPLY, 7, P.encode_vocab(v.words))
        sock.close()
    finally:
        s.stop()


def test_the_remote_backend_sends_ids_and_gets_the_engines_numbers(engine, cslm_corpus):  # noqa: F811
    from cslm.client import RemoteBackend

    sentences = [line.split() for line in cslm_corpus.read_text().splitlines()[:30]] + [["w0", "never-seen"]]
    s = ServerThread(engine)
    try:
        with Client("127.0.0.1", s.port) as c:
            remote = RemoteBackend(c)
            got = remote.score_sentences(sentences)
            words = remote.score_words([["w1"], ["w2", "never-seen"]])
            by_type = c.stats()["requests_by_type"]
    finally:
        s.stop()
    for (a, fa), (b, fb) in zip(got, engine.score_sentences(sentences)):
        assert np.array_equal(a, b) and np.array_equal(fa, fb)
    assert all(np.array_equal(x, y) for x, y in zip(words, engine.score_words([["w1"], ["w2", "never-seen"]])))
    assert by_type.get("score") == 2 and "score_text" not in by_type  # ids, as the C++ client sends them


def test_the_remote_backend_backs_off_through_the_server(cslm_model, cslm_corpus, unigram_arpa):  # noqa: F811
    pytest.importorskip("kenlm", reason="back-off mode needs the optional kenlm package")
    from cslm.client import RemoteBackend
    from cslm.engine import Engine

    eng = Engine.load(str(cslm_model), device="cpu", kenlm=str(unigram_arpa))
    sentences = [line.split() for line in cslm_corpus.read_text().splitlines()[:10]] + [["w0", "never-seen"]]
    s = ServerThread(eng)
    try:
        with Client("127.0.0.1", s.port) as c:
            got = RemoteBackend(c).score_sentences(sentences)
    finally:
        s.stop()
    want = eng.score_sentences(sentences)
    assert any((fl & P.BACKOFF).any() for _, fl in want)
    for (a, fa), (b, fb) in zip(got, want):
        assert np.array_equal(a, b) and np.array_equal(fa, fb)


# -- 8. slowloris --------------------------------------------------------------------------------------------------
def test_a_frame_that_stalls_is_closed_at_its_deadline(engine):  # noqa: F811
    s = ServerThread(engine, idle_timeout=30.0, frame_timeout=0.3)
    try:
        sock = raw_connection(s.port)
        sock.sendall(P.frame(P.LOOKUP, 2, P.encode_lookup(["w1"] * 200))[:10])  # ten bytes, then nothing
        assert read_frame(sock) is None  # closed (the socket's own timeout is 5 s)
        assert stats(s.port)["stalled"] == 1
    finally:
        s.stop()


def test_a_frame_larger_than_a_read_piece_is_answered_whole_or_closed_at_its_deadline(engine):  # noqa: F811
    """A payload over READ_PIECE is read piece by piece into one buffer (cslm.server._read_payload): sent in
    uneven parts, it is answered as the engine answers; stalled in the middle, closed at its frame deadline;
    cut by the client, the server serves the next one."""
    from cslm.server import READ_PIECE

    s = ServerThread(engine, cache_size=0, idle_timeout=30.0, frame_timeout=0.5)
    try:
        grams = random_ngrams(engine, 3 * READ_PIECE // 28 + 5, 7, seed=11)  # three pieces and a bit
        frame = P.frame(P.SCORE, 2, P.encode_score(grams))
        sock = raw_connection(s.port)
        for a, b in ((0, 5), (5, P.HEADER_SIZE + 3), (P.HEADER_SIZE + 3, READ_PIECE + 17),
                     (READ_PIECE + 17, 2 * READ_PIECE), (2 * READ_PIECE, len(frame))):
            sock.sendall(frame[a:b])
            time.sleep(0.02)
        assert read_frame(sock) == (P.SCORES, 2, P.encode_scores(*engine.score_ids(grams)))
        sock.sendall(frame[: len(frame) // 2])  # half of it, then nothing
        assert read_frame(sock) is None
        assert stats(s.port)["stalled"] == 1
        sock = raw_connection(s.port)
        sock.sendall(frame[: 2 * READ_PIECE + 3])
        sock.close()  # gone mid-payload
        with Client("127.0.0.1", s.port, timeout=10) as c:
            assert np.array_equal(c.score(grams[:9])[0], engine.score_ids(grams[:9])[0])
    finally:
        s.stop()


def test_connections_stalled_mid_frame_make_room_for_new_clients(engine):  # noqa: F811
    s = ServerThread(engine, max_connections=3, idle_timeout=30.0)
    try:
        frame = P.frame(P.LOOKUP, 2, P.encode_lookup(["w1"] * 200))
        stalled = [raw_connection(s.port) for _ in range(3)]
        for sock in stalled:
            sock.sendall(frame[: P.HEADER_SIZE + 10])  # the header and ten bytes, then nothing
        time.sleep(0.2)  # let the server read those ten bytes
        clients = []
        for k in range(3):  # each newcomer closes the stalled connection active least recently; none is refused
            clients.append(Client("127.0.0.1", s.port, timeout=10))
            assert clients[-1].lookup(["w2"]).tolist() == engine.vocab.encode(["w2"])
            assert read_frame(stalled[k]) is None
        for c in clients:
            c.close()
        st = stats(s.port)["connection_limit"]
        assert st["refused"] == 0 and st["evicted"] >= 3
    finally:
        s.stop()


# -- 9, 10. caps per connection and in all, fairness -------------------------------------------------------------
# a request of ROWS 7-grams: its 2,808-byte payload, its scores and flags, and its 1,516-byte reply
HELD = 8 + 28 * ROWS + 10 * ROWS + P.HEADER_SIZE + 4


def test_a_score_request_holds_its_payload_its_scores_and_its_reply():
    grams = np.arange(5 * 3, dtype=np.int32).reshape(5, 3)
    for type_, payload in ((P.SCORE, P.encode_score(grams)),
                           (P.SCORE_TEXT, P.encode_score_text([" ".join(map(str, g)) for g in grams]))):
        reply = P.scores_frame(1, np.zeros(5, np.float32), np.zeros(5, np.uint8))
        rows = 4 * 7 * 5 if type_ == P.SCORE_TEXT else 0  # a text request's ids, padded to the order
        assert P.held_bytes(type_, len(payload), payload[:P.COUNT_PREFIX[type_]], 7) == \
            len(payload) + 5 * 5 + len(reply) + rows
    # a count its payload cannot carry is bounded by what it can (decoding the payload then rejects it)
    lie = P.encode_score(grams)[:8] + bytes(12)
    assert P.held_bytes(P.SCORE, len(lie), lie[:8], 7) == len(lie) + 10 * 3 + P.HEADER_SIZE + 4
    assert P.held_bytes(P.STATS, 0, b"", 7) == 0


@pytest.mark.parametrize("cap", [{"max_pending": 2}, {"max_frame": 3000, "max_conn_bytes": 2 * HELD + 100}])
def test_a_connection_that_floods_is_read_no_further_than_its_caps(engine, cap):  # noqa: F811
    gated = GatedEngine(engine)
    gated.gate.clear()
    s = ServerThread(gated, cache_size=0, **cap)
    try:
        frames = [random_ngrams(engine, ROWS, 7, seed=k) for k in range(8)]
        sock = raw_connection(s.port)
        sock.sendall(b"".join(P.frame(P.SCORE, 10 + k, P.encode_score(g)) for k, g in enumerate(frames)))
        wait_for(lambda: score_requests(s.port) >= 2, "two requests read")
        time.sleep(0.3)  # time to read more, were the caps not there
        st = stats(s.port)
        assert st["requests_by_type"]["score"] == 2, st["requests_by_type"]
        assert st["buffered_bytes"]["peak"] <= s.srv.cfg.max_conn_bytes
        gated.gate.set()
        for k, g in enumerate(frames):  # every request answered, in order
            assert read_frame(sock) == (P.SCORES, 10 + k, P.encode_scores(*engine.score_ids(g)))
        sock.close()
    finally:
        gated.gate.set()
        s.stop()


def test_unfinished_frames_hold_no_more_than_the_global_cap(engine):  # noqa: F811
    frame = P.frame(P.SCORE, 3, P.encode_score(random_ngrams(engine, ROWS, 7, seed=3)))  # 2,808-byte payload
    # each connection's request alone holds more than its cap (admitted all the same); two fit the global one
    s = ServerThread(engine, max_frame=3000, max_conn_bytes=3000, max_total_bytes=2 * HELD + 100)
    try:
        socks = [raw_connection(s.port) for _ in range(4)]
        for sock in socks:
            sock.sendall(frame[:-1])  # all but its last byte
        wait_for(lambda: stats(s.port)["buffered_bytes"]["now"] == 2 * HELD, "two frames admitted")
        time.sleep(0.3)
        held = stats(s.port)["buffered_bytes"]
        assert held["now"] == 2 * HELD and held["peak"] <= 2 * HELD + 100, held  # two of four
        for sock in socks:  # each finished frame makes room for the next
            sock.sendall(frame[-1:])
        for sock in socks:
            assert read_frame(sock)[:2] == (P.SCORES, 3)
            sock.close()
    finally:
        s.stop()


def test_a_flooding_connection_does_not_hold_up_another_clients_request(engine):  # noqa: F811
    """One connection pipelines twelve requests of 2,000 n-grams; another's one request is scored in the
    batch after the one being computed, not after the flood (batches of 256: the flood is 94 batches)."""
    gated = GatedEngine(engine)
    gated.gate.clear()
    s = ServerThread(gated, cache_size=0, max_batch=256)
    try:
        flood = [random_ngrams(engine, 2000, 7, seed=100 + k) for k in range(12)]
        hog = raw_connection(s.port)
        hog.sendall(b"".join(P.frame(P.SCORE, k + 1, P.encode_score(g)) for k, g in enumerate(flood)))
        wait_for(lambda: score_requests(s.port) == 12 and len(gated.batches) == 1, "the flood read")
        mine = np.full((1, 7), 3, np.int32)
        other = raw_connection(s.port)
        other.sendall(P.frame(P.SCORE, 99, P.encode_score(mine)))
        wait_for(lambda: score_requests(s.port) == 13, "the other request read")
        gated.gate.set()
        assert read_frame(other) == (P.SCORES, 99, P.encode_scores(*engine.score_ids(mine)))
        at = next(i for i, b in enumerate(gated.batches) if (b == mine[0]).all(axis=1).any())
        assert at <= 2, f"scored in batch {at} of {len(gated.batches)}"
        for k, g in enumerate(flood):
            assert read_frame(hog) == (P.SCORES, k + 1, P.encode_scores(*engine.score_ids(g)))
        hog.close()
        other.close()
    finally:
        gated.gate.set()
        s.stop()


# -- 11. --max-delay-us ----------------------------------------------------------------------------------------------
def test_the_batching_delay_is_bounded_and_waited_without_spinning(engine, cslm_model):  # noqa: F811
    from cslm.limits import MAX_DELAY_US, ServerConfig

    with pytest.raises(UserError, match="--max-delay-us must be within 0..10000"):
        ServerConfig(max_delay=3.0)
    r = subprocess.run([sys.executable, "-m", "cslm.cli", "serve", str(cslm_model), "--max-delay-us", "3000000"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--max-delay-us" in r.stderr and "Traceback" not in r.stderr
    # an idle second connection makes every request wait the whole delay: the loop sleeps through it
    s = ServerThread(engine, max_delay=MAX_DELAY_US * 1e-6)
    try:
        idle = raw_connection(s.port)

        async def cpu():
            return time.thread_time()

        def loop_cpu():
            return asyncio.run_coroutine_threadsafe(cpu(), s.loop).result(10)

        grams = random_ngrams(engine, 4, 7, seed=5)
        with Client("127.0.0.1", s.port) as c:
            c.score(grams)
            before, t0 = loop_cpu(), time.monotonic()
            for _ in range(10):
                assert np.array_equal(c.score(grams)[0], engine.score_ids(grams)[0])
            waited, used = time.monotonic() - t0, loop_cpu() - before
        assert waited >= 10 * MAX_DELAY_US * 1e-6  # each request did wait
        assert used < 0.5 * waited, (used, waited)  # a busy poll spends the whole wait on the CPU
        idle.close()
    finally:
        s.stop()


# -- 12. SIGTERM ---------------------------------------------------------------------------------------------------
def test_sigterm_answers_every_request_read_and_exits_cleanly(cslm_model, engine, tmp_path):  # noqa: F811
    proc, port = start_server_process(cslm_model, tmp_path)
    answered, refused, errors = [0] * 8, [0] * 8, []
    started = threading.Barrier(9)

    def client(k):
        grams = random_ngrams(engine, 3000, 7, seed=k)
        try:
            c = Client("127.0.0.1", port, timeout=30)
        except ConnectionError as e:
            errors.append(repr(e))
            started.wait()
            return
        started.wait()
        try:
            while True:
                c.score(grams)
                answered[k] += 1
        except ServerError as e:
            if e.code == P.E_SHUTTING_DOWN:
                refused[k] += 1
            else:
                errors.append(repr(e))
        except (ConnectionError, OSError):
            pass  # closed between two requests
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    try:
        started.wait(30)
        wait_for(lambda: sum(answered) >= 16, "requests answered")
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert "Traceback" not in err and not errors, (err, errors)
    assert not (tmp_path / "port").exists()  # no port file left to name a port no longer served
    # every score request the server read was answered: its own count is the clients'
    read = int(err.split(" score requests")[0].rsplit(" ", 1)[1])
    assert read == sum(answered), (read, answered, refused, err)


# -- 21, 42: start-up errors ----------------------------------------------------------------------------------------
def test_a_port_file_in_a_missing_folder_is_refused_before_anything_is_announced(cslm_model, tmp_path):  # noqa: F811
    port_file = tmp_path / "no-such-folder" / "port"
    r = subprocess.run([sys.executable, "-m", "cslm.cli", "serve", str(cslm_model), "--port", "0", "--port-file",
                        str(port_file)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "serving" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [f"Error: --port-file {port_file}: no such folder {port_file.parent}"]


def test_a_busy_port_is_one_line_naming_it(cslm_model):  # noqa: F811
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "cslm.cli", "serve", str(cslm_model), "--port", str(port),
                            "--device", "cpu"], capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "Errno" not in r.stderr, r.stderr
    assert lines[0].startswith(f"Error: cannot listen on 127.0.0.1:{port}: address already in use"), lines


# -- 3: non-finite scores ---------------------------------------------------------------------------------------------
def test_non_finite_scores_are_refused_not_sent(engine, capsys):  # noqa: F811
    s = ServerThread(GatedEngine(engine, nonfinite=True), cache_size=0)
    try:
        with Client("127.0.0.1", s.port) as c:
            with pytest.raises(ServerError, match="non-finite scores") as e:
                c.score(random_ngrams(engine, 10, 7, seed=1))
        assert e.value.code == P.E_INTERNAL
    finally:
        s.stop()
    err = capsys.readouterr().err
    assert "non-finite scores (nan in a request of 10 n-grams); answered with an error" in err, err


# -- E_SHUTTING_DOWN --------------------------------------------------------------------------------------------------
def test_a_frame_arriving_during_shutdown_gets_shutting_down(engine):  # noqa: F811
    gated = GatedEngine(engine)
    gated.gate.clear()
    s = ServerThread(gated, cache_size=0)
    try:
        grams = random_ngrams(engine, ROWS, 7, seed=8)
        sock = raw_connection(s.port)
        sock.sendall(P.frame(P.SCORE, 1, P.encode_score(grams)))
        wait_for(lambda: len(gated.batches) == 1, "the request in the engine")
        s.loop.call_soon_threadsafe(s.srv.request_shutdown)
        wait_for(lambda: s.srv.closing, "the shutdown")
        sock.sendall(P.frame(P.SCORE, 2, P.encode_score(grams)))
        time.sleep(0.2)
        gated.gate.set()
        assert read_frame(sock) == (P.SCORES, 1, P.encode_scores(*engine.score_ids(grams)))
        reply = read_frame(sock)
        assert reply[:2] == (P.ERROR, 2) and P.decode_error(reply[2])[0] == P.E_SHUTTING_DOWN == 7
        assert read_frame(sock) is None
    finally:
        gated.gate.set()
        s.thread.join(10)
