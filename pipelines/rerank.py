"""Reranking n-best lists: the weights of a rescored list's features, tuned on dev; the best
hypothesis of each sentence under them.

`tune` runs Moses's own optimiser on one rescored dev n-best list (the lists a tuning
decoded, merged by `mt.py nbest-top`, plus the network's feature from
`moses-rnn rescore-nbest`): `extractor` turns the list into feature and BLEU-statistics
files, `mert` (Och 2003; the pipeline's tuner) searches the weights from the tuned ones
with the new feature at 0, `-r SEED` and 20 random restarts; with `free`, only the named
features' weights move (mert's `-o`), the others keep the tuning's. `rerank` picks each
sentence's best hypothesis under those weights. The weights file has one `NAME_i value`
line per score, named as `extractor` names them.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from moses_rnn.formats.mosesini import MosesIni
from mtcommon import nbest
from mtcommon.errors import UserError
from mtcommon.outputs import atomic_output


def read_weights(path: str) -> dict[str, float]:
    weights = {}
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        if len(parts) != 2:
            raise UserError(f"{path}:{lineno}: expected 'NAME_i value', got {line!r}")
        weights[parts[0]] = float(parts[1])
    return weights


def feature_of(name: str) -> str:
    """The moses.ini feature of a score named as `extractor` names it: `LM0_0` -> `LM0`."""
    return name.rpartition("_")[0]


def starting_weights(ini: str, names: list[str]) -> list[float]:
    """The weight of each `NAME_i` in moses.ini `ini` (a feature it does not weigh starts at 0)."""
    cfg = MosesIni.read(ini)
    known = set(cfg.weight_names())
    out = []
    for name in names:
        feature, index = feature_of(name), int(name.rpartition("_")[2])
        values = cfg.weights(feature) if feature in known else None
        out.append(values[index] if values and index < len(values) else 0.0)
    return out


def tune(nbest_path: str, reference: str, ini: str, moses: str, output: str, seed: int = 1,
         positive: list[str] | None = None, restarts: int = 20, free: list[str] | None = None) -> dict[str, float]:
    """Weights for the features of the rescored n-best list `nbest_path` that maximise the BLEU of its
    1-best (extractor + mert of Moses at `moses`); written to `output`, also returned. `free`: the
    features (names as in moses.ini) whose weights may move; None, all."""
    with tempfile.TemporaryDirectory(prefix="rerank-") as tmp:
        scores, features = os.path.join(tmp, "scores.dat"), os.path.join(tmp, "features.dat")
        _run([f"{moses}/bin/extractor", "--sctype", "BLEU", "--scconfig", "case:true", "--scfile", scores,
              "--ffile", features, "-r", reference, "-n", nbest_path], tmp)
        with open(features, encoding="utf-8") as f:
            header = f.readline().split()
        if not header or not header[0].startswith("FEATURES_TXT_BEGIN"):
            raise UserError(f"{nbest_path}: extractor wrote no feature names")
        names = header[4:]
        start = starting_weights(ini, names)
        with open(os.path.join(tmp, "init.opt"), "w", encoding="utf-8") as f:
            f.write(" ".join(f"{w:.6f}" for w in start) + "\n")
            f.write(" ".join("0" for _ in names) + "\n")  # random restarts draw in [0, 1) ...
            f.write(" ".join("1" for _ in names) + "\n")
        command = [f"{moses}/bin/mert", "-d", str(len(names)), "-r", str(seed), "-n", str(restarts), "--sctype",
                   "BLEU", "--scconfig", "case:true", "--scfile", scores, "--ffile", features, "--ifile", "init.opt"]
        kept = [n for n in names if feature_of(n) in (positive or [])]
        if kept:
            command += ["-P", ",".join(kept)]
        if free is not None:
            moving = [n for n in names if feature_of(n) in free]
            if not moving:
                raise UserError(f"{nbest_path}: none of the features {', '.join(free)} is in the list "
                                f"(it has {', '.join(sorted(set(map(feature_of, names))))})")
            command += ["-o", ",".join(moving)]
        _run(command, tmp)
        values = Path(tmp, "weights.txt").read_text().split()
    if len(values) != len(names):
        raise UserError(f"mert returned {len(values)} weights for {len(names)} features")
    weights = dict(zip(names, map(float, values)))
    with atomic_output(output, compress=False) as out:
        out.write("".join(f"{n} {w:.8g}\n" for n, w in weights.items()).encode("utf-8"))
    return weights


def _run(command: list[str], cwd: str) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = " ".join(done.stderr.split()[-30:])
        raise UserError(f"{os.path.basename(command[0])} failed ({done.returncode}): {tail}")


def rerank(nbest_path: str, weights: dict[str, float], sentences: int) -> list[str]:
    """The best hypothesis of sentences 0 .. `sentences`-1 of the list under `weights` (a feature the
    weights do not name counts 0); a sentence without hypotheses gets an empty line. Ties keep the
    list's order (Moses's own ranking)."""
    best: list[tuple[float, str] | None] = [None] * sentences
    for hyps in nbest.windows(nbest_path, 10000):
        for h in hyps:
            if h.sentence >= sentences:
                raise UserError(f"{nbest_path}:{h.lineno}: sentence id {h.sentence}, but only {sentences} sentences")
            try:
                score = sum(weights.get(name, 0.0) * value for name, value in h.features())
            except ValueError as e:
                raise UserError(f"{nbest_path}:{h.lineno}: {e}") from None
            if best[h.sentence] is None or score > best[h.sentence][0]:
                best[h.sentence] = (score, h.text.strip())
    return [b[1] if b else "" for b in best]
