"""Documents for a task that needs a token far back: passkey retrieval in translations.

The length study's documents (:mod:`mha.translator.lm_data`) never need anything far
back: a Spanish word depends on its own English sentence, at most 17 tokens earlier. A
model that keeps predicting well past its training length has shown it survives long
inputs, not that it uses them. Here one extra pair of tokens makes a target depend on a
token at a chosen distance. Into the usual stream of sentence pairs go, between two
pairs, a *passkey* (one of :data:`KEYS`, drawn at random) and, later, the question
``<ask>``, whose next token is the passkey again::

    <s> the cat sleeps <sep> el gato duerme </s> k7 a dog runs <sep> ... </s> <ask> k7 ...

The key tokens occur nowhere else, so a model can answer by finding the one key token
in its context and copying it: a lookup by content, which the position scheme can still
help or hinder on the way. Mohtashami and Jaggi (2023) built the test (a number hidden
in filler text); Chen et al. (2023) used it to measure how far a RoPE model extended
past its training length really reads.

Training documents hold ``L + 1`` tokens, the key and the question at random boundaries
between pairs with at least one pair between them, so a training distance (question
position minus key position) lies between the shortest pair's length and ``L - 2``.
Test documents are long (8 L in the study) with the question at the last boundary
before their end (within one pair of it) and the key at the boundary whose distance
lies in ``[d, d + SLACK]`` for a chosen ``d``: the answer needs a token ``d`` or more
positions back, asked from about the same far position in every test.

Shape legend: N documents, L tokens a document.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

from mha._checks import check_positive_int
from mha.translator.grammar import grammar_words, sample_sentence
from mha.translator.lm_data import ADJECTIVE_PROB, SEP, pair_tokens, translation_targets
from mha.translator.vocab import BOS, Vocab

__all__ = [
    "ASK",
    "KEYS",
    "SLACK",
    "PasskeyData",
    "generate_passkey_data",
    "passkey_document",
    "passkey_vocab",
]

#: The question: its next token is the passkey.
ASK = "<ask>"
#: The passkeys, tokens used for nothing else.
KEYS = tuple(f"<key{i}>" for i in range(10))
#: A test key sits ``d`` to ``d + SLACK`` positions before the question.
SLACK = 6


def passkey_vocab() -> Vocab:
    """:func:`mha.translator.lm_data.lm_vocab`'s tokens, then ``<ask>`` and the keys."""
    english, spanish = grammar_words()
    return Vocab([SEP, *english, *spanish, ASK, *KEYS])


def _pairs(rng: random.Random, size: int, exclude: frozenset) -> tuple[list[list[str]], set]:
    """Sentence pairs (as token lists) until they hold at least ``size`` tokens."""
    pairs, used, total = [], set(), 0
    while total < size:
        example = sample_sentence(rng, ADJECTIVE_PROB)
        if example.source in exclude:
            continue
        used.add(example.source)
        pairs.append(pair_tokens(example))
        total += len(pairs[-1])
    return pairs, used


