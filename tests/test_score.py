import gzip
import itertools
import math
import random
import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from moses_rnn.cli import main
from moses_rnn.formats.phrasetable import read_phrase_table
from moses_rnn.scoring.scorer import PhraseScorer, phrase_keys
from moses_rnn.scoring.table import score_table


def read_lines(path):
    data = open(path, "rb").read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8").splitlines(keepends=True)


def strip_appended(line, n):
    """Remove the last n columns of field 3."""
    src, tgt, scores, *rest = line.split(" ||| ")
    head = " ||| ".join([src, tgt, " ".join(scores.rstrip("\n").split()[:-n])])
    return head + ("" if rest else "\n" if scores.endswith("\n") else "") + "".join(" ||| " + r for r in rest)


def appended(line, n):
    return [float(v) for v in line.split(" ||| ")[2].split()[-n:]]


def test_cli_score_preserves_every_line(tmp_path, example_table, tiny_model):
    out = tmp_path / "out.gz"
    r = CliRunner().invoke(main, ["score", str(example_table), "-m", str(tiny_model), "-o", str(out), "--unknown", "--quiet"])
    assert r.exit_code == 0, r.output
    src, dst = read_lines(example_table), read_lines(out)
    assert len(src) == len(dst)
    scorer = PhraseScorer.from_dir(str(tiny_model), device="cpu")
    pairs = [(p.source, p.target) for p in read_phrase_table(str(example_table))]
    lp = scorer.score(pairs)
    unk = [sum(w not in scorer.src_vocab for w in s.split()) + sum(w not in scorer.tgt_vocab for w in t.split())
           for s, t in pairs]  # the words outside the shortlists
    for a, b, want_lp, want_unk in zip(src, dst, lp, unk):
        assert strip_appended(b, 2) == a
        got_lp, got_unk = (math.log(v) for v in appended(b, 2))
        assert got_lp == pytest.approx(want_lp, abs=1e-5)
        assert got_unk == pytest.approx(want_unk, abs=1e-5)


def test_score_is_independent_of_batch_and_order(tmp_path, real_table_slice, tiny_model):
    lines = read_lines(real_table_slice)[:1500]
    shuffled = lines[:]
    random.Random(3).shuffle(shuffled)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("".join(lines), encoding="utf-8")
    b.write_text("".join(shuffled), encoding="utf-8")
    scorer = PhraseScorer.from_dir(str(tiny_model), device="cpu", token_budget=512)
    score_table(scorer, str(a), str(tmp_path / "a.out"), window=700, progress=False)
    score_table(scorer, str(b), str(tmp_path / "b.out"), window=256, progress=False)
    in_order = {strip_appended(l, 1): appended(l, 1)[0] for l in read_lines(tmp_path / "a.out")}
    shuffled_scores = {strip_appended(l, 1): appended(l, 1)[0] for l in read_lines(tmp_path / "b.out")}
    assert [strip_appended(l, 1) for l in read_lines(tmp_path / "b.out")] == shuffled  # order kept
    sample = lines[::50]
    alone = [scorer.score([(l.split(" ||| ")[0], l.split(" ||| ")[1])])[0] for l in sample]
    for line, lp in zip(sample, alone):
        assert math.log(in_order[line]) == pytest.approx(lp, abs=1e-4)
        assert math.log(shuffled_scores[line]) == pytest.approx(lp, abs=1e-4)
    assert all(math.log(in_order[l]) == pytest.approx(math.log(shuffled_scores[l]), abs=1e-4) for l in lines)


def test_normalize_divides_by_symbols(example_table, tiny_model):
    scorer = PhraseScorer.from_dir(str(tiny_model), device="cpu")
    pairs = [("the black cat", "le chat noir"), ("a dog", "un chien")]
    scores = scorer.score_keys(*phrase_keys(pairs))
    raw = scores.columns()[:, 0]
    norm = scores.columns(normalize=True)[:, 0]
    assert np.array_equal(raw, scorer.score(pairs)) and np.array_equal(scores.symbols, [4, 3])
    assert np.allclose(norm, raw / np.array([4, 3]))


