"""Sampling and beam search, for both architectures."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from moses_rnn.cli import main
from moses_rnn.generation.generate import Generator, largest, max_words, read_sources
from moses_rnn.networks import ARCHS
from moses_rnn.networks.modelbase import ModelConfig
from moses_rnn.networks.modelio import LoadedModel, build_model
from moses_rnn.scoring.scorer import PhraseScorer
from mtcommon.textio import InputError
from mtcommon.vocab import Vocabulary

WORDS = ["</s>", "[UNK]", "a", "b", "c", "d"]


def random_loaded(arch: str, seed: int = 0, std: float = 0.4) -> LoadedModel:
    torch.manual_seed(seed)
    V = len(WORDS)
    cfg = ModelConfig(arch=arch, src_vocab=V, tgt_vocab=V, embed=6, hidden=10, maxout=5, out_rank=4,
                      align=8 if arch == "rnnsearch" else 0)
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    vocab = Vocabulary(WORDS)
    return LoadedModel(model.eval(), vocab, vocab, cfg, {})


SOURCES = ["a b c", "d", "b b a c d"]


@pytest.mark.parametrize("arch", ARCHS)
def test_samples_are_repeatable_counted_and_scored_like_the_scorer(arch):
    loaded = random_loaded(arch)
    gen = Generator(loaded)
    first = gen.sample(SOURCES, n=30, seed=7)
    again = gen.sample(SOURCES, n=30, seed=7)
    other = gen.sample(SOURCES, n=30, seed=8)
    key = lambda res: [[(h.text, h.count) for h in hyps] for hyps in res]  # noqa: E731
    assert key(first) == key(again)
    assert key(first) != key(other)
    scorer = PhraseScorer(loaded)
    for src, hyps in zip(SOURCES, first):
        assert sum(h.count for h in hyps) == 30
        assert len({h.text for h in hyps}) == len(hyps)  # distinct targets
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert all(1 <= len(h.words) <= max_words(len(src.split()), 2.0, 3) for h in hyps)
        expected = scorer.score([(src, h.text) for h in hyps])
        assert np.allclose([h.log_prob for h in hyps], expected, atol=1e-4)


def test_sampling_without_unk_and_length_limit():
    gen = Generator(random_loaded("rnnsearch"))
    res = gen.sample(["a b"], n=40, seed=1, allow_unk=False, len_ratio=0.0, len_extra=1)
    assert all(len(h.words) == 1 and "[UNK]" not in h.words for h in res[0])


def greedy(gen: Generator, source: str, limit: int) -> list[str]:
    """Plain argmax decoding, one word at a time, through the model's own step interface."""
    model, embed = gen.model, gen.model.target_embeddings()
    src = torch.tensor([gen.src_vocab.encode(source.split())])
    words = []
    with torch.no_grad():
        ctx = model.context(src, torch.ones_like(src, dtype=torch.bool))
        state = model.start_state(ctx)
        e_prev = embed.weight.new_zeros(1, embed.embedding_dim)  # e(y_0) = 0
        for t in range(limit + 1):
            logits, state = model.step(ctx, state, e_prev)
            if t == 0:
                logits[0, gen.eos] = -math.inf
            if t == limit:
                break
            y = int(logits.argmax())
            if y == gen.eos:
                break
            words.append(WORDS[y])
            e_prev = embed(torch.tensor([y]))
    return words

@pytest.mark.parametrize("arch", ARCHS)
def test_a_context_row_serves_a_group_of_states_as_its_copies_would(arch):
    """step_readout with one context row per K consecutive states (beam search, sampling) gives what
    it gives with the context copied for each state."""
    loaded = random_loaded(arch, seed=4)
    gen, model, K = Generator(loaded), loaded.model, 3
    ctx, _ = gen._encode(SOURCES)
    copies = ctx.select(torch.arange(len(SOURCES)).repeat_interleave(K))
    state = torch.randn(len(SOURCES) * K, loaded.config.hidden)
    e_prev = torch.randn(len(SOURCES) * K, loaded.config.embed)
    with torch.no_grad():
        shared = model.step_readout(ctx, state, e_prev)
        copied = model.step_readout(copies, state, e_prev)
    for a, b in zip(shared, copied):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)



