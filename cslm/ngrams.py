"""The one place where a sentence becomes n-grams, for word ids and for words alike.

A sentence w_1 .. w_m is scored as `<s>`^(n-1) w_1 .. w_m `</s>`: every word and the closing
`</s>` is predicted from its n-1 predecessors, the history padded with `<s>` at the sentence
start. An n-gram shorter than n (a decoder's request near the start of a sentence) is read as
if the missing history were `<s>` (`left_pad`). The C++ side has its counterpart in
cslm/moses/cslm_ngrams.h.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

import numpy as np

T = TypeVar("T")


def pad_sentence(tokens: Sequence[T], order: int, bos: T, eos: T) -> list[T]:
    """`<s>`^(order-1) tokens `</s>`: ids or words, as `bos` and `eos` are."""
    return [bos] * (order - 1) + list(tokens) + [eos]


def left_pad(gram: Sequence[T], order: int, bos: T) -> list[T]:
    """An n-gram of 1..order tokens as `order` tokens, the missing history `<s>`."""
    return [bos] * (order - len(gram)) + list(gram)


def sentence_ngrams(tokens: Sequence, order: int, bos, eos):
    """The len(tokens)+1 n-grams of one sentence, the predicted token last.

    Word ids (`bos` an int): an (len+1, order) int32 array. Words (`bos` a str): a list of word lists."""
    padded = pad_sentence(tokens, order, bos, eos)
    if isinstance(bos, str):
        return [padded[j : j + order] for j in range(len(padded) - order + 1)]
    return np.lib.stride_tricks.sliding_window_view(np.asarray(padded, np.int32), order).copy()