def test_bad_input_leaves_no_output_and_keeps_previous(tmp_path, example_table, tiny_model):
    out = tmp_path / "out.gz"
    out.write_bytes(gzip.compress(b"previous\n"))
    bad = tmp_path / "bad.txt"
    good = example_table.read_text(encoding="utf-8")
    bad.write_text(good + "x ||| y ||| 0.5 oops 1 1\n", encoding="utf-8")
    r = CliRunner().invoke(main, ["score", str(bad), "-m", str(tiny_model), "-o", str(out), "--quiet"])
    assert r.exit_code != 0
    assert f"bad.txt:{good.count(chr(10)) + 1}: score 'oops' is not a number" in r.output
    assert gzip.decompress(out.read_bytes()) == b"previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "out.gz"]


def test_interrupted_run_leaves_previous_output(tmp_path, real_table_slice, tiny_model):
    out = tmp_path / "out.gz"
    out.write_bytes(gzip.compress(b"previous\n"))
    code = (
        "import os, signal, sys\n"
        "from moses_rnn.scoring import scorer\n"
        "orig = scorer.PhraseScorer.run\n"
        "n = [0]\n"
        "def run(self, *a, **k):\n"
        "    n[0] += 1\n"
        "    if n[0] == 2: os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return orig(self, *a, **k)\n"
        "scorer.PhraseScorer.run = run\n"
        "from moses_rnn.cli import main\n"
        f"sys.argv = ['moses-rnn', 'score', {str(real_table_slice)!r}, '-m', {str(tiny_model)!r}, '-o', {str(out)!r}, '--window', '500', '--quiet']\n"
        "main()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 143, p.stderr
    assert gzip.decompress(out.read_bytes()) == b"previous\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.gz"]


@pytest.mark.parametrize("planning", [False, True])
def test_worker_processes_write_the_same_table(tmp_path, real_table_slice, tiny_model, planning):
    """Workers that score whole windows (a CPU's pool), or only plan them for this process to score (a
    GPU's), write the bytes this process alone writes."""
    scorer = PhraseScorer.from_dir(str(tiny_model), device="cpu")
    inline, pooled = tmp_path / "inline.gz", tmp_path / "pooled.gz"
    a = score_table(scorer, str(real_table_slice), str(inline), unknown=True, window=400, progress=False)
    b = score_table(scorer, str(real_table_slice), str(pooled), unknown=True, window=400, workers=3, progress=False,
                    planning=planning)
    assert a.lines == b.lines == 3000 and b.workers == 3 and a.distinct_sources == b.distinct_sources
    assert read_lines(inline) == read_lines(pooled)


def test_a_plan_from_the_vocabularies_alone_scores_as_the_scorers_own(real_table_slice, tiny_model):
    """A planning worker's plan (vocabularies only, no weights), pickled as it travels, runs to the scores the
    scorer gives; a plan made for other chunks is refused."""
    import pickle

    from moses_rnn.scoring.pool import _planner

    pairs = [(p.source, p.target) for p in itertools.islice(read_phrase_table(str(real_table_slice)), 700)]
    sources, targets = phrase_keys(pairs)
    scorer = PhraseScorer.from_dir(str(tiny_model), device="cpu", node_chunk=7, token_budget=64)
    plan = pickle.loads(pickle.dumps(_planner(str(tiny_model), 64, 7).plan(sources, targets)))
    expected = scorer.score_keys(sources, targets)
    assert np.array_equal(scorer.run(plan), expected.log_p)
    assert np.array_equal(plan.unknown, expected.unknown) and np.array_equal(plan.symbols, expected.symbols)
    assert len(plan.encoder) > 1 and max(len(level.bounds) for level in plan.levels) > 2  # several batches, chunks
    with pytest.raises(ValueError, match="chunks of 7 decoder nodes, not 9"):
        PhraseScorer.from_dir(str(tiny_model), device="cpu", node_chunk=9).run(plan)


