"""The joint model (NNJM, Devlin et al. 2014): affiliation, source windows, alignment errors, training and
exact resume, the engine against the network, commands, and plain CSLMs unchanged beside it."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cslm import modeldir
from cslm.data import SourceSide, affiliations, decoder_affiliations, iter_sentences, scan_corpus, sentence_rows, source_windows
from cslm.engine import Engine
from cslm.model import CSLM, CSLMConfig, preset_config
from cslm.train import TrainConfig, train
from mtcommon.errors import UserError
from mtcommon.textio import InputError
from mtcommon.vocab import BOS, EOS, UNK, Vocabulary


MOSES_FF = Path(__file__).resolve().parents[1] / "cslm" / "moses"


def parallel_corpus(root, sentences=300, seed=0):
    """A toy parallel corpus whose target words are translations of source words: t = f(s), some source words
    dropped (unaligned), some target words inserted ("the", unaligned), some source words giving two target
    words (one-to-many). A target-only model cannot tell which word comes next; the source window can."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(60)]
    src_lines, tgt_lines, ali_lines = [], [], []
    for _ in range(sentences):
        src = [f"s{k}" for k in rng.choices(range(60), weights, k=rng.randint(2, 10))]
        tgt, links = [], []
        for i, w in enumerate(src):
            r, k = rng.random(), int(w[1:])
            if r < 0.1:
                continue
            if rng.random() < 0.15:
                tgt.append("the")
            links.append(f"{i}-{len(tgt)}")
            tgt.append(f"t{(k * 7) % 60}")
            if r > 0.9:
                links.append(f"{i}-{len(tgt)}")
                tgt.append(f"u{k}")
        src_lines.append(" ".join(src))
        tgt_lines.append(" ".join(tgt))
        ali_lines.append(" ".join(links))
    paths = root / "tgt.txt", root / "src.txt", root / "ali.txt"
    for path, lines in zip(paths, (tgt_lines, src_lines, ali_lines)):
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return parallel_corpus(tmp_path_factory.mktemp("nnjm-corpus"), sentences=400, seed=1)