def passkey_document(
    rng: random.Random,
    size: int,
    distance: int | None = None,
    exclude: frozenset[tuple[str, ...]] = frozenset(),
) -> tuple[list[str], int, int, set[tuple[str, ...]]]:
    """One document of exactly ``size`` tokens with a passkey and its question.

    Parameters
    ----------
    rng : random.Random
        The only source of randomness.
    size : int
        Tokens, at least 4.
    distance : int, optional
        None: key and question at random boundaries between pairs (training). Else: the
        question at the last boundary where it and its answer fit, and the key at a
        boundary ``distance`` to ``distance + SLACK`` positions before it (the pairs are
        drawn again until there is one).
    exclude : frozenset of tuple of str
        English sentences never to use.

    Returns
    -------
    tokens : list of str
    ask : int
        The question's index: the model reads it there and predicts the key next.
    key : int
        The key's index (``ask - key`` is the distance).
    sentences : set of tuple of str
        The English sentences used.
    """
    size = check_positive_int(size, "size")
    if size < 4:
        raise ValueError(f"size must be at least 4 (<s>, key, question, answer), got {size}")
    if distance is not None:
        distance = check_positive_int(distance, "distance")
        if distance + 3 > size:
            raise ValueError(f"distance={distance} does not fit a document of {size} tokens")
    passkey = rng.choice(KEYS)
    while True:
        pairs, used = _pairs(rng, size, exclude)
        starts, position = [], 1  # where each pair begins after <s>
        for pair in pairs:
            starts.append(position)
            position += len(pair)
        # The key moves every later token on by one; the question (index ask_at) and its
        # answer must fit in the document.
        if distance is None:
            later = [s for s in starts[1:] if s <= size - 3]  # at least one pair between
            if not later:
                continue
            ask_at = rng.choice(later) + 1
            key_at = rng.choice([s for s in starts if s < ask_at - 1])
            break
        ask_at = max(s for s in starts if s <= size - 3) + 1
        near = [s for s in starts if distance <= ask_at - s <= distance + SLACK]
        if near:
            key_at = near[0]
            break
    tokens = [BOS] + [t for pair in pairs for t in pair]
    tokens.insert(key_at, passkey)
    tokens[ask_at:ask_at] = [ASK, passkey]
    tokens = tokens[:size]
    return tokens, ask_at, key_at, used


@dataclass(frozen=True)
class PasskeyData:
    """One seed's passkey documents.

    Attributes
    ----------
    train, valid : Tensor
        ``(N, L + 1)`` int64, key and question at random boundaries.
    valid_ask : Tensor
        ``(N,)`` the question's index in each validation document.
    valid_translation : Tensor
        ``(N, L)`` bool, the translation targets (for the training loop's measures).
    test : dict of int to Tensor
        For each asked distance ``d``: ``(n, test_len + 1)`` documents ending with the
        question and its answer.
    test_ask : dict of int to Tensor
        ``(n,)`` the question's index in each test document.
    test_distance : dict of int to Tensor
        ``(n,)`` the actual distances (``d`` to ``d + SLACK``).
    vocab : Vocab
    settings : dict
    """

    train: Tensor
    valid: Tensor
    valid_ask: Tensor
    valid_translation: Tensor
    test: dict[int, Tensor]
    test_ask: dict[int, Tensor]
    test_distance: dict[int, Tensor]
    vocab: Vocab
    settings: dict


def generate_passkey_data(
    seed: int,
    train_len: int,
    test_len: int,
    distances: tuple[int, ...],
    num_train: int,
    num_valid: int,
    num_per_distance: int,
) -> PasskeyData:
    """Training, validation and long test documents for one seed; no English sentence
    of the validation or test documents occurs in training."""
    vocab = passkey_vocab()
    rng = random.Random(seed)
    train, seen = [], set()
    for _ in range(num_train):
        tokens, _, _, used = passkey_document(rng, train_len + 1)
        train.append(tokens)
        seen |= used
    held_out = frozenset(seen)
    valid, asks = [], []
    for _ in range(num_valid):
        tokens, ask, _, _ = passkey_document(rng, train_len + 1, exclude=held_out)
        valid.append(tokens)
        asks.append(ask)
    test, test_ask, test_distance = {}, {}, {}
    for d in distances:
        docs = [passkey_document(rng, test_len + 1, d, held_out) for _ in range(num_per_distance)]
        test[d] = torch.tensor([vocab.encode(t) for t, *_ in docs])  # (n, test_len + 1)
        test_ask[d] = torch.tensor([ask for _, ask, _, _ in docs])  # (n,)
        test_distance[d] = torch.tensor([ask - key for _, ask, key, _ in docs])  # (n,)
    return PasskeyData(
        train=torch.tensor([vocab.encode(t) for t in train]),
        valid=torch.tensor([vocab.encode(t) for t in valid]),
        valid_ask=torch.tensor(asks),
        valid_translation=torch.tensor(translation_targets(valid)),
        test=test,
        test_ask=test_ask,
        test_distance=test_distance,
        vocab=vocab,
        settings={"seed": seed, "train_len": train_len, "test_len": test_len,
                  "distances": list(distances), "num_train": num_train,
                  "num_valid": num_valid, "num_per_distance": num_per_distance},
    )  # fmt: skip