def test_a_planning_worker_that_dies_is_one_line_and_leaves_nothing(tmp_path, real_table_slice, tiny_model,
                                                                   monkeypatch):
    """A planning worker killed while this process runs plans (out of memory, say): the run stops with the
    pool's one-line error, no output is written and no worker is left."""
    from moses_rnn.scoring import pool

    workers = []
    start = pool._Worker.__init__

    def recorded(self, *a, **k):
        start(self, *a, **k)
        workers.append(self)

    monkeypatch.setattr(pool._Worker, "__init__", recorded)
    scorer = PhraseScorer.from_dir(str(tiny_model), device="cpu")
    run = scorer.run

    def killing(plan):  # the third plan run here: the worker dies
        killing.calls += 1
        if killing.calls == 3:
            workers[0].process.kill()
            workers[0].process.wait()
        return run(plan)

    killing.calls = 0
    scorer.run = killing
    out = tmp_path / "out.gz"
    with pytest.raises(ChildProcessError, match=rf"^{re.escape(str(real_table_slice))}: a scoring worker process "
                                                r"died \(killed, or out of memory\?\); try fewer --workers$"):
        score_table(scorer, str(real_table_slice), str(out), window=200, workers=2, progress=False, planning=True)
    assert not out.exists() and all(w.process.poll() is not None for w in workers)


@pytest.mark.parametrize("planning", [False, True])
def test_worker_error_names_line_and_leaves_nothing(tmp_path, real_table_slice, tiny_model, planning):
    lines = read_lines(real_table_slice)
    lines[2345] = lines[2345].replace(" ||| ", " |||  ||| ", 1)  # empty target
    bad = tmp_path / "bad.txt"
    bad.write_text("".join(lines), encoding="utf-8")
    scorer = PhraseScorer.from_dir(str(tiny_model), device="cpu")
    from mtcommon.textio import InputError

    with pytest.raises(InputError, match=r"bad.txt:2346: empty target phrase"):
        score_table(scorer, str(bad), str(tmp_path / "out.gz"), window=300, workers=2, progress=False,
                    planning=planning)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]


@pytest.mark.parametrize("arch", ["encdec", "rnnsearch"])
def test_prefix_tree_equals_teacher_forcing(tmp_path, example_table, real_table_slice, arch):
    """The scorer's shared-prefix decoding gives the model's plain forward log-probability."""
    import torch

    from moses_rnn.training.train import TrainConfig, train

    train(str(example_table), str(tmp_path / arch),
          TrainConfig(preset="tiny", arch=arch, max_steps=20, eval_every=20, valid_pairs=10, device="cpu"),
          progress=False)
    scorer = PhraseScorer.from_dir(str(tmp_path / arch), device="cpu", node_chunk=7)
    pairs = [(p.source, p.target) for p in read_phrase_table(str(real_table_slice))][:400]
    got = scorer.score(pairs)
    assert scorer.decoder_nodes < sum(len(t.split()) + 1 for _, t in pairs)  # prefixes were shared
    model = scorer.model
    with torch.no_grad():
        for (s, t), lp in zip(pairs[::7], got[::7]):
            src = torch.tensor([scorer.src_vocab.encode(s.split())])
            tgt = torch.tensor([scorer.tgt_vocab.encode(t.split()) + [scorer.eos]])
            want = float(model(src, torch.ones_like(src, dtype=torch.bool), tgt, torch.ones_like(tgt, dtype=torch.bool))[0])
            assert lp == pytest.approx(want, abs=1e-4)


def cut_gzip_table(example_table, folder, copies=75):
    """The example table repeated (3 MB), gzipped and cut at two thirds: a half-copied file
    whose first megabyte decompresses, so scoring is under way when the stream ends."""
    data = gzip.compress(example_table.read_bytes() * copies, compresslevel=6)
    cut = folder / "cut.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    return cut


@pytest.mark.parametrize("workers", ["1", "2"])
def test_truncated_gzip_table_is_named_and_keeps_previous_output(tmp_path, example_table, tiny_model, workers):
    cut = cut_gzip_table(example_table, tmp_path)
    out = tmp_path / "out.gz"
    out.write_bytes(gzip.compress(b"previous\n"))
    r = CliRunner().invoke(main, ["score", str(cut), "-m", str(tiny_model), "-o", str(out), "--quiet",
                                  "--window", "2000", "--workers", workers])
    assert r.exit_code == 1, r.output
    assert "Aborted" not in r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: {cut}: truncated gzip stream after line "), r.output
    assert int(last.rsplit(" ", 1)[1]) >= 2000  # windows were scored before the stream ended
    assert gzip.decompress(out.read_bytes()) == b"previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gz", "out.gz"]


