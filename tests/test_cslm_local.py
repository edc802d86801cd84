"""The in-process C++ evaluator (cslm/cpp/cslm_local.*) against the Python model, and its error messages."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from cslm import modeldir
from cslm.engine import Engine
from cslm.train import TrainConfig, train

from test_cslm import synthetic_corpus



@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny CSLM trained one epoch with the (ln Z)^2 penalty."""
    root = tmp_path_factory.mktemp("cslm-local-model")
    corpus = synthetic_corpus(root / "corpus.txt", sentences=200, seed=3)
    cfg = TrainConfig(preset="tiny", vocab_size=50, max_epochs=1, valid_fraction=0.05, batch_size=64, device="cpu",
                      self_norm=0.1)
    out = root / "model"
    train(str(corpus), str(out), cfg, progress=False)
    return out, modeldir.load(str(out)), corpus


def ngrams_of(corpus: Path, order: int, limit: int = 300) -> list[list[str]]:
    grams = []
    for line in corpus.read_text().splitlines()[:40]:
        words = ["<s>"] * (order - 1) + line.split() + ["</s>"]
        grams += [words[i - order + 1: i + 1] for i in range(order - 1, len(words))]
    grams.append(["never-seen", "w1"])  # unknown history word, short n-gram (left-padded with <s>)
    grams.append(["w2"])
    return grams[:limit]


def run_local(exe: Path, model: Path, grams: list[list[str]], kernels: str | None = None,
              precision: str = "fp32") -> np.ndarray:
    """The evaluator's (exact, self-normalised) scores of `grams`; `kernels` caps the vector width (CSLM_KERNELS);
    `precision`: its layers after the first in fp32 or int8."""
    env = {**os.environ, "CSLM_KERNELS": kernels} if kernels is not None else None
    r = subprocess.run([str(exe), str(model), "--precision", precision],
                       input="".join(" ".join(g) + "\n" for g in grams),
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return np.array([[float(x) for x in line.split()] for line in r.stdout.splitlines()])


def random_model(loaded, hidden: tuple[int, ...], seed: int, scale: float, path: Path, grid: float = 0.0):
    """A model of `loaded`'s vocabulary and order with rectified layers `hidden` and weights uniform in
    +-scale, saved in `path` (not self-normalised); returns its config. With a `grid`, the embeddings and
    the first layer's weights are multiples of it, so that the first layer's premultiplied tables are exact
    in float32 whatever the kernel that builds them."""
    from cslm.model import CSLM, CSLMConfig

    cfg = CSLMConfig(**{**loaded.config.to_dict(), "hidden": hidden})
    torch.manual_seed(seed)
    model = CSLM(cfg)
    for p in model.parameters():
        torch.nn.init.uniform_(p, -scale, scale)
    if grid:
        with torch.no_grad():
            for p in (model.embed.weight, model.hidden[0].weight):
                p.copy_(torch.round(p / grid) * grid)
    modeldir.save_vocab(str(path), loaded.vocab)
    modeldir.save_weights(str(path), model, {"train_config": {"self_norm": 0.0}})
    return cfg


def test_local_evaluator_matches_python(local_exe, model_dir):
    out, loaded, corpus = model_dir
    order = loaded.config.order
    grams = ngrams_of(corpus, order)
    got = run_local(local_exe, out, grams)
    assert got.shape == (len(grams), 2)

    # exact: what `cslm score` gives (the engine's normalised log-probabilities)
    engine = Engine.load(str(out), device="cpu")
    exact, _ = engine.score_words(grams)
    assert np.max(np.abs(got[:, 0] - exact)) < 1e-4

    # self-normalised: o_w, the output activation alone, from the plain forward pass in float64
    model = loaded.model.double()
    rows = np.full((len(grams), order), engine.bos_id, np.int64)
    for i, g in enumerate(grams):
        rows[i, order - len(g):] = loaded.vocab.encode(g)
    with torch.no_grad():
        logits = model(torch.from_numpy(rows[:, :-1]))
    o_w = logits[torch.arange(len(grams)), torch.from_numpy(rows[:, -1])].numpy()
    assert np.max(np.abs(got[:, 1] - o_w)) < 1e-4
    # and the two differ by ln Z, which the (ln Z)^2 penalty keeps small but not zero
    log_z = torch.logsumexp(logits, dim=1).numpy()
    assert np.allclose(got[:, 1] - got[:, 0], log_z, atol=1e-4)


def test_narrower_kernels_score_the_same(local_exe, model_dir):
    """CSLM_KERNELS caps the vector width (to time the narrower kernels on one machine): the same scores to
    float rounding, the kernels it ran named; another value is refused in one line naming the variable."""
    out, loaded, corpus = model_dir
    grams = "".join(" ".join(g) + "\n" for g in ngrams_of(corpus, loaded.config.order, 100))
    runs = {}
    for cap in ("", "amx", "avx512", "avx2", "baseline"):
        r = subprocess.run([str(local_exe), str(out)], input=grams, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "CSLM_KERNELS": cap})
        assert r.returncode == 0, r.stderr
        runs[cap] = np.array([[float(x) for x in line.split()] for line in r.stdout.splitlines()])
        used = r.stderr.split("kernels ")[1].split()[0]
        assert used in ("amx", "avx512", "avx2", "baseline") and (used == cap or cap in ("", "amx", "avx512"))
        assert used != "amx" or cap in ("", "amx")
    for cap in ("amx", "avx512", "avx2", "baseline"):
        assert np.max(np.abs(runs[cap] - runs[""])) < 1e-4
    r = subprocess.run([str(local_exe), str(out)], input=grams, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "CSLM_KERNELS": "sse9"})
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip() == "CSLM_KERNELS=sse9: not amx, avx512, avx2 or baseline (unset it for the CPU's widest)"


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float64."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def int8_reference(loaded_dir: Path, grams: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """(exact, self-normalised) scores of `grams` by cslm_local.h's int8 equations (`int8_scores`)."""
    m = modeldir.load(str(loaded_dir))
    order = m.config.order
    rows = np.full((len(grams), order), m.vocab.encode(["<s>"])[0], np.int64)
    for i, g in enumerate(grams):
        rows[i, order - len(g):] = m.vocab.encode(g)
    return int8_scores(m, rows)


