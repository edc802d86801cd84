"""Self-normalised CSLM scoring (premultiplied first layer, one output row) against the exact softmax.

    python benchmarks/bench_cslm_selfnorm.py [--quick] [--model MODEL_DIR ...] [--text TEXT] [--json OUT]
    python benchmarks/bench_cslm_selfnorm.py --model SN_DIR --model CONTROL_DIR --plot docs/cslm-logz.png
    python benchmarks/bench_cslm_selfnorm.py --preset paper --history-cache 16384 --batches 2000

Same model, same n-grams, both sides back to back in one process: n-grams per
second of `Engine(normalized=False)` (h1 = relu(b1 + sum_p T_p[w_p]) from the
premultiplied tables, then the other rectified layers, then
o_w = out.weight[w] . h + out.bias[w]) against `Engine(normalized=True)` (the
full 10,000-word softmax), at decoder-like batch sizes (n-grams per call) and
with 1 thread and the default number of threads. The two sides take turns of
8,192 n-grams, so that both see the same load on a shared machine; medians
of --repeats passes. Target: >= 10x for the `small` preset on the CPU.

The n-grams are those of the sentences of test.tok.fr (every word and </s>,
in text order) when ../shared/data is beside the project, else synthetic
Zipf-distributed n-grams. Without --model the model is a randomly initialised
`small` preset (speed does not depend on training) whose shortlist is the
10,000 most frequent words of train.tok.fr (or synthetic words). With
--model, also the distribution of ln Z(h) over the text's n-grams and the
perplexity of the exact and of the unnormalised scores (`cslm eval --log-z`),
for each --model given (speed is timed on the first); --plot draws their ln Z
histograms into a PNG. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from common import SHARED, emit
from cslm.data import build_vocab, sentence_ngrams
from cslm.engine import Engine
from cslm.model import CSLM, preset_config
from mtcommon.modeldir import parameter_count
from mtcommon.textio import iter_lines
from mtcommon.vocab import BOS, EOS
from mtcommon.cliutil import run_script

TEST_TEXT = SHARED / "en-fr-moses" / "test.tok.fr"  # optional here: synthetic n-grams without it
TRAIN_TEXT = SHARED / "en-fr-moses" / "train.tok.fr"


def random_model(preset: str, counts: Counter | None, seed: int = 0):
    """A `preset` model with random weights; the shortlist from `counts`, or synthetic words."""
    cfg = preset_config(preset)
    if counts is None:
        counts = Counter({f"w{i}": cfg.vocab_size * 10 - i for i in range(cfg.vocab_size)})
    vocab = build_vocab(counts, cfg.vocab_size)
    cfg.vocab_size = len(vocab)
    torch.manual_seed(seed)
    model = CSLM(cfg)
    model.init_weights()
    return model, vocab


def text_ngrams(vocab, order: int, path: Path, limit: int) -> np.ndarray:
    bos, eos = vocab.index[BOS], vocab.index[EOS]
    rows, n = [], 0
    for _, line in iter_lines(str(path)):
        if line.strip():
            g = sentence_ngrams(vocab.encode(line.split()), order, bos, eos)
            rows.append(g)
            n += len(g)
            if n >= limit:
                break
    return np.concatenate(rows)[:limit]


def synthetic_ngrams(vocab_size: int, order: int, count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab_size + 1)
    return rng.choice(vocab_size, size=(count, order), p=p / p.sum()).astype(np.int32)


def interleaved_rates(a: Engine, b: Engine, grams: np.ndarray, batch: int, turn: int = 8192) -> tuple[float, float]:
    """N-grams per second of `a` and of `b` over `grams` in calls of `batch` n-grams. The two engines take
    turns of `turn` n-grams (which goes first alternates), so that both see the same load on a shared
    machine while each still runs many calls in a row, as a decoder would (its weights stay in cache)."""
    spent = {id(a): 0.0, id(b): 0.0}
    step = max(batch, turn // batch * batch)
    for k, start in enumerate(range(0, len(grams), step)):
        block = grams[start : start + step]
        for eng in ((a, b) if k % 2 == 0 else (b, a)):
            t0 = time.perf_counter()
            for i in range(0, len(block), batch):
                eng.score_ids(block[i : i + batch])
            spent[id(eng)] += time.perf_counter() - t0
    return len(grams) / spent[id(a)], len(grams) / spent[id(b)]


def compare(model, vocab, grams: np.ndarray, batches: list[int], threads: int, repeats: int) -> dict:
    torch.set_num_threads(threads)
    exact = Engine(model, vocab, "cpu")
    fast = Engine(model, vocab, "cpu", normalized=False)
    out = {}
    for b in batches:
        g = grams[: max(b, min(len(grams), 64 * b))]  # the small batches need fewer n-grams for a stable time
        exact.score_ids(g[:b]), fast.score_ids(g[:b])  # warm-up
        rates = [interleaved_rates(exact, fast, g, b) for _ in range(repeats)]
        e, f = statistics.median(r[0] for r in rates), statistics.median(r[1] for r in rates)
        ratios = [r[1] / r[0] for r in rates]
        out[str(b)] = {"ngrams": len(g), "exact_ngrams_per_s": round(e), "selfnorm_ngrams_per_s": round(f),
                       "speedup": round(statistics.median(ratios), 2),
                       "speedup_range": [round(min(ratios), 2), round(max(ratios), 2)]}
    return out


def history_cache_rates(model, vocab, rows: int, repeats: int, requests: int = 100, seed: int = 0) -> dict:
    """The self-normalised engine with and without a history cache of `rows` rows (`Engine.cache_histories`)
    on a decoder-like stream: requests of 2,000 n-grams, 100 histories of 20 words each, the histories drawn
    from a pool of 5,000 (a buffer's requests: hypotheses met again in later stacks). The cached engine first
    sees the stream once, so the timed passes measure histories met before; scores must be equal."""
    rng = np.random.default_rng(seed)
    V, n = model.config.vocab_size, model.config.order
    pool = rng.integers(0, V, (5000, n - 1))
    stream = [np.concatenate([pool[rng.integers(0, 5000, 100)].repeat(20, axis=0),
                              rng.integers(0, V, (2000, 1))], axis=1).astype(np.int32) for _ in range(requests)]
    plain = Engine(model, vocab, "cpu", normalized=False)
    cached = Engine(model, vocab, "cpu", normalized=False)
    cached.cache_histories(rows)
    equal = all(np.array_equal(plain.score_ids(g)[0], cached.score_ids(g)[0]) for g in stream)
    before = cached.history_cache.hits, cached.history_cache.misses
    grams = np.concatenate(stream)
    rates = [interleaved_rates(plain, cached, grams, 2000) for _ in range(repeats)]
    hits, misses = cached.history_cache.hits - before[0], cached.history_cache.misses - before[1]
    ratios = [r[1] / r[0] for r in rates]
    return {"rows": rows, "requests": requests, "ngrams_per_request": 2000, "histories_per_request": 100,
            "history_pool": 5000, "scores_equal": equal, "hit_rate": round(hits / max(hits + misses, 1), 3),
            "uncached_ngrams_per_s": round(statistics.median(r[0] for r in rates)),
            "cached_ngrams_per_s": round(statistics.median(r[1] for r in rates)),
            "speedup": round(statistics.median(ratios), 2)}


def text_log_z(model_dir: str, text: Path) -> tuple[dict, np.ndarray]:
    """ln Z statistics and perplexities over the n-grams of `text` (`cslm eval --log-z`), and the ln Z values."""
    from cslm.apply import perplexity

    eng = Engine.load(model_dir, device="cpu")
    res = perplexity(eng, str(text), progress=False, log_z=True)
    grams = np.concatenate([eng.sentence_ngrams(line.split()) for _, line in iter_lines(str(text))])
    _, _, log_z = eng.score_ids_log_z(grams)
    return {"file": text.name, "train_self_norm": eng.train_self_norm, "tokens": res["tokens"],
            "unknown": res["unknown"], "exact_ppl": res["cslm_ppl"],
            "unnormalized_ppl": res["cslm_ppl_unnormalized"],
            "exact_ppl_in_shortlist": res["cslm_ppl_in_shortlist"],
            "unnormalized_ppl_in_shortlist": res["cslm_ppl_unnormalized_in_shortlist"],
            "ppl_ratio_unnormalized_vs_exact": res["cslm_ppl_unnormalized"] / res["cslm_ppl"],
            "log_z": res["log_z"]}, log_z


def plot_log_z(hists: list[tuple[str, float | None, np.ndarray]], text_name: str, out: str) -> None:
    """Overlaid histograms of ln Z, one per model, with ln Z = 0 marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    zs = [z.astype(np.float64) for _, _, z in hists]
    lo = min(-0.5, min(float(np.percentile(z, 0.1)) for z in zs))
    hi = max(0.5, max(float(np.percentile(z, 99.9)) for z in zs))
    bins = np.linspace(lo, hi, 121)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for (d, alpha, _), z, c in zip(hists, zs, ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]):
        name = Path(d.rstrip("/")).name
        trained = f"alpha = {alpha:g}" if alpha is not None else "alpha unknown"
        ax.hist(z, bins=bins, histtype="stepfilled", alpha=0.35, color=c, edgecolor=c, linewidth=1.2,
                label=f"{name} ({trained}): mean {z.mean():.2f}, sd {z.std():.2f}, mean |ln Z| {np.abs(z).mean():.2f}")
    ax.axvline(0.0, color="black", linestyle="--", linewidth=1, label=r"$\ln Z = 0$: $o_w = \ln P(w \mid h)$")
    ax.set_xlabel(r"$\ln Z(h) = \ln \sum_w \exp(o_w)$  (natural log)")
    ax.set_ylabel(f"n-grams per bin of {bins[1] - bins[0]:.2f} (of {len(zs[0]):,})")
    ax.set_title(f"CSLM softmax normaliser ln Z over the n-grams of {text_name}")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[],
                    help="a trained CSLM directory (repeatable) [a random `small` preset model]")
    ap.add_argument("--plot", help="with --model: histograms of ln Z over the text's n-grams into this PNG")
    ap.add_argument("--preset", default="small", help="preset of the random model [small]")
    ap.add_argument("--text", help="n-grams and ln Z statistics from this text [test.tok.fr of ../shared/data]")
    ap.add_argument("--ngrams", type=int, default=32768, help="n-grams timed (the largest batch's pass)")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 512, 8192], help="n-grams per engine call")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per side (median)")
    ap.add_argument("--quick", action="store_true", help="small sizes: 8,192 n-grams, one pass per side")
    ap.add_argument("--history-cache", type=int, metavar="ROWS",
                    help="also the self-normalised engine with a history cache of ROWS rows against none, on a "
                         "decoder-like stream (histories met before)")
    ap.add_argument("--json", help="also write the report here")
    a = ap.parse_args()
    if a.quick:
        a.ngrams, a.repeats = 8192, 1
    default_threads = torch.get_num_threads()
    text = Path(a.text) if a.text else (TEST_TEXT if TEST_TEXT.exists() else None)

    t0 = time.perf_counter()
    if a.model:
        from cslm import modeldir

        m = modeldir.load(a.model[0], "cpu")
        model, vocab, source = m.model, m.vocab, a.model[0]
    else:
        counts = None
        if TRAIN_TEXT.exists():
            counts = Counter()
            for _, line in iter_lines(str(TRAIN_TEXT)):
                counts.update(line.split())
        model, vocab = random_model(a.preset, counts)
        source = f"random {a.preset} preset" + (", shortlist of train.tok.fr" if counts else ", synthetic words")
    model.eval()
    cfg = model.config
    if text is not None:
        grams, grams_from = text_ngrams(vocab, cfg.order, text, a.ngrams), text.name
    else:
        grams, grams_from = synthetic_ngrams(cfg.vocab_size, cfg.order, a.ngrams), "synthetic (Zipf)"
    setup_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    tables = model.first_layer_tables()
    tables_s = time.perf_counter() - t0

    # the two paths agree: o_w - ln Z (self-normalised path) against the exact ln P
    check = grams[:2048]
    lp, _, lz = Engine(model, vocab, "cpu").score_ids_log_z(check)
    o, _ = Engine(model, vocab, "cpu", normalized=False).score_ids(check)
    agree = float(np.abs((o - lz) - lp).max())

    report = {
        "model": source,
        "config": cfg.to_dict(),
        "parameters": parameter_count(model),
        "ngrams_from": grams_from,
        "ngrams": int(len(grams)),
        "distinct_histories": int(len(np.unique(grams[:, :-1], axis=0))),
        "tables_mb": round(tables.numel() * tables.element_size() / 1e6, 1),
        "tables_build_s": round(tables_s, 3),
        "max_abs_diff_selfnorm_minus_logz_vs_exact": agree,
        "repeats": a.repeats,
        "setup_s": round(setup_s, 1),
    }
    del tables
    by_threads = {}
    for threads in sorted({1, default_threads}):
        by_threads[f"threads_{threads}"] = compare(model, vocab, grams, a.batches, threads, a.repeats)
    torch.set_num_threads(default_threads)
    report["batches"] = by_threads
    speedups = [v["speedup"] for t in by_threads.values() for v in t.values()]
    report["speedup_min"] = min(speedups)
    report["speedup_max"] = max(speedups)
    report["target"] = ">= 10x (small preset, CPU)"
    if a.history_cache:
        report["history_cache"] = history_cache_rates(model, vocab, a.history_cache, a.repeats)

    if a.model and text is not None:
        report["text"] = {}
        hists = []
        for d in a.model:
            stats, log_z = text_log_z(d, text)
            report["text"][d] = stats
            hists.append((d, stats["train_self_norm"], log_z))
        if a.plot:
            plot_log_z(hists, text.name, a.plot)
            report["plot"] = a.plot

    emit(report, a.json)


if __name__ == "__main__":
    run_script(main)
