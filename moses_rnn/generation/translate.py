"""Translating a text file with a network: one line out per line in, in order, streamed.

`translate_file` reads the input a window of lines at a time, sorts each window's
non-empty lines by length so that a batch holds sources of similar length (less
padding, and a batch's beam search ends when its longest source does), decodes them
with `Generator.beam_search`, and writes the window back in input order. An empty
line gives an empty line. The output is written atomically (`mtcommon.outputs`): a
failed run leaves no partial file.

With `replace_unk`, each `[UNK]` of a translation is replaced by the source word its
attention weights point at (RNNsearch only): the argmax over source positions of
alpha_ij of that target position (Bahdanau et al., Section 5.2.2 shows such
alignments; the replacement itself is Luong et al. 2015's, with the attention as the
alignment).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Iterator

from tqdm import tqdm

from mtcommon.batching import batches
from mtcommon.errors import UserError
from mtcommon.textio import iter_lines
from mtcommon.outputs import atomic_output
from mtcommon.vocab import UNK

from .generate import Generator, Hypothesis


@dataclass
class TranslationStats:
    lines: int = 0
    translated: int = 0  # non-empty lines
    unknown_replaced: int = 0
    seconds: float = 0.0


def read_lines(path: str) -> Iterator[str]:
    """The lines of a plain or gzip UTF-8 file ('-': stdin), streamed."""
    return (line for _, line in iter_lines(path))


def replace_unknowns(gen: Generator, source: str, hyp: Hypothesis) -> int:
    """Put in place of each `[UNK]` of `hyp` the source unit that the attention of its target position
    weighs most; returns how many were replaced. Only for models with attention and word targets."""
    positions = [i for i, w in enumerate(hyp.words) if w == UNK]
    if not positions:
        return 0
    src_units = gen.src_vocab.units(source)
    best = gen.attention(source, hyp.text).argmax(axis=1)
    for i in positions:
        hyp.words[i] = src_units[int(best[i])]
    return len(positions)


def translate_lines(gen: Generator, lines: Iterable[str], output: str, beam: int = 5, n_best: int = 1,
                    normalize: bool = False, allow_unk: bool = True, replace_unk: bool = False, batch: int = 64,
                    window: int = 2048, len_ratio: float = 2.0, len_extra: int = 3,
                    progress: bool = True) -> TranslationStats:
    """Translate every line (tokenized text) into `output` ('-': stdout): its best translation, one line
    each; with `n_best` > 1, `index ||| translation ||| score` lines, `n_best` per input line (none for an
    empty one), as Moses writes n-best lists."""
    if replace_unk and not gen.model.has_attention:
        raise UserError(f"--replace-unk uses the attention weights: this model has none (architecture "
                        f"{gen.model.config.arch!r}; train with --arch rnnsearch)")
    if replace_unk and gen.tgt_vocab.kind != "words":
        raise UserError("--replace-unk is for word shortlists: a subword model never writes [UNK]")
    stats = TranslationStats()
    start = time.perf_counter()
    with atomic_output(output) as out, tqdm(unit=" lines", disable=not progress, dynamic_ncols=True,
                                            desc="translating") as bar:
        for lines in batches((" ".join(line.split()) for line in lines), window):
            results: list[list[Hypothesis]] = [[] for _ in lines]
            order = sorted((i for i, line in enumerate(lines) if line), key=lambda i: len(lines[i].split()))
            for k in range(0, len(order), batch):
                members = order[k : k + batch]
                sources = [lines[i] for i in members]
                found = gen.beam_search(sources, beam=beam, n_best=n_best, len_ratio=len_ratio, len_extra=len_extra,
                                        normalize=normalize, allow_unk=allow_unk)
                for i, source, hyps in zip(members, sources, found):
                    if replace_unk:
                        stats.unknown_replaced += sum(replace_unknowns(gen, source, h) for h in hyps)
                    results[i] = hyps
                bar.update(len(members))
            bar.update(len(lines) - len(order))
            if n_best == 1:
                text = "".join((hyps[0].text if hyps else "") + "\n" for hyps in results)
            else:
                text = "".join(f"{stats.lines + i} ||| {h.text} ||| {h.score:.4f}\n"
                               for i, hyps in enumerate(results) for h in hyps)
            out.write(text.encode("utf-8"))
            stats.lines += len(lines)
            stats.translated += len(order)
    stats.seconds = time.perf_counter() - start
    return stats
