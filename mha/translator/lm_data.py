"""Documents for the language-model length study: translations read as one sequence.

A sentence pair of :mod:`mha.translator.grammar` becomes one run of tokens, the English
words, ``<sep>``, the Spanish words and ``</s>``::

    the black cat sleeps <sep> el gato negro duerme </s>

and a *document* is ``<s>`` followed by such pairs back to back, cut to the length
asked for (the last pair is usually cut short). A document can so be made as long as
wanted, out of the same sentences: :mod:`mha.translator.lm_lengths` trains on short
ones and evaluates on long ones. One vocabulary (:func:`lm_vocab`) holds both
languages (they share one word, "a": the English article and the Spanish personal
"a" are the same token) and the special tokens.

What can be predicted: the English sentences are random draws of the grammar, so the
model can at best learn their distribution; the Spanish is a function of the English
(:mod:`mha.translator.grammar`: one translation per sentence), so every Spanish word,
and the ``</s>`` after it, is determined by what came before. :attr:`LMData.translation`
marks those targets.

Shape legend: N documents, L tokens a document.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mha._checks import check_positive_int
from mha.translator.grammar import Example, grammar_words, sample_sentence
from mha.translator.vocab import BOS, EOS, Vocab

__all__ = ["SEP", "LMData", "generate_lm_data", "lm_vocab", "pair_tokens", "sample_documents"]

#: Between a sentence and its translation.
SEP = "<sep>"
#: Probability that a noun phrase carries an adjective (as the translator's corpus).
ADJECTIVE_PROB = 0.5


def lm_vocab() -> Vocab:
    """``<pad>``, ``<s>``, ``</s>``, ``<sep>``, the English words, then the Spanish ones
    (the shared "a" once, at its English place): the same ids for every seed."""
    english, spanish = grammar_words()
    return Vocab([SEP, *english, *spanish])


def pair_tokens(example: Example) -> list[str]:
    """``english <sep> spanish </s>``: one sentence pair as tokens."""
    return [*example.source, SEP, *example.target, EOS]


def sample_documents(
    rng: random.Random, num: int, size: int, exclude: frozenset[tuple[str, ...]] = frozenset()
) -> tuple[list[list[str]], set[tuple[str, ...]]]:
    """``num`` documents of exactly ``size`` tokens: ``<s>`` then pairs, the last one cut.

    Parameters
    ----------
    rng : random.Random
        The only source of randomness (draws in a fixed order: seeded, reproducible).
    num, size : int
    exclude : frozenset of tuple of str
        English sentences (word tuples) never to use: a sentence drawn from it is
        drawn again.

    Returns
    -------
    documents : list of list of str
    sentences : set of tuple of str
        Every English sentence that appears in a document, whole or cut.
    """
    num = check_positive_int(num, "num")
    size = check_positive_int(size, "size")
    documents, used = [], set()
    for _ in range(num):
        tokens = [BOS]
        while len(tokens) < size:
            example = sample_sentence(rng, ADJECTIVE_PROB)
            if example.source in exclude:
                continue
            used.add(example.source)
            tokens += pair_tokens(example)
        documents.append(tokens[:size])
    return documents, used


def translation_targets(documents: Iterable[list[str]]) -> list[list[bool]]:
    """For every document, whether each of its tokens after the first is determined by
    the earlier ones: a Spanish word or the ``</s>`` after it (the last marker before it
    is ``<sep>``, not ``<s>`` or ``</s>``)."""
    rows = []
    for tokens in documents:
        row, spanish = [], False
        for token in tokens[:-1]:  # the input token t decides about target t + 1
            if token == SEP:
                spanish = True
            elif token in (BOS, EOS):
                spanish = False
            row.append(spanish)
        rows.append(row)
    return rows


@dataclass(frozen=True)
class LMData:
    """The token ids of one seed's documents, and which targets are translation.

    Attributes
    ----------
    train, valid : Tensor
        ``(N, L + 1)`` int64: documents of ``train_len + 1`` tokens, which a model reads
        as ``train_len`` inputs and ``train_len`` next-token targets (``valid`` is the
        in-length validation set).
    test : Tensor
        ``(N, test_len + 1)`` int64, the long held-out documents.
    valid_translation, test_translation : Tensor
        bool, ``(N, L)``: True where the target (token ``t + 1``) is on the translation
        side (see the module docstring).
    vocab : Vocab
    settings : dict
        The arguments of :func:`generate_lm_data`, and ``seed``.

    No English sentence of ``valid`` or ``test`` occurs in ``train``, whole or cut.
    """

    train: Tensor
    valid: Tensor
    test: Tensor
    valid_translation: Tensor
    test_translation: Tensor
    vocab: Vocab
    settings: dict[str, int] = field(default_factory=dict)


def generate_lm_data(
    seed: int, train_len: int, test_len: int, num_train: int, num_valid: int, num_test: int
) -> LMData:
    """Training, in-length validation and long test documents for one seed.

    Parameters
    ----------
    seed : int
        Seeds the one ``random.Random`` that draws every sentence (train first).
    train_len : int
        L: a training (and validation) document holds L + 1 tokens, L inputs.
    test_len : int
        Inputs of a test document (the study uses 4 L); at least ``train_len``.
    num_train, num_valid, num_test : int
        Documents of each set.
    """
    train_len = check_positive_int(train_len, "train_len")
    test_len = check_positive_int(test_len, "test_len")
    if test_len < train_len:
        raise ValueError(f"test_len={test_len} must be at least train_len={train_len}")
    vocab = lm_vocab()
    rng = random.Random(seed)
    train, seen = sample_documents(rng, num_train, train_len + 1)
    held_out = frozenset(seen)
    valid, _ = sample_documents(rng, num_valid, train_len + 1, exclude=held_out)
    test, _ = sample_documents(rng, num_test, test_len + 1, exclude=held_out)

    def ids(documents: list[list[str]]) -> Tensor:
        return torch.tensor([vocab.encode(d) for d in documents])  # (N, size)

    return LMData(
        train=ids(train),
        valid=ids(valid),
        test=ids(test),
        valid_translation=torch.tensor(translation_targets(valid)),
        test_translation=torch.tensor(translation_targets(test)),
        vocab=vocab,
        settings={"seed": seed, "train_len": train_len, "test_len": test_len,
                  "num_train": num_train, "num_valid": num_valid, "num_test": num_test},
    )  # fmt: skip
