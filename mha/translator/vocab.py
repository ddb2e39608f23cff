"""The translator's vocabularies: words <-> ids (:class:`Vocab`), and :func:`tokenize`.

A :class:`Vocab` maps each word of one language to a row of the model's embedding and
back; the corpus builds one per language from every word its grammar can produce (see
:func:`mha.translator.grammar.grammar_words`), and a checkpoint stores both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

__all__ = ["BOS", "EOS", "PAD", "Vocab", "tokenize"]

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


class Vocab:
    """Word <-> id table with ``<pad>`` = 0, ``<s>`` = 1, ``</s>`` = 2.

    There is no unknown-word token on purpose: a word outside the vocabulary raises a
    ``ValueError`` that names it, instead of being silently mapped to ``<unk>``.
    """

    pad_id = 0
    bos_id = 1
    eos_id = 2

    def __init__(self, words: Iterable[str]) -> None:
        tokens = [PAD, BOS, EOS]
        for w in words:
            if w not in tokens:
                tokens.append(w)
        self.tokens: list[str] = tokens
        self.index: dict[str, int] = {w: i for i, w in enumerate(tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, word: object) -> bool:
        return word in self.index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.tokens == other.tokens

    __hash__ = None  # type: ignore[assignment]  # mutable-looking; compare by tokens

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens)"

    def encode(
        self, words: Sequence[str], add_bos: bool = False, add_eos: bool = False
    ) -> list[int]:
        """Map words to ids, optionally framed by ``<s>`` / ``</s>``.

        Raises
        ------
        ValueError
            If any word is not in the vocabulary (all unknown words are named).
        """
        if isinstance(words, str):
            raise ValueError(f"words must be a sequence of words, got the string {words!r}")
        unknown = [w for w in words if w not in self.index]
        if unknown:
            raise ValueError(
                f"unknown word(s) {sorted(set(unknown))}; the vocabulary has {len(self)} "
                f"words, e.g. {self.tokens[3:8]}"
            )
        ids = [self.index[w] for w in words]
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Map ids back to words: skip ``<pad>`` and ``<s>``, stop at the first ``</s>``.

        Raises
        ------
        ValueError
            If an id is outside ``[0, len(vocab))``.
        """
        words = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.tokens):
                raise ValueError(f"id {i} is outside the vocabulary [0, {len(self.tokens)})")
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.bos_id):
                words.append(self.tokens[i])
        return words

    def to_json(self) -> str:
        return json.dumps(self.tokens, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Vocab:
        tokens = json.loads(text)
        if tokens[:3] != [PAD, BOS, EOS]:
            raise ValueError(f"a vocabulary must start with {[PAD, BOS, EOS]}, got {tokens[:3]}")
        return cls(tokens[3:])


def tokenize(text: str) -> list[str]:
    """Lower-case ``text``, drop punctuation and split on white space."""
    return re.sub(r"[.,;:!?¡¿\"]", " ", text.lower()).split()