def test_truncated_gzip_table_stops_training(tmp_path, example_table):
    cut = cut_gzip_table(example_table, tmp_path)
    r = CliRunner().invoke(main, ["train", str(cut), "-o", str(tmp_path / "m"), "--preset", "tiny", "--max-steps", "10",
                                  "--quiet"])
    assert r.exit_code == 1 and "Aborted" not in r.output
    assert f"Error: {cut}: truncated gzip stream after line " in r.output


def test_empty_table_is_an_error_not_an_empty_output(tmp_path, tiny_model):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    out = tmp_path / "out.gz"
    r = CliRunner().invoke(main, ["score", str(empty), "-m", str(tiny_model), "-o", str(out), "--quiet"])
    assert r.exit_code == 1 and f"Error: {empty}: the phrase table is empty" in r.output
    assert not out.exists()


def direct_log_probs(model, src_vocab, tgt_vocab, pairs):
    """log p(target | source) of each pair from one plain teacher-forced forward pass of `model`."""
    import torch

    out = []
    with torch.no_grad():
        for s, t in pairs:
            src = torch.tensor([src_vocab.encode(s.split())])
            tgt = torch.tensor([tgt_vocab.encode(t.split()) + [tgt_vocab.index["</s>"]]])
            out.append(float(model(src, torch.ones_like(src, dtype=torch.bool), tgt,
                                   torch.ones_like(tgt, dtype=torch.bool))[0]))
    return np.array(out)


