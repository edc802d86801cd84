from collections import Counter

import pytest

from mtcommon.vocab import EOS, UNK, Vocabulary


def test_shortlist_order_ties_and_unknowns(tmp_path):
    counts = Counter({"la": 5, "le": 5, "chat": 3, "noir": 1, "rare": 1})
    v = Vocabulary.build(counts, size=5)
    assert v.words == [EOS, UNK, "la", "le", "chat"]  # frequency, then the word itself
    assert v.encode(["le", "noir", "chat"]) == [3, v.unk_id, 4]
    assert [w in v for w in ["le", "noir", "rare", "chat"]] == [True, False, False, True]
    path = tmp_path / "v.vocab"
    v.save(str(path))
    w = Vocabulary.load(str(path))
    assert w.words == v.words and w.counts == v.counts and w.checksum() == v.checksum()
    assert path.read_text(encoding="utf-8").splitlines()[2] == "la\t5"


def test_bad_vocab_file_names_line(tmp_path):
    path = tmp_path / "v.vocab"
    path.write_text(f"{EOS}\t0\n{UNK}\t0\nno-count\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"v.vocab:3:"):
        Vocabulary.load(str(path))


def test_size_too_small():
    with pytest.raises(ValueError):
        Vocabulary.build(Counter({"a": 1}), size=2)
