"""Subword units: an open vocabulary for the phrase networks.

A `SubwordVocabulary` is a `Vocabulary` whose entries are the units of a
sentencepiece model (Kudo and Richardson, 2018), learned on the training side
of one language. Every word splits into units the model knows, and a
character it never saw into its UTF-8 bytes (`byte_fallback`), so no phrase
maps to `[UNK]`. Units never span two words (`split_by_whitespace`), and the
text is not normalised (`identity`): `join(encode(phrase)) == phrase` for any
tokenized phrase whose words are separated by single spaces (tested on every
line of the shipped example table).

Ids are the sentencepiece model's own: `</s>` is 0 and `[UNK]` is 1, as in a
word shortlist (`Vocabulary.build`), so a phrase is encoded by one C++ call
with no id mapping. On disk the vocabulary is the sentencepiece model file
(a protobuf, parsed by sentencepiece without running code); its SHA-256 is
what a model config records, so a model directory whose segmentation was
swapped is refused when it loads.

Why sentencepiece BPE, measured against HF tokenizers and subword-nmt on the
shared corpus: docs/subwords.md.
"""

from __future__ import annotations

import hashlib
import io
import itertools
from typing import Iterable, Sequence

import numpy as np

from .errors import UserError
from .textio import InputError
from .outputs import atomic_output
from .vocab import EOS, UNK, Vocabulary

# The training options every model is learned with (sentencepiece's names), besides its size.
OPTIONS = dict(
    model_type="bpe",
    character_coverage=1.0,  # every character seen in training is a unit
    byte_fallback=True,  # ... and one never seen is spelled by its UTF-8 bytes, never [UNK]
    split_by_whitespace=True,  # a unit never spans two words
    split_by_unicode_script=False,  # "l'" and "10%" may be one unit (measured: fewer units per word)
    split_by_number=True,
    normalization_rule_name="identity",  # tokenized text is scored as it is written in the table
    remove_extra_whitespaces=False,
    eos_id=0, unk_id=1, bos_id=-1, pad_id=-1,  # the ids of a word shortlist's reserved symbols
    eos_piece=EOS, unk_piece=UNK,
)

# At most this many lines per side are given to the trainer: a table's millions of distinct
# phrases are thinned to an evenly spaced subset (deterministic, unlike sentencepiece's sampling).
MAX_TRAINING_LINES = 2_000_000


class SubwordVocabulary(Vocabulary):
    kind = "sentencepiece"

    def __init__(self, model: bytes, path: str = "<sentencepiece model>"):
        """The vocabulary of a serialized sentencepiece model; an InputError naming `path` if it is not one
        this project trained (a protobuf that does not parse, other reserved ids)."""
        import sentencepiece

        try:
            sp = sentencepiece.SentencePieceProcessor(model_proto=model)
        except (RuntimeError, TypeError):  # sentencepiece's message is its C++ source line
            raise InputError(path, None, "not a sentencepiece model (its protobuf does not parse)") from None
        size = sp.get_piece_size()
        if size < 2 or sp.id_to_piece(0) != EOS or sp.id_to_piece(1) != UNK or sp.bos_id() != -1:
            raise InputError(path, None, f"a sentencepiece model without this project's reserved units "
                                         f"(id 0 {EOS}, id 1 {UNK}, no <s>)")
        self._sp, self._model = sp, bytes(model)
        try:
            super().__init__([sp.id_to_piece(i) for i in range(size)], [0] * size)
        except UserError as e:
            raise InputError(path, None, str(e)) from None

    # -- construction -------------------------------------------------------
    @classmethod
    def train(cls, lines: Iterable[str], size: int, threads: int = 1) -> "SubwordVocabulary":
        """Units learned by BPE on `lines` (text of one language, words separated by spaces): `size`
        units at most, `</s>`, `[UNK]` and the 256 byte units included. A corpus too small for `size`
        gives fewer units (the vocabulary's length says how many)."""
        import sentencepiece

        if size < 260 + 2:
            raise UserError(f"{size} subword units leave no room beside the 256 byte units and 2 reserved symbols")
        lines = list(lines)
        if len(lines) > MAX_TRAINING_LINES:
            lines = [lines[i] for i in np.linspace(0, len(lines) - 1, MAX_TRAINING_LINES).astype(np.int64)]
        if not any(line.strip() for line in lines):
            raise UserError("no text to learn subword units from")
        out = io.BytesIO()
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(lines), model_writer=out, vocab_size=size, hard_vocab_limit=False,
                num_threads=max(1, threads), minloglevel=2, **OPTIONS)
        except RuntimeError as e:  # more characters than units, say; the message follows its C++ source line
            reason = " ".join(str(e).split()).rpartition("] ")[2]
            raise UserError(f"cannot learn {size} subword units: {reason[:200]}") from None
        return cls(out.getvalue())

    # -- phrases ------------------------------------------------------------
    def units(self, phrase: str) -> list[str]:
        """The units a network reads for `phrase`."""
        return self._sp.encode(phrase, out_type=str)

    def encode_phrases(self, phrases: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(the ids of every phrase's units, concatenated, int64; the number of units of each phrase, int64):
        one call into sentencepiece for the whole batch."""
        pieces = self._sp.encode(list(phrases), out_type=int)
        lens = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        ids = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64, count=int(lens.sum()))
        return ids, lens

    def encode_keys(self, keys: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """`encode_phrases` of UTF-8 phrases (a table's keys, validated UTF-8 when they were read)."""
        return self.encode_phrases([k.decode("utf-8") for k in keys])

    def join(self, ids: Iterable[int]) -> str:
        """The phrase that units `ids` spell (`</s>` is dropped; bytes units become their characters)."""
        return self._sp.decode([int(i) for i in ids])

    # -- persistence -------------------------------------------------------
    def to_text(self) -> str:
        raise TypeError("a subword vocabulary is saved as its sentencepiece model (save), not as text")

    def checksum(self) -> str:
        """SHA-256 of the sentencepiece model file: what a model config records."""
        return hashlib.sha256(self._model).hexdigest()

    def save(self, path: str) -> None:
        with atomic_output(path, compress=False) as f:
            f.write(self._model)

    @classmethod
    def load(cls, path: str, unk: str = UNK) -> "SubwordVocabulary":
        """A saved model; an InputError naming `path` if it is not one."""
        with open(path, "rb") as f:
            return cls(f.read(), path)

    def __repr__(self) -> str:
        return f"SubwordVocabulary({len(self)} units)"
