"""The self-normalised scores as CUDA graphs over fixed batch sizes (cslm/graphs.py): on a CPU the same buckets,
staging and parts run eagerly, and the server's choice of evaluator refuses them where they do not apply."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from cslm import engine as engine_module
from cslm import graphs
from cslm.client import Client
from cslm.engine import Engine
from cslm.graphs import GraphScorer, buckets
from cslm.model import CSLM, preset_config
from cslm.stats import startup_message
from mtcommon.errors import UserError

from test_cslm_local import model_dir  # noqa: F401 (a self-normalised model, shared within the module)
from test_cslm_server import ServerThread, random_ngrams


def test_buckets_are_powers_of_two_up_to_the_largest_batch():
    assert buckets(8192) == [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert buckets(1000) == [64, 128, 256, 512, 1000]
    assert buckets(10) == [10]
    model = CSLM(preset_config("tiny", vocab_size=20)).eval()
    assert GraphScorer(model, None, torch.device("cpu"), max_rows=10**6).sizes[-1] == graphs.MAX_ROWS == 16384
    with pytest.raises(ValueError):
        buckets(0)


@pytest.mark.parametrize("sizes", [(1, 63, 64, 65, 200), (1000,), (5000, 3)])
def test_buckets_answer_as_the_engines_eager_path(model_dir, sizes):  # noqa: F811
    """Calls of every size (one row, a bucket's edge, several parts of the largest bucket, more rows than the
    staging buffer holds: 4,096 for a largest bucket of 128) score each row as the engine's eager path does,
    within float rounding, whatever came before in the same buckets."""
    out, _, _ = model_dir
    engine = Engine.load(str(out), device="cpu", normalized=False)
    scorer = GraphScorer(engine.model, engine.tables, engine.device, max_rows=128)
    assert len(scorer._rows_host) == 4096 and scorer.sizes == [64, 128]
    for i, n in enumerate(sizes):
        rows = engine.pad(random_ngrams(engine, n, 7, seed=i))
        want = engine.score_rows(rows)[0]
        got = scorer.score(rows)
        assert got.dtype == np.float32 and got.shape == (n,)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_exact_scores_through_the_buckets_are_the_engines(model_dir):  # noqa: F811
    """Without tables the graphs compute exact log-probabilities, o_w - ln Z (Eq. (2)), as the eager path does."""
    out, _, _ = model_dir
    engine = Engine.load(str(out), device="cpu")
    scorer = GraphScorer(engine.model, None, engine.device, max_rows=256)
    rows = engine.pad(random_ngrams(engine, 700, 7, seed=8))
    want = engine.score_rows(rows)[0]
    assert scorer.normalized and np.all(want < 0)
    np.testing.assert_allclose(scorer.score(rows), want, rtol=0, atol=1e-5)


def test_a_joint_model_takes_its_source_window_through_the_buckets():
    """A joint model's rows (target history, source window, word) go through the same graphs: each row's o_w is
    the model's own, computed in one batch."""
    torch.manual_seed(0)
    model = CSLM(preset_config("tiny", vocab_size=50, source_window=3, source_vocab_size=40)).eval()
    model.init_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(30)  # weights large enough that rows differ visibly
        tables = model.first_layer_tables()
        rng = np.random.default_rng(1)
        rows = np.concatenate([rng.integers(0, 50, (300, 6)), rng.integers(0, 40, (300, 3)),
                               rng.integers(0, 50, (300, 1))], axis=1).astype(np.int32)
        t = torch.from_numpy(rows.astype(np.int64))
        want = model.output_rows(model.features_from_tables(tables, t[:, :-1]), t[:, -1]).numpy()
    got = GraphScorer(model, tables, torch.device("cpu"), max_rows=256).score(rows)
    assert np.ptp(want) > 1e-3
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_graphs_need_a_gpu(model_dir):  # noqa: F811
    """`--evaluator graphs` on a CPU (self-normalised or exact), or with int8: refused in one line; capture
    without CUDA is a programming error."""
    out, _, _ = model_dir
    fast = Engine.load(str(out), device="cpu", normalized=False)
    with pytest.raises(UserError, match="on a GPU.*served on cpu: --evaluator torch"):
        fast.use_evaluator("graphs", 0)
    with pytest.raises(UserError, match="served on cpu"):
        Engine.load(str(out), device="cpu").use_evaluator("graphs", None)
    with pytest.raises(ValueError, match="int8 is the C\\+\\+ evaluator's"):
        fast.use_evaluator("graphs", None, "int8")
    with pytest.raises(ValueError, match="CUDA"):
        GraphScorer(fast.model, fast.tables, torch.device("cpu"), capture=True)
    assert fast.use_evaluator("torch", None) == "torch" and fast.graphs is None