@pytest.mark.parametrize("arch", ARCHS)
def test_beam_of_one_is_greedy(arch):
    gen = Generator(random_loaded(arch, seed=3))
    for src in SOURCES:
        limit = max_words(len(src.split()), 2.0, 3)
        assert gen.beam_search([src], beam=1)[0][0].words == greedy(gen, src, limit)


@pytest.mark.parametrize("arch", ARCHS)
def test_wide_beam_finds_the_exact_best_target(arch):
    """With a beam as wide as the search space, beam search is exact: compare with enumeration."""
    loaded = random_loaded(arch, seed=5, std=0.8)
    gen, scorer = Generator(loaded), PhraseScorer(loaded)
    real = WORDS[1:]  # every word but </s>
    for src in SOURCES:
        candidates = [" ".join(c) for n in (1, 2) for c in itertools.product(real, repeat=n)]
        scores = scorer.score([(src, c) for c in candidates])
        best = gen.beam_search([src], beam=len(candidates), n_best=3, len_ratio=0.0, len_extra=2)[0]
        assert best[0].text == candidates[int(np.argmax(scores))]
        assert np.allclose([h.log_prob for h in best], np.sort(scores)[::-1][:3], atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_beam_search_equals_one_phrase_at_a_time(arch):
    gen = Generator(random_loaded(arch, seed=2))
    together = gen.beam_search(SOURCES, beam=4, n_best=4)
    for src, hyps in zip(SOURCES, together):
        alone = gen.beam_search([src], beam=4, n_best=4)[0]
        assert [h.text for h in hyps] == [h.text for h in alone]
        assert np.allclose([h.log_prob for h in hyps], [h.log_prob for h in alone], atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("n_best", [1, 2])
def test_early_stop_returns_what_the_full_search_returns_in_fewer_steps(arch, n_best):
    """A source stops once its n_best finished hypotheses beat every live one: the same n-best, and
    never more hypotheses stepped through the decoder (counted over a few peaked random models)."""
    sources = SOURCES + ["c c c c d d a", "b", "a d"]
    rows = {True: 0, False: 0}
    for seed in range(4):
        gen = Generator(random_loaded(arch, seed=seed, std=0.8))
        step, found = gen.model.step_readout, {}
        for early in (True, False):
            def counted(ctx, state, e_prev, early=early):
                rows[early] += state.shape[0]
                return step(ctx, state, e_prev)
            gen.model.step_readout = counted
            found[early] = gen.beam_search(sources, beam=4, n_best=n_best, stop_early=early)
        for a, b in zip(found[True], found[False]):
            assert [h.text for h in a] == [h.text for h in b]
            assert np.allclose([h.log_prob for h in a], [h.log_prob for h in b], atol=1e-5)
    assert rows[True] <= rows[False]
    if n_best == 1:  # these models finish a best hypothesis early enough to save steps at n_best 1
        assert rows[True] < rows[False]


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_search_ranks_words_the_same_a_block_of_rows_at_a_time(arch):
    """The output layer in blocks of 8 rows (3 blocks here) gives what one block of every row gives."""
    sources = SOURCES + ["c c c c d d a", "b", "a d"]
    whole = Generator(random_loaded(arch, seed=3)).beam_search(sources, beam=4, n_best=4)
    gen = Generator(random_loaded(arch, seed=3))
    gen.logit_block_bytes = 1
    blocks = gen.beam_search(sources, beam=4, n_best=4)
    for a, b in zip(whole, blocks):
        assert [h.text for h in a] == [h.text for h in b]
        assert np.allclose([h.log_prob for h in a], [h.log_prob for h in b], atol=1e-6)


@pytest.mark.parametrize("V, n", [(8000, 12), (8000, 1), (3000, 7), (700, 12), (5, 3)])
def test_largest_ranks_only_the_chunks_that_can_hold_the_top_and_finds_it(V, n):
    """`largest` returns the values and columns `topk` does, also where a row's best values crowd one
    chunk, tie, sit in the columns after the last whole chunk, or the row is too short to chunk."""
    torch.manual_seed(V + n)
    x = torch.randn(40, V)
    x[1, 64:64 + 2 * n] += 10.0  # one chunk holds the whole top
    x[2] = x[2].round()  # many ties
    x[3, -3:] += 10.0  # the best after the last whole chunk
    top, cols = largest(x, n)
    want = x.topk(n, dim=1).values
    assert torch.equal(top.sort(dim=1, descending=True).values, want)
    assert torch.equal(x.gather(1, cols), top)
    assert all(len(set(r)) == n for r in cols.tolist())  # n distinct columns a row


@pytest.mark.parametrize("t, allow_unk, block_bytes", [(0, False, 1), (0, True, 1 << 22), (3, False, 1 << 22), (3, True, 1)])
def test_best_words_are_the_top_of_the_allowed_log_softmax(t, allow_unk, block_bytes):
    """The beam's word choice equals `_allowed(log_softmax(logits))` then topk, rows at their length
    limit (only </s>) included, in one block or in blocks of 8 rows."""
    gen = Generator(random_loaded("encdec", seed=6, std=1.5))
    gen.logit_block_bytes = block_bytes
    torch.manual_seed(0)
    out = torch.randn(21, gen.model.config.maxout) * 3
    # every 4th row must stop (from t = 1 on: a target has at least one word)
    limit = torch.tensor([t if i % 4 == 0 and t > 0 else t + 5 for i in range(21)])
    for W in (1, 2, 3):
        with torch.no_grad():
            top, word = gen._best_words(out, W, t, limit, allow_unk)
            ref = gen._allowed(torch.log_softmax(gen.model.output.logits(out), dim=-1), t, limit, allow_unk)
            ref_top, ref_word = ref.topk(W, dim=1)
        assert torch.allclose(top, ref_top, atol=1e-5)
        finite = ref_top > -math.inf
        assert torch.equal(word[finite], ref_word[finite])


@pytest.mark.parametrize("arch", ARCHS)
def test_n_best_per_source(arch):
    """A list gives each source its own n-best size: each list the head of the full beam's."""
    gen = Generator(random_loaded(arch, seed=1, std=0.8))
    full = gen.beam_search(SOURCES, beam=4, n_best=4)
    some = gen.beam_search(SOURCES, beam=4, n_best=[1, 3, 2])
    assert [len(h) for h in some] == [1, 3, 2]
    for a, b in zip(some, full):
        assert [h.text for h in a] == [h.text for h in b[: len(a)]]
    with pytest.raises(ValueError, match="2 n-best sizes for 3 sources"):
        gen.beam_search(SOURCES, beam=4, n_best=[1, 2])
    with pytest.raises(ValueError, match="n_best <= beam"):
        gen.beam_search(SOURCES, beam=4, n_best=[1, 5, 2])


def test_length_normalisation_ranks_by_log_prob_per_symbol():
    gen = Generator(random_loaded("encdec", seed=4))
    hyps = gen.beam_search(["a b c"], beam=5, n_best=5, normalize=True)[0]
    for h in hyps:
        assert h.score == pytest.approx(h.log_prob / (len(h.words) + 1))
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    with pytest.raises(ValueError):
        gen.beam_search(["a"], beam=2, n_best=3)


def test_read_sources_reports_file_and_line(tmp_path):
    f = tmp_path / "src.txt"
    f.write_text("a b\n\nc\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"src.txt:2: empty source phrase"):
        read_sources(str(f))


def test_cli_sample_and_translate(tiny_model, tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["sample", "-m", str(tiny_model), "a big book", "-n", "20", "--top", "3", "--tsv",
                             "--seed", "3"])
    assert r.exit_code == 0, r.output
    rows = [line.split("\t") for line in r.output.splitlines()]
    assert 1 <= len(rows) <= 3 and all(row[0] == "a big book" and float(row[3]) < 0 for row in rows)
    again = runner.invoke(main, ["sample", "-m", str(tiny_model), "a big book", "-n", "20", "--top", "3", "--tsv",
                                 "--seed", "3"])
    assert again.output == r.output

    src = tmp_path / "src.txt"
    src.write_text("a big book\nthe house\na red car\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    r = runner.invoke(main, ["translate", "-m", str(tiny_model), "-i", str(src), "-o", str(out), "--beam", "3",
                             "--n-best", "2", "--quiet"])
    assert r.exit_code == 0, r.output
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [line.split(" ||| ")[0] for line in lines] == ["0", "0", "1", "1", "2", "2"]
    r = runner.invoke(main, ["translate", "-m", str(tiny_model)])
    assert r.exit_code != 0 and "source phrases" in r.output
