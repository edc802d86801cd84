"""Perplexity of a CSLM beside a KenLM n-gram model on the same held-out text, same tokens.

    python benchmarks/bench_cslm_ppl.py MODEL_DIR TEXT LM.arpa[.gz]|LM.binary [--limit N]

Per-token perplexity over every word and </s> (natural log throughout; the
choice of base does not change a perplexity). Also reported on the tokens
whose word is in the CSLM's shortlist only, and for the CSLM in back-off mode
(unknown words scored by the KenLM model). Prints a JSON report.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import time

from cslm.apply import perplexity
from common import emit
from cslm.engine import Engine, KenLMBackoff
from mtcommon.textio import iter_lines
from mtcommon.cliutil import run_script


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("text")
    ap.add_argument("kenlm")
    ap.add_argument("--limit", type=int, help="only the first N sentences")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="also write the report here")
    a = ap.parse_args()

    text = a.text
    if a.limit:
        fd, text = tempfile.mkstemp(suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for _, line in itertools.islice(iter_lines(a.text), a.limit):
                f.write(line + "\n")
    try:
        t0 = time.perf_counter()
        lm = KenLMBackoff(a.kenlm)
        load_s = time.perf_counter() - t0
        engine = Engine.load(a.model_dir, device=a.device)
        t0 = time.perf_counter()
        res = perplexity(engine, text, kenlm=lm, progress=False)
        res["cslm_seconds"] = round(time.perf_counter() - t0, 1)
        engine.backoff, engine.mode = lm, "backoff"
        back = perplexity(engine, text, progress=False)
        res["cslm_backoff_ppl"] = back["cslm_ppl"]
        res["kenlm_load_seconds"] = round(load_s, 1)
        res["model"] = engine.model.config.to_dict()
        with open(os.path.join(a.model_dir, "config.json"), encoding="utf-8") as f:
            meta = json.load(f).get("meta", {})
        res["training"] = {k: meta.get(k) for k in ("train_ngrams", "epoch", "step", "valid_ppl")}
    finally:
        if a.limit:
            os.unlink(text)
    emit(res, a.json)


if __name__ == "__main__":
    run_script(main)
