"""The corpus steps: tokenized, lowercased and filtered text, symmetrized alignments, detokenized output."""

from __future__ import annotations

import itertools
import sys

from mtcommon.textio import iter_lines

from files import write_lines


def prepare(in_prefix: str, out_prefix: str, src: str, trg: str, lines: int = 0, stride: int = 1, max_len: int = 0,
            max_ratio: float = 9.0, lowercase: bool = True) -> None:
    """Tokenize (Moses escaping), lowercase, and for training data filter by length: the pairs of
    IN_PREFIX.SRC and IN_PREFIX.TRG, the first `lines` of every `stride`-th (0: all), those with a side
    over `max_len` words (0: no limit) or a length ratio over `max_ratio` dropped.

    Writes OUT_PREFIX.SRC, OUT_PREFIX.TRG (tokenized) and OUT_PREFIX.ref.TRG (the raw target side of
    the kept lines, the reference that detokenized output is scored against).
    """
    from sacremoses import MosesTokenizer

    tok = {lang: MosesTokenizer(lang=lang) for lang in (src, trg)}
    src_path, trg_path = f"{in_prefix}.{src}", f"{in_prefix}.{trg}"
    kept, seen, dropped = [], 0, 0
    for pair in itertools.zip_longest(iter_lines(src_path), iter_lines(trg_path)):
        if lines and seen >= lines:
            break
        if None in pair:
            raise SystemExit(f"{src_path} and {trg_path} have different line counts")
        (ln, s), (_, t) = pair
        if stride > 1 and (ln - 1) % stride:
            continue
        seen += 1  # lines sampled; --lines counts these
        ts = tok[src].tokenize(s.strip(), escape=True, return_str=True, aggressive_dash_splits=True)
        tt = tok[trg].tokenize(t.strip(), escape=True, return_str=True, aggressive_dash_splits=True)
        if lowercase:
            ts, tt = ts.lower(), tt.lower()
        if max_len:
            ns, nt = len(ts.split()), len(tt.split())
            if not ns or not nt or ns > max_len or nt > max_len or max(ns, nt) > max_ratio * min(ns, nt):
                dropped += 1
                continue
        kept.append((ts, tt, t.strip()))
    write_lines(f"{out_prefix}.ref.{trg}", (r for _, _, r in kept))
    write_lines(f"{out_prefix}.{trg}", (t for _, t, _ in kept))
    write_lines(f"{out_prefix}.{src}", (s for s, _, _ in kept))
    print(f"{out_prefix}: {len(kept)} pairs kept, {dropped} dropped by length", file=sys.stderr)


def _links(line: str) -> set[tuple[int, int]]:
    out = set()
    for tok in line.split():
        i, _, j = tok.partition("-")
        out.add((int(i), int(j)))
    return out


def grow_diag_final_and(fwd: set, rev: set) -> set:
    """Koehn et al.'s grow-diag-final-and symmetrisation of two directional alignments (i = source)."""
    union, align = fwd | rev, set(fwd & rev)
    neighbours = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]

    def src_aligned(i):
        return any(a == i for a, _ in align)

    def trg_aligned(j):
        return any(b == j for _, b in align)

    added = True
    while added:
        added = False
        for i, j in sorted(align):
            for di, dj in neighbours:
                p = (i + di, j + dj)
                if p in union and p not in align and (not src_aligned(p[0]) or not trg_aligned(p[1])):
                    align.add(p)
                    added = True
    for direction in (fwd, rev):  # final-and: both words still unaligned
        for i, j in sorted(direction):
            if not src_aligned(i) and not trg_aligned(j):
                align.add((i, j))
    return align


def symmetrize(forward: str, reverse: str, output: str) -> None:
    """Symmetrize two directional alignments (Pharaoh "i-j" links, a sentence a line) into `output`."""
    fwd, rev = iter_lines(forward), iter_lines(reverse)

    def gen():
        for (ln, f), (_, r) in zip(fwd, rev, strict=True):
            links = grow_diag_final_and(_links(f), _links(r))
            yield " ".join(f"{i}-{j}" for i, j in sorted(links))

    n = write_lines(output, gen())
    print(f"{output}: {n} sentence alignments", file=sys.stderr)


def detok(tokenized: str, output: str, lang: str) -> None:
    """Detokenize Moses's tokenized output (its escapes undone), a sentence a line."""
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)
    write_lines(output, (md.detokenize(line.split(), unescape=True) for _, line in iter_lines(tokenized)))
