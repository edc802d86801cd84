"""Word shortlists: the one vocabulary type used by the phrase scorer and the CSLM.

A `Vocabulary` maps words to contiguous ids. Reserved symbols come first (their
ids are fixed by the order the caller gives), then the most frequent words,
ties broken by the word itself so the same counts always give the same ids.
Words outside the shortlist map to the unknown symbol. On disk a vocabulary is
plain UTF-8 text, one entry per line in id order: `word<TAB>count` (reserved
symbols have count 0), so it can be read, diffed and checksummed by anyone.

The networks read phrases through the phrase-level methods (`units`,
`encode_phrases`, `encode_keys`, `join`): here a phrase's units are its words;
`mtcommon.subword.SubwordVocabulary` gives the same methods over subword units.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np

from .errors import UserError

UNK = "[UNK]"
EOS = "</s>"
BOS = "<s>"
RESERVED = (EOS, UNK)  # a phrase model's shortlist's reserved symbols, ids 0 and 1 (the CSLM adds BOS)


class Vocabulary:
    def __init__(self, words: Sequence[str], counts: Sequence[int] | None = None, unk: str = UNK):
        if len(set(words)) != len(words):
            dup = next(w for w, c in Counter(words).items() if c > 1)
            raise UserError(f"vocabulary has a duplicate entry: {dup!r}")
        if unk not in words:
            raise UserError(f"vocabulary lacks the unknown-word symbol {unk!r}")
        self.words: list[str] = list(words)
        self.counts: list[int] = list(counts) if counts is not None else [0] * len(words)
        self.index: dict[str, int] = {w: i for i, w in enumerate(self.words)}
        self.unk = unk
        self.unk_id = self.index[unk]

    # -- construction -------------------------------------------------------
    @classmethod
    def build(cls, counts: Counter, size: int, reserved: Sequence[str] = RESERVED) -> "Vocabulary":
        """Shortlist of the `size` most frequent words, reserved symbols included in `size`."""
        if size <= len(reserved):
            raise UserError(f"vocabulary size {size} leaves no room beside {len(reserved)} reserved symbols")
        ranked = sorted((w for w in counts if w not in reserved), key=lambda w: (-counts[w], w))
        kept = ranked[: size - len(reserved)]
        return cls(list(reserved) + kept, [0] * len(reserved) + [counts[w] for w in kept])

    # -- lookup ------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self.index

    def encode(self, words: Iterable[str]) -> list[int]:
        get, unk = self.index.get, self.unk_id
        return [get(w, unk) for w in words]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.words[i] for i in ids]

    # -- phrases: what the networks read and write -------------------------------
    kind = "words"  # the `segmentation` a model config names for this vocabulary type

    def units(self, phrase: str) -> list[str]:
        """The units a network reads for `phrase`: its words."""
        return phrase.split()

    def encode_phrases(self, phrases: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(the ids of every phrase's units, concatenated, int64; the number of units of each phrase, int64)."""
        split = [p.split() for p in phrases]
        lens = np.fromiter(map(len, split), dtype=np.int64, count=len(split))
        ids = np.fromiter(self.encode(itertools.chain.from_iterable(split)), dtype=np.int64, count=int(lens.sum()))
        return ids, lens

    def encode_keys(self, keys: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """`encode_phrases` of UTF-8 phrases whose words are separated by single spaces (the keys
        `phrasetable.Window` and `phrase_key` make). Every pass is C-level: bytes.count and
        bytes.split, dict.get through map; the words are never decoded."""
        if b"" in keys:  # an empty phrase (only through the API): no words
            lens = np.fromiter(map(len, map(bytes.split, keys)), dtype=np.int64, count=len(keys))
            words = itertools.chain.from_iterable(map(bytes.split, keys))
        else:
            lens = np.fromiter(map(bytes.count, keys, itertools.repeat(b" ")), dtype=np.int64, count=len(keys)) + 1
            words = b" ".join(keys).split(b" ")
        ids = np.fromiter(map(self._byte_index.get, words, itertools.repeat(self.unk_id)), dtype=np.int64,
                          count=int(lens.sum()))
        return ids, lens

    @cached_property
    def _byte_index(self) -> dict[bytes, int]:
        """The shortlist keyed by UTF-8 bytes, made once: table phrases are looked up without decoding."""
        return {w.encode("utf-8"): i for i, w in enumerate(self.words)}

    def join(self, ids: Iterable[int]) -> str:
        """The phrase that units `ids` spell (reserved symbols included, as their names)."""
        return " ".join(self.decode(ids))

    # -- persistence -------------------------------------------------------
    def to_text(self) -> str:
        return "".join(f"{w}\t{c}\n" for w, c in zip(self.words, self.counts))

    def checksum(self) -> str:
        """SHA-256 of the saved form: two processes agree on ids iff this matches."""
        return hashlib.sha256(self.to_text().encode("utf-8")).hexdigest()

    def save(self, path: str) -> None:
        from .outputs import atomic_output

        with atomic_output(path, compress=False) as f:
            f.write(self.to_text().encode("utf-8"))

    @classmethod
    def load(cls, path: str, unk: str = UNK) -> "Vocabulary":
        """Read a saved vocabulary; anything else is an InputError naming the file (and line)."""
        from .textio import InputError, decode_line

        words, counts = [], []
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                line = decode_line(raw, path, lineno).rstrip("\r\n")
                word, sep, count = line.partition("\t")
                if not sep or not word or not (count.isascii() and count.isdigit()):
                    raise InputError(path, lineno, f"expected 'word<TAB>count', got {line!r}")
                words.append(word)
                counts.append(int(count))
        try:
            return cls(words, counts, unk=unk)
        except UserError as e:  # a duplicate word, no unknown-word symbol
            raise InputError(path, None, str(e)) from None

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} words, unk={self.unk!r})"
