"""pipelines/: the Makefile's plan, its Moses-free steps on a slice of the shared corpus, and mt.py."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIPE = ROOT / "pipelines"
sys.path.insert(0, str(PIPE))
import corpus  # noqa: E402
import health  # noqa: E402
import mt  # noqa: E402
import preflight  # noqa: E402
import runs  # noqa: E402
import sections  # noqa: E402

from moses_rnn.formats.mosesini import MosesIni  # noqa: E402
from mtcommon.errors import UserError  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


# the paper's four systems of Table 1, which a run builds, tunes and reports
PAPER_SYSTEMS = ("baseline", "rnn", "cslm-rnn", "cslm-rnn-wp")
# and the systems past the paper's limits: subword units, attention, attention with the CSLM, augmentation
NEW_SYSTEMS = ("rnn-subword", "rnnsearch", "cslm-rnnsearch", "cslm-rnn-aug")
ALL_SYSTEMS = PAPER_SYSTEMS + NEW_SYSTEMS


def _make(*args, cwd=PIPE, env_extra=None, **vars_):
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), **(env_extra or {})}
    env.pop("MAKEFLAGS", None)
    env.pop("MOSES", None)
    cmd = ["make", "--no-print-directory", "-C", str(cwd), f"PYTHON={sys.executable}", *args]
    cmd += [f"{k}={v}" for k, v in vars_.items()]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_dry_run_shows_the_whole_plan(tmp_path, shared_data):
    """SYSTEMS=all: the paper's systems and those past it, reranking and the sentence networks."""
    r = _make("-n", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"), DATA=str(shared_data / "en-fr"))
    assert r.returncode == 0, r.stderr
    plan = r.stdout
    for step in ["mt.py prepare", "eflomal-align", "mt.py symmetrize", "/opt/mosesdecoder/bin/lmplz",
                 "/opt/mosesdecoder/bin/build_binary", "train-model.perl", "-first-step 4",
                 "moses-rnn train", "moses-rnn score", "cslm train", "ini add-columns", "ini add-feature",
                 "mt.py detok", "sacrebleu", "mt.py report", "--self-norm 0.1"]:
        assert step in plan, step
    # the RNN column starts at RNN_WEIGHT (0.05), in both systems that add it to the table
    assert "--count 1 --weight 0.05 --path" in plan and "--count 2 --weight 0.05 --weight -0.1 --path" in plan
    # the sorted extracts go once the tables are built, before the folder is renamed; lex.* stay
    assert plan.index("extract.*sorted.gz") < plan.index(f"mv {tmp_path}/w/train.tmp {tmp_path}/w/train")
    assert "rm -f" in plan.splitlines()[[i for i, l in enumerate(plan.splitlines()) if "extract.*sorted.gz" in l][0]]
    for system in ALL_SYSTEMS:  # three tunings each by the default tuner, PRO with -b, seeds 1, 2, 3
        for k in (1, 2, 3):
            assert f"systems/{system}/pro-bp-{k}/mert" in plan and f"systems/{system}/pro-bp-{k}/$set.ini" in plan
        # the tables filtered once per system, each run's weights put into them; every tuning
        # starts from the filtered dev model
        assert f"filter-model-given-input.pl $out.tmp {tmp_path}/w/systems/{system}/moses.ini" in plan
        assert plan.count(f"mert-moses.pl {tmp_path}/w/data/dev.en {tmp_path}/w/data/dev.fr \\\n"
                          f"  /opt/mosesdecoder/bin/moses {tmp_path}/w/systems/{system}/moses.ini.filtered-dev "
                          "--no-filter-phrase-table") == 3
    assert plan.count("filter-model-given-input.pl") == 8 and plan.count("mt.py reweight") == 24
    assert plan.count("mert-moses.pl") == 24 and plan.count('--pairwise-ranked --proargs "-r 3 -b "') == 8
    # PRO keeps the reordering and phrase-table weights positive: megam.py's -nonneg, from the names of their scores
    assert plan.count(f"positive=$({sys.executable} {PIPE}/mt.py positive {tmp_path}/w/systems/rnn/moses.ini.filtered-dev "
                      "LexicalReordering0 TranslationModel0) && ") == 3
    assert plan.count("/mert --nbest 300 --threads 2 ") == 24  # 300-best lists; the optimiser on THREADS threads
    assert "--batch-mira" not in plan and "--mertmertargs" not in plan and plan.count("pro-features run1.features.dat") == 24
    # dev: the tuning's own decoding of the weights it kept
    assert plan.count("mt.py best-iteration") == 24  # each tuning's dev result (a reranked one merges every list)
    # the whole table scored (SCORE_SCOPE=all, the default)
    assert f"moses-rnn score $(" in plan and f"table-path {tmp_path}/w/model/moses.ini)" in plan
    assert "model-devtest" not in plan
    assert "--test-ref" in plan and "--plot" in plan and '--label ""' in plan and '--tuner pro --tuner-args="-b" ' in plan
    # the report's systems: the Makefile's list, then the reranked ones
    assert f'--systems "{" ".join(ALL_SYSTEMS)} baseline-rerank cslm-rnn-rerank"' in plan
    for step in ["align", "lm", "phrases", "rnn-train", "rnn-score", "cslm-train", "tune-baseline.pro-bp", "decode-rnn"]:
        assert f"times.tsv {step} -- " in plan, step
    assert "--max-minutes 120" in plan  # the full run's budget per network
    # the longest chain first: the RNN trains as soon as the phrase table exists
    assert plan.index("moses-rnn train") < plan.index("cslm train") < plan.index("mert-moses.pl")
    # the default: the CSLM evaluated inside Moses, no server
    assert "with-cslm" not in plan and "CSLM name=CSLM0 order=7 path=" in plan and "port=" not in plan
    # the CSLM interpolated with KenLM: the weight estimated on dev, the perplexities measured on test
    w = tmp_path / "w"
    assert f"cslm mix {w}/cslm/model {w}/data/dev.fr --kenlm {w}/lm/lm.fr.blm > {w}/cslm/mix.json.tmp" in plan
    assert f"weight=$({sys.executable} {PIPE}/mt.py json-field {w}/cslm/mix.json weight) && " in plan
    assert f"--kenlm {w}/lm/lm.fr.blm --log-z --mix $weight --quiet > {w}/cslm/ppl.json.tmp" in plan
    assert not (tmp_path / "w").exists()  # a dry run writes nothing


def test_dry_run_budget(tmp_path, shared_data):
    """BUDGET=1: 400 dev sentences, 10 MERT iterations, 35 minutes per network, a labelled report;
    a variable given on the command line still wins; any other BUDGET value is refused."""
    r = _make("-n", "SYSTEMS=all", "BUDGET=1", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"), DATA=str(shared_data / "en-fr"))
    assert r.returncode == 0, r.stderr
    assert "--lines 400" in r.stdout and r.stdout.count("--maximum-iterations 10") == 24
    # the CSLM, three phrase networks and the two sentence networks
    assert "cslm train" in r.stdout and r.stdout.count("--max-minutes 35") == 6
    assert '--label "BUDGET=1 (a first table' in r.stdout and "tuned by pro -b on the first 400" in r.stdout
    # the RNN scores only what dev and test can use: the base model filtered to both sets' sources
    w = tmp_path / "w"
    assert f"cat {w}/data/dev.en {w}/data/test.en > {w}/devtest.en" in r.stdout
    assert f"filter-model-given-input.pl {w}/model-devtest.tmp {w}/model/moses.ini {w}/devtest.en" in r.stdout
    assert f"table-path {w}/model-devtest/moses.ini)" in r.stdout
    assert f"cp {w}/model-devtest/moses.ini {w}/systems/baseline/moses.ini.tmp" in r.stdout
    assert r.stdout.count(f"ini add-columns {w}/model-devtest/moses.ini") == 5
    r = _make("-n", "SYSTEMS=all", "BUDGET=1", "DEV_LINES=100", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"),
              DATA=str(shared_data / "en-fr"))
    assert "--lines 100" in r.stdout and "first 100 dev sentences" in r.stdout
    r = _make("-n", "SYSTEMS=all", "BUDGET=yes", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"))
    assert r.returncode != 0 and "BUDGET must be 0 or 1, not yes" in r.stderr


def test_dry_run_new_systems(tmp_path):
    """The subword and RNNsearch networks train as the RNN does (its arguments and budget, plus their own),
    on the phrase table; the subword units are learned on the training corpus; the subword column comes
    without an unknown-word count; cslm-rnnsearch adds the CSLM to rnnsearch as cslm-rnn does to rnn."""
    w = tmp_path / "w"
    r = _make("-n", "BUDGET=1", "SYSTEMS=rnn-subword rnnsearch cslm-rnnsearch", MOSES="/opt/mosesdecoder", WORK=str(w),
              DATA=str(tmp_path / "no-data"))
    assert r.returncode == 0, r.stderr
    plan = r.stdout
    rnn_args = "--preset small --max-minutes 35 --max-steps 1000000 --threads 1"
    assert (f"moses-rnn train {w}/train/model/phrase-table.gz -o {w}/rnn-subword/model {rnn_args} --subwords 8000 "
            f"--subword-corpus {w}/data/train.en {w}/data/train.fr") in plan
    assert f"moses-rnn train {w}/train/model/phrase-table.gz -o {w}/rnnsearch/model {rnn_args} --arch rnnsearch" in plan
    assert "times.tsv rnn-subword-train -- " in plan and "times.tsv rnnsearch-score -- " in plan
    assert f"-m {w}/rnn-subword/model -o {w}/rnn-subword/phrase-table.rnn.gz --threads 1 --quiet" in plan  # no --unknown
    assert f"-m {w}/rnnsearch/model -o {w}/rnnsearch/phrase-table.rnn.gz --unknown --threads 1 --quiet" in plan
    assert (f"ini add-columns {w}/model-devtest/moses.ini --table TranslationModel0 --count 1 --weight 0.05 "
            f"--path {w}/rnn-subword/phrase-table.rnn.gz -o {w}/systems/rnn-subword/moses.ini\n") in plan
    assert f"--path {w}/rnnsearch/phrase-table.rnn.gz -o {w}/systems/rnnsearch/moses.ini.tmp" in plan
    assert f"ini add-feature {w}/systems/rnnsearch/moses.ini CSLM name=CSLM0" in plan
    assert f"ini weight {w}/systems/cslm-rnnsearch/moses.ini.tmp LM0 0.4" in plan
    assert plan.count("mert-moses.pl") == 9 and f"-o {w}/rnn/model" not in plan  # the word-level RNN is not trained
    assert '--systems "rnn-subword rnnsearch cslm-rnnsearch"' in plan
    r = _make("-n", "BUDGET=1", "SYSTEMS=rnn-subword", "SUBWORDS=16000", MOSES="/opt/mosesdecoder", WORK=str(w),
              DATA=str(tmp_path / "no-data"))
    assert "--subwords 16000" in r.stdout


def test_dry_run_reranked_systems(tmp_path):
    """S-rerank, for each of the RERANKED systems' tunings: the test set decoded as an NBEST-best list with
    the tuning's weights, both lists rescored by the sentence network (trained on the corpus's sentence
    pairs), the weights tuned on the dev list with the tuning's seed, each set's best hypotheses scored."""
    w = tmp_path / "w"
    extras = ("RERANKED=baseline", "NETWORKS=sent sent-encdec")
    r = _make("-n", "BUDGET=1", "SYSTEMS=baseline rnn", *extras, MOSES="/opt/mosesdecoder", WORK=str(w),
              DATA=str(tmp_path / "no-data"))
    assert r.returncode == 0, r.stderr
    plan = r.stdout
    assert (f"moses-rnn train --corpus {w}/data/train.en {w}/data/train.fr -o {w}/sent/model --preset small "
            "--subwords 8000 --max-len 50 --max-minutes 35 --max-steps 1000000 --threads 1 --arch rnnsearch") in plan
    # the networks alone: RNNsearch and the encoder-decoder, trained alike, translate the test set
    assert f"-o {w}/sent-encdec/model --preset small --subwords 8000" in plan and "--threads 1 --arch encdec" in plan
    for name in ("sent", "sent-encdec"):
        assert f"moses-rnn translate -m {w}/{name}/model -i {w}/data/test.en -o {w}/{name}/test.out --beam 5" in plan
        assert f"sacrebleu {w}/data/test.ref.fr -i {w}/{name}/test.detok -lc -w 2" in plan
    assert f'--networks "sent sent-encdec" --length-plot {w}/report.lengths.png' in plan
    for name in ("sent", "sent-encdec"):  # Table 2: each network's learning statistics, for the report
        assert (f"moses-rnn analyze learning {w}/{name}/model --label {name} --dev {w}/data/dev.en {w}/data/dev.fr "
                f"-o {w}/{name}/learning.json") in plan
    assert (f"moses-rnn align -m {w}/sent/model -i {w}/data/test.en --targets {w}/data/test.fr "
            f"-o {w}/sent/alignments.png") in plan  # Figure 3
    run, base = f"{w}/systems/baseline-rerank/pro-bp-2", f"{w}/systems/baseline/pro-bp-2"
    # RERANK_NBEST (100): the test set's 100-best lists, and the first 100 of each dev sentence's 300
    assert (f"/opt/mosesdecoder/bin/moses -f {base}/test.ini -threads 2 -search-algorithm 1 -cube-pruning-pop-limit "
            f"1000 -n-best-list {run}/test.nbest.tmp 100 distinct < {w}/data/test.en") in plan
    # RERANK_DEV (all): the lists of every iteration of the tuning, merged
    assert f"mt.py nbest-top {base}/mert/run*.best300.out.gz 100 -o {run}/dev.nbest.gz" in plan
    assert (f"moses-rnn rescore-nbest {run}/dev.nbest.gz -m {w}/sent/model --source "
            f"{w}/data/dev.en -o {run}/dev.nbest.rnn.gz --threads 1") in plan  # NET_THREADS: -j2 runs two
    assert f"rescore-nbest {run}/test.nbest.gz -m {w}/sent/model --source {w}/data/test.en" in plan
    assert (f"mt.py rerank-tune {run}/dev.nbest.rnn.gz --ref {w}/data/dev.fr --ini {base}/tuned.ini --moses "
            f"/opt/mosesdecoder --seed 2 --positive \"LexicalReordering0 TranslationModel0\"") in plan
    assert f"mt.py rerank {run}/$set.nbest.rnn.gz {run}/weights.txt --source {w}/data/$set.en" in plan
    assert plan.count("mt.py rerank-tune") == 3 and "rnn-rerank" not in plan  # RERANKED: those named
    assert "--free" not in plan
    assert '--systems "baseline rnn baseline-rerank"' in plan
    r = _make("-n", "BUDGET=1", "SYSTEMS=baseline rnn", *extras, "RERANK_NBEST=300", MOSES="/opt/mosesdecoder", WORK=str(w),
              DATA=str(tmp_path / "no-data"))
    assert f"{run}/test.nbest.tmp 300 distinct" in r.stdout and "best300.out.gz 300 -o" in r.stdout
    r = _make("-n", "BUDGET=1", "SYSTEMS=baseline rnn", *extras, "NET_THREADS=2", MOSES="/opt/mosesdecoder",
              WORK=str(w), DATA=str(tmp_path / "no-data"))  # with -j1, the core count
    assert r.stdout.count("dev.nbest.rnn.gz --threads 2 --quiet") == 3 and "--beam 5 --threads 2 --quiet" in r.stdout
    assert "phrase-table.rnn.gz --unknown --threads 2 --quiet" in r.stdout and "--threads 1 --quiet" not in r.stdout
    r = _make("-n", "BUDGET=1", "SYSTEMS=baseline rnn", *extras, "RERANK_DEV=kept", MOSES="/opt/mosesdecoder",
              WORK=str(w), DATA=str(tmp_path / "no-data"))  # the one list the kept weights decoded
    assert f"mt.py nbest-top {base}/mert/run$best.best300.out.gz 100 -o {run}/dev.nbest.gz" in r.stdout
    assert f"mt.py best-iteration {base}/mert.log" in r.stdout
    r = _make("-n", "BUDGET=1", "SYSTEMS=baseline rnn", *extras, "RERANK_FREE=RNN0 WordPenalty0",
              MOSES="/opt/mosesdecoder", WORK=str(w), DATA=str(tmp_path / "no-data"))  # only these weights move
    assert f'--free "RNN0 WordPenalty0" -o {run}/weights.txt' in r.stdout
    r = _make("-n", "BUDGET=1", "RERANK_DEV=some", MOSES="/opt/mosesdecoder", WORK=str(w), DATA=str(tmp_path / "no-data"))
    assert r.returncode != 0 and "RERANK_DEV must be all or kept, not some" in r.stderr
    for bad in ("301", "0", "many"):
        r = _make("-n", "BUDGET=1", f"RERANK_NBEST={bad}", MOSES="/opt/mosesdecoder", WORK=str(w),
                  DATA=str(tmp_path / "no-data"))
        assert r.returncode != 0 and f"RERANK_NBEST must be a number from 1 to NBEST (300), not {bad}" in r.stderr
    # systems named without RERANKED and NETWORKS: neither reranking nor the sentence networks
    r = _make("-n", "BUDGET=1", "SYSTEMS=baseline rnn", MOSES="/opt/mosesdecoder", WORK=str(w),
              DATA=str(tmp_path / "no-data"))
    assert "rescore-nbest" not in r.stdout
    assert "sent/model" not in r.stdout and '--networks ""' in r.stdout


def test_dry_run_augmented_system(tmp_path):
    """cslm-rnn-aug: the base table augmented by the RNN (sources with one target, at most 20% more lines),
    scored by the RNN, then cslm-rnn's set-up with the indicator column tuned from 0 and the unknown-word
    column fixed; cslm-rnn-aug-input: the dev and test sources' missing n-grams too, in its own folder."""
    w = tmp_path / "w"
    r = _make("-n", "BUDGET=1", "SYSTEMS=cslm-rnn-aug cslm-rnn-aug-input", MOSES="/opt/mosesdecoder", WORK=str(w),
              DATA=str(tmp_path / "no-data"))
    assert r.returncode == 0, r.stderr
    plan = r.stdout
    for folder, system in (("augment", "cslm-rnn-aug"), ("augment-input", "cslm-rnn-aug-input")):
        assert (f"moses-rnn augment $({sys.executable} {PIPE}/mt.py table-path {w}/model-devtest/moses.ini) -m "
                f"{w}/rnn/model -o {w}/{folder}/phrase-table.gz") in plan
        assert (f"score {w}/{folder}/phrase-table.gz -m {w}/rnn/model -o {w}/{folder}/phrase-table.rnn.gz "
                "--unknown") in plan
        assert (f"ini add-columns {w}/model-devtest/moses.ini --table TranslationModel0 --count 2 --weight 0 "
                f"--weight 0.05 --path {w}/{folder}/phrase-table.rnn.gz -o {w}/systems/{system}/moses.ini.tmp") in plan
        # each tuning's test set decoded again with Moses's segmentation, for the generated pairs it used
        for k in (1, 2, 3):
            run = f"{w}/systems/{system}/pro-bp-{k}"
            assert f"-f {run}/test.ini -threads 2 -search-algorithm 1 -cube-pruning-pop-limit 1000 -t" in plan
            assert (f"moses-rnn analyze augmented {w}/{folder}/phrase-table.rnn.gz {run}/test.trace {w}/data/test.en "
                    f"-o {run}/usage.json") in plan
    lex = f"--lex-f2e {w}/train/model/lex.f2e --lex-e2f {w}/train/model/lex.e2f"
    assert f"{lex} --few 1 --per-source 3 --max-growth 0.2 --quiet" in plan  # (a) only
    assert f"cat {w}/data/dev.en {w}/data/test.en > {w}/augment-input/input.en" in plan
    assert (f"{lex} --few 1 --per-source 3 --max-growth 0.2 --max-ngram 3 --input {w}/augment-input/input.en "
            "--quiet") in plan
    assert f"{w}/augment/input.en" not in plan
    assert "--count 1 --weight 0 --fixed" in plan and "ini weight" in plan and "CSLM name=CSLM0" in plan
    assert plan.count("mert-moses.pl") == 6 and "times.tsv augment -- " in plan


def test_report_networks_alone_and_bleu_by_length(tmp_path, tiny_model):
    """The networks' own translations beside the systems, on all test sentences and on those with no word
    outside the networks' vocabularies; BLEU by source length as a table and a PNG."""
    sacrebleu = pytest.importorskip("sacrebleu")
    pytest.importorskip("matplotlib")
    from moses_rnn.networks import modelio

    loaded = modelio.load_model(str(tiny_model))
    known, fr = loaded.src_vocab.words[2:7], loaded.tgt_vocab.words[2:8]
    src = [" ".join(known[:3]), "zzz " + known[0], " ".join(known * 3), known[1]]  # line 2: an unknown word
    ref = [" ".join(fr[:3]), " ".join(fr[3:6]), " ".join(fr * 3), "qqq"]  # line 4: an unknown word
    (tmp_path / "test.en").write_text("\n".join(src) + "\n")
    (tmp_path / "test.fr").write_text("\n".join(ref) + "\n")
    (tmp_path / "test.ref").write_text("\n".join(ref) + "\n")
    shutil.copytree(tiny_model, tmp_path / "sent" / "model")
    network = [ref[0], fr[3] + " x " + fr[5], " ".join(fr[:4]), "qqq"]
    (tmp_path / "sent" / "test.detok").write_text("\n".join(network) + "\n")
    run = tmp_path / "systems" / "baseline" / "mert-1"
    run.mkdir(parents=True)
    (run / "test.detok").write_text("\n".join([ref[0], ref[1], " ".join(fr), "w"]) + "\n")
    (run / "test.bleu.json").write_text(json.dumps({"name": "BLEU", "score": 1.0}))
    nll = {"pairs": 10, "target_symbols": 50, "total": 123.0, "per_pair": 12.3, "perplexity": 11.7}
    (tmp_path / "sent" / "learning.json").write_text(json.dumps([{
        "label": "sent", "arch": "rnnsearch", "updates": 3944, "epochs": 4.21, "hours": 0.574,
        "device": "cpu, bf16, 1 thread(s)", "train": nll, "heldout": {**nll, "per_pair": 39.04}, "dev": None}]))
    mt.main(["report", str(tmp_path), str(tmp_path / "report.md"), "--systems", "baseline", "--test-ref",
             str(tmp_path / "test.ref"), "--samples", "10", "--ar-samples", "10", "--test-src", str(tmp_path / "test.en"),
             "--test-trg", str(tmp_path / "test.fr"), "--networks", "sent", "--length-plot", str(tmp_path / "len.png")])
    text = (tmp_path / "report.md").read_text()
    assert "| sent (RNNsearch) | 3,944 | 4.2 | 0.57 | cpu, bf16, 1 thread(s) | 12.3 | 39.0 | – |" in text
    assert "and on the 2 whose source and reference" in text  # lines 1 and 3
    every = sacrebleu.corpus_bleu(network, [ref], lowercase=True).score
    clean = sacrebleu.corpus_bleu([network[0], network[2]], [[ref[0], ref[2]]], lowercase=True).score
    assert f"| sent (network alone, beam 5) | 1 | {every:.2f} | {clean:.2f} |" in text
    assert (tmp_path / "len.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| Models | 0-9 | 10-19 | 20-29 | 30-39 | 40-49 | 50+ |" in text


def test_nbest_top_keeps_each_sentences_first_lines(tmp_path):
    """mt.py nbest-top: the first N lines of each sentence, byte for byte, gzip by name; a bad line names
    the file and line."""
    import gzip

    src = tmp_path / "n.txt"
    lines = [f"{i} ||| h{i}.{j} ||| LM0= -{j}.5 ||| -{j}\n" for i in range(3) for j in range(4 - i)]
    src.write_text("".join(lines))
    mt.main(["nbest-top", str(src), "2", "-o", str(tmp_path / "top.gz")])
    with gzip.open(tmp_path / "top.gz", "rt") as f:
        assert f.read() == "".join(lines[0:2] + lines[4:6] + lines[7:9])
    mt.main(["nbest-top", str(src), "9", "-o", str(tmp_path / "all.txt")])
    assert (tmp_path / "all.txt").read_text() == src.read_text()
    src.write_text(lines[0] + "not a line\n")
    with pytest.raises(SystemExit, match="n.txt:2"):
        mt.main(["nbest-top", str(src), "2", "-o", str(tmp_path / "x.txt")])
    assert not (tmp_path / "x.txt").exists()
    src.write_text(lines[4] + lines[0])  # sentence 1 before sentence 0: not Moses's order
    with pytest.raises(SystemExit, match="n.txt:2: sentence 0 after sentence 1"):
        mt.main(["nbest-top", str(src), "2", "-o", str(tmp_path / "x.txt")])


def test_nbest_top_merges_lists_per_sentence_without_repeats(tmp_path):
    """mt.py nbest-top with several lists (a tuning's iterations): per sentence, the first N lines of each
    list in the order given; a line whose hypothesis and scores repeat a kept one is dropped (its total and
    later fields not compared); a sentence that one list lacks comes from the others."""
    a, b = tmp_path / "run1.txt", tmp_path / "run2.txt"
    a.write_text("0 ||| x ||| LM0= -1 ||| -1\n0 ||| y ||| LM0= -2 ||| -2\n2 ||| z ||| LM0= -3 ||| -3\n")
    b.write_text("0 ||| y ||| LM0= -2.0 ||| -9 ||| 0-0\n0 ||| y ||| LM0= -2.5 ||| -2\n0 ||| w ||| LM0= -4 ||| -4\n"
                 "1 ||| v ||| LM0= -5 ||| -5\n")
    mt.main(["nbest-top", str(a), str(b), "2", "-o", str(tmp_path / "m.txt")])
    assert (tmp_path / "m.txt").read_text() == ("0 ||| x ||| LM0= -1 ||| -1\n0 ||| y ||| LM0= -2 ||| -2\n"
                                                "0 ||| y ||| LM0= -2.5 ||| -2\n1 ||| v ||| LM0= -5 ||| -5\n"
                                                "2 ||| z ||| LM0= -3 ||| -3\n")


def test_json_field_prints_one_field_or_names_the_file(tmp_path, capsys):
    f = tmp_path / "mix.json"
    f.write_text(json.dumps({"weight": 0.55, "tokens": 10}))
    mt.main(["json-field", str(f), "weight"])
    assert capsys.readouterr().out == "0.55\n"
    with pytest.raises(SystemExit, match=f"mt.py json-field: {f}: no field 'mix'"):
        mt.main(["json-field", str(f), "mix"])
    f.write_text("{cut")
    with pytest.raises(SystemExit, match="mix.json"):
        mt.main(["json-field", str(f), "weight"])


def test_reranking_resumes_at_the_step_it_was_in(tmp_path):
    """Each step of S-rerank is its own target: with the test list decoded and the dev list rescored, a new
    run neither decodes nor rescores the dev list again; it rescores the test list, tunes and reranks."""
    w = tmp_path / "w"
    base, run = w / "systems/baseline/pro-bp-1", w / "systems/baseline-rerank/pro-bp-1"
    run.mkdir(parents=True)
    (run / "test.nbest.gz").write_bytes(b"")
    (run / "dev.nbest.gz").write_bytes(b"")
    (run / "dev.nbest.rnn.gz").write_bytes(b"")
    old = [f"--old-file={p}" for p in (base / "test.bleu.json", w / "sent/model/.done")]
    r = _make("-n", *old, str(run / "test.bleu.json"), "BUDGET=1", "SYSTEMS=baseline", "RERANKED=baseline", MOSES="/opt/mosesdecoder",
              WORK=str(w), DATA=str(tmp_path / "no-data"))
    assert r.returncode == 0, r.stderr
    plan = r.stdout
    assert "/opt/mosesdecoder/bin/moses " not in plan and "best-iteration" not in plan
    assert f"rescore-nbest {run}/test.nbest.gz" in plan and "mt.py rerank-tune" in plan and "mt.py rerank " in plan
    (run / "test.nbest.rnn.gz").write_bytes(b"")
    (run / "weights.txt").write_text("")
    r = _make("-n", *old, str(run / "test.bleu.json"), "BUDGET=1", "SYSTEMS=baseline", "RERANKED=baseline", MOSES="/opt/mosesdecoder",
              WORK=str(w), DATA=str(tmp_path / "no-data"))
    assert "rescore-nbest" not in r.stdout and "rerank-tune" not in r.stdout and "mt.py rerank " in r.stdout


def test_rerank_tunes_with_moses_and_picks_the_best_hypotheses(tmp_path):
    """rerank.py: the features named as extractor names them, mert started from the tuned weights with the
    new feature at 0 (fake Moses binaries record their arguments), and each sentence's best hypothesis."""
    import rerank

    nbest = tmp_path / "nbest"
    nbest.write_text("0 ||| a b ||| LM0= -2 TM0= -1 -3 RNN0= -5 ||| 0\n"
                     "0 ||| a c ||| LM0= -1 TM0= -2 -3 RNN0= -9 ||| 0\n"
                     "2 ||| d ||| LM0= -4 TM0= 0 0 RNN0= -1 ||| 0\n")
    ini = tmp_path / "tuned.ini"
    ini.write_text("[weight]\nLM0= 0.5\nTM0= 0.2 0.3\n")
    moses = tmp_path / "moses"
    (moses / "bin").mkdir(parents=True)
    (moses / "bin" / "extractor").write_text(
        '#!/bin/sh\necho "$@" > extractor.args\nwhile [ $# -gt 0 ]; do [ "$1" = --ffile ] && f=$2; shift; done\n'
        'echo "FEATURES_TXT_BEGIN_0 0 2 4 LM0_0 TM0_0 TM0_1 RNN0_0" > $f\n')
    (moses / "bin" / "mert").write_text('#!/bin/sh\ncp init.opt "$OUT.init"\necho "$@" > "$OUT.args"\n'
                                       'echo "0.1 0.2 0.3 0.4" > weights.txt\n')
    for b in ("extractor", "mert"):
        (moses / "bin" / b).chmod(0o755)
    os.environ["OUT"] = str(tmp_path / "mert")
    try:
        weights = rerank.tune(str(nbest), "ref", str(ini), str(moses), str(tmp_path / "w.txt"), seed=3,
                              positive=["TM0"])
    finally:
        del os.environ["OUT"]
    assert weights == {"LM0_0": 0.1, "TM0_0": 0.2, "TM0_1": 0.3, "RNN0_0": 0.4}
    assert rerank.read_weights(str(tmp_path / "w.txt")) == weights
    assert (tmp_path / "mert.init").read_text().splitlines()[0] == "0.500000 0.200000 0.300000 0.000000"
    args = (tmp_path / "mert.args").read_text().split()
    assert args[args.index("-d") + 1] == "4" and args[args.index("-r") + 1] == "3"
    assert args[args.index("-P") + 1] == "TM0_0,TM0_1"
    # LM0 -2*.1 + TM0 -.2 -.9 + RNN -2 = -3.3 against -.1 -.4 -.9 -3.6 = -5.0: "a b"; sentence 1 has no list
    os.environ["OUT"] = str(tmp_path / "free")
    try:  # the network's weight alone moves (mert -o); a feature the list lacks is one line
        rerank.tune(str(nbest), "ref", str(ini), str(moses), str(tmp_path / "w2.txt"), free=["RNN0"])
        with pytest.raises(UserError, match="none of the features WP0 is in the list .it has LM0, RNN0, TM0"):
            rerank.tune(str(nbest), "ref", str(ini), str(moses), str(tmp_path / "w3.txt"), free=["WP0"])
    finally:
        del os.environ["OUT"]
    args = (tmp_path / "free.args").read_text().split()
    assert args[args.index("-o") + 1] == "RNN0_0" and "-o" not in (tmp_path / "mert.args").read_text().split()
    assert rerank.rerank(str(nbest), weights, 3) == ["a b", "", "d"]
    assert rerank.rerank(str(nbest), {"RNN0_0": -1.0}, 3)[0] == "a c"
    with pytest.raises(UserError, match="nbest:3: sentence id 2, but only 2"):
        rerank.rerank(str(nbest), weights, 2)


def test_dry_run_server_mode(tmp_path, shared_data):
    r = _make("-n", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"), DATA=str(shared_data / "en-fr"),
              CSLM_MODE="server")
    assert r.returncode == 0, r.stderr
    assert "mt.py with-cslm" in r.stdout and "port=5107" in r.stdout and "buffer=65536" in r.stdout
    assert '--serve-args="--self-normalized" ' in r.stdout and "/cslm/model 5107 -- " in r.stdout
    r = _make("-n", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"), CSLM_MODE="gpu")
    assert r.returncode != 0 and "CSLM_MODE must be local or server" in r.stderr


def test_dry_run_cslm_precision(tmp_path, shared_data):
    """CSLM_PRECISION=int8: precision=int8 on the CSLM and NNJM lines in process, --precision int8 for the
    server; by default neither; another value stops the plan in one line."""
    data = str(shared_data / "en-fr")
    plan = {}
    for precision, mode in (("fp32", "local"), ("int8", "local"), ("int8", "server")):
        r = _make("-n", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"), DATA=data, CSLM_MODE=mode,
                  CSLM_PRECISION=precision, SYSTEMS="cslm-rnn nnjm")
        assert r.returncode == 0, r.stderr
        plan[precision, mode] = r.stdout
    assert "precision=" not in plan["fp32", "local"] and "--precision" not in plan["fp32", "local"]
    assert "path=" + str(tmp_path / "w" / "cslm" / "model") + " precision=int8" in plan["int8", "local"]
    assert "path=" + str(tmp_path / "w" / "nnjm" / "model") + " precision=int8" in plan["int8", "local"]
    assert '--serve-args="--self-normalized --precision int8"' in plan["int8", "server"]
    r = _make("-n", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"), CSLM_PRECISION="int4")
    assert r.returncode != 0 and "CSLM_PRECISION must be fp32 or int8, not int4" in r.stderr


def test_dry_run_cslm_keys(tmp_path, shared_data):
    """CSLM_KEYS: more keys on the CSLM line in either mode, each replacing the mode's own of the same
    key; a word that is not key=value stops the plan in one line."""
    data = str(shared_data / "en-fr")
    model = str(tmp_path / "w" / "cslm" / "model")
    lines = {}
    for mode in ("local", "server"):
        r = _make("-n", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"), DATA=data, CSLM_MODE=mode,
                  CSLM_PRECISION="int8", CSLM_KEYS="buffer=4096 predict=8", SYSTEMS="cslm-rnn")
        assert r.returncode == 0, r.stderr
        lines[mode] = [ln for ln in r.stdout.splitlines() if " CSLM name=CSLM0 " in ln]
        assert lines[mode]
    assert all(f"path={model} precision=int8 buffer=4096 predict=8 " in ln for ln in lines["local"])
    assert all(f"path={model} buffer=4096 predict=8 " in ln and "buffer=65536" not in ln
               for ln in lines["server"])
    r = _make("-n", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"), CSLM_KEYS="buffer=1 predict")
    assert r.returncode != 0 and "CSLM_KEYS holds key=value pairs, not predict" in r.stderr


def test_dry_run_without_moses(tmp_path):
    # no data either: the plan is shown whether the default corpus folder exists or not
    r = _make("-n", "report", WORK=str(tmp_path / "w"), DATA=str(tmp_path / "no-data"))
    assert r.returncode == 0, r.stderr
    assert "mert-moses.pl" in r.stdout and "mt.py prepare" in r.stdout
    r = _make("-n", "report", WORK=str(tmp_path / "w"))  # the default DATA, beside the project or not
    assert r.returncode == 0, r.stderr


def test_missing_corpus_is_named_in_one_line(tmp_path):
    r = _make("prepare", WORK=str(tmp_path / "w"), DATA=str(tmp_path / "no-data"))
    assert r.returncode != 0
    msg = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("make")]
    assert msg == [f"pipelines: {tmp_path / 'no-data'}/train.en does not exist: pass DATA=/path/to/corpora "
                   "(train, dev, test .en/.fr) or CORPUS=, DEV=, TEST="], r.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("target", ["phrases", "lm", "rnn", "cslm", "tune-baseline", "eval-rnn", "report", "W/rnn/model/.done"])
def test_moses_steps_need_moses(tmp_path, target):
    target = target.replace("W/", f"{tmp_path / 'w'}/")  # a file named as the goal
    r = _make(target, WORK=str(tmp_path / "w"))
    assert r.returncode != 0
    msg = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(msg) == 1 and "MOSES is not set" in msg[0] and "MOSES=/path/to/mosesdecoder" in msg[0]
    assert not (tmp_path / "w").exists()
    r = _make(target, WORK=str(tmp_path / "w"), MOSES=str(tmp_path))
    assert r.returncode != 0 and "has no bin/moses" in r.stderr


def test_prepare_and_align_on_a_slice(tmp_path, shared_data):
    if shutil.which("eflomal-align", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("eflomal is not installed")
    work = tmp_path / "w"
    args = dict(WORK=str(work), DATA=str(shared_data / "en-fr"), TRAIN_LINES=400, TRAIN_STRIDE=50,
                DEV_LINES=30, TEST_LINES=25, EFLOMAL_ARGS="-m 1")
    r = _make("prepare", "align", **args)
    assert r.returncode == 0, r.stderr
    data = work / "data"
    lines = {p.name: p.read_text(encoding="utf-8").splitlines() for p in data.iterdir()}
    assert len(lines["dev.en"]) == len(lines["dev.fr"]) == len(lines["dev.ref.fr"]) == 30
    assert len(lines["test.en"]) == 25
    n = len(lines["train.en"])
    assert 300 <= n <= 400 and len(lines["train.fr"]) == n
    # tokenized and lowercased with Moses escaping, the reference raw
    assert all(line == line.lower() for line in lines["train.fr"])
    assert any("&apos;" in line for line in lines["train.fr"] + lines["dev.fr"])
    assert any(any(c.isupper() for c in line) for line in lines["dev.ref.fr"])
    # every link points inside its sentence pair
    links = (work / "align" / "aligned.grow-diag-final-and").read_text().splitlines()
    assert len(links) == n
    for src, trg, a in zip(lines["train.en"], lines["train.fr"], links):
        for link in a.split():
            i, j = map(int, link.split("-"))
            assert i < len(src.split()) and j < len(trg.split())
    assert not list(work.rglob("*.tmp")) and not list(work.rglob(".*.tmp"))
    # incremental: nothing left to do; touching the corpus slice redoes the alignment only
    r = _make("-q", "prepare", "align", **args)
    assert r.returncode == 0
    r = _make("prepare", "align", **args)
    assert "Nothing to be done" in r.stdout or "is up to date" in r.stdout


def test_a_corpus_copied_again_leaves_the_work_folder_up_to_date(tmp_path):
    """New time stamps on the same raw text: nothing to do, and a dry run says so; new text: prepared again."""
    data = tmp_path / "corpora"
    data.mkdir()
    for name in ("train", "dev", "test"):
        (data / f"{name}.en").write_text("Hello, world.\nThe cat sat.\n", encoding="utf-8")
        (data / f"{name}.fr").write_text("Bonjour, le monde.\nLe chat était assis.\n", encoding="utf-8")
    args = dict(WORK=str(tmp_path / "w"), DATA=str(data))
    r = _make("prepare", **args)
    assert r.returncode == 0, r.stderr
    prepared = tmp_path / "w" / "data" / "train.fr"
    stamp = prepared.stat().st_mtime_ns
    later = time.time() + 5
    for f in data.iterdir():  # copied again: the same text, newer than everything prepared
        f.write_bytes(f.read_bytes())
        os.utime(f, (later, later))
    assert _make("-q", "prepare", **args).returncode == 0
    r = _make("-n", "prepare", **args)
    assert "mt.py prepare" not in r.stdout, r.stdout
    assert _make("prepare", **args).returncode == 0 and prepared.stat().st_mtime_ns == stamp
    (data / "train.fr").write_text("Bonjour.\nLe chat.\n", encoding="utf-8")  # new text is prepared again
    assert _make("-q", "prepare", **args).returncode != 0
    assert _make("prepare", **args).returncode == 0
    assert prepared.read_text(encoding="utf-8") == "bonjour .\nle chat .\n"
    assert _make("-q", "prepare", **args).returncode == 0


def test_prepare_keeps_an_unchanged_output_and_its_time(tmp_path):
    """A corpus copied again (new time stamp, same text) must not make every later step out of date."""
    corpus = tmp_path / "c"
    (tmp_path / "c.en").write_text("Hello, world.\nThe cat sat.\n", encoding="utf-8")
    (tmp_path / "c.fr").write_text("Bonjour, le monde.\nLe chat était assis.\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = ["prepare", str(corpus), str(out), "--src", "en", "--trg", "fr"]
    mt.main(argv)
    files = [tmp_path / f"out.{x}" for x in ("en", "fr", "ref.fr")]
    for f in files:
        os.utime(f, ns=(10**18, 10**18))  # an old time stamp, as a built work folder has
    os.utime(tmp_path / "c.en")  # the corpus "copied again": newer than the outputs
    mt.main(argv)
    assert [f.stat().st_mtime_ns for f in files] == [10**18] * 3
    assert files[1].read_text(encoding="utf-8").splitlines() == ["bonjour , le monde .", "le chat était assis ."]
    (tmp_path / "c.fr").write_text("Bonjour.\nLe chat.\n", encoding="utf-8")  # a real change is written
    mt.main(argv)
    assert files[1].read_text(encoding="utf-8").splitlines() == ["bonjour .", "le chat ."]
    assert files[0].stat().st_mtime_ns == 10**18 and files[1].stat().st_mtime_ns > 10**18
    assert not list(tmp_path.glob(".*.tmp"))


def test_grow_diag_final_and():
    fwd = {(0, 0), (1, 2), (2, 1)}
    rev = {(0, 0), (1, 1), (1, 2), (3, 3)}
    got = corpus.grow_diag_final_and(fwd, rev)
    # the intersection, grown by (1,1) (beside (1,2), target word 1 unaligned) and
    # (2,1) (diagonal to (1,2), source word 2 unaligned); final-and adds (3,3)
    assert got == {(0, 0), (1, 2), (1, 1), (2, 1), (3, 3)}
    assert got <= fwd | rev
    assert corpus.grow_diag_final_and(set(), set()) == set()
    assert corpus.grow_diag_final_and({(0, 1)}, {(0, 1)}) == {(0, 1)}


def test_detok_and_report(tmp_path):
    src = tmp_path / "out"
    src.write_text("l&apos; homme n&apos; a pas &amp; de chance .\n", encoding="utf-8")
    mt.main(["detok", "--lang", "fr", str(src), str(tmp_path / "detok")])
    assert (tmp_path / "detok").read_text(encoding="utf-8") == "l'homme n'a pas & de chance.\n"

    sig = "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0"
    for system, (dev, test) in {"baseline": (20.1, 21.5), "rnn": (20.9, 22.0)}.items():
        d = tmp_path / "systems" / system
        d.mkdir(parents=True)
        for part, score in (("dev", dev), ("test", test)):
            (d / f"{part}.bleu.json").write_text(json.dumps({"name": "BLEU", "score": score, "signature": sig}))
    (tmp_path / "cslm").mkdir()
    (tmp_path / "cslm" / "ppl.json").write_text(json.dumps({
        "tokens": 1000, "unknown": 100, "cslm_ppl": 102.2, "cslm_ppl_in_shortlist": 128.7, "kenlm_order": 5,
        "kenlm_ppl": 286.2, "kenlm_ppl_in_shortlist": 129.0, "log_z": {"mean": -0.01, "sd": 0.57},
        "mix_weight": 0.55, "mix_ppl": 250.0, "mix_ppl_in_shortlist": 103.2}))
    mt.main(["report", str(tmp_path), str(tmp_path / "report.md"), "--systems", "baseline rnn cslm-rnn"])
    assert ("(1,000 tokens): CSLM 102.2, KenLM 5-gram 286.2; on the 900 tokens in the CSLM's shortlist: "
            "CSLM 128.7, KenLM 129.0. The two interpolated (weight 0.55 on the CSLM, estimated on the dev set): "
            "103.2 on the shortlist's tokens (0.80x KenLM), 250.0 on all. Self-normalisation: ln Z mean -0.01, "
            "sd 0.57.") in (tmp_path / "report.md").read_text()
    table = (tmp_path / "report.md").read_text().splitlines()
    assert table[0] == "Tuner: mert (mert-moses.pl, --random-restarts 20); tunings systems/SYSTEM/mert-K."
    assert table[2] == ("| Models | tunings | BLEU dev | BLEU test | test gain per tuning | p per tuning "
                        "| p all tunings (AR) | p all tunings (bootstrap) |")
    assert "| Baseline | 1 | 20.10 | 21.50 | – | – | – | – |" in table
    assert "| RNN | 1 | 20.90 | 22.00 | +0.50 | – | – | – |" in table
    assert not any(line.startswith("| CSLM") for line in table)
    assert any(sig in line for line in table)


def test_report_lists_the_networks_from_their_model_directories(tmp_path):
    """The networks' table comes from each model directory as the project reads one: its size from
    the weights, the rest from config.json's training metadata; a damaged config.json is one line."""
    import numpy as np
    from safetensors.numpy import save_file

    model = tmp_path / "rnn" / "model"
    model.mkdir(parents=True)
    save_file({"w": np.zeros((1000, 1500), dtype=np.float32)}, str(model / "model.safetensors"))
    meta = {"train_config": {"preset": "small", "recipe": "fast", "max_minutes": 60, "threads": 2}, "step": 1234,
            "valid_ppl": 6.4321}
    (model / "config.json").write_text(json.dumps({"format": "moses-rnn", "model": {}, "meta": meta}))
    mt.main(["report", str(tmp_path), str(tmp_path / "report.md"), "--systems", "baseline"])
    assert ("| RNN Encoder–Decoder | small | 1.5 M | fast | 60 min, 2 thread(s) | 1234 | 6.43 |"
            in (tmp_path / "report.md").read_text().splitlines())
    nnjm = tmp_path / "nnjm" / "model"  # the joint model's directory has its row too
    nnjm.mkdir(parents=True)
    save_file({"w": np.zeros((1000, 500), dtype=np.float32)}, str(nnjm / "model.safetensors"))
    meta["valid_ppl"] = 30.5
    (nnjm / "config.json").write_text(json.dumps({"format": "cslm", "model": {"source_window": 11}, "meta": meta}))
    mt.main(["report", str(tmp_path), str(tmp_path / "report.md"), "--systems", "baseline"])
    assert ("| NNJM | small | 0.5 M | fast | 60 min, 2 thread(s) | 1234 | 30.50 |"
            in (tmp_path / "report.md").read_text().splitlines())
    (model / "config.json").write_text(json.dumps({"format": "moses-rnn", "model": {}, "meta": ["not", "a", "dict"]}))
    with pytest.raises(SystemExit, match=f"mt.py report: {model / 'config.json'}: \"meta\" is not an object"):
        mt.main(["report", str(tmp_path), str(tmp_path / "report2.md"), "--systems", "baseline"])


def test_report_over_several_tunings_with_paired_bootstrap(tmp_path):
    """Three tunings per system: mean ± sample sd, and a paired bootstrap p-value per tuning that is
    small where the system's output is much closer to the reference than the baseline's, not small
    where its errors are as many as the baseline's (other ones)."""
    pytest.importorskip("sacrebleu")
    rng = __import__("random").Random(0)
    words = [f"w{i}" for i in range(50)]
    ref = [" ".join(rng.choices(words, k=12)) for _ in range(150)]
    worse = [" ".join(w if rng.random() < 0.5 else "x" for w in r.split()) for r in ref]
    better = [" ".join(w if rng.random() < 0.9 else "x" for w in r.split()) for r in ref]
    as_bad = [" ".join(w if rng.random() < 0.5 else "x" for w in r.split()) for r in ref]  # other errors, same rate
    (tmp_path / "test.ref").write_text("\n".join(ref) + "\n")
    sig = "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0"
    scores = {"baseline": [20.0, 21.0, 22.0], "rnn": [23.0, 23.0, 23.0], "cslm-rnn": [20.0, 21.0, 22.0]}
    outputs = {"baseline": worse, "rnn": better, "cslm-rnn": as_bad}
    for system, values in scores.items():
        for k, score in enumerate(values, 1):
            d = tmp_path / "systems" / system / f"kbmira-{k}"
            d.mkdir(parents=True)
            for part in ("dev", "test"):
                (d / f"{part}.bleu.json").write_text(json.dumps({"name": "BLEU", "score": score, "signature": sig}))
            (d / "test.detok").write_text("\n".join(outputs[system]) + "\n")
    # another tuner's runs in the same work folder are not this report's, nor mert's with 0 restarts
    for other in ("mert-1", "mert-r0-1"):
        (tmp_path / "systems" / "rnn" / other).mkdir()
        (tmp_path / "systems" / "rnn" / other / "test.bleu.json").write_text(
            json.dumps({"name": "BLEU", "score": 99.0, "signature": sig}))
    mt.main(["report", str(tmp_path), str(tmp_path / "report.md"), "--systems", "baseline rnn cslm-rnn",
             "--tuner", "kbmira", "--test-ref", str(tmp_path / "test.ref"), "--samples", "200", "--ar-samples", "500",
             "--pairs", "cslm-rnn:rnn rnn:missing"])
    text = (tmp_path / "report.md").read_text()
    # --pairs: each system against the one it extends (a pair naming a system without tunings is left out)
    extended = [line for line in text.splitlines() if line.startswith("| CSLM + RNN | RNN |")]
    assert len(extended) == 1 and "| -3.00 / -2.00 / -1.00 (min -3.00) |" in extended[0]
    assert "| RNN | missing |" not in text
    main_table = text.split("Against the system each one extends")[0]
    rows = {line.split(" | ")[0]: line.rstrip(" |").split(" | ") for line in main_table.splitlines()
            if line.startswith("| ") and not line.startswith("| Models")}
    assert text.startswith("Tuner: kbmira (mert-moses.pl --batch-mira); tunings systems/SYSTEM/kbmira-K.")
    assert rows["| Baseline"][1:] == ["3", "21.00 ± 1.00", "21.00 ± 1.00", "–", "–", "–", "–"]
    assert rows["| RNN"][3] == "23.00 ± 0.00"
    assert rows["| RNN"][4] == "+3.00 / +2.00 / +1.00 (min +1.00)"  # each tuning against the baseline's same seed
    assert all(float(p) < 0.05 for p in rows["| RNN"][5].split(" / "))
    assert all(float(p) > 0.05 for p in rows["| CSLM + RNN"][5].split(" / "))
    # over all tunings together (stratified approximate randomization)
    for column in (6, 7):  # approximate randomization, bootstrap
        assert float(rows["| RNN"][column]) < 0.05 and float(rows["| CSLM + RNN"][column]) > 0.05
    assert "paired bootstrap signature: `nrefs:1|bs:200|" in text
    assert "over all tunings: `test:stratified-ar|" in text and text.count("over all tunings: `") == 2


def test_report_weighs_the_columns_and_scores_the_shortlist_misses(tmp_path):
    """The tuned weight of each network column (TranslationModel0's 5th score), of the CSLM and of the joint
    model, with their shares of all weights; BLEU on the test sentences with a source word outside the RNN's shortlist
    alone (as sacrebleu scores those lines); both left out when the files are missing."""
    sacrebleu = pytest.importorskip("sacrebleu")
    from mtcommon.vocab import Vocabulary

    src = ["a b c", "a zz b", "c a", "qq"]  # lines 2 and 4 hold words outside the shortlist {a, b, c}
    ref = ["x y z w", "x y v w", "z x", "q r s t"]
    out = {"baseline": ["x y z w", "x u v w", "z x", "q r u t"], "rnn-subword": ["x y z w", "x y v w", "z x", "q r s t"],
           "nnjm": ["x y z w", "x y v w", "z x", "q r u t"]}
    (tmp_path / "test.en").write_text("\n".join(src) + "\n")
    (tmp_path / "test.ref").write_text("\n".join(ref) + "\n")
    Vocabulary(["</s>", "[UNK]", "a", "b", "c"]).save(str(tmp_path / "src.vocab"))
    weights = {"baseline": "TranslationModel0= 0.2 0.2 0.2 0.2\nLM0= 0.2\n",
               "rnn-subword": "TranslationModel0= 0.1 0.1 0.1 0.1 0.1\nLM0= 0.3\nCSLM0= 0.2\n",
               "nnjm": "TranslationModel0= 0.1 0.1 0.1 0.1\nLM0= 0.2\nNNJM0= 0.4 -0.1\n"}
    for system in out:
        run = tmp_path / "systems" / system / "mert-1"
        run.mkdir(parents=True)
        (run / "test.detok").write_text("\n".join(out[system]) + "\n")
        (run / "test.bleu.json").write_text(json.dumps({"name": "BLEU", "score": 1.0}))
        (run / "tuned.ini").write_text("[weight]\n" + weights[system])
    args = [str(tmp_path), str(tmp_path / "report.md"), "--systems", "baseline rnn-subword nnjm", "--test-ref",
            str(tmp_path / "test.ref"), "--samples", "20", "--ar-samples", "20", "--test-src", str(tmp_path / "test.en")]
    mt.main(["report", *args, "--shortlist", str(tmp_path / "src.vocab")])
    text = (tmp_path / "report.md").read_text()
    assert "| RNN, subword units mert-1 | 0.1000 (10.0%) | 0.2000 (20.0%) | – |" in text
    assert "| NNJM mert-1 | – | – | 0.4000 (36.4%) |" in text
    assert "| Baseline mert-1 |" not in text  # no neural feature
    assert "BLEU on the 2 test sentences with a source word outside" in text
    for system, label in (("baseline", "Baseline"), ("rnn-subword", "RNN, subword units")):
        expected = sacrebleu.corpus_bleu([out[system][1], out[system][3]], [[ref[1], ref[3]]], lowercase=True).score
        assert f"| {label} | 1 | {expected:.2f} |" in text
    mt.main(["report", *args, "--shortlist", str(tmp_path / "no.vocab")])
    assert "outside the word-level RNN's shortlist" not in (tmp_path / "report.md").read_text()


# ---- the Moses feature function's Moses-independent parts (cslm/moses/) ----------------

MOSES_FF = ROOT / "cslm" / "moses"


def test_feature_ngram_logic_compiles_and_passes(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path / "cslm_ngrams_test"
    subprocess.run([cxx, "-std=c++11", "-O1", "-Wall", "-Werror", "-o", str(exe),
                    str(MOSES_FF / "cslm_ngrams_test.cc")], check=True, timeout=120)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "all checks passed" in r.stdout


def test_add_to_moses_registers_once(tmp_path):
    ff = tmp_path / "mosesdecoder" / "moses" / "FF"
    ff.mkdir(parents=True)
    factory = ff / "Factory.cpp"
    factory.write_text('#include "util/exception.hh"\n#include "moses/FF/Factory.h"\n#include "x.h"\n'
                       "void f() {\n  MOSES_FNAME(ExampleStatefulFF);\n  MOSES_FNAME(Other);\n}\n")
    search = ff.parent / "SearchNormal.cpp"  # the three places the buffer hooks into, as in Moses
    search.write_text('#include "Manager.h"\n#include "SearchNormal.h"\n\nbool SearchNormal::ProcessOneStack() {\n'
                      "  for (h = c.begin(); h != c.end(); ++h)\n    ProcessOneHypothesis(**h);\n  return true;\n}\n"
                      "void SearchNormal::ExpandHypothesis() {\n  if (x) {\n"
                      "    newHypo->EvaluateWhenApplied(estimatedScore);\n  }\n}\n")
    cube = ff.parent / "BitmapContainer.cpp"  # cube pruning: the cube's two constructor exits, its successors
    cube.write_text('#include <utility>\n\n#include "BitmapContainer.h"\n#include "Manager.h"\n\n'
                    "BackwardsEdge::BackwardsEdge() {\n  if (maxDistortion == -1) {\n"
                    "    for (iter = a.begin(); iter != a.end(); ++iter) {\n      m_hypotheses.push_back(*iter);\n"
                    "    }\n    return;\n  }\n  HypothesisScoreOrdererWithDistortion orderer (&r, d);\n"
                    "  std::sort(m_hypotheses.begin(), m_hypotheses.end(), orderer);\n\n}\n\n"
                    "void\nBackwardsEdge::PushSuccessors(const size_t x, const size_t y)\n{\n  Hypothesis *newHypo;\n}\n")
    cube_search = ff.parent / "SearchCubePruning.cpp"  # ... and the stack loop that initialises the cubes
    cube_search.write_text('#include "Manager.h"\n#include "SearchCubePruning.h"\n\nvoid SearchCubePruning::Decode() {\n'
                           "    const _BMType &accessor = sourceHypoColl.GetBitmapAccessor();\n\n"
                           "    for(bmIter = accessor.begin(); bmIter != accessor.end(); ++bmIter) {\n"
                           "      // build the first hypotheses\n      bmIter->second->InitializeEdges();\n    }\n}\n")
    for _ in range(2):
        r = subprocess.run(["bash", str(MOSES_FF / "add-to-moses.sh"), str(tmp_path / "mosesdecoder")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    hooked = cube.read_text()
    assert hooked.count("CSLMBuffer") == 4 and hooked.count('#include "moses/FF/CSLMBuffer.h"') == 1
    assert hooked.index("m_hypotheses.push_back(*iter);") < hooked.index("CSLMBuffer::Cube(") < hooked.index("return;")
    assert hooked.rindex("std::sort(m_hypotheses") < hooked.rindex("CSLMBuffer::Cube(") < hooked.index("PushSuccessors")
    assert hooked.index("PushSuccessors") < hooked.index("CSLMBuffer::Successors(") < hooked.index("Hypothesis *newHypo")
    hooked = cube_search.read_text()
    assert hooked.count("CSLMBuffer") == 2
    assert hooked.index("GetBitmapAccessor") < hooked.index("CSLMBuffer::Flush();") < hooked.index("InitializeEdges")
    text = factory.read_text()
    assert text.count('#include "moses/FF/CSLM.h"') == 1 and text.count("MOSES_FNAME(CSLM);") == 1
    assert text.index("MOSES_FNAME(ExampleStatefulFF);") < text.index("MOSES_FNAME(CSLM);")
    hooked = search.read_text()
    assert hooked.count("CSLMBuffer") == 3 and hooked.count('#include "moses/FF/CSLMBuffer.h"') == 1
    assert hooked.index("ProcessOneHypothesis(**h);") < hooked.index("CSLMBuffer::Flush();") < hooked.index("return true;")
    assert hooked.index("CSLMBuffer::Hold(newHypo") < hooked.index("newHypo->EvaluateWhenApplied(estimatedScore);")
    names = {p.name for p in ff.iterdir()}
    assert {"CSLM.h", "CSLM.cpp", "CSLMBuffer.h", "CSLMBuffer.cpp", "cslm_ngrams.h", "cslm_client.h",
            "cslm_client.cpp", "cslm_local.h", "cslm_local.cpp", "cslm_backend.h", "cslm_backend.cpp",
            "cslm_kernels.h", "cslm_kernels.cpp", "cslm_modeldir.h", "cslm_modeldir.cpp", "cslm_json.h",
            "cslm_json.cpp"} <= names
    # a Moses whose search this script does not know: a clear error, the file untouched
    search.write_text("// something else\n")
    r = subprocess.run(["bash", str(MOSES_FF / "add-to-moses.sh"), str(tmp_path / "mosesdecoder")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "could not hook the CSLM buffer" in r.stderr
    assert search.read_text() == "// something else\n"
    r = subprocess.run(["bash", str(MOSES_FF / "add-to-moses.sh"), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode != 0 and "a mosesdecoder checkout?" in r.stderr
    for args in ([], ["a", "b"]):  # the usage, in one line
        r = subprocess.run(["bash", str(MOSES_FF / "add-to-moses.sh"), *args], capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr == "usage: add-to-moses.sh MOSES_CHECKOUT\n", r.stderr
    r = subprocess.run(["bash", str(MOSES_FF / "add-to-moses.sh"), str(tmp_path / "none")], capture_output=True,
                       text=True)
    assert r.returncode == 1 and r.stderr.strip().endswith("none is not a directory (usage: add-to-moses.sh "
                                                           "MOSES_CHECKOUT)"), r.stderr


def test_mt_py_names_a_truncated_corpus_in_one_line(tmp_path):
    import gzip

    data = gzip.compress("".join(f"l'homme {i} &amp; co .\n" for i in range(20000)).encode("utf-8"))
    (tmp_path / "out.gz").write_bytes(data[: len(data) // 2])
    r = subprocess.run([sys.executable, str(PIPE / "mt.py"), "detok", "--lang", "fr", str(tmp_path / "out.gz"),
                        str(tmp_path / "detok")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.startswith(f"mt.py detok: {tmp_path / 'out.gz'}: truncated gzip stream after line "), r.stderr
    assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "detok").exists()


def test_reweight_puts_the_tuned_weights_into_the_filtered_model(tmp_path):
    filtered = tmp_path / "filtered.ini"
    filtered.write_text("# filtered\n[feature]\nPhraseDictionaryMemory name=TranslationModel0 path=/f/pt.gz\n\n"
                        "[weight]\nTranslationModel0= 0.2 0.2\nLM0= 0.5\n\n[distortion-limit]\n6\n")
    tuned = tmp_path / "tuned.ini"
    tuned.write_text("[feature]\nPhraseDictionaryMemory name=TranslationModel0 path=/full/pt.gz\n\n"
                     "[weight]\nLM0= 0.1\nTranslationModel0= 0.03 -0.4\n")
    mt.main(["reweight", str(filtered), str(tuned), "-o", str(tmp_path / "out.ini")])
    out = (tmp_path / "out.ini").read_text()
    assert "path=/f/pt.gz" in out and "/full/" not in out  # the filtered tables
    assert "LM0= 0.1\nTranslationModel0= 0.03 -0.4" in out and "0.2 0.2" not in out  # the tuned weights
    assert out.startswith("# filtered\n[feature]") and "[distortion-limit]\n6" in out
    tuned.write_text("[weight]\nLM0= 0.1\nTranslationModel0= 0.03 -0.4\nCSLM0= 0.1\n")
    with pytest.raises(SystemExit, match="tuned.ini weights features"):
        mt.main(["reweight", str(filtered), str(tuned), "-o", str(tmp_path / "bad.ini")])
    tuned.write_text("[feature]\nDistortion\n")
    with pytest.raises(SystemExit, match=f"mt.py reweight: {tuned}: expected one \\[weight\\] section, found 0"):
        mt.main(["reweight", str(filtered), str(tuned), "-o", str(tmp_path / "bad.ini")])
    assert not (tmp_path / "bad.ini").exists()


def test_positive_names_every_score_of_each_feature(tmp_path):
    ini = tmp_path / "moses.ini"
    ini.write_text("[feature]\nLexicalReordering name=LexicalReordering0 num-features=6 path=r\nDistortion\n"
                   "PhraseDictionaryMemory name=TranslationModel0 num-features=6 tuneable-components=true,true,true,true,true,false path=p\n"
                   "PhraseDictionaryMemory name=TranslationModel1 num-features=2 tuneable-components=1,2 path=p\n"
                   "KENLM name=LM0 path=lm order=5 tuneable=false\n"
                   "[weight]\nLexicalReordering0= 0.3 0.3 0.3 0.3 0.3 0.3\nDistortion0= 0.3\n")
    r = subprocess.run([sys.executable, str(PIPE / "mt.py"), "positive", str(ini), "LexicalReordering0", "Distortion0"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == ",".join([f"LexicalReordering0_{i}" for i in range(6)] + ["Distortion0_0"]) + "\n"
    # a phrase table with the RNN's fixed unknown-word column: mert names its five tuned scores _0.._4
    r = subprocess.run([sys.executable, str(PIPE / "mt.py"), "positive", str(ini), "TranslationModel0"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == ",".join(f"TranslationModel0_{i}" for i in range(5)) + "\n"
    for name, message in (("LM1", "no feature named 'LM1'"), ("LM0", "is not tuned"),
                          ("TranslationModel1", "is not 2 booleans")):
        r = subprocess.run([sys.executable, str(PIPE / "mt.py"), "positive", str(ini), name], capture_output=True, text=True)
        assert r.returncode == 1 and r.stdout == "" and message in r.stderr and len(r.stderr.splitlines()) == 1


def test_pro_features_maps_score_names_to_pros_columns(tmp_path):
    """PRO's data name dense scores F<j>, j their place in the extractor's features file: POSITIVE's
    scores become megam.py's -nonneg list through that file's header; a name it lacks, or a file
    that is not a features file, is one line naming the file; no names read no file."""
    feats = tmp_path / "run1.features.dat"
    feats.write_text("FEATURES_TXT_BEGIN_0 0 2 4 LM0_0 LexicalReordering0_0 TranslationModel0_0 Distortion0_0\n"
                     "-12 -1 -2 0\nFEATURES_TXT_END_0\n")

    def pro_features(path, names):
        return subprocess.run([sys.executable, str(PIPE / "mt.py"), "pro-features", str(path), names],
                              capture_output=True, text=True)
    r = pro_features(feats, "TranslationModel0_0,LexicalReordering0_0")
    assert r.returncode == 0 and r.stdout == "F2,F1\n"
    r = pro_features(tmp_path / "absent", "")
    assert r.returncode == 0 and r.stdout == "\n"
    r = pro_features(feats, "LexicalReordering0_0,LexicalReordering0_5")
    assert r.returncode == 1 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert f"{feats}: no score named LexicalReordering0_5" in r.stderr
    bad = tmp_path / "bad.dat"
    bad.write_text("FEATURES_TXT_BEGIN_0 0 2 3 LM0_0\n")  # says 3 scores, names 1
    r = pro_features(bad, "LM0_0")
    assert r.returncode == 1 and f"{bad}: not a Moses features file" in r.stderr and len(r.stderr.splitlines()) == 1


def test_best_iteration_and_table_path(tmp_path):
    log = tmp_path / "mert.log"
    log.write_text("run 5 end\ncopying weights from best iteration (4, bleu=0.1161) to moses.ini\nTraining finished\n")
    r = subprocess.run([sys.executable, str(PIPE / "mt.py"), "best-iteration", str(log)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "4\n"
    log.write_text("run 5 end\nTraining finished\n")  # no --return-best-dev
    r = subprocess.run([sys.executable, str(PIPE / "mt.py"), "best-iteration", str(log)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout == ""
    (tmp_path / "pt.gz").write_bytes(b"")  # Moses adds .gz to a path that does not exist
    ini = tmp_path / "moses.ini"
    ini.write_text(f"[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 path={tmp_path}/pt\n")
    r = subprocess.run([sys.executable, str(PIPE / "mt.py"), "table-path", str(ini)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == f"{tmp_path}/pt.gz\n"


def test_timed_logs_successful_steps_only(tmp_path):
    times = tmp_path / "times.tsv"
    ok = subprocess.run([sys.executable, str(PIPE / "mt.py"), "timed", str(times), "align", "--",
                         sys.executable, "-c", "print('out')"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout == "out\n"
    bad = subprocess.run([sys.executable, str(PIPE / "mt.py"), "timed", str(times), "lm", "--",
                          sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, text=True)
    assert bad.returncode == 3
    step, seconds, start = times.read_text().split("\t")
    assert step == "align" and float(seconds) >= 0 and abs(float(start) - time.time()) < 60
    assert runs.step_time_rows(times)[0].startswith("| align | 1 | 0.0 |")


def test_an_interrupted_step_logs_its_time_as_interrupted(tmp_path):
    times = tmp_path / "times.tsv"
    p = subprocess.Popen([sys.executable, str(PIPE / "mt.py"), "timed", str(times), "tune-rnn", "--",
                          sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout.readline() == "up\n"
        os.killpg(p.pid, signal.SIGTERM)  # the group, as Ctrl-C or a sitting's end reaches it
        assert p.wait(timeout=30) == 128 + 15
    finally:  # nothing left running if the step did not stop
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    step, seconds, start, mark = times.read_text().rstrip("\n").split("\t")
    assert (step, mark) == ("tune-rnn", "interrupted") and float(seconds) < 30
    assert runs.wall_seconds(times)[2:] == (1, 1) and runs.step_minutes(times) == {}


def test_wall_time_counts_overlapping_steps_once_and_gaps_not_at_all(tmp_path):
    times = tmp_path / "times.tsv"
    times.write_text("prepare\t5.0\n"                # an older line: no start, not in the wall time
                     "lm\t100.0\t1000\n"              # 1000-1100
                     "align\t50.0\t1050\n"            # 1050-1100, beside lm: counted once
                     "phrases\t30.0\t1090\n"          # 1090-1120: 20 s past lm
                     "tune-baseline\t60.0\t5000\n")   # after a gap (another sitting): 60 s
    assert runs.wall_seconds(times) == (180.0, 240.0, 4, 0)
    assert runs.step_minutes(times)["prepare"] == [5.0 / 60]
    with times.open("a") as f:
        f.write("tune-rnn\t40.0\t5100\tinterrupted\n")   # a sitting's end: in the wall time, not the medians
    assert runs.wall_seconds(times) == (220.0, 280.0, 5, 1)
    assert "tune-rnn" not in runs.step_minutes(times)
    assert runs.wall_seconds(tmp_path / "none.tsv") is None
    times.write_text("lm\tslow\t1000\n")
    with pytest.raises(ValueError, match="times.tsv: not STEP"):
        runs.step_minutes(times)


def test_report_plots_dev_bleu_per_mert_iteration(tmp_path):
    """The PNG beside the report: one curve per tuning, the BLEU of each iteration's 1-best output."""
    pytest.importorskip("matplotlib")
    ref = ["a b c d e f", "g h i j k l"]
    (tmp_path / "dev.fr").write_text("\n".join(ref) + "\n")
    sig = "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0"
    outputs = [["a b x d e x", "g h x x k l"], ["a b c d e x", "g h i j k x"], ref]
    for system in ("baseline", "rnn"):
        for k in (1, 2):
            d = tmp_path / "systems" / system / f"mert-{k}"
            (d / "mert").mkdir(parents=True)
            for n, out in enumerate(outputs[: 2 + (system == "rnn")], 1):
                (d / "mert" / f"run{n}.out").write_text("\n".join(out) + "\n")
            for part in ("dev", "test"):
                (d / f"{part}.bleu.json").write_text(json.dumps({"name": "BLEU", "score": 20.0, "signature": sig}))
    curves = health.dev_bleu_curves(tmp_path, ["baseline", "rnn"], tmp_path / "dev.fr")
    assert len(curves["baseline"]["mert-1"]) == 2 and len(curves["rnn"]["mert-2"]) == 3
    assert curves["rnn"]["mert-1"][0] < curves["rnn"]["mert-1"][1] < curves["rnn"]["mert-1"][2] == pytest.approx(100.0)
    mt.main(["report", str(tmp_path), str(tmp_path / "report.md"), "--systems", "baseline rnn",
             "--dev-ref", str(tmp_path / "dev.fr"), "--plot", str(tmp_path / "mert.png"), "--label", "BUDGET=1 (a test)"])
    assert (tmp_path / "mert.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("**BUDGET=1 (a test)**") and "`mert.png`" in report
    assert "| RNN mert-1 | 3 | " in report and report.count("| ok |") == 4
    assert "0 of 4 tunings failed or collapsed, 0 dipped" in report
    # mert with 0 random restarts (RESTARTS=0): its own folders, mert-r0-K
    d = tmp_path / "systems" / "baseline" / "mert-r0-1"
    d.mkdir()
    for part, score in (("dev", 11.0), ("test", 17.5)):
        (d / f"{part}.bleu.json").write_text(json.dumps({"name": "BLEU", "score": score, "signature": sig}))
    assert runs.tuning_name("mert", 0) == "mert-r0" and runs.tuning_name("mert") == "mert" == runs.tuning_name("mert", 20)
    assert runs.tuning_name("kbmira", 0) == "kbmira"
    assert runs.tuning_name("pro", 20, "-b") == "pro-bp" and runs.tuning_name("pro", 20, "-bx") == "pro"
    assert runs.tuning_name("kbmira", 20, "-b") == "kbmira"
    mt.main(["report", str(tmp_path), str(tmp_path / "r0.md"), "--systems", "baseline rnn", "--restarts", "0"])
    report = (tmp_path / "r0.md").read_text()
    assert report.startswith("Tuner: mert (mert-moses.pl, --random-restarts 0); tunings systems/SYSTEM/mert-r0-K.")
    assert "| Baseline | 1 | 11.00 | 17.50 |" in report and "| RNN |" not in report
    mt.main(["report", str(tmp_path), str(tmp_path / "named.md"), "--systems", "baseline rnn", "--tuning", "mert-r0"])
    assert "| Baseline | 1 | 11.00 | 17.50 |" in (tmp_path / "named.md").read_text()  # TUNING: the folders by name
    # pro with -b: its own folders (pro-bp-K), the option named on the report's first line
    d.rename(d.with_name("pro-bp-1"))
    mt.main(["report", str(tmp_path), str(tmp_path / "bp.md"), "--systems", "baseline rnn", "--tuner", "pro",
             "--tuner-args=-b"])  # as the Makefile passes it (argparse would read a separate "-b" as an option)
    report = (tmp_path / "bp.md").read_text()
    assert report.startswith("Tuner: pro (mert-moses.pl --pairwise-ranked, megam by pipelines/megam.py; pro -b); "
                             "tunings systems/SYSTEM/pro-bp-K.") and "| Baseline | 1 | 11.00 | 17.50 |" in report
    mt.main(["report", str(tmp_path), str(tmp_path / "r20.md"), "--systems", "baseline rnn"])  # mert-K alone
    assert "| Baseline | 2 | 20.00 ± 0.00 | 20.00 ± 0.00 |" in (tmp_path / "r20.md").read_text()


@pytest.mark.parametrize("scores,verdict", [
    ([10.8, 0.9, 10.5, 10.7], "failed"),       # the best is the first: it kept its starting weights
    ([10.8, 0.9, 10.5, 12.4], "collapsed"),    # fell 9.9 below the first, then climbed
    ([10.8, 9.4, 11.0, 12.4], "dipped"),       # fell 1.4 below the first
    ([10.8, 10.5, 11.2, 11.3], "weak"),        # never 1.0 above the first
    ([10.8, 10.2, 11.9, 12.1], "ok"),
    ([10.8], "failed"),
])
def test_tuning_health(scores, verdict):
    h = health.tuning_health(scores)
    assert h["verdict"] == verdict and h["first"] == 10.8 and h["best"] == max(scores)
    assert h["best_at"] == scores.index(max(scores)) + 1 and h["iterations"] == len(scores)


def test_report_says_which_tunings_failed(tmp_path):
    """A collapsed tuning and one whose best iteration is its first are named as such."""
    ref = [f"w{i} w{i + 1} w{i + 2} w{i + 3}" for i in range(40)]
    (tmp_path / "dev.fr").write_text("\n".join(ref) + "\n")
    bad = [" ".join(["x"] * 4)] * 40
    half = [r if i % 2 else "x x x x" for i, r in enumerate(ref)]
    sig = "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0"
    for k, its in ((1, [half, bad, ref]), (2, [ref, half, half]), (3, [half, ref])):
        d = tmp_path / "systems" / "baseline" / f"pro-{k}"
        (d / "mert").mkdir(parents=True)
        for n, out in enumerate(its, 1):
            (d / "mert" / f"run{n}.out").write_text("\n".join(out) + "\n")
        (d / "test.bleu.json").write_text(json.dumps({"name": "BLEU", "score": 20.0, "signature": sig}))
    mt.main(["report", str(tmp_path), str(tmp_path / "report.md"), "--systems", "baseline", "--tuner", "pro",
             "--dev-ref", str(tmp_path / "dev.fr")])
    report = (tmp_path / "report.md").read_text()
    verdicts = {line.split(" | ")[0][2:]: line.rstrip(" |").split(" | ")[-1] for line in report.splitlines()
                if line.startswith("| Baseline pro-")}
    assert verdicts == {"Baseline pro-1": "collapsed", "Baseline pro-2": "failed", "Baseline pro-3": "ok"}
    assert "2 of 3 tunings failed or collapsed, 0 dipped" in report


def test_tuners_side_by_side(tmp_path):
    """mt.py tuners: per system and tuner, BLEU over the tunings, AR against the first tuner's, each
    tuning's iterations and verdict, minutes per tuning from times.tsv (mert's step bare, another
    tuner's with its name), and a picture; a tuner without tunings is left out, none at all refused."""
    ref = [f"w{i} w{i + 1} w{i + 2} w{i + 3}" for i in range(40)]
    (tmp_path / "dev.fr").write_text("\n".join(ref) + "\n")
    (tmp_path / "test.ref").write_text("\n".join(ref) + "\n")
    half = [r if i % 2 else "x x x x" for i, r in enumerate(ref)]
    bad = ["x x x x"] * 40
    for tuner, its, test in (("mert", [half, ref], ref), ("pro", [half, ref], ref), ("kbmira", [half, bad], bad)):
        for k in (1, 2):
            d = tmp_path / "systems" / "baseline" / f"{tuner}-{k}"
            (d / "mert").mkdir(parents=True)
            for n, out in enumerate(its, 1):
                (d / "mert" / f"run{n}.out").write_text("\n".join(out) + "\n")
            (d / "test.detok").write_text("\n".join(test) + "\n")
            (d / "tuned.ini").write_text("[weight]\n")
            for part, score in (("dev", 10.0 + k), ("test", 17.0 + k)):
                (d / f"{part}.bleu.json").write_text(json.dumps({"name": "BLEU", "score": score}))
    (tmp_path / "systems" / "baseline" / "mert-3" / "mert").mkdir(parents=True)  # still tuning: left out
    (tmp_path / "times.tsv").write_text("tune-baseline\t600\ntune-baseline\t1200\ntune-baseline.pro\t300\n"
                                        "tune-baseline.pro\t420\ntune-baseline.mert-r0\t60\n")
    mt.main(["tuners", str(tmp_path), str(tmp_path / "tuners.md"), "--systems", "baseline,rnn", "--tuners", "mert,pro,kbmira",
             "--test-ref", str(tmp_path / "test.ref"), "--dev-ref", str(tmp_path / "dev.fr"), "--ar-samples", "200",
             "--plot", str(tmp_path / "tuners.png")])
    rows = {cells[1]: cells for cells in (line.strip("| ").split(" | ") for line in
                                          (tmp_path / "tuners.md").read_text().splitlines() if line.startswith("| Baseline |"))}
    assert set(rows) == {"mert", "pro", "kbmira"}
    assert rows["mert"][2:6] == ["2", "11.50 ± 0.71", "18.50 ± 0.71", "18.00 / 19.00"] and rows["mert"][6] == "–"
    assert rows["pro"][6] == "1.0000" and float(rows["kbmira"][6]) < 0.05  # the same outputs; all wrong
    assert rows["pro"][9:11] == ["ok ×2", "6.0 (2)"] and rows["mert"][10] == "15.0 (2)"  # medians of 5, 7 / 10, 20 min
    assert rows["kbmira"][9] == "failed ×2" and rows["kbmira"][10] == "–"
    assert (tmp_path / "tuners.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = subprocess.run([sys.executable, str(PIPE / "mt.py"), "tuners", str(tmp_path), str(tmp_path / "x.md"),
                        "--systems", "rnn"], capture_output=True, text=True)
    assert r.returncode == 1 and "no tunings of rnn" in r.stderr and not (tmp_path / "x.md").exists()
    # `make tuners`: the same over the work folder's data, without Moses
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dev.fr").write_text("\n".join(ref) + "\n")
    (tmp_path / "data" / "test.ref.fr").write_text("\n".join(ref) + "\n")
    r = _make("tuners", WORK=str(tmp_path), SYSTEMS="baseline", TUNERS="pro kbmira")
    assert r.returncode == 0, r.stderr
    assert "| Baseline | kbmira | 2 |" in (tmp_path / "report.tuners.md").read_text() and (tmp_path / "report.tuners.png").exists()


# what a fake bin/moses holds to pass for one built with the CSLM feature (preflight looks for it)
WITH_CSLM = f"# {preflight.CSLM_FEATURE_MARK.decode()}\n"


def _fake_moses(root: Path, tuner: str = "pro") -> Path:
    """A Moses folder with (empty) every program and script a run calls, as preflight checks them,
    and a bin/moses built with the CSLM feature."""
    for rel in ["bin/moses"] + preflight.MOSES_NEEDS + preflight.TUNER_NEEDS[tuner]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).touch()
    (root / "bin" / "moses").write_text(WITH_CSLM)
    return root


def test_a_run_checks_every_tool_before_its_first_step(tmp_path):
    moses = tmp_path / "moses"
    (moses / "bin").mkdir(parents=True)
    (moses / "bin" / "moses").touch()
    r = _make("report", WORK=str(tmp_path / "w"), MOSES=str(moses), TUNER="pro", EFLOMAL="no-such-aligner")
    assert r.returncode != 0
    msg = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(msg) == 1 and "missing before the run starts" in msg[0], r.stderr
    for name in ["bin/lmplz", "bin/mert", "bin/pro", "mert-moses.pl", "no-such-aligner (not on PATH)"]:
        assert name in msg[0]
    assert "bin/kbmira" not in msg[0]
    assert not (tmp_path / "w").exists()
    # with everything there, the same goal plans its steps
    _fake_moses(moses, "pro")
    r = _make("-q", "report", WORK=str(tmp_path / "w"), MOSES=str(moses), TUNER="pro")
    assert "missing" not in r.stderr and r.returncode == 1, r.stderr  # -q: out of date, nothing run
    # prepare and align need no Moses
    r = _make("-q", "align", WORK=str(tmp_path / "w"))
    assert "MOSES" not in r.stderr


def test_a_new_tuning_redoes_nothing_finished(tmp_path):
    """eval-SYSTEM with one more tuning (RUNS=2 after RUNS=1) tunes and decodes only the new one:
    the filtered models stay (make must not delete them as intermediates and filter again, which
    would put the finished tuning out of date), and no temporary ini is left behind."""
    moses = _fake_moses(tmp_path / "moses")
    scripts = moses / "scripts" / "training"
    fakes = {  # each records its call in calls.log beside the work folder
        scripts / "filter-model-given-input.pl": 'mkdir -p "$1" && cp "$2" "$1/moses.ini"',
        scripts / "mert-moses.pl": 'wd=""; prev=""; for a in "$@"; do [ "$prev" = --working-dir ] && wd=$a; prev=$a; done\n'
                                   'mkdir -p "$wd" && printf "[weight]\\nLM0= 0.5\\n" > "$wd/moses.ini"',
        moses / "bin" / "moses": f"{WITH_CSLM}cat",
        tmp_path / "sacrebleu": 'echo \'{"score": 1.0}\'',
    }
    for path, body in fakes.items():
        path.write_text(f'#!/bin/sh\necho "$(basename $0) $*" >> {tmp_path}/calls.log\n{body}\n')
        path.chmod(0o755)
    work = tmp_path / "w"
    (work / "data").mkdir(parents=True)
    for name in ("dev.en", "dev.fr", "test.en", "test.ref.fr"):
        (work / "data" / name).write_text("a house\n")
    (work / "systems" / "baseline").mkdir(parents=True)
    (work / "systems" / "baseline" / "moses.ini").write_text("[feature]\nKENLM name=LM0\n[weight]\nLM0= 0.5\n")
    old = ["-o", str(work / "data" / "dev.en"), "-o", str(work / "data" / "test.en"),
           "-o", str(work / "systems" / "baseline" / "moses.ini")]  # the model: built, not remade here
    args = dict(MOSES=str(moses), WORK=str(work), SACREBLEU=str(tmp_path / "sacrebleu"), POSITIVE="")
    r = _make(*old, "eval-baseline", RUNS=1, **args)
    assert r.returncode == 0, r.stdout + r.stderr
    system = work / "systems" / "baseline"
    assert (system / "moses.ini.filtered-dev").exists() and (system / "moses.ini.filtered-test").exists()
    assert (system / "pro-bp-1" / "test.bleu.json").exists()  # the default tuner's
    first = (tmp_path / "calls.log").read_text().splitlines()
    assert sum(c.startswith("filter-model-given-input.pl") for c in first) == 2  # dev and test, once
    (tmp_path / "calls.log").unlink()
    r = _make(*old, "eval-baseline", RUNS=2, **args)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert not any(c.startswith("filter-model-given-input.pl") for c in calls), calls
    tunings = [c for c in calls if c.startswith("mert-moses.pl")]
    assert len(tunings) == 1 and "/pro-bp-2/mert" in tunings[0] and "/pro-bp-1/" not in tunings[0]
    assert not list(work.rglob("*.tmp"))


@pytest.mark.parametrize("tuner", ["mert", "kbmira", "pro"])
def test_interrupted_tuning_resumes_from_its_last_finished_iteration(tmp_path, tuner):
    """tune-SYSTEM runs mert-moses.pl with --continue when the working folder holds a finished
    iteration (finished_step.txt), keeping that work; otherwise it starts in an empty folder.
    Each tuner gets its own options and the run's seed; PRO gets a mertdir with megam in it."""
    moses = _fake_moses(tmp_path / "moses", tuner)
    fake = moses / "scripts" / "training" / "mert-moses.pl"  # records its arguments, writes moses.ini
    header = "FEATURES_TXT_BEGIN_0 0 300 11 LM0_0 " + " ".join(
        [f"LexicalReordering0_{i}" for i in range(6)] + [f"TranslationModel0_{i}" for i in range(4)])
    fake.write_text(f'#!/bin/sh\nheader="{header}"\n'
                    'wd=""; md=""; prev=""\n'
                    'for a in "$@"; do [ "$prev" = --working-dir ] && wd=$a; [ "$prev" = --mertdir ] && md=$a; prev=$a; done\n'
                    'mkdir -p "$wd"; ls "$wd" > "$wd/../found"; echo "$@" > "$wd/args"; ls "$md" > "$wd/../mertdir"\n'
                    # PRO: megam run as mert-moses.pl runs it, in the tuning's mert/ folder beside the
                    # extractor's features file; the data want F1 (LexicalReordering0_0) below 0
                    '[ -x "$md/megam_i686.opt" ] && cd "$wd" && printf "%s\\n" "$header" > run1.features.dat\n'
                    '[ -x "$md/megam_i686.opt" ] && printf "1 F0 1 F1 -2\\n0 F0 -1 F1 2\\n1 F0 1 F1 -1\\n0 F0 -1 F1 1\\n" > p.data'
                    ' && "$md/megam_i686.opt" -fvals -nobias -quiet binary p.data > ../megam 2>&1\n'
                    'printf "[weight]\\nLM0= 0.5\\n" > "$wd/moses.ini"\n')
    fake.chmod(0o755)
    work = tmp_path / "w"
    (work / "data").mkdir(parents=True)
    (work / "data" / "dev.en").write_text("a\n")
    system = work / "systems" / "baseline"
    system.mkdir(parents=True)
    (system / "moses.ini.filtered-dev").write_text(
        "[feature]\nLexicalReordering name=LexicalReordering0 num-features=6 path=r\n"
        "PhraseDictionaryMemory name=TranslationModel0 num-features=5 tuneable-components=true,true,true,true,false path=p\n"
        "[weight]\nLM0= 1\n")
    corpus = tmp_path / "dev"  # the raw dev set, older than the prepared one
    for lang in ("en", "fr"):
        Path(f"{corpus}.{lang}").write_text("a\n")
        os.utime(f"{corpus}.{lang}", (1, 1))
    old = ["-o", str(system / "moses.ini.filtered-dev"), f"DEV={corpus}"]
    run3 = system / f"{tuner}-3"
    run3.mkdir()
    (run3 / "tuned.ini").write_text("[weight]\nLM0= 0.1\n")  # tuned before the dev set changed
    os.utime(run3 / "tuned.ini", (2, 2))
    for k, finished in ((1, "4\n"), (2, None), (3, "10\n")):
        run = system / f"{tuner}-{k}"
        mert = run / "mert"
        mert.mkdir(parents=True)
        (mert / "run1.features.dat").write_text("x\n")
        (run / "mert.log").write_text("the first 4 iterations\n")
        if finished:
            (mert / "finished_step.txt").write_text(finished)
        r = _make(*old, str(run / "tuned.ini"), MOSES=str(moses), WORK=str(work), TUNER=tuner)
        assert r.returncode == 0, r.stdout + r.stderr
        args, found = (mert / "args").read_text(), (run / "found").read_text().split()
        assert (run / "tuned.ini").read_text() == "[weight]\nLM0= 0.5\n"
        if k == 1:
            assert "--continue" in args and "run1.features.dat" in found
            assert (run / "mert.log.4").read_text() == "the first 4 iterations\n"  # the log kept
        else:
            assert "--continue" not in args and found == []
        assert "--no-filter-phrase-table" in args and "moses.ini.filtered-dev" in args
        flags = {"mert": f"--mertmertargs -r {k} -P " + ",".join([f"LexicalReordering0_{i}" for i in range(6)]
                                                                  + [f"TranslationModel0_{i}" for i in range(4)]) + " ",
                 "kbmira": f"--batch-mira --batch-mira-args -r {k} ",
                 "pro": f"--pairwise-ranked --proargs -r {k} "}[tuner]
        assert flags in args
        for other in {"mert": "--mertmertargs", "kbmira": "--batch-mira", "pro": "--pairwise-ranked"}.values():
            assert (other in args) == (other in flags)
        if tuner == "pro":  # Moses's optimiser binaries beside a megam that runs pipelines/megam.py
            assert set((run / "mertdir").read_text().split()) == {"extractor", "mert", "pro", "kbmira", "evaluator",
                                                                  "megam_i686.opt"}
            weights = (run / "megam").read_text()  # POSITIVE's scores are F1-F10 there: F1 held at 0
            assert weights.startswith("F0 ") and "F1 " not in weights, weights
        else:
            assert f"--mertdir {moses}/bin " in args


@pytest.mark.parametrize("tuner,flag", [("mert", '--mertmertargs "-r 2 -m 5 -P $positive "'),
                                        ("kbmira", '--batch-mira --batch-mira-args "-r 2 -m 5 "'),
                                        ("pro", '--pairwise-ranked --proargs "-r 2 -m 5 "')])
def test_dry_run_per_tuner(tmp_path, tuner, flag):
    """TUNER picks mert-moses.pl's optimiser: its options, the seed, TUNER_ARGS, the runs' folders,
    the report's tuner; anything else is refused in one line."""
    w = tmp_path / "w"
    r = _make("-n", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(w), TUNER=tuner, TUNER_ARGS="-m 5")
    assert r.returncode == 0, r.stderr
    plan = r.stdout
    assert plan.count("mert-moses.pl") == 24 and plan.count(flag) == 8
    for system in ALL_SYSTEMS:
        assert f"{w}/systems/{system}/{tuner}-3/tuned.ini" in plan
    assert f"--tuner {tuner} " in plan and f"{w}/report.{tuner}.png" in plan
    assert (plan.count("megam_i686.opt") > 0) == (tuner == "pro")
    assert plan.count("mt.py positive ") == (0 if tuner == "kbmira" else 24)
    assert plan.count("pro-features run1.features.dat") == (24 if tuner == "pro" else 0)
    # times.tsv: the papers' tuner (mert, 20 restarts) as tune-SYSTEM, any other as tune-SYSTEM.TUNING
    assert ("tune-baseline -- " in plan) == (tuner == "mert") and (f"tune-baseline.{tuner} " in plan) == (tuner != "mert")
    if tuner == "mert":  # POSITIVE empty: no constraint
        r = _make("-n", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(w), TUNER="mert", POSITIVE="")
        assert r.returncode == 0 and "mt.py positive" not in r.stdout and '--mertmertargs "-r 1 "' in r.stdout
    r = _make("-n", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(w), TUNER=tuner, NBEST="100")
    assert r.returncode == 0 and r.stdout.count("--nbest 100 ") == 24 and "--nbest 300" not in r.stdout
    # RESTARTS: mert's random restarts; other than 20 its tunings get their own folders and report
    r = _make("-n", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(w), TUNER=tuner, RESTARTS="0")
    assert (r.returncode == 0) == (tuner != "mert")  # mert: three tunings from one seedless optimiser
    if tuner == "mert":
        assert "RESTARTS=0 leaves mert's seed nothing to draw, so the RUNS=3 tunings would be identical" in r.stderr
        r = _make("-n", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(w), TUNER=tuner, RESTARTS="0", RUNS="1")
        assert r.returncode == 0, r.stderr
        assert f"{w}/systems/baseline/mert-r0-2/" not in r.stdout
    # pro's default TUNER_ARGS is -b (the pipeline's default tuner): its tunings are pro-bp-K
    tuning = {"mert": "mert-r0", "pro": "pro-bp"}.get(tuner, tuner)
    assert r.stdout.count("--random-restarts 0 ") == (8 if tuner == "mert" else 0)
    assert f"{w}/systems/baseline/{tuning}-{1 if tuner == 'mert' else 3}/tuned.ini" in r.stdout and f"{w}/report.{tuning}.png" in r.stdout
    assert (f"{w}/systems/baseline/{'pro-bp' if tuner == 'pro' else tuner}-1/" in r.stdout) == (tuner != "mert")
    assert "--restarts 0 " in r.stdout and f"tune-baseline.{tuning} " in r.stdout  # times.tsv tells tunings apart
    # TUNING names the tunings: those made with other TUNER_ARGS sit beside the tuner's own
    r = _make("-n", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(w), TUNER=tuner, TUNER_ARGS="-x", TUNING=f"{tuner}-x")
    assert r.returncode == 0, r.stderr
    assert f"{w}/systems/rnn/{tuner}-x-3/tuned.ini" in r.stdout and f"{w}/systems/rnn/{tuner}-3/" not in r.stdout
    assert f"tune-baseline.{tuner}-x " in r.stdout and f"--tuning {tuner}-x " in r.stdout and "-r 3 -x " in r.stdout
    # pro's -b (the smoothed brevity penalty) names its tunings pro-bp without TUNING; the report says -b
    r = _make("-n", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(w), TUNER=tuner, TUNER_ARGS="-b")
    assert r.returncode == 0, r.stderr
    bp = f"{tuner}-bp" if tuner == "pro" else tuner
    assert f"{w}/systems/rnn/{bp}-3/tuned.ini" in r.stdout and f"{w}/report.{bp}.png" in r.stdout
    assert '--tuner-args="-b" ' in r.stdout and f"--tuning {bp} " in r.stdout
    r = _make("-n", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(w), TUNING="pro_b")
    assert r.returncode != 0 and "TUNING must be a name of letters, digits, dots and single hyphens, not 'pro_b'" in r.stderr
    r = _make("-n", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(w), TUNER="adam")
    assert r.returncode != 0 and "TUNER must be mert, kbmira or pro, not adam" in r.stderr
    r = _make("-n", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(w), SCORE_SCOPE="some")
    assert r.returncode != 0 and "SCORE_SCOPE must be all or devtest, not some" in r.stderr


def test_interrupted_training_resumes_from_its_checkpoint(tmp_path):
    fake = tmp_path / "fake-train"  # records its arguments
    fake.write_text('#!/bin/sh\necho "$@" >> "$0.args"\n')
    fake.chmod(0o755)
    work = tmp_path / "w"
    (work / "model").mkdir(parents=True)
    (work / "model" / "moses.ini").write_text("[weight]\n")
    (work / "data").mkdir()
    (work / "data" / "train.en").write_text("a\n")
    old = ["-o", str(work / "model" / "moses.ini"), "-o", str(work / "data" / "train.en")]
    targets = [str(work / "rnn" / "model" / ".done"), str(work / "cslm" / "model" / ".done")]
    for d in ("rnn", "cslm"):
        (work / d / "model").mkdir(parents=True)
    (work / "rnn" / "model" / "checkpoint.pt").write_bytes(b"state")  # the RNN was interrupted
    moses = _fake_moses(tmp_path / "moses")
    r = _make(*old, *targets, MOSES_RNN=str(fake), CSLM=str(fake), WORK=str(work), MOSES=str(moses))
    assert r.returncode == 0, r.stdout + r.stderr
    rnn, cslm = (tmp_path / "fake-train.args").read_text().splitlines()
    assert rnn.startswith("train ") and "phrase-table.gz" in rnn and rnn.endswith("--resume --quiet")
    assert "train.fr" in cslm and "--resume" not in cslm and "--overwrite" in cslm
    # a finished model whose phrase table changed is trained afresh, not continued
    os.utime(work / "rnn" / "model" / ".done", (1, 1))
    made = [str(work / "align" / "aligned.grow-diag-final-and"), str(work / "lm" / "lm.fr.blm")]
    r = _make("-o", made[0], "-o", made[1], targets[0], MOSES_RNN=str(fake), WORK=str(work), MOSES=str(moses))
    assert r.returncode == 0, r.stdout + r.stderr
    again = (tmp_path / "fake-train.args").read_text().splitlines()[-1]
    assert again.startswith("train ") and "--resume" not in again and "--overwrite" in again


def test_systems_start_from_the_documented_weights(tmp_path):
    """The four systems' moses.ini files, built by make from a base model: the RNN column starts at
    RNN_WEIGHT (its unknown-word column fixed at 0 in rnn), the CSLM at CSLM_WEIGHT, and beside the
    CSLM the n-gram LM at LM_WEIGHT_BESIDE_CSLM; every other weight is the base model's."""
    moses = _fake_moses(tmp_path / "moses")
    w = tmp_path / "w"
    (w / "model").mkdir(parents=True)
    base = ("[feature]\nUnknownWordPenalty\nWordPenalty\nKENLM name=LM0 factor=0 path=lm.blm order=5\n"
            "PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=pt.gz input-factor=0 output-factor=0\n"
            "\n[weight]\nUnknownWordPenalty0= 1\nWordPenalty0= -1\nLM0= 0.5\nTranslationModel0= 0.2 0.2 0.2 0.2\n")
    (w / "model" / "moses.ini").write_text(base)
    (w / "rnn").mkdir()
    with gzip.open(w / "rnn" / "phrase-table.rnn.gz", "wt") as f:
        f.write("a ||| b ||| 0.5 0.5 0.5 0.5 0.1 1 ||| 0-0 ||| 1 1 1 ||| |||\n")
    (w / "cslm" / "model").mkdir(parents=True)
    (w / "cslm" / "model" / ".done").touch()
    old = [f"-o{w}/model/moses.ini", f"-o{w}/rnn/phrase-table.rnn.gz", f"-o{w}/cslm/model/.done"]
    targets = [str(w / "systems" / s / "moses.ini") for s in PAPER_SYSTEMS]
    r = _make(*old, *targets, MOSES=str(moses), WORK=str(w))
    assert r.returncode == 0, r.stdout + r.stderr
    ini = {s: MosesIni.read(str(w / "systems" / s / "moses.ini")) for s in PAPER_SYSTEMS}
    assert ini["baseline"].weights("TranslationModel0") == [0.2] * 4 and ini["baseline"].weights("LM0") == [0.5]
    assert ini["rnn"].weights("TranslationModel0") == [0.2] * 4 + [0.05, 0.0] and ini["rnn"].weights("LM0") == [0.5]
    assert ini["cslm-rnn"].weights("TranslationModel0") == [0.2] * 4 + [0.05, 0.0]
    assert ini["cslm-rnn"].weights("CSLM0") == [0.1] and ini["cslm-rnn"].weights("LM0") == [0.4]
    assert ini["cslm-rnn-wp"].weights("TranslationModel0") == [0.2] * 4 + [0.05, -0.1]
    assert ini["cslm-rnn-wp"].weights("CSLM0") == [0.1, -0.1] and ini["cslm-rnn-wp"].weights("LM0") == [0.4]
    for s in PAPER_SYSTEMS:
        assert ini[s].weights("WordPenalty0") == [-1.0] and not list((w / "systems" / s).glob("*.tmp"))
    # cslm-rnn-nofc: cslm-rnn, its CSLM line saying future-cost=false; nothing else changed
    nofc = w / "systems" / "cslm-rnn-nofc" / "moses.ini"
    r = _make(*old, str(nofc), MOSES=str(moses), WORK=str(w))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = nofc.read_text().splitlines()
    cslm_line = [line for line in lines if line.startswith("CSLM ")]
    assert len(cslm_line) == 1 and cslm_line[0].endswith(" future-cost=false") and "name=CSLM0" in cslm_line[0]
    assert [line for line in lines if not line.startswith("CSLM ")] == \
        [line for line in (w / "systems" / "cslm-rnn" / "moses.ini").read_text().splitlines() if not line.startswith("CSLM ")]
    r = _make("-n", str(nofc), MOSES=str(moses), WORK=str(w), SYSTEMS="cslm-rnn-nofc", CSLM_MODE="server")
    assert r.returncode != 0 and "cslm-rnn-nofc needs CSLM_MODE=local" in r.stderr
    # the variables move them
    for s in PAPER_SYSTEMS:
        (w / "systems" / s / "moses.ini").unlink()
    r = _make(*old, *targets, MOSES=str(moses), WORK=str(w), RNN_WEIGHT="0.2", CSLM_WEIGHT="0.05",
              LM_WEIGHT_BESIDE_CSLM="0.45")
    assert r.returncode == 0, r.stdout + r.stderr
    wp = MosesIni.read(str(w / "systems" / "cslm-rnn-wp" / "moses.ini"))
    assert wp.weights("TranslationModel0")[4] == 0.2 and wp.weights("CSLM0") == [0.05, -0.1]
    assert wp.weights("LM0") == [0.45]


def test_report_rows_of_an_augmented_system(tmp_path):
    """Per tuning, the generated pairs its 1-best used and the BLEU of the sentences that used one against
    the extended system's tuning of the same seed; the most used pairs with their sentences' BLEU."""
    pytest.importorskip("sacrebleu")
    w = tmp_path / "w"
    ref = ["la maison rouge .", "une voiture rouge .", "il pleut ."]
    (tmp_path / "ref").write_text("\n".join(ref) + "\n")
    outputs = {"cslm-rnn-aug": ["la maison rouge .", "une voiture rouge .", "il pleut ."],
               "cslm-rnn": ["la maison .", "une auto .", "il pleut ."]}
    for system, out in outputs.items():
        run = w / "systems" / system / "mert-1"
        run.mkdir(parents=True)
        (run / "test.detok").write_text("\n".join(out) + "\n")
    usage = {"table_lines": 12, "generated_lines": 2, "growth": 0.2, "sentences": 3, "phrases": 7,
             "generated_phrases_used": 2, "distinct_generated_pairs_used": 2, "sentences_using_generated": 2,
             "sentence_ids": [0, 1], "examples": [{"source": "red", "target": "rouge", "uses": 1, "sentence": 1},
                                                  {"source": "car", "target": "voiture", "uses": 1, "sentence": 2}]}
    (w / "systems" / "cslm-rnn-aug" / "mert-1" / "usage.json").write_text(json.dumps(usage))
    text = "\n".join(sections.augmentation_rows(w, ["cslm-rnn", "cslm-rnn-aug"], "mert", tmp_path / "ref"))
    assert "2 generated lines added to the table's 10 (+20.0%)" in text
    assert "| mert-1 | 7 | 2 (2) | 2 | 100.00 |" in text  # the augmented outputs match the references there
    assert "| red | rouge | 1 | 1 | 100.0 |" in text and text.count("| yes |") == 2
    assert sections.augmentation_rows(w, ["cslm-rnn"], "mert", tmp_path / "ref") == []


def test_the_joint_model_systems_plan(tmp_path, shared_data):
    """nnjm and cslm-rnn-wp-nnjm: the joint model trained on the corpus and the align step's alignment with
    the sizes the NNJM line then names, in process, each system tested against the one it extends."""
    w = tmp_path / "w"
    r = _make("-n", "SYSTEMS=baseline cslm-rnn-wp nnjm cslm-rnn-wp-nnjm", "BUDGET=1", MOSES="/opt/mosesdecoder",
              WORK=str(w), DATA=str(shared_data / "en-fr"))
    assert r.returncode == 0, r.stderr
    plan = r.stdout
    assert (f"cslm train {w}/data/train.fr --source {w}/data/train.en --alignment {w}/align/aligned.grow-diag-final-and"
            f" -o {w}/nnjm/model") in plan
    assert "--order 7 --source-window 11 --self-norm 0.1 --lr 3e-3" in plan and plan.count("times.tsv nnjm-train") == 1
    line = f"NNJM name=NNJM0 order=7 source_window=11 path={w}/nnjm/model"
    assert f"ini add-feature {w}/model-devtest/moses.ini {line} num-features=1 --weight 0.1" in plan
    assert f"ini add-feature {w}/systems/cslm-rnn-wp/moses.ini {line} num-features=2 --weight 0.1 --weight -0.1" in plan
    assert plan.count("tune-nnjm.pro-bp --") == 3 and plan.count("tune-cslm-rnn-wp-nnjm.pro-bp --") == 3
    assert plan.index("aligned.grow-diag-final-and") < plan.index("nnjm-train")
    assert '--systems "baseline cslm-rnn-wp nnjm cslm-rnn-wp-nnjm"' in plan
