"""The model's equations, checked against a direct transcription of the paper."""

import torch

from moses_rnn.model import EncoderDecoder, ModelConfig


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
    e, d, H = m.encoder, m.decoder, m.config.hidden
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
        logits = d.G_l.weight @ (d.G_r.weight @ s) + d.G_l.bias
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
    w = m.decoder.G_l.weight.detach()
    assert abs(float(w.std()) - 0.01) < 0.001 and abs(float(w.mean())) < 0.001
    assert float(m.encoder.W.bias.detach().abs().max()) == 0.0
