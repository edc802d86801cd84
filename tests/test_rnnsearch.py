"""RNNsearch (Bahdanau et al., 2015): attention, padding invariance, learning, and the shared tools."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from moses_rnn.cli import main
from moses_rnn.generate import Generator
from moses_rnn.model import ModelConfig, build_model, preset_config
from moses_rnn.modelio import LoadedModel, load_model
from moses_rnn.rnnsearch import AttentionContext, RNNSearch
from moses_rnn.score import PhraseScorer, score_table
from moses_rnn.train import TrainConfig, train
from moses_rnn.vocab import Vocabulary


def small_model(seed: int = 0, V: int = 12, std: float = 0.5) -> RNNSearch:
    """A random model with weights large enough for peaked attention and outputs."""
    torch.manual_seed(seed)
    cfg = ModelConfig(arch="rnnsearch", src_vocab=V, tgt_vocab=V, embed=8, hidden=12, maxout=6, out_rank=4, align=10)
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    return model.eval()


def padded_batch(rows: list[list[int]]):
    T = max(len(r) for r in rows)
    src = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    mask = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in rows])
    return src, mask


def test_presets_and_dispatch():
    cfg = preset_config("paper", 15000, 15000, arch="rnnsearch")
    assert (cfg.embed, cfg.hidden, cfg.align, cfg.maxout) == (620, 1000, 1000, 500)
    assert isinstance(build_model(preset_config("tiny", 30, 30, arch="rnnsearch")), RNNSearch)
    with pytest.raises(ValueError):
        RNNSearch(preset_config("tiny", 30, 30))  # an encdec config


def test_init_weights_follow_the_paper():
    model = build_model(preset_config("tiny", 50, 60, arch="rnnsearch"))
    model.init_weights()
    d = model.decoder
    assert torch.all(d.v_a.weight == 0) and torch.all(d.W.bias == 0)
    H = model.config.hidden
    block = model.fwd.U.weight
    assert torch.allclose(block @ block.T, torch.eye(H), atol=1e-5)  # orthogonal recurrent matrix
    assert d.W_a.weight.std() < 0.002 < d.embed.weight.std() < 0.02


def test_attention_sums_to_one_over_real_positions():
    model = small_model()
    src, mask = padded_batch([[2, 3, 4, 5, 6], [7, 8], [9]])
    tgt = torch.tensor([[3, 4, 5, 0]] * 3)
    alpha = model.alignment(src, mask, tgt)  # [B, T_tgt, T_src]
    assert alpha.shape == (3, 4, 5)
    assert torch.allclose(alpha.sum(-1), torch.ones(3, 4), atol=1e-6)
    assert torch.all(alpha[~mask[:, None, :].expand_as(alpha)] == 0)  # padding gets no weight
    assert alpha[0].std() > 0.01  # and the weights are not trivially uniform


def test_padding_never_changes_a_score():
    model = small_model()
    rows = [[2, 3, 4, 5, 6, 7], [8, 9], [10], [3, 11, 4]]
    src, mask = padded_batch(rows)
    tgt = torch.tensor([[4, 5, 6, 0], [5, 0, 0, 0], [7, 8, 0, 0], [9, 10, 11, 0]])
    tgt_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]).bool()
    with torch.no_grad():
        batch = model(src, mask, tgt, tgt_mask)
        alone = [
            model(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.bool), tgt[i : i + 1, : int(tgt_mask[i].sum())],
                  torch.ones(1, int(tgt_mask[i].sum()), dtype=torch.bool))
            for i, r in enumerate(rows)
        ]
    assert torch.allclose(batch, torch.cat(alone), atol=1e-5)


def test_context_cat_pads_and_select_trims():
    model = small_model()
    with torch.no_grad():
        a = model.context(*padded_batch([[2, 3, 4, 5]]))
        b = model.context(*padded_batch([[6, 7]]))
        both = AttentionContext.cat([a, b])
        assert both.mask.tolist() == [[True] * 4, [True, True, False, False]]
        sel = both.select(torch.tensor([1, 1]))
        assert sel.annotations.shape[1] == 2  # trimmed to the longest real source selected
        tgt = torch.tensor([[3, 0]])
        m = torch.ones_like(tgt, dtype=torch.bool)
        assert torch.allclose(model.log_prob(both.select(torch.tensor([1])), tgt, m), model.log_prob(b, tgt, m))
        assert torch.allclose(model.log_prob(both.select(torch.tensor([0])), tgt, m), model.log_prob(a, tgt, m))


def test_scorer_mixed_source_lengths_match_single_pairs():
    model = small_model(V=12)
    vocab = Vocabulary(["</s>", "[UNK]"] + [f"w{i}" for i in range(10)])
    loaded = LoadedModel(model, vocab, vocab, model.config, {})
    pairs = [("w1 w2 w3 w4 w5", "w2 w3"), ("w6", "w7 w8 w9"), ("w1 w2", "w2"), ("w6", "w1")]
    scorer = PhraseScorer(loaded)
    together = scorer.score(pairs)
    alone = np.array([scorer.score([p])[0] for p in pairs])
    assert np.allclose(together, alone, atol=1e-5)


def reverse_task(rng: np.random.Generator, n: int, V: int):
    rows = [list(rng.integers(2, V, size=rng.integers(2, 5))) for _ in range(n)]
    src, mask = padded_batch(rows)
    tgt_rows = [r[::-1] + [0] for r in rows]
    tgt, tgt_mask = padded_batch(tgt_rows)
    return src, mask, tgt, tgt_mask


@pytest.fixture(scope="module")
def reverse_model():
    """A tiny RNNsearch trained to reverse sequences of 2-4 symbols."""
    torch.manual_seed(0)
    V = 8
    cfg = ModelConfig(arch="rnnsearch", src_vocab=V, tgt_vocab=V, embed=16, hidden=32, maxout=16, out_rank=16,
                      align=32)
    model = build_model(cfg)
    model.init_weights()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    for _ in range(300):
        src, mask, tgt, tgt_mask = reverse_task(rng, 64, V)
        loss = -model(src, mask, tgt, tgt_mask).sum() / tgt_mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_learns_to_reverse_to_near_zero_loss(reverse_model):
    src, mask, tgt, tgt_mask = reverse_task(np.random.default_rng(1), 256, 8)
    with torch.no_grad():
        loss = -reverse_model(src, mask, tgt, tgt_mask).sum() / tgt_mask.sum()
    assert loss.item() < 0.05, f"per-symbol loss {loss.item():.4f}"


def test_beam_search_and_alignment_of_the_reverse_model(reverse_model):
    vocab = Vocabulary(["</s>", "[UNK]"] + [f"s{i}" for i in range(2, 8)])
    gen = Generator(LoadedModel(reverse_model, vocab, vocab, reverse_model.config, {}))
    sources = ["s2 s3 s4", "s7 s5", "s6 s2 s2 s3"]
    best = gen.beam_search(sources, beam=3)
    assert [b[0].text for b in best] == ["s4 s3 s2", "s5 s7", "s3 s2 s2 s6"]
    # attention of a reversal is anti-diagonal: target word i looks at source word N + 1 - i
    src = torch.tensor([[2, 3, 4, 5]])
    alpha = reverse_model.alignment(src, torch.ones_like(src, dtype=torch.bool), torch.tensor([[5, 4, 3, 2, 0]]))[0]
    assert alpha[:4].argmax(-1).tolist() == [3, 2, 1, 0]


def test_train_score_and_generate_through_the_shared_tools(example_table, tmp_path):
    model_dir = tmp_path / "rnnsearch"
    cfg = TrainConfig(preset="tiny", arch="rnnsearch", max_steps=12, eval_every=12, valid_pairs=20, device="cpu")
    summary = train(str(example_table), str(model_dir), cfg, progress=False)
    assert math.isfinite(summary["valid_ppl"])
    loaded = load_model(str(model_dir))
    assert isinstance(loaded.model, RNNSearch) and loaded.config.arch == "rnnsearch"

    out = tmp_path / "scored.phrase-table"
    stats = score_table(PhraseScorer(loaded), str(example_table), str(out), progress=False)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert stats.lines == len(lines) == 404
    first = lines[0].split(" ||| ")
    logp = math.log(float(first[2].split()[-1]))
    direct = PhraseScorer(loaded).score([(first[0], first[1])])[0]
    assert abs(logp - direct) < 1e-4

    runner = CliRunner()
    r = runner.invoke(main, ["translate", "-m", str(model_dir), "a big book", "the house", "--quiet"])
    assert r.exit_code == 0, r.output
    assert len(r.output.splitlines()) == 2
    png = tmp_path / "align.png"
    r = runner.invoke(main, ["align", "-m", str(model_dir), "a big book", "un grand livre", "-o", str(png)])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_train_arch_rnnsearch(example_table, tmp_path):
    r = CliRunner().invoke(main, ["train", str(example_table), "-o", str(tmp_path / "m"), "--preset", "tiny",
                                  "--arch", "rnnsearch", "--max-steps", "2", "--eval-every", "2",
                                  "--valid-pairs", "10", "--device", "cpu", "--quiet"])
    assert r.exit_code == 0, r.output
    assert load_model(str(tmp_path / "m")).config.arch == "rnnsearch"
