"""RNNsearch (Bahdanau et al., 2015): the appendix equations, attention, padding invariance, learning,
and the shared tools."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from moses_rnn.cli import main
from moses_rnn.generation.generate import Generator
from moses_rnn.networks.modelbase import ModelConfig, preset_config, preset_vocab
from moses_rnn.networks.modelio import LoadedModel, build_model, load_model
from moses_rnn.networks.rnnsearch import AttentionContext, RNNSearch
from moses_rnn.scoring.scorer import PhraseScorer
from moses_rnn.scoring.table import score_table
from moses_rnn.training.train import TrainConfig, train
from mtcommon.vocab import Vocabulary


def small_model(seed: int = 0, V: int = 12, std: float = 0.5, out_rank: int = 4) -> RNNSearch:
    """A random model with weights large enough for peaked attention and outputs."""
    torch.manual_seed(seed)
    cfg = ModelConfig(arch="rnnsearch", src_vocab=V, tgt_vocab=V, embed=8, hidden=12, maxout=6, out_rank=out_rank,
                      align=10)
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    return model.eval()


@torch.no_grad()
def reference_log_prob(m: RNNSearch, x: list[int], y: list[int]) -> float:
    """log p(y | x) by Appendix A of Bahdanau et al. (2015), one word at a time, from m's weights.

    Biases are the model's deliberate addition to every input map; E y_0 = 0.
    """
    H, sig, tanh = m.config.hidden, torch.sigmoid, torch.tanh

    def gru_direction(layer, words):  # A.2.1, one direction of the encoder
        W, Wz, Wr = layer.W.weight.split(H)
        bW, bz, br = layer.W.bias.split(H)
        Uz, Ur = layer.U_zr.weight.split(H)
        U = layer.U.weight
        h, states = torch.zeros(H), []  # h_0 = 0
        for w in words:
            Ex = m.src_embed.weight[w]  # E x_j
            z = sig(Wz @ Ex + bz + Uz @ h)  # z_j
            r = sig(Wr @ Ex + br + Ur @ h)  # r_j
            h_tilde = tanh(W @ Ex + bW + U @ (r * h))  # h~_j = tanh(W E x_j + U [r_j ∘ h_{j-1}])
            h = (1 - z) * h + z * h_tilde  # h_j = (1 - z_j) ∘ h_{j-1} + z_j ∘ h~_j (not Cho et al.'s Eq. 7)
            states.append(h)
        return states

    fwd = gru_direction(m.fwd, x)  # h->_1 .. h->_Tx
    bwd = gru_direction(m.bwd, x[::-1])[::-1]  # h<-_1 .. h<-_Tx (read from x_Tx back to x_1)
    annotations = [torch.cat([f, b]) for f, b in zip(fwd, bwd)]  # h_j = [h->_j ; h<-_j]

    d, out = m.decoder, m.output
    W, Wz, Wr = d.W.weight.split(H)
    bW, bz, br = d.W.bias.split(H)
    U, Uz, Ur = d.U.weight.split(H)
    C, Cz, Cr = d.C.weight.split(H)
    if isinstance(out.G_r, torch.nn.Linear):  # W_o = G_l G_r below full rank
        W_o = out.G_l.weight @ out.G_r.weight
    else:
        W_o = out.G_l.weight
    s = tanh(d.W_s.weight @ bwd[0] + d.W_s.bias)  # s_0 = tanh(W_s h<-_1)
    Ey = torch.zeros(m.config.embed)  # E y_0 = 0
    total = 0.0
    for w in y:
        # alignment model (A.1.2): e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j), alpha = softmax, c_i = sum alpha h
        e = [float(d.v_a.weight[0] @ tanh(d.W_a.weight @ s + d.W_a.bias + d.U_a.weight @ h_j)) for h_j in annotations]
        Z = sum(math.exp(e_k) for e_k in e)
        alpha = [math.exp(e_j) / Z for e_j in e]
        c = sum(a * h_j for a, h_j in zip(alpha, annotations))
        # output (A.2.2): t~_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i, t_i,k = max(t~_i,2k-1, t~_i,2k)
        t_tilde = d.U_o.weight @ s + d.U_o.bias + d.V_o.weight @ Ey + d.C_o.weight @ c
        t = torch.maximum(t_tilde[0::2], t_tilde[1::2])
        logits = W_o @ t + out.G_l.bias  # p(y_i | ...) ∝ exp(y_i^T W_o t_i)
        total += float(logits[w] - torch.logsumexp(logits, 0))
        # decoder GRU (A.2.2)
        z = sig(Wz @ Ey + bz + Uz @ s + Cz @ c)  # z_i
        r = sig(Wr @ Ey + br + Ur @ s + Cr @ c)  # r_i
        s_tilde = tanh(W @ Ey + bW + U @ (r * s) + C @ c)  # s~_i = tanh(W E y_{i-1} + U [r_i ∘ s_{i-1}] + C c_i)
        s = (1 - z) * s + z * s_tilde  # s_i = (1 - z_i) ∘ s_{i-1} + z_i ∘ s~_i
        Ey = d.embed.weight[w]
    return total


@pytest.mark.parametrize("out_rank", [4, 6])  # low-rank W_o = G_l G_r, and the paper's full W_o
def test_matches_paper_equations(out_rank):
    m = small_model(out_rank=out_rank)
    pairs = [([3, 5, 7, 2], [4, 9, 0]), ([6], [2, 8, 11, 5, 0]), ([4, 4], [3, 0])]
    S, T = max(len(s) for s, _ in pairs), max(len(t) for _, t in pairs)
    src = torch.tensor([s + [0] * (S - len(s)) for s, _ in pairs])
    tgt = torch.tensor([t + [0] * (T - len(t)) for _, t in pairs])
    smask = torch.tensor([[i < len(s) for i in range(S)] for s, _ in pairs])
    tmask = torch.tensor([[i < len(t) for i in range(T)] for _, t in pairs])
    with torch.no_grad():
        got = m(src, smask, tgt, tmask).tolist()
    for lp, (s, t) in zip(got, pairs):
        assert lp == pytest.approx(reference_log_prob(m, s, t), abs=1e-5)


def padded_batch(rows: list[list[int]]):
    T = max(len(r) for r in rows)
    src = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    mask = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in rows])
    return src, mask


def test_presets_and_dispatch():
    cfg = preset_config("paper", 15000, 15000, arch="rnnsearch")
    assert (cfg.embed, cfg.hidden, cfg.align, cfg.maxout) == (620, 1000, 1000, 500)
    tiny = preset_config("tiny", arch="rnnsearch")  # each architecture's own shortlists
    assert (tiny.src_vocab, tiny.tgt_vocab) == (preset_vocab("tiny", "rnnsearch"), 2000)
    assert preset_config("tiny").src_vocab == preset_vocab("tiny") == 256
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
