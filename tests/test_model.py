"""The encoder-decoder's equations, checked against a direct transcription of the paper;
the interface both architectures share (modelbase.PhraseModel)."""

import pytest
import torch

from moses_rnn.networks.model import EncoderDecoder
from moses_rnn.networks import ARCHITECTURES, ARCHS, PRESET_NAMES
from moses_rnn.networks.modelbase import ModelConfig, PhraseModel, preset_config
from moses_rnn.networks.modelio import MODEL_CLASSES, build_model


def small_model(seed=0):
    torch.manual_seed(seed)
    m = EncoderDecoder(ModelConfig(src_vocab=11, tgt_vocab=13, embed=4, hidden=6, maxout=5, out_rank=3))
    m.init_weights()
    with torch.no_grad():  # non-trivial biases and scales so every term matters
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m.eval()


@torch.no_grad()
def reference_log_prob(m, x, y):
    """Eqs. 5-8 and Appendix A of Cho et al. (2014), one word at a time."""
    e, d, G, H = m.encoder, m.decoder, m.output, m.config.hidden
    sig, tanh = torch.sigmoid, torch.tanh
    W, Wz, Wr = e.W.weight.split(H)
    bW, bz, br = e.W.bias.split(H)
    Uz, Ur = e.U_zr.weight.split(H)
    h = torch.zeros(H)
    for w in x:
        ex = e.embed.weight[w]
        z = sig(Wz @ ex + bz + Uz @ h)  # Eq. 6
        r = sig(Wr @ ex + br + Ur @ h)  # Eq. 5
        h_tilde = tanh(W @ ex + bW + e.U.weight @ (r * h))  # Eq. 8
        h = z * h + (1 - z) * h_tilde  # Eq. 7
    c = tanh(e.V.weight @ h + e.V.bias)
    W_, Wz_, Wr_ = d.W.weight.split(H)
    bW_, bz_, br_ = d.W.bias.split(H)
    U_, Uz_, Ur_ = d.U.weight.split(H)
    C, Cz, Cr = d.C.weight.split(H)
    hd = tanh(d.V.weight @ c + d.V.bias)  # h'_0 = tanh(V' c)
    prev = torch.zeros(m.config.embed)  # e(y_0) = 0
    total = 0.0
    for w in y:
        z = sig(Wz_ @ prev + bz_ + Uz_ @ hd + Cz @ c)
        r = sig(Wr_ @ prev + br_ + Ur_ @ hd + Cr @ c)
        h_tilde = tanh(W_ @ prev + bW_ + r * (U_ @ hd + C @ c))
        hd = z * hd + (1 - z) * h_tilde
        s_ = d.O_h.weight @ hd + d.O_h.bias + d.O_y.weight @ prev + d.O_c.weight @ c
        s = torch.maximum(s_[0::2], s_[1::2])  # maxout over adjacent pairs
        logits = G.G_l.weight @ (G.G_r.weight @ s) + G.G_l.bias  # G = G_l G_r
        total += float(torch.log_softmax(logits, 0)[w])
        prev = d.embed.weight[w]
    return total


def test_matches_paper_equations():
    m = small_model()
    x, y = [3, 5, 7], [4, 9, 0]
    with torch.no_grad():
        got = m(torch.tensor([x]), torch.ones(1, 3, dtype=torch.bool), torch.tensor([y]), torch.ones(1, 3, dtype=torch.bool))
    assert abs(float(got[0]) - reference_log_prob(m, x, y)) < 1e-5


def test_padding_never_changes_a_score():
    m = small_model(1)
    pairs = [([3, 5, 7, 2], [4, 0]), ([6], [2, 8, 9, 0]), ([4, 4], [3, 0])]
    with torch.no_grad():
        alone = [float(m(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.bool),
                         torch.tensor([t]), torch.ones(1, len(t), dtype=torch.bool))[0]) for s, t in pairs]
        S, T = max(len(s) for s, _ in pairs), max(len(t) for _, t in pairs)
        src = torch.tensor([s + [10] * (S - len(s)) for s, _ in pairs])
        tgt = torch.tensor([t + [12] * (T - len(t)) for _, t in pairs])
        smask = torch.tensor([[i < len(s) for i in range(S)] for s, _ in pairs])
        tmask = torch.tensor([[i < len(t) for i in range(T)] for _, t in pairs])
        batched = m(src, smask, tgt, tmask).tolist()
    for a, b, (s, t) in zip(alone, batched, pairs):
        assert abs(a - b) < 1e-5
        assert abs(a - reference_log_prob(m, s, t)) < 1e-5


