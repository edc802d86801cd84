"""Moses's word translation tables (`lex.f2e`, `lex.e2f`) and the lexical weights of a phrase pair.

`train-model.perl` (step 4) writes two files of `WORD GIVEN probability` lines:

    lex.f2e   e f w(e|f)     target word, source word (NULL for an unaligned target word)
    lex.e2f   f e w(f|e)     source word, target word (NULL for an unaligned source word)

and its phrase scorer (`phrase-extract/score-main.cpp`, `computeLexicalTranslation`)
computes the lexical weight of a pair from them (Koehn et al. 2003):

    lex(e|f, a) = prod_i  mean_{j aligned to i} w(e_i | f_j)     (w(e_i | NULL) if e_i is unaligned)

and lex(f|e, a) the same way with the roles swapped. A word pair absent from the
file counts 1.0, as the scorer's `permissiveLookup` has it. The table's columns
are p(f|e), lex(f|e), p(e|f), lex(e|f).
"""

from __future__ import annotations

from typing import Sequence

from mtcommon.textio import InputError, iter_lines

NULL = "NULL"


class LexicalTable:
    """w(word | given) of one direction, read from a `lex.*` file."""

    def __init__(self, probs: dict[tuple[str, str], float]):
        self.probs = probs
        self.by_given: dict[str, dict[str, float]] = {}
        for (word, given), p in probs.items():
            self.by_given.setdefault(given, {})[word] = p

    @classmethod
    def load(cls, path: str) -> "LexicalTable":
        probs = {}
        for lineno, line in iter_lines(path):
            parts = line.split()
            if len(parts) != 3:
                raise InputError(path, lineno, f"expected 'word given probability', got {line[:200]!r}")
            try:
                p = float(parts[2])
            except ValueError:
                raise InputError(path, lineno, f"probability {parts[2]!r} is not a number") from None
            if not 0.0 <= p <= 1.0:
                raise InputError(path, lineno, f"probability {parts[2]} is not in [0, 1]")
            probs[(parts[0], parts[1])] = p
        return cls(probs)

    def lookup(self, word: str, given: str) -> float:
        """w(word | given); 1.0 for a pair the file lacks (the phrase scorer's permissiveLookup)."""
        return self.probs.get((word, given), 1.0)

    def weight(self, words: Sequence[str], given: Sequence[str], links: Sequence[tuple[int, int]]) -> float:
        """lex(words | given, links): `links` are (given position, word position) pairs."""
        aligned: list[list[int]] = [[] for _ in words]
        for g, w in links:
            aligned[w].append(g)
        score = 1.0
        for i, word in enumerate(words):
            if aligned[i]:
                score *= sum(self.lookup(word, given[g]) for g in aligned[i]) / len(aligned[i])
            else:
                score *= self.lookup(word, NULL)
        return score

    def best_links(self, words: Sequence[str], given: Sequence[str]) -> list[tuple[int, int]]:
        """An alignment from the table: each word linked to the given word it is likeliest to translate
        (the highest w(word | given) among the pairs the file has); a word with no such pair stays unlinked.
        (given position, word position) pairs, sorted."""
        links = []
        for i, word in enumerate(words):
            best, where = 0.0, None
            for g, other in enumerate(given):
                p = self.by_given.get(other, {}).get(word)
                if p is not None and p > best:
                    best, where = p, g
            if where is not None:
                links.append((where, i))
        return sorted(links)
