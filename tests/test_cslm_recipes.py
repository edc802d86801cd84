"""benchmarks/cslm_recipes.py: recipes trained for the same updates, measured and chosen as its docstring says."""

import json
import subprocess
import sys
from pathlib import Path

from tests.test_cslm import synthetic_corpus

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cslm_recipes.py"


def test_recipes_train_the_same_updates_and_the_dev_text_chooses(tmp_path):
    corpus = synthetic_corpus(tmp_path / "train.txt", sentences=300, seed=4)
    dev = synthetic_corpus(tmp_path / "dev.txt", sentences=40, seed=5)
    test = synthetic_corpus(tmp_path / "test.txt", sentences=40, seed=6)
    r = subprocess.run([sys.executable, str(SCRIPT), str(corpus), str(test), "--dev", str(dev), "-o", str(tmp_path / "m"),
                        "--preset", "tiny", "--updates", "20", "--eval-every", "10", "--batch-size", "64", "--jobs", "2",
                        "--recipe", "plain=--dtype fp32", "--recipe", "again=--dtype fp32 --seed 1",
                        "--recipe", "decayed=--dtype fp32 --lr 3e-3 --lr-schedule linear --dropout 0.1"],
                       capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    rows = {row["recipe"]: row for row in report["recipes"]}
    assert set(rows) == {"plain", "again", "decayed"}
    for row in rows.values():
        assert row["updates"] == 20 and [step for step, _ in row["heldout_curve"]] == [10, 20]
        assert row["best_heldout_ppl"] == min(ppl for _, ppl in row["heldout_curve"])
    # the same options and seed train the same model: every number agrees
    for key in ("best_heldout_ppl", "dev_ppl_in_shortlist", "test_ppl_in_shortlist"):
        assert rows["plain"][key] == rows["again"][key]
    assert rows["decayed"]["dev_ppl_in_shortlist"] != rows["plain"]["dev_ppl_in_shortlist"]
    assert report["chosen_by_dev"] == min(rows.values(), key=lambda row: row["dev_ppl_in_shortlist"])["recipe"]
    assert (tmp_path / "m" / "decayed" / "model.safetensors").exists()