def int8_scores(m, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exact, self-normalised) scores of a loaded model's id rows (the history, a joint model's source window,
    the predicted word) by cslm_local.h's int8 equations, in float64 with numpy: the first layer's tables
    T_p[w] = W_1[:, p] . embed[w] (and S_q[s] with src_embed) rounded to bfloat16, then W_k ~ s_j q_j
    (q = round(W / s_j), s_j = max |W_j| / 127), each layer's input rounded to r = round(h / s_h),
    s_h = max h / 255, h_k = relu(b_k + s_h s_j sum_i r_i q_j[i]) for every rectified layer after the first."""
    sd = {k: v.double().numpy() for k, v in m.model.state_dict().items()}
    e = sd["embed.weight"].shape[1]
    h = sd["hidden.0.bias"]
    for p in range(rows.shape[1] - 1):  # target positions, then source ones
        emb = sd["embed.weight"] if p < m.config.order - 1 else sd["src_embed.weight"]
        table = bf16(emb @ sd["hidden.0.weight"][:, p * e : (p + 1) * e].T)
        h = h + table[rows[:, p]]
    h = np.maximum(h, 0)
    k = 1
    while f"hidden.{k}.weight" in sd:
        w, b = sd[f"hidden.{k}.weight"], sd[f"hidden.{k}.bias"]
        s = np.abs(w).max(axis=1) / 127
        q = np.rint(w / s[:, None])
        sh = h.max(axis=1) / 255
        r = np.rint(h / np.where(sh > 0, sh, 1)[:, None])
        h = np.maximum(b + (r @ q.T) * sh[:, None] * s[None, :], 0)
        k += 1
    logits = h @ sd["out.weight"].T + sd["out.bias"]
    o_w = logits[np.arange(len(rows)), rows[:, -1]]
    log_z = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    return o_w - log_z, o_w


def test_int8_layers_follow_their_equations_with_every_kernel(local_exe, model_dir, tmp_path):
    """--precision int8: the first layer's tables in bfloat16 and the layers after it in 8 bits (cslm_local.h,
    "Precision"), their outputs 300, 270 and 30 padded to whole vectors and their inputs to 64. Every kernel
    (AMX and AVX-512 VNNI where the CPU has them) gives the scores of the equations computed in float64; the
    integer sums are exact, so the kernels differ only by the float rounding of the last steps. The scores
    stay near float32's, not equal. The first layer's weights lie on a grid, so that its tables are exact in
    float32 before their rounding, whatever the kernel that builds them, and the bound is tight."""
    out, loaded, corpus = model_dir
    random_model(loaded, (300, 270, 30), 4, 0.1, tmp_path / "wide", grid=2.0**-7)
    grams = ngrams_of(corpus, loaded.config.order, 100)
    want_exact, want_sn = int8_reference(tmp_path / "wide", grams)
    fp32 = run_local(local_exe, tmp_path / "wide", grams)
    runs = {}
    for cap in ("amx", "avx512", "avx2", "baseline"):
        got = runs[cap] = run_local(local_exe, tmp_path / "wide", grams, kernels=cap, precision="int8")
        assert np.max(np.abs(got[:, 1] - want_sn)) < 1e-5 and np.max(np.abs(got[:, 0] - want_exact)) < 1e-5, cap
    assert np.array_equal(runs["amx"], runs["avx512"])  # the same float steps on exact sums
    assert np.max(np.abs(runs["avx2"] - runs["avx512"])) < 1e-4
    assert np.max(np.abs(runs["baseline"] - runs["avx512"])) < 1e-4
    diff = np.abs(runs["avx512"] - fp32)
    assert 0 < diff.max() < 0.2 and diff.mean() < 0.05


def test_local_evaluator_deeper_network(local_exe, model_dir, tmp_path):
    """Three hidden layers, random weights: the evaluator follows the weights it finds."""
    out, loaded, corpus = model_dir
    cfg = random_model(loaded, (24, 20, 12), 0, 0.5, tmp_path / "deep")
    grams = ngrams_of(corpus, cfg.order, 100)
    got = run_local(local_exe, tmp_path / "deep", grams)
    exact, _ = Engine.load(str(tmp_path / "deep"), device="cpu").score_words(grams)
    assert np.max(np.abs(got[:, 0] - exact)) < 1e-4


def test_wide_layers_score_the_same_with_every_kernel(local_exe, model_dir, tmp_path):
    """Layers of 300 and 270 units: 270 outputs are a block of registers (16 AVX-512 vectors, 8 of AVX2 or
    SSE2), then whole vectors, then single floats, in each kernel. Each output sums in the same order whatever
    the block, so every width gives the Python engine's scores. The nonzeros of 300 and 270 rectified units
    are packed sixteen at a time by AVX-512, then one by one."""
    out, loaded, corpus = model_dir
    cfg = random_model(loaded, (300, 270), 1, 0.1, tmp_path / "wide")
    grams = ngrams_of(corpus, cfg.order, 100)
    exact, _ = Engine.load(str(tmp_path / "wide"), device="cpu").score_words(grams)
    for cap in ("avx512", "avx2", "baseline"):
        got = run_local(local_exe, tmp_path / "wide", grams, kernels=cap)
        assert got.shape == (len(grams), 2) and np.max(np.abs(got[:, 0] - exact)) < 1e-4, cap


@pytest.mark.parametrize("train_config,self_normalized", [({"self_norm": 0.0}, 0), ({"self_norm": 0.1}, 1),
                                                           ({"self_norm": 0.0, "objective": "nce"}, 1),
                                                           ({"self_norm": 0.0, "objective": "softmax"}, 0)])
def test_local_evaluator_knows_a_self_normalised_training(local_exe, model_dir, tmp_path, train_config, self_normalized):
    """The (ln Z)^2 penalty or NCE: Moses's feature then uses o_w by default, as the Python engine decides."""
    from cslm.engine import trained_self_normalized

    out, loaded, corpus = model_dir
    d = tmp_path / "m"
    modeldir.save_vocab(str(d), loaded.vocab)
    # a float32 copy: the module's model may have been made float64 by an earlier test
    modeldir.save_weights(str(d), copy.deepcopy(loaded.model).float(), {"train_config": train_config})
    r = subprocess.run([str(local_exe), str(d)], input="le chat\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"self-normalized {self_normalized}" in r.stderr, r.stderr
    assert trained_self_normalized({"train_config": train_config}) == bool(self_normalized)


@pytest.mark.parametrize("damage", ["no-weights", "truncated", "not-cslm", "vocab-size"])
def test_local_evaluator_errors_name_the_file(local_exe, model_dir, tmp_path, damage):
    out, _, _ = model_dir
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    if damage == "no-weights":
        (bad / "model.safetensors").unlink()
        expect = "model.safetensors: cannot read"
    elif damage == "truncated":
        data = (bad / "model.safetensors").read_bytes()
        (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
        expect = "model.safetensors: "
    elif damage == "not-cslm":
        blob = json.loads((bad / "config.json").read_text())
        blob["format"] = "moses-rnn"
        (bad / "config.json").write_text(json.dumps(blob))
        expect = "config.json: not a CSLM model directory"
    else:
        with open(bad / "cslm.vocab", "a") as f:
            f.write("extra\t1\n")
        expect = "model.safetensors: embed.weight has"
    r = subprocess.run([str(local_exe), str(bad)], input="w1 w2\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and expect in r.stderr, r.stderr