def test_setup_scoring_runs_the_model_with_the_cores_it_should(example_table, tiny_model, tmp_path):
    """What `moses-rnn score` sets up: the directory's model (its scores are the model's own), on one
    torch thread for a model below the `small` preset, in one process for a small table and in one
    process per core for a table over 8 MB; the user's choices kept; no workers refused."""
    import torch

    from moses_rnn.networks.modelio import load_model
    from moses_rnn.scoring.table import setup_scoring
    from mtcommon.runtime import cpu_count

    before = torch.get_num_threads()
    try:
        s = setup_scoring(str(tiny_model), str(example_table), device="cpu")
        assert s.device.type == "cpu" and (s.threads, torch.get_num_threads(), s.workers) == (1, 1, 1)
        pairs = [(p.source, p.target) for p in read_phrase_table(str(example_table))][::20]
        loaded = load_model(str(tiny_model))
        assert np.allclose(s.scorer.score(pairs), direct_log_probs(loaded.model, loaded.src_vocab, loaded.tgt_vocab,
                                                                   pairs), atol=1e-4)
        big = tmp_path / "big.phrase-table"
        big.write_bytes(example_table.read_bytes() * (9 * 2**20 // example_table.stat().st_size))
        assert setup_scoring(str(tiny_model), str(big), device="cpu").workers == (cpu_count() if cpu_count() > 1
                                                                                  else 1)
        s = setup_scoring(str(tiny_model), str(big), device="cpu", threads=2, workers=3, token_budget=99)
        assert (s.threads, torch.get_num_threads(), s.workers, s.scorer.token_budget) == (2, 2, 3, 99)
        with pytest.raises(ValueError, match="at least 1"):
            setup_scoring(str(tiny_model), str(example_table), device="cpu", workers=0)
    finally:
        torch.set_num_threads(before)


def test_default_workers_by_device_model_and_table(tmp_path, example_table, monkeypatch):
    """One process for a small table; for a large one, a process per core on CPU for models below `small`,
    and on a GPU, for any model, up to GPU_WORKERS planning processes, one per core."""
    import torch

    from moses_rnn.networks.modelbase import preset_config
    from moses_rnn.scoring import table

    big = tmp_path / "big.phrase-table"
    big.write_bytes(example_table.read_bytes() * (9 * 2**20 // example_table.stat().st_size))
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    tiny, paper = preset_config("tiny", 100, 100), preset_config("paper", 100, 100)
    for cores, expected in ((16, {"cpu-tiny": 16, "cpu-paper": 1, "gpu-tiny": 8, "gpu-paper": 8}),
                            (4, {"cpu-tiny": 4, "cpu-paper": 1, "gpu-tiny": 4, "gpu-paper": 4}),
                            (1, {"cpu-tiny": 1, "cpu-paper": 1, "gpu-tiny": 1, "gpu-paper": 1})):
        monkeypatch.setattr(table, "cpu_count", lambda: cores)
        got = {f"{d}-{m}": table.default_workers(dev, cfg, str(big))
               for d, dev in (("cpu", cpu), ("gpu", gpu)) for m, cfg in (("tiny", tiny), ("paper", paper))}
        assert got == expected, cores
        assert table.default_workers(gpu, paper, str(example_table)) == 1  # small: start-up would not pay


def test_the_scorers_sizes_by_device_and_memory():
    """A CPU's sizes whatever it is; a GPU's scaled by its memory (as torch reports it for cards sold as 8, 16,
    24, 32, 40, 80 and 141 GB), from half to four times a 16 GB card's, the window only down; node chunks of a
    logit block, never under 512 rows."""
    import torch

    from moses_rnn.scoring import scorer as sc

    assert sc.device_sizes(torch.device("cpu")) == sc.CPU_SIZES
    assert sc.CPU_SIZES.node_chunk(100) == (1 << 18) // 100
    assert sc.CPU_SIZES.node_chunk(1000) == 512
    gib = 1 << 30
    for memory, scale in ((7.8, 0.5), (15.8, 1), (23.6, 1), (31.7, 2), (39.4, 2), (79.1, 4), (139.8, 4)):
        got = sc.gpu_sizes(int(memory * gib))
        assert (got.window, got.token_budget, got.logit_block) == \
            (int(65536 * min(scale, 1)), int(65536 * scale), int((1 << 26) * scale)), memory
        assert got.node_chunk(15000) == int((1 << 26) * scale) // 15000


def test_a_device_that_is_not_there_is_one_line(example_table, tiny_model, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = CliRunner().invoke(main, ["score", str(example_table), "-m", str(tiny_model), "-o", str(tmp_path / "o.gz"),
                                  "--device", "cuda", "--quiet"])
    assert r.exit_code == 1 and r.output == "Error: --device cuda asked for, but torch sees no CUDA device\n"


def test_worker_errors_come_in_table_order(tmp_path, real_table_slice, tiny_model):
    """Windows are scored here and in the pool at once; the error reported is still the first in the table."""
    lines = read_lines(real_table_slice)
    for n in (1234, 2345):
        lines[n - 1] = lines[n - 1].replace(" ||| ", " |||  ||| ", 1)
    bad = tmp_path / "bad.txt"
    bad.write_text("".join(lines), encoding="utf-8")
    scorer = PhraseScorer.from_dir(str(tiny_model), device="cpu")
    from mtcommon.textio import InputError

    with pytest.raises(InputError, match=r"bad.txt:1234: empty target phrase"):
        score_table(scorer, str(bad), str(tmp_path / "out.gz"), window=200, workers=2, progress=False)


# -- whole windows: the vectorised parser and formatter -------------------------------------------------------------
WORDS = ["le", "chat", "noir", "&apos;", "é", "x|y", "|", "||", "a\u00a0b", "c\u2009d", "e\tf", "g\x1ch", "日本",
         "k\u3000l", "m\u0085n"]
SCORES = ["0.5", "1", "2.718", "1e-05", "0.0109534", ".5", "5.", "+1", "1E3", "1_0", "0", "-1", "x", "nan", "inf",
          "1e400", "1e-400", "١", "0x10", "1.2.3", "1e", "--1", "1e+5"]


def fuzzed_line(r: random.Random, nscores: int) -> str:
    """A phrase-table line, now and then with what parse_line treats specially: wide or doubled spaces,
    tabs, spaces around phrases, odd or bad scores, other score counts, odd separators, many fields."""
    def phrase():
        words = [r.choice(WORDS[:5] if r.random() < 0.8 else WORDS) for _ in range(r.choice([0] + [1, 2, 3, 5] * 30))]
        text = (" " if r.random() < 0.95 else r.choice(["  ", "\t", " \u3000 "])).join(words)
        return (" " if r.random() < 0.05 else "") + text + (" " if r.random() < 0.05 else "")

    k = nscores if r.random() < 0.998 else r.choice([1, 2, 3, 5])
    scores = [r.choice(SCORES[:10]) if r.random() < 0.995 else r.choice(SCORES) for _ in range(k)]
    fields = [phrase(), phrase(), (" " if r.random() < 0.97 else "  ").join(scores)]
    fields += [r.choice(["0-0 1-1", "1 1 1", "", "x ||| y", "|||"]) for _ in range(r.choice([0, 0, 1, 2, 3, 4]))]
    text = (" ||| " if r.random() < 0.995 else r.choice([" |||", "||| ", "|||", " ||||", " |||  "])).join(fields)
    if r.random() < 0.003:
        text = text.replace(" ||| ", " ||| ||| ", 1)
    return text + r.choice(["\n"] * 20 + ["\r\n", "\r\n", " \n", "\r"])


def test_window_parser_matches_parse_line_line_by_line():
    """parse_window (numpy over the bytes, parse_line for lines it is unsure of) gives exactly what
    parse_line gives line by line: the same phrases and insert points, or the same first error."""
    from moses_rnn.formats.phrasetable import parse_window, parse_window_exactly
    from mtcommon.textio import InputError

    def outcome(parse, data, nscores):
        try:
            w = parse(data, "t.txt", 7, nscores)
            return "ok", w.sources, w.targets, w.insert_at.tolist()
        except InputError as e:
            return "error", str(e)

    r = random.Random(1)
    seen = {"ok": 0, "error": 0}
    for _ in range(1500):
        nscores = r.choice([1, 4])
        lines = [fuzzed_line(r, nscores) for _ in range(r.choice([1, 2, 5, 40]))]
        if r.random() < 0.2:
            lines[-1] = lines[-1].rstrip("\n")
        data = "".join(lines).encode("utf-8")
        if r.random() < 0.02:
            data = data[: len(data) // 2] + b"\xff" + data[len(data) // 2 :]
        given = None if r.random() < 0.3 else nscores
        fast, exact = outcome(parse_window, data, given), outcome(parse_window_exactly, data, given)
        assert fast == exact, data
        seen[fast[0]] += 1
    assert min(seen.values()) > 300  # both outcomes well exercised


def test_window_parser_takes_the_fast_path_on_a_real_table(example_table, monkeypatch):
    """No line of a well-formed table falls back to parse_line (the fast path is not silently lost)."""
    from moses_rnn.formats import phrasetable

    data = example_table.read_bytes()
    want = phrasetable.parse_window_exactly(data, "t", 1, 4)
    calls = []
    monkeypatch.setattr(phrasetable, "parse_line", lambda *a, **k: calls.append(a) or pytest.fail("slow path"))
    got = phrasetable.parse_window(data, "t", 1, 4)
    assert not calls and got.sources == want.sources and got.targets == want.targets
    assert got.insert_at.tolist() == want.insert_at.tolist()
    raw = phrasetable.split_lines(data)
    ends = (want.insert_at - np.cumsum([0] + [len(x) for x in raw])[:-1]).tolist()  # within each line
    assert got.with_columns([b" 9"] * len(got)) == b"".join(x[:k] + b" 9" + x[k:] for x, k in zip(raw, ends))


def test_gzip_output_is_a_function_of_the_text(tmp_path):
    """The compressed bytes do not depend on how the text was cut into writes (what lets a sharded run
    reproduce a single-process run's .gz exactly)."""
    from mtcommon.outputs import atomic_output

    text = b"".join(b"line %d ||| ligne %d ||| 0.5 1\n" % (i, i) for i in range(200_000))
    outs = []
    for cut in (1, 7919, 1 << 20, len(text)):
        path = tmp_path / f"o{cut}.gz"
        with atomic_output(str(path)) as f:
            pieces = [text[i : i + 50_000] for i in range(0, len(text), 50_000)] if cut == 1 else \
                [text[i : i + cut] for i in range(0, len(text), cut)]
            for p in pieces:
                f.write(p)
        outs.append(path.read_bytes())
    assert gzip.decompress(outs[0]) == text and len(set(outs)) == 1


@pytest.mark.parametrize("vocab_size", [256, 15000])
def test_logits_come_in_cache_sized_blocks(vocab_size):
    """On a CPU the prefix-tree decoder computes the softmax over a block of nodes at a time: at most
    1 MiB of logits (a core's L2 cache) for a small shortlist, 512 rows for a large one (matrix products
    of useful size), and the scores are the model's own whatever the block."""
    import torch

    loaded = untrained("encdec", vocab_size)
    scorer = PhraseScorer(loaded)
    blocks = []
    step = scorer.model.step

    def watched(*args):
        logits, state = step(*args)
        blocks.append(logits.shape)
        return logits, state

    scorer.model.step = watched
    r = random.Random(1)
    words = [f"w{i}" for i in range(40)]
    pairs = [(" ".join(r.choices(words, k=r.randint(2, 4))), " ".join(r.choices(words, k=r.randint(1, 3))))
             for _ in range(3000)]
    got = scorer.score(pairs)
    rows = max(b[0] for b in blocks)
    assert all(b[1] == vocab_size for b in blocks)
    if vocab_size == 256:
        assert (1 << 19) < rows * vocab_size * 4 <= 1 << 20
    else:
        assert rows == 512
    del scorer.model.step
    assert np.allclose(got[::50], direct_log_probs(loaded.model, loaded.src_vocab, loaded.tgt_vocab, pairs[::50]),
                       rtol=1e-4, atol=1e-4)  # log p of -20 to -60 nats: the weights are scaled up (untrained)
    assert np.allclose(got, PhraseScorer(loaded, node_chunk=7).score(pairs), rtol=1e-5, atol=1e-5)


# -- bfloat16 ---------------------------------------------------------------------------------------------------
def untrained(arch: str, vocab_size: int = 42):
    import torch

    from moses_rnn.networks.modelbase import preset_config
    from moses_rnn.networks.modelio import LoadedModel, build_model
    from mtcommon.vocab import Vocabulary

    vocab = Vocabulary(["</s>", "[UNK]"] + [f"w{i}" for i in range(vocab_size - 2)])
    torch.manual_seed(0)
    model = build_model(preset_config("tiny", len(vocab), len(vocab), arch=arch))
    model.init_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(30.0)  # away from uniform, so that rounding shows
    return LoadedModel(model, vocab, vocab, model.config, {})


def native_bf16() -> bool:
    from mtcommon.runtime import cpu_has_bf16

    return cpu_has_bf16()


@pytest.mark.skipif(not native_bf16(), reason="this CPU has no native bfloat16")
@pytest.mark.parametrize("arch", ["encdec", "rnnsearch"])
def test_bf16_scores_are_close_and_keep_the_softmax_in_float32(arch):
    import torch

    from moses_rnn.scoring.bf16 import Bf16Linear, Float32Output

    loaded = untrained(arch)
    r = random.Random(0)
    pairs = [(" ".join(f"w{r.randrange(45)}" for _ in range(r.randint(1, 4))),
              " ".join(f"w{r.randrange(45)}" for _ in range(r.randint(1, 4)))) for _ in range(300)]
    exact = PhraseScorer(loaded).score(pairs)
    scorer = PhraseScorer(loaded, dtype="bf16")
    assert scorer.compute_dtype == "bf16" and loaded.model.output.G_l.weight.dtype == torch.float32  # a copy
    assert isinstance(scorer.model.output, Float32Output)
    linears = [m for m in scorer.model.modules() if isinstance(m, (torch.nn.Linear, Bf16Linear))]
    assert all(isinstance(m, Bf16Linear) for m in linears if m not in set(scorer.model.output.modules()))
    got = scorer.score(pairs)
    delta = np.abs(got - exact)
    assert 0 < delta.max() and delta.mean() < 0.05 * np.abs(exact).mean()
    assert np.array_equal(got, scorer.score(pairs))  # deterministic


def test_bf16_where_it_is_not_native_is_a_clear_error(tmp_path, example_table, tiny_model, monkeypatch):
    from mtcommon import runtime

    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: False)
    r = CliRunner().invoke(main, ["score", str(example_table), "-m", str(tiny_model), "-o", str(tmp_path / "o.gz"),
                                  "--device", "cpu", "--dtype", "bf16", "--quiet"])
    assert r.exit_code == 1
    assert r.output == "Error: --dtype bf16 asked for, but this CPU has no native bfloat16 (AVX-512 BF16 or AMX)\n"
    assert list(tmp_path.iterdir()) == []
    # 'auto' falls back to float32 there
    r = CliRunner().invoke(main, ["score", str(example_table), "-m", str(tiny_model), "-o", str(tmp_path / "o.gz"),
                                  "--device", "cpu", "--dtype", "auto", "--quiet"])
    assert r.exit_code == 0 and "fp32" in r.output
