"""The CSLM server: same answers as the engine, concurrency, robustness to bad frames, SIGTERM, C++ client."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cslm import protocol as P
from cslm.client import AsyncClient, Client, ServerError
from cslm.engine import Engine
from cslm.server import Server, ServerConfig

from test_cslm import cslm_corpus, cslm_model, engine, unigram_arpa  # noqa: F401 (shared session fixtures)

ROOT = Path(__file__).resolve().parents[1]
CPP = ROOT / "cslm" / "cpp"


class ServerThread:
    """A server on an ephemeral port, running its own event loop in a background thread."""

    def __init__(self, engine: Engine, **cfg):
        self.srv = Server(engine, ServerConfig(port=0, **cfg))
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _run(self):
        async def main():
            self.port = await self.srv.start()
            self.ready.set()
            await self.srv.wait_closed()

        self.loop.run_until_complete(main())

    def stop(self):
        self.loop.call_soon_threadsafe(self.srv.request_shutdown)
        self.thread.join(10)


@pytest.fixture(scope="module")
def server(engine):  # noqa: F811
    s = ServerThread(engine, idle_timeout=30.0)
    yield s
    s.stop()


def random_ngrams(engine, count, n, seed):  # noqa: F811
    return np.random.default_rng(seed).integers(0, len(engine.vocab), size=(count, n)).astype(np.int32)


def raw_connection(port, hello=True):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if hello:
        sock.sendall(P.frame(P.HELLO, 1, P.encode_hello()))
        read_frame(sock)
    return sock


def read_frame(sock):
    """-> (type, request id, payload), or None once the server closed the connection."""
    head = b""
    while len(head) < P.HEADER_SIZE:
        chunk = sock.recv(P.HEADER_SIZE - len(head))
        if not chunk:
            return None
        head += chunk
    length, type_, rid = P.parse_header(head)
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            return None
        body += chunk
    return type_, rid, body


def expect_error_and_close(sock, code):
    reply = read_frame(sock)
    assert reply is not None and reply[0] == P.ERROR, reply
    assert P.decode_error(reply[2])[0] == code, P.decode_error(reply[2])
    assert read_frame(sock) is None  # closed after the error
    sock.close()


def assert_alive(server, engine):  # noqa: F811
    grams = random_ngrams(engine, 20, 7, seed=99)
    with Client("127.0.0.1", server.port, timeout=10) as c:
        logp, _ = c.score(grams)
    assert np.array_equal(logp, engine.score_ids(grams)[0])


# -- answers ------------------------------------------------------------------------
def test_handshake_describes_the_model(server, engine):  # noqa: F811
    with Client("127.0.0.1", server.port, expected_checksum=engine.vocab.checksum()) as c:
        assert c.info["order"] == 7 and c.info["vocab_size"] == len(engine.vocab)
        assert (c.info["bos_id"], c.info["eos_id"], c.info["unk_id"]) == (engine.bos_id, engine.eos_id, engine.unk_id)
        assert c.info["mode"] == "unk" and c.info["version"] == P.VERSION
        assert c.vocabulary() == engine.vocab.words
        assert c.lookup(["w0", "not-a-word", "</s>"]).tolist() == engine.vocab.encode(["w0", "not-a-word", "</s>"])
    with pytest.raises(ConnectionError, match="expected"):
        Client("127.0.0.1", server.port, expected_checksum="00" * 32)


@pytest.mark.parametrize("n", [1, 3, 7])
def test_server_answers_equal_the_engine(server, engine, n):  # noqa: F811
    grams = random_ngrams(engine, 3000, n, seed=n)
    grams[:500, :-1] = grams[0, :-1]
    with Client("127.0.0.1", server.port) as c:
        logp, flags = c.score(grams)
        want, want_flags = engine.score_ids(grams)
        assert np.array_equal(logp, want) and np.array_equal(flags, want_flags)
        text = [" ".join(engine.vocab.decode(g)) for g in grams[:200]]
        tlp, tfl = c.score_text(text)
        assert np.array_equal(tlp, want[:200]) and np.array_equal(tfl, want_flags[:200])


def test_a_scores_frame_is_laid_out_as_specified():
    """docs/cslm.md: header (length, type, flags, reserved, id), then count, float32 scores, uint8 flags."""
    logp = np.array([-1.5, -0.25, -7.0], np.float64)  # converted to float32 on the wire
    flags = np.array([0, P.UNKNOWN, P.BACKOFF], np.uint8)
    frame = bytes(P.scores_frame(42, logp, flags))
    assert frame == struct.pack("<IBBHII3f3B", 4 + 5 * 3, P.SCORES, 0, 0, 42, 3, *logp, *flags)
    assert P.decode_scores(frame[P.HEADER_SIZE:]) == (pytest.approx(logp), pytest.approx(flags))
    assert P.encode_scores(logp, flags) == frame[P.HEADER_SIZE:]
    assert bytes(P.scores_frame(7, logp[:0], flags[:0])) == struct.pack("<IBBHII", 4, P.SCORES, 0, 0, 7, 0)


def test_cache_hits_return_the_same_numbers(engine):  # noqa: F811
    grams = random_ngrams(engine, 400, 7, seed=7)
    server = ServerThread(engine, cache_size=100_000)
    try:
        with Client("127.0.0.1", server.port) as c:
            before = c.stats()["cache"]["hits"]
            first, _ = c.score(grams)
            second, _ = c.score(grams)
            stats = c.stats()
    finally:
        server.stop()
    assert np.array_equal(first, second)
    assert stats["cache"]["hits"] - before >= 400
    assert stats["latency_ms"]["p50"] > 0 and stats["requests_by_type"]["score"] >= 2


def test_concurrent_clients_get_their_own_answers(server, engine):  # noqa: F811
    def worker(k):
        with Client("127.0.0.1", server.port) as c:
            for r in range(5):
                grams = random_ngrams(engine, 50 + 13 * k, 7, seed=1000 * k + r)
                logp, _ = c.score(grams)
                assert np.array_equal(logp, engine.score_ids(grams)[0]), (k, r)
        return k

    with ThreadPoolExecutor(12) as pool:
        assert sorted(pool.map(worker, range(12))) == list(range(12))


def test_pipelined_requests_are_matched_by_id(server, engine):  # noqa: F811
    batches = [random_ngrams(engine, 10 + i, 7, seed=500 + i) for i in range(40)]

    async def go():
        c = await AsyncClient.connect("127.0.0.1", server.port)
        try:
            before = await c.stats()
            return before, await asyncio.gather(*(c.score(b) for b in batches)), await c.stats()
        finally:
            await c.close()

    before, results, after = asyncio.run(go())
    for b, (logp, _) in zip(batches, results):
        assert np.array_equal(logp, engine.score_ids(b)[0])
    # every request counted once, with its n-grams; no other client was talking meanwhile
    assert after["requests_by_type"]["score"] - before["requests_by_type"].get("score", 0) == 40
    assert after["ngrams"] - before["ngrams"] == sum(len(b) for b in batches) == 40 * 10 + 780
    assert 1 <= after["batches"] - before["batches"] <= 40


def test_stats_count_a_known_sequence_exactly(engine):  # noqa: F811
    s = ServerThread(engine, cache_size=1000)
    try:
        a, b = random_ngrams(engine, 10, 7, seed=1), random_ngrams(engine, 25, 7, seed=2)
        with Client("127.0.0.1", s.port) as c:
            c.score(a)
            c.score(b)
            c.score(a[:4])  # all four from the cache
            c.score_text(["w0 w1", "w2"])
            c.lookup(["w0"])
            st = c.stats()
    finally:
        s.stop()
    assert st["requests_by_type"] == {"hello": 1, "score": 3, "score_text": 1, "lookup": 1, "stats": 1}
    assert st["requests"] == 7 and st["ngrams"] == 10 + 25 + 4 + 2
    # one blocking client: each score request is a batch of its own
    assert st["batches"] == 4 and st["batch_ngrams"] == {"mean": 10.2, "max": 25, "requests_per_batch": 1.0}
    distinct = len({g.tobytes() for g in np.concatenate([a, b])})
    assert st["cache"]["hits"] == 4 + (35 - distinct) and st["cache"]["misses"] == distinct + 2
    assert st["cache"]["size"] == distinct + 2 and st["errors"] == 0
    assert st["connections"] == {"open": 1, "total": 1} and st["latency_ms"]["window"] == 4
    # one engine call a batch, each inside its request's latency
    assert st["compute_ms"]["window"] == 4 and 0 < st["compute_ms"]["max"] <= st["latency_ms"]["max"]


def test_a_batch_waits_only_while_more_rows_would_pay():
    """A batch waits for an idle connection's requests while it is smaller than the scorer's full batch (the
    C++ evaluator's), or than max_batch where the scorer has none (torch). A request the batcher would score at
    once and alone is scored on the caller's thread: a small one (INLINE_ROWS) from a lone connection, and with
    the C++ evaluator one of up to INLINE_FULL_BATCHES full batches, from a lone connection or a full batch."""
    from cslm.batcher import INLINE_FULL_BATCHES, INLINE_ROWS, Batcher
    from cslm.stats import Stats

    def scorer(rows):
        return np.zeros(len(rows), np.float32), np.zeros(len(rows), np.uint8)

    def rows(n):
        return np.zeros((n, 7), np.int32)

    async def main():
        later = time.monotonic() + 60
        full, plain = Batcher(scorer, 8192, 0.01, Stats(), 512), Batcher(scorer, 8192, 0.01, Stats())
        try:
            for b in (full, plain):
                b.attach()
                most = INLINE_FULL_BATCHES * 512 if b is full else INLINE_ROWS
                assert b.takes_now(INLINE_ROWS) and b.takes_now(most) and not b.takes_now(most + 1)
                b.attach()  # one connection sends, another is idle
                assert b.takes_now(INLINE_ROWS) is False
                assert b.takes_now(511) is False and b.takes_now(512) == (b is full)  # a full batch would not wait
                b.submit(rows(511), "a")
                assert b._should_wait(later)
                b.submit(rows(1), "a")
                assert b._should_wait(later) == (b is plain)  # 512 rows: full for the C++ evaluator
                b.submit(rows(8192 - 512), "a")
                assert not b._should_wait(later)  # max_batch: full for any scorer
                assert not b._should_wait(time.monotonic())  # the delay is over
        finally:
            full.close()
            plain.close()

    asyncio.run(main())


def test_a_self_normalized_server_keeps_histories_and_answers_as_the_engine(cslm_model):  # noqa: F811
    """The self-normalised server with torch's evaluator scores through its history cache (STATS counts it),
    small requests of a lone client on the fast path and larger ones through the batcher, and answers what the
    engine does (the C++ evaluator: test_cslm_native.py)."""
    engine = Engine.load(str(cslm_model), device="cpu", normalized=False)
    reference = Engine.load(str(cslm_model), device="cpu", normalized=False)
    s = ServerThread(engine, cache_size=0, evaluator="torch", history_cache=1000)
    try:
        grams = random_ngrams(engine, 300, 7, seed=3)
        grams[100:, :-1] = grams[:200, :-1]  # the later n-grams repeat earlier histories
        with Client("127.0.0.1", s.port) as c, Client("127.0.0.1", s.port) as d:
            for client, part in ((c, grams[:100]), (d, grams[100:120]), (c, grams[120:])):
                assert np.array_equal(client.score(part)[0], reference.score_ids(part)[0])
            st = c.stats()
    finally:
        s.stop()
    assert st["model"]["scores"] == "self-normalized"
    hc = st["history_cache"]
    assert hc["capacity"] == 1000 and hc["hits"] > 0 and hc["hits"] + hc["misses"] >= len(np.unique(grams[:, :-1], axis=0))


# -- robustness ---------------------------------------------------------------------
def test_oversized_frame_is_refused(engine):  # noqa: F811
    s = ServerThread(engine, max_frame=1024)
    try:
        sock = raw_connection(s.port)
        sock.sendall(P.HEADER.pack(1 << 30, P.SCORE, 0, 0, 5))
        expect_error_and_close(sock, P.E_TOO_LARGE)
        with Client("127.0.0.1", s.port) as c:
            with pytest.raises(ServerError, match="exceeds"):
                c.score(np.zeros((300, 7), np.int32))
        assert_alive(s, engine)
    finally:
        s.stop()


@pytest.mark.parametrize("name,hello,frame,code", [
    ("no handshake", False, P.frame(P.SCORE, 2, P.encode_score(np.zeros((1, 7), np.int32))), P.E_NO_HANDSHAKE),
    ("bad magic", False, P.frame(P.HELLO, 2, b"XXXX\x01\x00\x00\x00"), P.E_VERSION),
    ("bad version", False, P.frame(P.HELLO, 2, b"CSLM\x09\x00\x00\x00"), P.E_VERSION),
    ("unknown type", True, P.frame(0x42, 2, b""), P.E_UNKNOWN_TYPE),
    ("short SCORE", True, P.frame(P.SCORE, 2, struct.pack("<II", 5, 7) + b"\0" * 12), P.E_MALFORMED),
    ("n too large", True, P.frame(P.SCORE, 2, struct.pack("<II", 1, 8) + b"\0" * 32), P.E_BAD_REQUEST),
    ("id out of range", True, P.frame(P.SCORE, 2, P.encode_score(np.full((1, 7), 10**6))), P.E_BAD_REQUEST),
    ("bad UTF-8", True, P.frame(P.SCORE_TEXT, 2, struct.pack("<I", 1) + b"w0 \xff"), P.E_MALFORMED),
    ("count mismatch", True, P.frame(P.LOOKUP, 2, struct.pack("<I", 3) + b"a\nb"), P.E_MALFORMED),
    ("empty word", True, P.frame(P.SCORE_TEXT, 2, struct.pack("<I", 1) + b"w0  w1"), P.E_BAD_REQUEST),
])
def test_malformed_frames_get_an_error_and_a_close(server, engine, name, hello, frame, code):  # noqa: F811
    sock = raw_connection(server.port, hello=hello)
    sock.sendall(frame)
    expect_error_and_close(sock, code)
    assert_alive(server, engine)


def test_truncated_frames_and_abrupt_disconnects(server, engine):  # noqa: F811
    full = P.frame(P.SCORE, 3, P.encode_score(random_ngrams(engine, 2000, 7, seed=3)))
    for cut in (5, P.HEADER_SIZE, P.HEADER_SIZE + 7, len(full) - 1, len(full)):
        sock = raw_connection(server.port)
        sock.sendall(full[:cut])
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
        sock.close()
    assert_alive(server, engine)


def test_idle_connections_time_out(engine):  # noqa: F811
    s = ServerThread(engine, idle_timeout=0.3)
    try:
        sock = raw_connection(s.port)
        t0 = time.monotonic()
        assert read_frame(sock) is None
        assert 0.2 < time.monotonic() - t0 < 5
    finally:
        s.stop()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(hello=st.booleans(), junk=st.one_of(
    st.binary(max_size=64),
    st.builds(lambda t, n, body: P.HEADER.pack(n, t, 0, 0, 9) + body,
              st.integers(0, 255), st.integers(0, 4096), st.binary(max_size=80)),
    st.builds(lambda c, n, ids: P.frame(P.SCORE, 4, struct.pack("<II", c, n) + ids),
              st.integers(0, 2**32 - 1), st.integers(0, 9), st.binary(max_size=64)),
), abrupt=st.booleans())
def test_fuzzed_frames_never_take_the_server_down(server, engine, hello, junk, abrupt):  # noqa: F811
    sock = raw_connection(server.port, hello=hello)
    try:
        sock.sendall(junk)
        if abrupt:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(5)
            while read_frame(sock) is not None:  # replies, maybe an error, then the close
                pass
    except OSError:
        pass
    finally:
        sock.close()
    assert_alive(server, engine)


# -- the real process: SIGTERM, the C++ client ------------------------------------------
def start_server_process(model_dir, tmp_path, *extra):
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cslm.cli", "serve", str(model_dir), "--port", "0", "--port-file", str(port_file),
         "--device", "cpu", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"server did not start: {proc.communicate()[1]}")
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def test_sigterm_drains_in_flight_requests(cslm_model, engine, tmp_path):  # noqa: F811
    # One thread, as the `engine` fixture (conftest). The drain may cut the request into other batches than
    # the engine's single call, and torch's products need not sum alike for other batch sizes, so the scores
    # are compared to the last bits of a float32 (one of 20,000 once differed by 1e-5), not bit for bit: what
    # is tested is that the in-flight request is answered whole, in order, before the server stops.
    proc, port = start_server_process(cslm_model, tmp_path, "--threads", "1")
    try:
        grams = random_ngrams(engine, 20000, 7, seed=11)
        sock = raw_connection(port)
        sock.sendall(P.frame(P.SCORE, 77, P.encode_score(grams)))
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        reply = read_frame(sock)
        assert reply is not None and reply[:2] == (P.SCORES, 77)
        np.testing.assert_allclose(P.decode_scores(reply[2])[0], engine.score_ids(grams)[0], rtol=1e-5, atol=0)
        assert proc.wait(30) == 0
        err = proc.stderr.read()
        assert err.startswith(f"cslm: serving {cslm_model} on 127.0.0.1:{port} (order 7, 60 words, mode unk, "
                              "device cpu)\n"), err
        assert "server stopped after" in err and "1 score requests, 20000 n-grams" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cli_score_through_the_server_prints_the_same(cslm_model, cslm_corpus, tmp_path):  # noqa: F811
    proc, port = start_server_process(cslm_model, tmp_path)
    try:
        head = tmp_path / "head.txt"
        head.write_text("".join(cslm_corpus.read_text().splitlines(True)[:40]) + "w0 never-seen w1\n")
        run = lambda *a: subprocess.run([sys.executable, "-m", "cslm.cli", "score", *a, "--per-word", "--quiet"],  # noqa: E731
                                        capture_output=True, text=True)
        local = run(str(cslm_model), str(head), "--device", "cpu")
        remote = run("--server", f"127.0.0.1:{port}", str(head))
        assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
        assert local.stdout == remote.stdout and len(local.stdout.splitlines()) == 41

        # the C++ client: compiled with the system compiler, run against the live server
        cxx = shutil.which("g++") or shutil.which("c++")
        if cxx is None:
            pytest.skip("no C++ compiler")
        exe = tmp_path / "cslm_client_test"
        subprocess.run([cxx, "-std=c++11", "-Wall", "-Wextra", "-Werror", "-O1", "-o", str(exe),
                        str(CPP / "cslm_client.cc"), str(CPP / "cslm_client_test.cc")], check=True)
        sentences = [line.split() for line in head.read_text().splitlines()[:10]]
        r = subprocess.run([str(exe), "127.0.0.1", str(port)], input="\n".join(" ".join(s) for s in sentences) + "\n",
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out = r.stdout.splitlines()
        assert out[0].startswith("order 7 vocab 60 bos 1 eos 0 unk 2 mode 0 checksum ")
        assert out[-1] == "ok"
        eng = Engine.load(str(cslm_model), device="cpu")
        want = [f"{lp:.6f} {fl}" for s in eng.score_sentences(sentences) for lp, fl in zip(*(a.tolist() for a in s))]
        assert out[1:-1] == want
    finally:
        proc.terminate()
        proc.wait(30)


def closed_port() -> int:
    """A port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cpp_client_reports_connect_failure(tmp_path):
    """The compiled C++ client against a closed port: ConnectError, named host and port, exit 1, at once."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path / "cslm_client_test"
    subprocess.run([cxx, "-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O1", "-o", str(exe),
                    str(CPP / "cslm_client.cc"), str(CPP / "cslm_client_test.cc")], check=True, timeout=120)
    port = closed_port()
    t0 = time.monotonic()
    r = subprocess.run([str(exe), "127.0.0.1", str(port)], input="", capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"error: cslm: cannot connect to 127.0.0.1:{port}: "), r.stderr
    assert "refused" in r.stderr.lower() and time.monotonic() - t0 < 5


def test_python_client_errors_are_one_clear_line(cslm_model, engine, server, tmp_path):  # noqa: F811
    from cslm.client import VocabularyMismatch, connect

    port = closed_port()
    with pytest.raises(ConnectionError, match=f"cannot connect to 127.0.0.1:{port}"):
        connect(f"127.0.0.1:{port}")
    # something that is not a cslm server: an HTTP-like reply, then silence
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def other_server(reply, done):
        conn, _ = listener.accept()
        conn.recv(64)
        conn.sendall(reply)
        done.wait(10)  # the connection stays open
        conn.close()

    for reply, what in [(b"HTTP/1.1 400 Bad Request\r\n\r\n", "is not a cslm server"),
                        (b"", "no reply from")]:
        done = threading.Event()
        t = threading.Thread(target=other_server, args=(reply, done), daemon=True)
        t.start()
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match=what):
            connect(f"127.0.0.1:{listener.getsockname()[1]}", timeout=0.5)
        assert time.monotonic() - t0 < 2.5  # no wait for a 1.3 GB "frame", nor for the peer to hang up
        done.set()
        t.join()
    listener.close()
    # a model directory whose vocabulary is not the server's
    other = tmp_path / "other"
    shutil.copytree(cslm_model, other)
    words = (other / "cslm.vocab").read_text(encoding="utf-8").splitlines()
    words[-1], words[-2] = words[-2], words[-1]
    (other / "cslm.vocab").write_text("\n".join(words) + "\n", encoding="utf-8")
    with pytest.raises(VocabularyMismatch, match=f"serves a different vocabulary than {other}"):
        connect(f"127.0.0.1:{server.port}", model_dir=str(other))
    with connect(f"127.0.0.1:{server.port}", model_dir=str(cslm_model)) as c:
        assert c.info["checksum"] == engine.vocab.checksum()


def test_mixture_through_a_server_equals_the_one_in_process(server, engine, cslm_corpus, unigram_arpa):  # noqa: F811
    """cslm.mix reads the network from wherever it is: the server's numbers, mixed with the same KenLM
    model on the client's side, are the in-process mixture's."""
    pytest.importorskip("kenlm", reason="interpolation needs the optional kenlm package")
    from cslm.apply import RemoteBackend
    from cslm.engine import KenLMBackoff
    from cslm.mix import MixedBackend

    lm = KenLMBackoff(str(unigram_arpa))
    sentences = [line.split() for line in cslm_corpus.read_text().splitlines()[:20]] + [["w0", "never-seen", "w1"]]
    with Client("127.0.0.1", server.port) as client:
        remote = MixedBackend(RemoteBackend(client), lm, 0.7).score_sentences(sentences)
    local = MixedBackend(engine, lm, 0.7).score_sentences(sentences)
    for (a, fa), (b, fb) in zip(remote, local):
        assert np.array_equal(fa, fb) and np.allclose(a, b, rtol=0, atol=1e-6)
