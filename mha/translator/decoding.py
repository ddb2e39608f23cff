"""Greedy decoding and the :class:`Translator`: a trained model with its vocabularies."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from mha.threads import num_threads
from mha.transformer import AttentionMaps, Transformer
from mha.translator.grammar import FIXED_PHRASES
from mha.translator.vocab import Vocab, tokenize

__all__ = ["Translator", "greedy_decode", "greedy_margins"]


@contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run in eval mode (no dropout), then give every submodule back its own mode."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    max_new_tokens: int | None = None,
    use_cache: bool = True,
    return_logits: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Translate a batch by always taking the most likely next token.

    The source is encoded once. With the KV cache (the default) each step runs the
    decoder on the newest position only: the keys and values of the earlier positions
    are cached, and the memory is projected once; without it the decoder is re-run on
    the whole growing prefix. Both give the same tokens, unless two candidates are
    within rounding of each other (see :func:`greedy_margins`). A row is finished once it
    emits ``eos_id``; decoding stops when every row is finished or after
    ``max_new_tokens`` tokens.

    Parameters
    ----------
    model : Transformer
    src : Tensor
        ``(B, S)`` source ids, padded with ``model.pad_id``.
    bos_id, eos_id : int
        Start and end token ids of the target vocabulary.
    max_new_tokens : int, optional
        Length limit (end token included); default and maximum ``model.max_len - 1``,
        the longest prefix the positional table allows after ``<s>``.
    use_cache : bool
        Decode with a KV cache (see :meth:`mha.transformer.Transformer.decode`).
    return_logits : bool
        Also return the logits each step chose from.

    Returns
    -------
    ids : Tensor
        ``(B, L)`` generated ids without ``<s>``, ``L <= max_new_tokens``. Each row ends
        at its first ``eos_id``; positions after it hold ``model.pad_id``.
    logits : Tensor
        ``(B, L, V)``, only with ``return_logits``: step ``t``'s next-token scores,
        whose argmax is ``ids[:, t]`` until the row ends (see :func:`greedy_margins`).
    """
    limit = model.max_len - 1
    if max_new_tokens is None:
        max_new_tokens = limit
    if not 1 <= max_new_tokens <= limit:
        raise ValueError(f"max_new_tokens must be in [1, {limit}], got {max_new_tokens}")
    with _eval_mode(model):
        return _greedy(model, src, bos_id, eos_id, max_new_tokens, use_cache, return_logits)


def _greedy(
    model: Transformer,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    max_new_tokens: int,
    use_cache: bool,
    return_logits: bool,
) -> Tensor | tuple[Tensor, Tensor]:
    memory, _ = model.encode(src)  # (B, S) -> (B, S, D)
    batch = src.shape[0]
    out = torch.full((batch, 1), bos_id, dtype=torch.long)  # (B, 1): the <s> prefix
    done = torch.zeros(batch, dtype=torch.bool)
    cache = model.new_cache() if use_cache else None
    steps = []
    for _ in range(max_new_tokens):
        # (B, t) -> (B, t, V), or (B, 1, V) for the newest position with the cache
        logits, _, _ = model.decode(out, memory, src, cache=cache)
        steps.append(logits[:, -1])  # (B, V)
        nxt = logits[:, -1].argmax(dim=-1)  # (B, V) -> (B,)
        nxt = nxt.masked_fill(done, model.pad_id)  # finished rows only pad
        out = torch.cat([out, nxt[:, None]], dim=1)  # (B, t) -> (B, t + 1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
    if return_logits:
        return out[:, 1:], torch.stack(steps, dim=1)  # L x (B, V) -> (B, L, V)
    return out[:, 1:]


def greedy_margins(ids: Tensor, logits: Tensor, eos_id: int) -> Tensor:
    """How clearly greedy decoding made each choice: the chosen token's logit minus
    the runner-up's.

    Two computations of the same logits (with and without the KV cache, or on two
    CPUs) differ in their last bits; they choose the same tokens as long as every
    margin is larger than twice that difference. A near-tie is a margin close to it.

    Parameters
    ----------
    ids, logits : Tensor
        ``(B, L)`` and ``(B, L, V)``, as returned by
        ``greedy_decode(..., return_logits=True)``.
    eos_id : int
        End token: after a row's first ``eos_id`` nothing is chosen.

    Returns
    -------
    Tensor
        ``(B, L)`` margins, ``inf`` after each row's end token.
    """
    top2 = logits.topk(2, dim=-1).values  # (B, L, V) -> (B, L, 2)
    margins = top2[..., 0] - top2[..., 1]  # (B, L)
    is_end = (ids == eos_id).long()  # (B, L)
    ended = is_end.cumsum(dim=1) - is_end > 0  # an end token at an earlier step
    return margins.masked_fill(ended, float("inf"))


