"""Sampling a list of source phrases into a file: the distinct targets of each, by model score, with counts."""

from __future__ import annotations

from tqdm import tqdm

from mtcommon.batching import batches
from mtcommon.outputs import atomic_output

from .generate import Generator


def write_samples(gen: Generator, sources: list[str], output: str, n: int = 50, seed: int = 1, top: int = 5,
                  tsv: bool = False, batch: int = 64, progress: bool = True, **decoding) -> None:
    """Draw `n` samples for each source, `batch` sources at a time (`Generator.sample`, `decoding`: its
    length and [UNK] options), and write the first `top` distinct targets of each (0: all) into `output`
    ('-': stdout): with `tsv`, `source<TAB>target<TAB>count<TAB>log p` lines; else the source, then one
    indented `count  log p  target` line per target."""
    with atomic_output(output) as out, tqdm(total=len(sources), unit=" phrases", desc="sampling",
                                            disable=not progress or len(sources) <= batch) as bar:
        for part in batches(sources, batch):
            lines = []
            for src, hyps in zip(part, gen.sample(part, n=n, seed=seed, **decoding)):
                hyps = hyps[:top] if top > 0 else hyps
                if tsv:
                    lines += [f"{src}\t{h.text}\t{h.count}\t{h.log_prob:.4f}\n" for h in hyps]
                else:
                    lines.append(f"{src}\n")
                    lines += [f"  {h.count:5d}  {h.log_prob:9.3f}  {h.text}\n" for h in hyps]
            out.write("".join(lines).encode("utf-8"))
            bar.update(len(part))