def told_it_is_on_a_gpu(engine, monkeypatch) -> None:
    """A CPU engine that believes it is on a GPU: its graphs are recorded on the CPU, so run eagerly."""
    engine.device = torch.device("cuda")
    real = graphs.GraphScorer
    monkeypatch.setattr("cslm.engine.GraphScorer", lambda m, t, d, rows, name: real(m, t, "cpu", rows, name=name))


def test_auto_on_a_gpu_takes_the_graphs_or_warns_and_keeps_torch(model_dir, monkeypatch, capsys):  # noqa: F811
    """On a GPU `auto` records the graphs (here a CPU engine told it is on one, with the graphs run eagerly); a
    history cache asked for keeps torch's; a failed recording is one warning line, and torch scores."""
    out, _, _ = model_dir
    engine = Engine.load(str(out), device="cpu", normalized=False)
    want = engine.score_rows(engine.pad(random_ngrams(engine, 100, 7, seed=3)))[0]
    told_it_is_on_a_gpu(engine, monkeypatch)
    assert engine.use_evaluator("auto", None, max_rows=256) == "graphs" and engine.graphs.sizes[-1] == 256
    rows = engine.pad(random_ngrams(engine, 100, 7, seed=3))
    np.testing.assert_allclose(engine.score_rows(rows)[0], want, rtol=0, atol=1e-5)
    real_cache = engine_module.HistoryCache  # torch's cache for a history cache asked for, here on the CPU
    monkeypatch.setattr("cslm.engine.HistoryCache", lambda slots, ctx, width, d: real_cache(slots, ctx, width, "cpu"))
    assert engine.use_evaluator("auto", 1000) == "torch" and engine.graphs is None
    assert engine.history_cache.slots == 1000

    def refuse(*args, **kwargs):
        raise UserError(f"{out}: CUDA graphs of its scores could not be recorded on cuda: no")

    monkeypatch.setattr("cslm.engine.GraphScorer", refuse)
    assert engine.use_evaluator("auto", None) == "torch" and engine.graphs is None
    assert capsys.readouterr().err == f"cslm: warning: {out}: CUDA graphs of its scores could not be recorded " \
                                      f"on cuda: no\n"
    with pytest.raises(UserError, match="could not be recorded"):
        engine.use_evaluator("graphs", None)


def test_the_cli_refuses_graphs_on_a_cpu_in_one_line(model_dir):  # noqa: F811
    out, _, _ = model_dir
    r = subprocess.run([sys.executable, "-m", "cslm.cli", "serve", str(out), "--port", "0", "--self-normalized",
                        "--evaluator", "graphs"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "CUDA graphs" in r.stderr and str(out) in r.stderr


@pytest.mark.parametrize("normalized", [False, True])
def test_a_server_reports_the_graphs_it_scores_with(model_dir, monkeypatch, normalized):  # noqa: F811
    """A server whose engine took the graphs, self-normalised or exact, answers their scores, and STATS and the
    start-up line say so."""
    out, _, _ = model_dir
    engine = Engine.load(str(out), device="cpu", normalized=normalized)
    grams = random_ngrams(engine, 300, 7, seed=4)
    want = engine.score_ids(grams)[0]
    told_it_is_on_a_gpu(engine, monkeypatch)
    s = ServerThread(engine, cache_size=0, max_batch=512)
    try:
        with Client("127.0.0.1", s.port) as c:
            lp, _ = c.score(grams)
            st = c.stats()
    finally:
        s.stop()
    np.testing.assert_allclose(lp, want, rtol=0, atol=1e-5)
    assert st["model"]["evaluator"] == "graphs" and engine.graphs.sizes[-1] == 512
    assert engine.graphs.normalized == normalized
    assert startup_message(engine, "h", 1).startswith("cslm: serving on h:1 (order 7, 50 words, mode unk, device "
                                                      "cuda, CUDA graphs of 4 batch sizes up to 512")
