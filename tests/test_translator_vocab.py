"""The vocabularies: special ids, round trips, errors that name the word, tokenize."""

from __future__ import annotations

import pytest

from mha.translator import Vocab, generate_corpus
from mha.translator.vocab import tokenize


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(seed=0)


def test_vocab_special_ids_and_round_trip(corpus):
    vocab = corpus.tgt_vocab
    assert vocab.tokens[:3] == ["<pad>", "<s>", "</s>"]
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2)
    for ex in corpus.heldout[:50]:
        ids = vocab.encode(ex.target, add_bos=True, add_eos=True)
        assert ids[0] == 1 and ids[-1] == 2
        assert vocab.decode(ids + [0, 0]) == list(ex.target)
    assert Vocab.from_json(vocab.to_json()) == vocab


def test_decode_stops_at_end_token():
    vocab = Vocab(["a", "b"])
    assert vocab.decode([1, 3, 4, 2, 3, 3]) == ["a", "b"]


def test_vocab_errors_name_the_problem():
    vocab = Vocab(["gato", "perro"])
    with pytest.raises(ValueError, match=r"unknown word\(s\) \['caballo', 'x'\]"):
        vocab.encode(["gato", "x", "caballo"])
    with pytest.raises(ValueError, match="sequence of words"):
        vocab.encode("gato")
    with pytest.raises(ValueError, match="id 9 is outside"):
        vocab.decode([3, 9])
    with pytest.raises(ValueError, match="must start with"):
        Vocab.from_json('["a", "b"]')


def test_tokenize_lowercases_and_drops_punctuation():
    assert tokenize("You are welcome!") == ["you", "are", "welcome"]
    assert tokenize("  The black cats, sleep. ") == ["the", "black", "cats", "sleep"]