def joint_cfg(corpus, **kw):
    _, src, ali = corpus
    base = dict(preset="tiny", vocab_size=80, source=str(src), alignment=str(ali), source_window=5, max_epochs=4,
                valid_fraction=0.05, batch_size=64, device="cpu", dtype="fp32", threads=1, lr=3e-3)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def joint_model(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("nnjm-model")
    summary = train(str(corpus[0]), str(out), joint_cfg(corpus), progress=False)
    return out, summary


# -- affiliation (Devlin et al. 2014, Sec. 2) -----------------------------------------------------------------
def test_one_to_one_takes_its_source_word_and_eos_takes_the_source_eos():
    assert affiliations([(0, 1), (1, 0), (2, 2)], 3, 3).tolist() == [1, 0, 2, 3]


@pytest.mark.parametrize("sources,middle", [([4, 1, 2], 2), ([3, 1], 1), ([0, 5, 2, 4], 2), ([2, 2, 7], 2)])
def test_one_to_many_takes_the_middle_the_left_one_of_an_even_count(sources, middle):
    """Odd: the middle in source order; even: the left of the two middles, as Moses's BilingualLM."""
    assert affiliations([(i, 0) for i in sources], 8, 1).tolist() == [middle, 8]


def test_unaligned_words_take_the_nearest_aligned_word_right_first():
    # target 0 and 4 aligned; 1 is nearer 0, 3 nearer 4, 2 as near both: the right one
    links = [(5, 0), (9, 4)]
    assert affiliations(links, 10, 5).tolist() == [5, 5, 9, 9, 9, 10]


def test_unaligned_words_at_the_edges_take_the_only_side_there_is():
    assert affiliations([(3, 2)], 6, 5).tolist() == [3, 3, 3, 3, 3, 6]  # left edge: right; right edge: left
    assert affiliations([(1, 0), (4, 3)], 6, 4).tolist() == [1, 1, 4, 4, 6]


def test_null_heavy_sentence_hangs_on_its_few_links():
    links = [(0, 6)]  # one link among seven target words, most source words unaligned
    assert affiliations(links, 9, 7).tolist() == [0] * 7 + [9]


def test_fully_unaligned_sentence_takes_the_proportional_source_position():
    # floor((2j + 1) * 4 / (2 * 3)): the source word under each target word's centre
    assert affiliations([], 4, 3).tolist() == [0, 2, 3, 4]
    assert affiliations([], 2, 5).tolist() == [0, 0, 1, 1, 1, 2]
    assert affiliations([], 0, 2).tolist() == [0, 0, 0]  # an empty source: its </s>


# -- the window --------------------------------------------------------------------------------------------
def test_windows_are_padded_with_source_bos_and_eos_beyond_the_edges():
    b, e = 1, 0
    win = source_windows([10, 11, 12], np.array([0, 1, 2, 3]), 5, b, e)
    assert win.tolist() == [[b, b, 10, 11, 12], [b, 10, 11, 12, e], [10, 11, 12, e, e], [11, 12, e, e, e]]
    assert source_windows([], np.array([0]), 3, b, e).tolist() == [[b, e, e]]
    assert source_windows([7], np.array([0, 1]), 1, b, e).tolist() == [[7], [e]]


def test_a_row_is_the_target_history_the_source_window_then_the_word():
    tv = Vocabulary.build({"a": 2, "b": 1}, 10, reserved=(EOS, BOS, UNK))
    sv = Vocabulary.build({"x": 2, "y": 1}, 10, reserved=(EOS, BOS, UNK))
    rows = sentence_rows(["a", "b"], tv, 3, ["x", "y"], [(1, 0), (0, 1)], sv, 3)
    a, b, x, y = tv.index["a"], tv.index["b"], sv.index["x"], sv.index["y"]
    B, E = tv.index[BOS], tv.index[EOS]
    assert rows.tolist() == [[B, B, x, y, E, a], [B, a, B, x, y, b], [a, b, y, E, E, E]]


# -- bad alignments: one line naming the file and line --------------------------------------------------------
def _files(tmp_path, tgt, src, ali):
    paths = tmp_path / "t.txt", tmp_path / "s.txt", tmp_path / "a.txt"
    for p, text in zip(paths, (tgt, src, ali)):
        p.write_text(text, encoding="utf-8")
    return paths


@pytest.mark.parametrize("ali,where,what", [
    ("0-0\n0-0 2-1\n", "a.txt:2", "source index 2 out of range"),
    ("0-0\n0-2\n", "a.txt:2", "target index 2 out of range"),
    ("0-0\n0-0 1_1\n", "a.txt:2", "malformed alignment pair '1_1'"),
    ("0-0\n0-x\n", "a.txt:2", "malformed"),
    ("0-0\n-1-0\n", "a.txt:2", "malformed"),
    ("0-0\n0-\n", "a.txt:2", "malformed"),
    ("0-0\n", "t.txt:2", "a.txt ends at line 1"),
    ("0-0\n0-0\n1-1\n", "a.txt:3", "t.txt ends at line 2"),
])
def test_bad_alignments_name_the_file_and_line(tmp_path, ali, where, what):
    t, s, a = _files(tmp_path, "a\nb c\n", "x\ny z\n", ali)
    with pytest.raises(InputError) as e:
        list(iter_sentences(str(t), SourceSide(str(s), str(a))))
    assert str(e.value).startswith(f"{tmp_path}/{where}: ") and what in str(e.value) and "\n" not in str(e.value)


def test_a_source_text_shorter_than_the_target_is_named(tmp_path):
    t, s, a = _files(tmp_path, "a\nb\nc\n", "x\ny\n", "0-0\n0-0\n0-0\n")
    with pytest.raises(InputError, match=r"t.txt:3: .*s.txt ends at line 2"):
        scan_corpus(str(t), 0.1, 1, SourceSide(str(s), str(a)))


def test_cli_train_on_a_bad_alignment_is_one_line(tmp_path, corpus):
    tgt, src, ali = corpus
    bad = tmp_path / "bad.txt"
    lines = ali.read_text().splitlines()
    lines[6] += " 99-0"
    bad.write_text("\n".join(lines) + "\n")
    r = subprocess.run([sys.executable, "-m", "cslm.cli", "train", str(tgt), "--source", str(src), "--alignment",
                        str(bad), "-o", str(tmp_path / "m"), "--preset", "tiny", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0, r.stderr
    assert f"{bad}:7: alignment pair '99-0': source index 99 out of range" in r.stderr
    assert not (tmp_path / "m").exists()  # no empty model folder left behind


# -- configuration --------------------------------------------------------------------------------------------
def test_paper_defaults_a_4gram_history_and_an_11_word_window():
    cfg = TrainConfig(preset="tiny", source="s", alignment="a")
    assert (cfg.order, cfg.source_window) == (4, 11)
    m = cfg.model_config()
    assert (m.order, m.source_window, m.source_vocab_size, m.context) == (4, 11, 1000, 14)
    plain = TrainConfig(preset="tiny")
    assert plain.order is None and plain.model_config().order == 7 and plain.model_config().source_window == 0
    assert TrainConfig(preset="tiny", order=5).model_config().order == 5


@pytest.mark.parametrize("kwargs,message", [
    (dict(source="s"), "give both"),
    (dict(alignment="a"), "give both"),
    (dict(source_window=5), "--source-window is for a joint model"),
    (dict(source="s", alignment="a", source_window=4), "odd"),
    (dict(source="s", alignment="a", valid_text="v"), "--valid-text"),
])
def test_bad_joint_options_are_refused(kwargs, message):
    with pytest.raises(UserError, match=message):
        TrainConfig(preset="tiny", **kwargs)


def test_a_plain_config_is_written_as_before():
    """No source keys in a plain CSLM's config.json: old and new plain models read alike."""
    d = preset_config("tiny").to_dict()
    assert set(d) == {"vocab_size", "order", "embed", "hidden", "init_range", "dropout"}
    assert CSLMConfig(**d) == preset_config("tiny")
    with pytest.raises(UserError, match="source_vocab_size"):
        CSLMConfig(source_vocab_size=50)


def test_first_layer_tables_cover_the_source_positions():
    """T_p for the target positions, S_q for the source ones: the premultiplied path is the network's."""
    torch.manual_seed(0)
    cfg = preset_config("tiny", 30, order=4, source_window=3, source_vocab_size=45)
    model = CSLM(cfg).double()
    model.init_weights()
    for p in model.parameters():
        torch.nn.init.uniform_(p, -0.5, 0.5)
    T = model.first_layer_tables(torch.float64)
    assert T.shape == (6, 45, 64)
    ctx = torch.cat([torch.randint(0, 30, (20, 3)), torch.randint(0, 45, (20, 3))], 1)
    with torch.no_grad():
        assert torch.allclose(model.features_from_tables(T, ctx), model.features(ctx), atol=1e-12)


# -- training, resume, the engine -----------------------------------------------------------------------------
def test_the_joint_model_learns_what_the_target_alone_cannot(corpus, joint_model, tmp_path):
    """Same target tokens, shortlist and updates: the source window does the work (perplexity < 0.6x)."""
    out, joint = joint_model
    plain = train(str(corpus[0]), str(tmp_path / "plain"),
                  joint_cfg(corpus, source=None, alignment=None, source_window=None, order=4), progress=False)
    assert joint["valid_ngrams"] == plain["valid_ngrams"]
    assert joint["best_valid_ppl"] < 0.6 * plain["best_valid_ppl"]
    m = modeldir.load(str(out))
    assert m.config.source_window == 5 and m.config.order == 4 and len(m.src_vocab) == m.config.source_vocab_size
    assert (out / "cslm.src.vocab").exists() and m.src_vocab.words[:3] == [EOS, BOS, UNK]


def test_resume_is_exact_and_keeps_its_source_and_alignment(corpus, tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    train(str(corpus[0]), str(whole), joint_cfg(corpus, max_epochs=3), progress=False)
    train(str(corpus[0]), str(split), joint_cfg(corpus, max_epochs=1), progress=False)
    train(str(corpus[0]), str(split), joint_cfg(corpus, max_epochs=3), resume=True, progress=False)
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(split / "model.safetensors"))
    assert a.keys() == b.keys() and "src_embed.weight" in a
    assert all(torch.equal(a[k], b[k]) for k in a)
    # another alignment is other data: refused, naming it
    other = tmp_path / "other.txt"
    other.write_text(corpus[2].read_text().replace("0-0", "0-0 0-0", 1))
    with pytest.raises(UserError, match="is not the data the run"):
        train(str(corpus[0]), str(split), joint_cfg(corpus, alignment=str(other), max_epochs=4), resume=True,
              progress=False)


def _sentences(corpus, n=40):
    tgt, src, ali = corpus
    side = SourceSide(str(src), str(ali))
    items = list(iter_sentences(str(tgt), side))[:n]
    return [w for _, w, _, _ in items], [s for _, _, s, _ in items], [a for _, _, _, a in items]


def test_engine_scores_are_the_networks_forward_pass(corpus, joint_model):
    out, _ = joint_model
    loaded = modeldir.load(str(out))
    sents, srcs, alis = _sentences(corpus)
    for normalized in (True, False):
        engine = Engine.load(str(out), device="cpu", normalized=normalized)
        got = engine.score_sentences(sents, srcs, alis)
        rows = np.concatenate([sentence_rows(w, loaded.vocab, 4, s, a, loaded.src_vocab, 5)
                               for w, s, a in zip(sents, srcs, alis)])
        with torch.no_grad():
            o = loaded.model(torch.from_numpy(rows[:, :-1]).long()).double()
        if normalized:
            o = torch.log_softmax(o, -1)
        want = o[torch.arange(len(rows)), torch.from_numpy(rows[:, -1]).long()].numpy()
        assert np.allclose(np.concatenate([lp for lp, _ in got]), want, atol=1e-5)
        assert [len(lp) for lp, _ in got] == [len(s) + 1 for s in sents]


def test_a_joint_engine_needs_its_source_and_a_plain_one_refuses_it(corpus, joint_model, tmp_path):
    out, _ = joint_model
    engine = Engine.load(str(out), device="cpu")
    sents, srcs, alis = _sentences(corpus, 3)
    with pytest.raises(UserError, match="is a joint model"):
        engine.score_sentences(sents)
    with pytest.raises(UserError, match="is a joint model"):
        engine.score_words([["t1", "t2"]])
    with pytest.raises(ValueError, match=r"\(N, 9\)"):
        engine.score_ids(np.zeros((2, 4), np.int32))
    plain = tmp_path / "plain"
    train(str(corpus[0]), str(plain), joint_cfg(corpus, source=None, alignment=None, source_window=None,
                                                max_epochs=1), progress=False)
    with pytest.raises(UserError, match="is a target-only CSLM"):
        Engine.load(str(plain), device="cpu").score_sentences(sents, srcs, alis)


def _cslm(*args):
    return subprocess.run([sys.executable, "-m", "cslm.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_eval_and_score_commands(corpus, joint_model, tmp_path):
    out, _ = joint_model
    tgt, src, ali = corpus
    r = _cslm("eval", out, tgt, "--source", src, "--alignment", ali, "--quiet", "--threads", "1")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    sents, srcs, alis = _sentences(corpus, 400)
    scored = Engine.load(str(out), device="cpu").score_sentences(sents, srcs, alis)
    total = sum(float(np.sum(lp, dtype=np.float64)) for lp, _ in scored)
    assert res["tokens"] == sum(len(s) + 1 for s in sents)
    assert res["cslm_ppl"] == pytest.approx(np.exp(-total / res["tokens"]), rel=1e-9)
    score = tmp_path / "scores.txt"
    r = _cslm("score", out, tgt, "--source", src, "--alignment", ali, "-o", score, "--quiet", "--threads", "1")
    assert r.returncode == 0, r.stderr
    sums = [float(line.split("\t")[0]) for line in score.read_text().splitlines()]
    assert np.allclose(sums, [np.sum(lp, dtype=np.float64) for lp, _ in scored], atol=1e-5)


@pytest.mark.parametrize("args,expect", [
    (["eval", "{m}", "{t}"], "is a joint model"),
    (["score", "{m}", "{t}"], "is a joint model"),
    (["score", "{m}", "{t}", "--ngrams", "--source", "{s}", "--alignment", "{a}"], "carry no source window"),
    (["score", "{m}", "{t}", "--source", "{s}"], "--source and --alignment go together"),
    (["rescore-nbest", "{m}", "{t}", "-o", "{o}"], "is a joint model"),
    (["rescore-nbest", "{m}", "{t}", "-o", "{o}", "--source", "{s}", "--server", "127.0.0.1:1"], "not for --server"),
    (["serve", "{m}", "--port", "0"], "is a joint model"),
])
def test_commands_refuse_a_joint_model_without_its_source_in_one_line(corpus, joint_model, tmp_path, args, expect):
    out, _ = joint_model
    tgt, src, ali = corpus
    fill = dict(m=out, t=tgt, s=src, a=ali, o=tmp_path / "o.txt")
    r = _cslm(*[a.format(**fill) for a in args])
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error: ")]
    assert r.returncode != 0 and len(errors) == 1 and expect in errors[0], r.stderr  # click's usage lines aside
    assert "Traceback" not in r.stderr and not (tmp_path / "o.txt").exists()


def test_a_plain_model_refuses_a_source_in_one_line(corpus, tmp_path):
    plain = tmp_path / "plain"
    train(str(corpus[0]), str(plain), joint_cfg(corpus, source=None, alignment=None, source_window=None,
                                                max_epochs=1), progress=False)
    cfg = json.loads((plain / "config.json").read_text())
    assert "source_window" not in cfg["model"] and not (plain / "cslm.src.vocab").exists()
    assert not any(k.startswith("src_embed") for k in load_file(str(plain / "model.safetensors")))
    tgt, src, ali = corpus
    r = _cslm("eval", plain, tgt, "--source", src, "--alignment", ali, "--quiet")
    assert r.returncode == 1 and r.stderr.strip() == f"Error: {plain} is a target-only CSLM: a source text and " \
                                                      f"alignment are for a joint model"


def _joint_rows(corpus, loaded):
    """Rows of the first sentences (with <s>/</s> padding in both the history and the window) and rows with
    words outside both shortlists, as id arrays and as the C++ driver's word lines."""
    sents, srcs, alis = _sentences(corpus, 30)
    rows = np.concatenate([sentence_rows(w, loaded.vocab, 4, s, a, loaded.src_vocab, 5)
                           for w, s, a in zip(sents, srcs, alis)])
    tw, sw = loaded.vocab.words, loaded.src_vocab.words
    lines = [" ".join([tw[i] for i in r[:3]] + [sw[i] for i in r[3:-1]] + [tw[r[-1]]]) for r in rows]
    unk, src_unk = loaded.vocab.index[UNK], loaded.src_vocab.index[UNK]
    extra = [("never-seen t1 the s1 unseen-src s2 </s> </s> t2", [unk, 0, 0, 0, src_unk, 0, 0, 0, 0]),
             ("<s> <s> <s> <s> <s> s3 s4 s5 zzz", [0] * 8 + [unk])]
    for line, ids in extra:
        words = line.split()
        row = [loaded.vocab.index.get(w, unk) for w in words[:3]] + \
              [loaded.src_vocab.index.get(w, src_unk) for w in words[3:8]] + [loaded.vocab.index.get(words[8], unk)]
        assert all(row[k] == ids[k] for k in range(9) if ids[k])  # the unknown words are [UNK] indeed
        rows = np.concatenate([rows, np.array([row], rows.dtype)])
        lines.append(line)
    return rows, lines


def test_the_cpp_evaluator_agrees_with_the_engine_on_a_joint_model(local_exe, corpus, joint_model):
    """h_1 = relu(b_1 + sum_p T_p[w_p] + sum_q S_q[s_q]): exact and self-normalised scores as the engine's."""
    out, _ = joint_model
    loaded = modeldir.load(str(out))
    rows, lines = _joint_rows(corpus, loaded)
    assert (rows[:, 3:8] == loaded.src_vocab.index[BOS]).any() and (rows[:, 3:8] == loaded.src_vocab.index[EOS]).any()
    r = subprocess.run([str(local_exe), str(out)], input="".join(line + "\n" for line in lines), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = np.array([[float(x) for x in line.split()] for line in r.stdout.splitlines()])
    assert got.shape == (len(rows), 2)
    for column, normalized in ((0, True), (1, False)):
        want, _ = Engine.load(str(out), device="cpu", normalized=normalized).score_ids(rows)
        assert np.max(np.abs(got[:, column] - want)) < 1e-4


def test_the_cpp_evaluators_int8_joint_model_follows_its_equations(local_exe, corpus, joint_model, tmp_path):
    """--precision int8 on a joint model (Moses's NNJM takes it too): h_1 from the target and source tables
    T_p and S_q, both in bfloat16, the layers after it in 8 bits (cslm_local.h, "Precision"), with every
    kernel, as the equations computed in float64. The embeddings and the first layer's weights are put on a
    grid, so that the tables are exact in float32 before their rounding, whatever the kernel that builds
    them."""
    from safetensors.torch import save_file
    from test_cslm_local import int8_scores, run_local

    out, _ = joint_model
    grid = tmp_path / "grid"
    shutil.copytree(out, grid)
    tensors = load_file(str(grid / "model.safetensors"))
    for name in ("embed.weight", "src_embed.weight", "hidden.0.weight"):
        tensors[name] = torch.round(tensors[name] * 128) / 128
    save_file(tensors, str(grid / "model.safetensors"))
    loaded = modeldir.load(str(grid))
    rows, lines = _joint_rows(corpus, loaded)
    want_exact, want_sn = int8_scores(loaded, rows)
    fp32, _ = Engine.load(str(grid), device="cpu", normalized=False).score_ids(rows)
    for cap in ("amx", "avx512", "avx2", "baseline"):
        got = run_local(local_exe, grid, [line.split() for line in lines], kernels=cap, precision="int8")
        assert np.max(np.abs(got[:, 0] - want_exact)) < 5e-5 and np.max(np.abs(got[:, 1] - want_sn)) < 5e-5, cap
        assert 0 < np.max(np.abs(got[:, 1] - fp32)) < 0.2, cap


def test_the_cpp_evaluator_wants_whole_joint_rows(local_exe, joint_model):
    out, _ = joint_model
    r = subprocess.run([str(local_exe), str(out)], input="t1 t2\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and not r.stdout
    assert r.stderr.strip() == "line 1: expected 9 words (3 target, 5 source, the predicted word)"


@pytest.mark.parametrize("damage", ["no-src-embed", "src-vocab-size", "no-src-vocab"])
def test_a_damaged_joint_model_is_one_line_naming_the_file(local_exe, joint_model, tmp_path, damage):
    from safetensors.torch import save_file

    out, _ = joint_model
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    if damage == "no-src-embed":
        tensors = load_file(str(bad / "model.safetensors"))
        del tensors["src_embed.weight"]
        save_file(tensors, str(bad / "model.safetensors"))
        expect = f"{bad}/model.safetensors: no tensor src_embed.weight"
    elif damage == "src-vocab-size":
        with open(bad / "cslm.src.vocab", "a") as f:
            f.write("extra\t1\n")
        expect = f"{bad}/cslm.src.vocab: has "
    else:
        (bad / "cslm.src.vocab").unlink()
        expect = f"{bad}/cslm.src.vocab: cannot read"
    r = subprocess.run([str(local_exe), str(bad)], input="", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and not r.stdout and r.stderr.count("\n") == 1 and r.stderr.startswith(expect), r.stderr


def test_the_moses_backend_scores_a_joint_models_rows_as_the_engine(backend_exe, corpus, joint_model):
    """The NNJM feature's backend (cslm::LocalBackend): whole rows in, the engine's scores out, the unknown
    flag from the predicted word (each row's last id, not its order-th)."""
    out, _ = joint_model
    loaded = modeldir.load(str(out))
    rows, lines = _joint_rows(corpus, loaded)
    for self_normalized in ("false", "true"):
        r = subprocess.run([str(backend_exe), "--self-normalized", self_normalized, str(out)],
                           input="".join(line + "\n" for line in lines), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        got = np.array([[float(x) for x in line.split()] for line in r.stdout.splitlines()])
        engine = Engine.load(str(out), device="cpu", normalized=self_normalized == "false")
        want, _ = engine.score_ids(rows)
        assert got.shape == (len(rows), 2) and np.max(np.abs(got[:, 0] - want)) < 1e-4
        assert np.array_equal(got[:, 1] == 1, rows[:, -1] == loaded.vocab.index[UNK])
    assert (got[:, 1] == 1).any() and (rows[:, 3:8] == loaded.src_vocab.index[UNK]).any()


@pytest.fixture(scope="module")
def affiliation_exe(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("cslm-affiliation") / "cslm_affiliation_test"
    subprocess.run([cxx, "-std=c++11", "-O1", "-Wall", "-Wextra", "-Werror", "-o", str(exe),
                    str(MOSES_FF / "cslm_affiliation_test.cc")], check=True, timeout=120)
    return exe


def test_the_decoders_affiliation_is_the_training_rule_inside_each_phrase_pair(affiliation_exe):
    """cslm_affiliation.h (the Moses feature's) against cslm.data.affiliations on random phrase pairs:
    one-to-one, many-to-one, unaligned words on either side, ties, and pairs with no alignment at all."""
    rng = random.Random(3)
    cases = [(1, 1, []), (3, 1, []), (1, 4, []), (2, 2, [(0, 1)]), (4, 3, [(0, 1), (3, 1), (1, 1), (2, 1)]),
             (2, 3, [(0, 0), (1, 2)])]  # target word 1 is as near to 0 as to 2: the right one wins
    for _ in range(500):
        src_len, tgt_len = rng.randint(1, 7), rng.randint(1, 7)
        links = {(rng.randrange(src_len), rng.randrange(tgt_len)) for _ in range(rng.randint(0, 8))}
        cases.append((src_len, tgt_len, sorted(links)))
    text = "".join(f"{s} {t} " + " ".join(f"{i}-{j}" for i, j in links) + "\n" for s, t, links in cases)
    r = subprocess.run([str(affiliation_exe)], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = [[int(x) for x in line.split()] for line in r.stdout.splitlines()]
    assert got == [list(affiliations(links, s, t)[:-1]) for s, t, links in cases]
    assert got[:6] == [[0], [1], [0, 0, 0, 0], [0, 0], [1, 1, 1], [0, 1, 1]]


def test_decoder_affiliations_stay_inside_each_phrase_pair():
    """A hypothesis of two phrase pairs: source 0-1 -> target 0-2, source 2-4 -> target 3-4. Target word 2 is
    unaligned: inside its phrase pair it takes word 1's source (1); over the whole sentence its nearest aligned
    word would be target 3, aligned to source 4. A pair with no alignment takes the proportional position."""
    links = [(0, 0), (1, 1), (4, 3), (3, 4)]
    assert list(decoder_affiliations([(0, 2, 0, 3), (2, 5, 3, 5)], links, 5, 5)) == [0, 1, 1, 4, 3, 5]
    assert list(affiliations(links, 5, 5)) == [0, 1, 4, 4, 3, 5]
    assert list(decoder_affiliations([(0, 3, 0, 2), (3, 4, 2, 3)], [(3, 2)], 4, 3)) == [0, 2, 3, 4]


def _nbest(corpus, tmp_path, count=40, segmentation=True):
    """An n-best list of the corpus's first sentences as Moses writes it with -include-segmentation-in-n-best
    and -print-alignment-info-in-n-best: each target sentence as a hypothesis, cut into phrase pairs that
    respect its alignment (a pair ends where no link crosses), then the words' links."""
    sents, srcs, alis = _sentences(corpus, count)
    lines = []
    for k, (words, src, links) in enumerate(zip(sents, srcs, alis)):
        segs, t0, s0 = [], 0, 0
        for t in range(1, len(words) + 1):  # close a pair where no link joins the two sides of the cut
            inside = [i for i, j in links if t0 <= j < t]
            s1 = max([s0 + 1] + [i + 1 for i in inside])
            crossing = any((j < t) != (i < s1) for i, j in links if j >= t0 and i >= s0)
            if not crossing and (t == len(words) or s1 < len(src)):
                segs.append(f"{s0}-{s1 - 1}={t0}-{t - 1}" if t - t0 > 1 or s1 - s0 > 1 else f"{s0}={t0}")
                t0, s0 = t, s1
        fields = [str(k), " ".join(words), "CSLM0= -1 0", "-1"]
        if segmentation and t0 == len(words) and s0 == len(src):
            fields.append(" ".join(segs))
        fields.append(" ".join(f"{i}-{j}" for i, j in links))
        lines.append(" ||| ".join(fields))
    path = tmp_path / ("nbest" if segmentation else "nbest.words")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, sents, srcs, lines


def test_rescore_nbest_with_a_joint_model_takes_the_decoders_affiliations(corpus, joint_model, tmp_path):
    """With the segmentation, each word's window is the one Moses's NNJM feature gives it (the rule inside each
    phrase pair); without it, training's rule over the whole hypothesis, as `cslm score` with the alignment."""
    from mtcommon import nbest as nbest_list

    out, _ = joint_model
    engine = Engine.load(str(out), device="cpu")
    for segmentation in (True, False):
        path, sents, srcs, lines = _nbest(corpus, tmp_path, segmentation=segmentation)
        result = tmp_path / f"rescored-{segmentation}"
        r = _cslm("rescore-nbest", out, path, "-o", result, "--source", corpus[1], "--feature", "NNJM0", "--threads", "1")
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stderr.strip().splitlines()[-1])
        hyps = [nbest_list.parse(line, str(path), k + 1) for k, line in enumerate(lines)]
        if segmentation:
            assert 0 < summary["decoder_affiliations"] <= len(lines)
        else:
            assert summary["decoder_affiliations"] == 0
        alignments = []
        for h, words, src in zip(hyps, sents, srcs):
            segments, links = h.alignment(str(path))
            affil = (decoder_affiliations(segments, links, len(src), len(words)) if segments is not None
                     else affiliations(links, len(src), len(words)))
            alignments.append([(int(a), j) for j, a in enumerate(affil[:-1])])
        want = [float(np.sum(lp, dtype=np.float64)) for lp, _ in engine.score_sentences(sents, srcs, alignments)]
        got = [float(line.split(" ||| ")[2].split("NNJM0= ")[1].split()[0]) for line in result.read_text().splitlines()]
        assert np.allclose(got, want, atol=1e-5)
        assert all(a.split(" ||| ")[4:] == b.split(" ||| ")[4:] for a, b in zip(lines, result.read_text().splitlines()))


@pytest.mark.parametrize("damage,expect", [
    ("no-alignment", ":1: no word alignment after the total"),
    ("sentence", "sentence 999 has no source line"),
    ("link", "alignment link 99-0 outside the hypothesis"),
])
def test_rescore_nbest_with_a_joint_model_refuses_a_bad_list_in_one_line(corpus, joint_model, tmp_path, damage, expect):
    out, _ = joint_model
    path, _, _, lines = _nbest(corpus, tmp_path, count=3)
    fields = lines[0].split(" ||| ")
    if damage == "no-alignment":
        fields = fields[:4]
    elif damage == "sentence":
        fields[0] = "999"
    else:
        fields[-1] = "99-0"
    path.write_text("\n".join([" ||| ".join(fields)] + lines[1:]) + "\n", encoding="utf-8")
    r = _cslm("rescore-nbest", out, path, "-o", tmp_path / "o", "--source", corpus[1], "--quiet")
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(errors) == 1 and expect in errors[0] and str(path) in errors[0], r.stderr
    assert not (tmp_path / "o").exists()