# The only one-word sentences of the corpus ("hello", "please", ...).
_ONE_WORD = {en for en, _ in FIXED_PHRASES if len(en.split()) == 1}


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, L)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


@dataclass
class Translator:
    """A trained model with its two vocabularies.

    Attributes
    ----------
    model : Transformer
    src_vocab, tgt_vocab : Vocab
    """

    model: Transformer
    src_vocab: Vocab
    tgt_vocab: Vocab

    @property
    def max_source_len(self) -> int:
        """Longest source sentence (in words) the positional table can hold."""
        return self.model.max_len

    def source_ids(self, sentences: Sequence[str | Sequence[str]]) -> Tensor:
        """``(B, S)`` source token ids of the sentences, padded with ``pad_id``: the
        ``src`` that :func:`greedy_decode` and the model take. Errors as in
        :meth:`translate`."""
        rows = []
        for k, sentence in enumerate(sentences):
            words = tokenize(sentence) if isinstance(sentence, str) else list(sentence)
            if not words:
                raise ValueError(f"sentence {k} is empty: {sentence!r}; give at least one word")
            if len(words) > self.max_source_len:
                raise ValueError(
                    f"sentence {k} has {len(words)} words, more than the model's "
                    f"max_len={self.max_source_len}: {' '.join(words[:8])} ..."
                )
            try:
                rows.append(self.src_vocab.encode(words))
            except ValueError as err:
                raise ValueError(f"sentence {k} ({' '.join(words)!r}): {err}") from None
        return _pad(rows, self.src_vocab.pad_id)

    def translate(
        self, sentences: str | Sequence[str | Sequence[str]], max_new_tokens: int | None = None
    ) -> str | list[str]:
        """Translate one English sentence (a ``str``) or a list of them.

        Input is lower-cased and punctuation is dropped ("You are welcome." works).

        Parameters
        ----------
        sentences : str or sequence
            One sentence, or a list whose items are sentences (``str``) or lists of
            words. A list is decoded as one padded batch.
        max_new_tokens : int, optional
            Length limit of each translation, see :func:`greedy_decode`.

        Returns
        -------
        str or list of str
            The Spanish translation(s), words joined by spaces, without ``</s>``.

        Raises
        ------
        ValueError
            For an empty sentence or list, a word outside the vocabulary (named), a
            sentence longer than ``max_source_len`` words, or a list of single words
            (most likely one sentence split by mistake).
        """
        single = isinstance(sentences, str)
        batch = [sentences] if single else list(sentences)
        if not batch:
            raise ValueError("sentences is an empty list; give at least one sentence")
        one_word = [s for s in batch if isinstance(s, str) and len(s.split()) == 1]
        if len(batch) > 1 and len(one_word) == len(batch) and not set(one_word) <= _ONE_WORD:
            # ["the", "cat"] would silently translate each word as a sentence of its own.
            raise ValueError(
                f"sentences {batch[:6]!r} looks like one sentence split into words; pass "
                "it as one string, or as a list of word lists: [['the', 'cat', ...]]"
            )
        src = self.source_ids(batch)  # (B, S)
        with num_threads(1):
            ids = greedy_decode(
                self.model, src, self.tgt_vocab.bos_id, self.tgt_vocab.eos_id, max_new_tokens
            )  # (B, L)
        out = [" ".join(self.tgt_vocab.decode(row.tolist())) for row in ids]
        return out[0] if single else out

    def attention(
        self, sentence: str, target: str | None = None
    ) -> tuple[list[str], list[str], AttentionMaps]:
        """Attention weights of every head while producing a translation.

        The decoder is run once with teacher forcing on ``<s> + target`` (the model's own
        greedy translation if ``target`` is None), which gives the same weights as the
        last step of greedy decoding.

        Returns
        -------
        source_words : list of str
            Length S.
        target_words : list of str
            The decoder *input* tokens, ``["<s>", ...]``, length T. Query row ``t`` of
            the decoder attentions is the step that writes ``target_words[t + 1]``
            (the last row writes ``</s>``).
        maps : AttentionMaps
            ``encoder`` (1, H, S, S), ``decoder_self`` (1, H, T, T), ``cross`` (1, H, T, S)
            per layer, detached.
        """
        src = self.source_ids([sentence])  # (1, S)
        if target is None:
            target = str(self.translate(sentence))
        tgt_words = tokenize(target)
        tgt_in = torch.tensor([self.tgt_vocab.encode(tgt_words, add_bos=True)])  # (1, T)
        with torch.no_grad(), _eval_mode(self.model):
            _, maps = self.model(src, tgt_in, need_weights=True)
        return tokenize(sentence), ["<s>", *tgt_words], maps
