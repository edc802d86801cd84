"""How a tuning went: its dev BLEU at each iteration, and the verdict those scores give."""

from __future__ import annotations

from pathlib import Path

from files import read_lines
from runs import tunings
from systems import label

def dev_bleu_curves(work: Path, systems: list[str], dev_ref: Path, tuner: str = "mert") -> dict[str, dict[str, list[float]]]:
    """BLEU of each tuning iteration's decoded 1-best dev output (mert/runN.out, whatever the tuner;
    tokenized and lowercased like the reference dev.TRG, so BLEU on these tokens as the tuner sees them):
    system -> run -> [BLEU of iteration 1, 2, ...]."""
    from sacrebleu.metrics import BLEU

    reference = read_lines(dev_ref)
    bleu = BLEU(tokenize="none", force=True)
    curves: dict[str, dict[str, list[float]]] = {}
    for system in systems:
        for name, folder in tunings(work, system, tuner).items():
            scores, n = [], 1
            while (folder / "mert" / f"run{n}.out").exists():
                hyp = read_lines(folder / "mert" / f"run{n}.out")
                if len(hyp) == len(reference):
                    scores.append(bleu.corpus_score(hyp, [reference]).score)
                n += 1
            if scores:
                curves.setdefault(system, {})[name] = scores
    return curves


# A tuning whose decoded dev BLEU never rises FAIL_GAIN above its first iteration's did little;
# one that falls DIP_DROP below it at some iteration dipped there (the weights the optimiser
# proposed decode worse than where it started), and one that falls below half of it collapsed.
FAIL_GAIN, DIP_DROP = 1.0, 1.0


def tuning_health(scores: list[float]) -> dict:
    """What a tuning's dev BLEU per iteration says: the first, the best and its iteration (1-based),
    the lowest after the first, and a verdict: 'failed' (the best is the first iteration),
    'collapsed' (it fell below half of the first), 'dipped' (more than DIP_DROP below the first),
    'weak' (the best is less than FAIL_GAIN above the first), else 'ok'."""
    first, best = scores[0], max(scores)
    best_at = scores.index(best) + 1
    lowest = min(scores[1:]) if len(scores) > 1 else first
    if best_at == 1:
        verdict = "failed"
    elif lowest < first / 2:
        verdict = "collapsed"
    elif lowest < first - DIP_DROP:
        verdict = "dipped"
    elif best < first + FAIL_GAIN:
        verdict = "weak"
    else:
        verdict = "ok"
    return {"iterations": len(scores), "first": first, "best": best, "best_at": best_at, "lowest": lowest,
            "verdict": verdict}


def health_rows(curves: dict[str, dict[str, list[float]]]) -> list[str]:
    rows = []
    for system, runs in curves.items():
        for name, scores in runs.items():
            h = tuning_health(scores)
            rows.append(f"| {label(system)} {name} | {h['iterations']} | {h['first']:.2f} | "
                        f"{h['best']:.2f} ({h['best_at']}) | {h['lowest']:.2f} | {h['verdict']} |")
    return rows