def test_init_follows_supplementary_material():
    torch.manual_seed(0)
    m = EncoderDecoder(ModelConfig(src_vocab=300, tgt_vocab=300, embed=20, hidden=40, maxout=10, out_rank=8))
    m.init_weights()
    U = m.decoder.U.weight.detach()
    for k in range(3):  # each recurrent gate block is orthogonal
        block = U[k * 40 : (k + 1) * 40]
        assert torch.allclose(block @ block.T, torch.eye(40), atol=1e-5)
    w = m.output.G_l.weight.detach()
    assert abs(float(w.std()) - 0.01) < 0.001 and abs(float(w.mean())) < 0.001
    assert float(m.encoder.W.bias.detach().abs().max()) == 0.0


# -- the interface both architectures share -------------------------------------


def random_model(arch: str, out_rank: int = 3, seed: int = 0) -> PhraseModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(arch=arch, src_vocab=11, tgt_vocab=13, embed=4, hidden=6, maxout=5, out_rank=out_rank,
                      align=7 if arch == "rnnsearch" else 0)
    m = build_model(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.5)
    return m.eval()


ARCH_RANKS = [("encdec", 3), ("encdec", 8), ("rnnsearch", 3), ("rnnsearch", 8)]


def test_every_architecture_is_built_and_presets_cover_the_same_names():
    assert PRESET_NAMES == ("paper", "small", "tiny")
    assert all(set(a.presets) == set(PRESET_NAMES) for a in ARCHITECTURES.values())
    for arch in ARCHS:  # every name `--arch` offers builds its own class at every preset
        for name in PRESET_NAMES:
            model = build_model(preset_config(name, 40, 50, arch))
            assert type(model) is MODEL_CLASSES[arch] and model.config.arch == arch
    assert set(MODEL_CLASSES) == set(ARCHS)
    with pytest.raises(ValueError):
        ModelConfig(arch="encdec", align=8)  # an RNNsearch size in an encdec config
    with pytest.raises(ValueError):
        ModelConfig(arch="transformer")
    with pytest.raises(ValueError):
        preset_config("huge")


@pytest.mark.parametrize("arch,out_rank", ARCH_RANKS)
def test_teacher_forcing_equals_stepping(arch, out_rank):
    """readout_states + output (training, scoring) and step (generation, prefix-tree scoring) agree."""
    m = random_model(arch, out_rank)
    src = torch.tensor([[3, 5, 7, 2], [4, 1, 0, 0]])
    tgt = torch.tensor([[4, 9, 0], [2, 6, 0]])
    with torch.no_grad():
        ctx = m.context(src, src != 0)
        s = m.readout_states(ctx, tgt)
        assert s.shape == (2, 3, m.config.maxout)
        forced = torch.log_softmax(m.output.logits(s), -1)
        embed = m.target_embeddings()
        state, e_prev = m.start_state(ctx), embed.weight.new_zeros(2, m.config.embed)
        for t in range(tgt.shape[1]):
            logits, state = m.step(ctx, state, e_prev)
            assert torch.allclose(torch.log_softmax(logits, -1), forced[:, t], atol=1e-6)
            e_prev = embed(tgt[:, t])
        want = forced.gather(2, tgt[:, :, None]).squeeze(2).sum(1)
        assert torch.allclose(m.log_prob(ctx, tgt, torch.ones_like(tgt, dtype=torch.bool)), want, atol=1e-6)
        flat = m.output.log_probs(s.reshape(-1, m.config.maxout), tgt.reshape(-1))
        assert torch.allclose(flat, forced.gather(2, tgt[:, :, None]).reshape(-1), atol=1e-6)


@pytest.mark.parametrize("arch,out_rank", ARCH_RANKS)
def test_output_layer_factors(arch, out_rank):
    """G_l holds one row and bias per target word; G_r projects to the rank, or is the identity."""
    m = random_model(arch, out_rank)
    V, M = m.config.tgt_vocab, m.config.maxout
    full = arch == "rnnsearch" and out_rank >= M  # RNNsearch's full W_o; the encdec always factors G
    assert m.output.G_l.weight.shape == (V, M if full else out_rank) and m.output.G_l.bias.shape == (V,)
    assert isinstance(m.output.G_r, torch.nn.Identity) == full
    s, rows = torch.randn(2, 3, M), torch.tensor([7, 0, 12])
    assert torch.allclose(m.output.logits(s, rows=rows), m.output.logits(s)[..., rows], atol=1e-6)
    assert [n for n, _ in m.named_parameters()][-len(list(m.output.parameters())) :] == [
        "output." + n for n, _ in m.output.named_parameters()]  # last, where saved optimiser states expect them


def test_only_attention_models_align():
    src, tgt = torch.tensor([[3, 5]]), torch.tensor([[4, 0]])
    assert random_model("rnnsearch").has_attention
    assert random_model("rnnsearch").alignment(src, src != 0, tgt).shape == (1, 2, 2)
    encdec = random_model("encdec")
    assert not encdec.has_attention
    with pytest.raises(ValueError, match="no attention"):
        encdec.alignment(src, src != 0, tgt)
