"""The causal_mask and padding_mask exercises: their cases, and models of the usual mistakes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import mha

from ._core import _Case, _Mistake, _mixed_mask

# --------------------------------------------------------------------------- mistake models


def _causal_shifted(offset: int) -> Callable[[int], np.ndarray]:
    def model(size: int) -> np.ndarray:
        return np.tril(np.ones((size, size), dtype=bool), k=offset)

    return model


def _padding_changed(
    lengths_mode: Callable[..., np.ndarray] | None = None,
    tokens_mode: Callable[..., np.ndarray] | None = None,
) -> Callable[..., np.ndarray]:
    """A padding_mask model: correct except in the mode(s) given."""

    def model(
        lengths: Any = None, *, tokens: Any = None, pad_id: Any = None, max_len: Any = None
    ) -> np.ndarray:
        if tokens is None and lengths_mode is not None:
            return lengths_mode(np.asarray(lengths), max_len)
        if tokens is not None and tokens_mode is not None:
            return tokens_mode(np.asarray(tokens), pad_id)
        return mha.padding_mask(lengths, tokens=tokens, pad_id=pad_id, max_len=max_len)

    return model


def _padding_transformed(transform: Callable[[np.ndarray], np.ndarray]) -> Callable:
    def model(lengths: Any = None, **kwargs: Any) -> np.ndarray:
        return transform(mha.padding_mask(lengths, **kwargs))

    return model


def _lengths_one_too_many(lengths: np.ndarray, max_len: int | None) -> np.ndarray:
    width = int(lengths.max()) if max_len is None else max_len
    keep = np.arange(width)[None, :] <= lengths[:, None]  # (1, S) <= (B, 1) -> (B, S)
    return keep[:, None, None, :]


def _lengths_without_max_len(lengths: np.ndarray, max_len: int | None) -> np.ndarray:
    return mha.padding_mask(lengths)


def _tokens_pad_zero(tokens: np.ndarray, pad_id: int) -> np.ndarray:
    return (tokens != 0)[:, None, None, :]


def _tokens_pad_falsy(tokens: np.ndarray, pad_id: int) -> np.ndarray:
    if not pad_id:  # `if pad_id:` takes the padding id 0 for a missing one
        raise ValueError("pad_id must be given with tokens")
    return mha.padding_mask(tokens=tokens, pad_id=pad_id)


# --------------------------------------------------------------------------- diagnoses

_BOOL_MASK = (
    "Right pattern, but not a boolean array: mha's masks are boolean (True = may "
    "attend), and mha refuses masks of any other dtype.",
    "A float mask is ambiguous (1 = keep, or 0 = keep as in additive masks); a boolean one is not.",
)


def _causal_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _causal_shifted(-1),
            "Off by one: the diagonal is False, so a token cannot see itself.",
            "The mask hides the future only: is position t in its own past or future?",
        ),
        _Mistake(
            _causal_shifted(1),
            "Off by one: token t may also see token t + 1, one step ahead.",
            "The mask hides the future only: which keys may query t see?",
        ),
        _Mistake(
            lambda size: ~mha.causal_mask(size),
            "An inverted mask: True marks the blocked (future) positions; in mha, "
            "True = may attend.",
            "Revisit mha's mask convention (True = may attend).",
        ),
        _Mistake(
            lambda size: mha.causal_mask(size).T,
            "The mask is transposed: token t may see itself and the future, not the past.",
            "Rows are queries and columns are keys: which keys may query t see?",
        ),
        _Mistake(lambda size: mha.causal_mask(size).astype(np.float64), *_BOOL_MASK),
        _Mistake(
            lambda size: mha.to_additive_mask(mha.causal_mask(size)),
            "An additive mask (0 and -inf); mha's masks are boolean, True = may attend.",
            "mha converts with to_additive_mask when an additive mask is needed; the "
            "mask itself is boolean.",
        ),
    )


def _padding_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _padding_transformed(np.logical_not),
            "An inverted mask: True marks the padding; in mha, True = a real token that "
            "may be attended to.",
            "Revisit mha's mask convention (True = may attend).",
        ),
        _Mistake(
            _padding_transformed(lambda m: m[:, 0, 0, :]),
            "Shape (B, S): mha's padding mask is (B, 1, 1, S), so that it broadcasts over "
            "the heads and queries of the scores (B, H, T, S).",
            "Revisit how NumPy aligns a (B, S) array with (B, H, T, S): from the right.",
        ),
        _Mistake(
            _padding_changed(lengths_mode=_lengths_one_too_many),
            "Off by one: position lengths[b] is marked as real, one pad too many.",
            "A sequence of length n has real positions 0 .. n - 1.",
        ),
        _Mistake(
            _padding_changed(lengths_mode=_lengths_without_max_len),
            "max_len is ignored: the mask is only as wide as the longest sequence.",
            "The mask must be as wide as the padded batch, S = max_len when it is given.",
        ),
        _Mistake(
            _padding_changed(tokens_mode=_tokens_pad_zero),
            "Padding is recognised by the id 0, whatever pad_id says.",
            "The padding id is an argument: compare the tokens with it.",
        ),
        _Mistake(
            _padding_changed(tokens_mode=_tokens_pad_falsy),
            "Fails for pad_id = 0: a test such as `if pad_id:` (or `pad_id or ...`) "
            "takes the id 0 for a missing pad_id, though 0 is the usual padding id.",
            "Ask whether an argument was given with `is None`: 0 is a value like any "
            "other.",
        ),
        _Mistake(_padding_transformed(lambda m: m.astype(np.float64)), *_BOOL_MASK),
    )


# --------------------------------------------------------------------------- cases


def _causal_cases(rng: np.random.Generator) -> list[_Case]:
    return [_Case(f"size={size}", (size,)) for size in (1, 2, 4, 7)]


def _padding_cases(rng: np.random.Generator) -> list[_Case]:
    tokens = np.array([[5, 7, 2, 0, 0], [3, 0, 0, 0, 0], [1, 2, 3, 4, 6]])
    other_pad = np.array([[4, 1, 6, 1], [1, 1, 2, 3]])
    return [
        _Case("lengths [3, 1, 4]", (np.array([3, 1, 4]),)),
        _Case("lengths [2, 5], max_len=7", (np.array([2, 5]),), {"max_len": 7}),
        _Case("lengths as a list [2, 4, 1]", ([2, 4, 1],)),
        _Case(
            "lengths [0, 3], max_len=3: a sequence with nothing to attend to",
            (np.array([0, 3]),),
            {"max_len": 3},
        ),
        _Case("tokens (3, 5), pad_id=0", (), {"tokens": tokens, "pad_id": 0}),
        _Case("tokens (2, 4), pad_id=1", (), {"tokens": other_pad, "pad_id": 1}),
    ]


# --------------------------------------------------------------------------- to_torch_attn_mask
# Chapter 5's Rosetta stone: mha's mask (True = may attend, (T, S) or (B, 1 or H, T, S))
# to nn.MultiheadAttention's boolean attn_mask (True = blocked, (T, S) or (B*H, T, S)).


def _torch_mask_model(*, invert: bool = True, head_major: bool = False,
                      broadcast: bool = True, additive: bool = False) -> Callable[..., Any]:
    def model(mask: Any, num_heads: int | None = None) -> np.ndarray:
        mask = np.asarray(mask)
        out = ~mask if invert else mask
        if mask.ndim == 4:
            batch, _, target_len, source_len = mask.shape
            if broadcast:
                out = np.broadcast_to(out, (batch, num_heads, target_len, source_len))
            if head_major:
                out = np.swapaxes(out, 0, 1)  # (H, B, T, S): heads outermost
            out = out.reshape(-1, target_len, source_len)
        return np.where(out, -np.inf, 0.0) if additive else out

    return model


def _torch_mask_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _torch_mask_model(invert=False),
            "Not inverted: nn.MultiheadAttention's boolean attn_mask marks the blocked "
            "positions with True, the opposite of mha's True = may attend.",
            "Look at the Rosetta stone's column for nn.MultiheadAttention: what does "
            "True mean there?",
        ),
        _Mistake(
            _torch_mask_model(head_major=True),
            "The (B*H) axis is head-major (all batches of head 0, then head 1, ...); "
            "PyTorch's order is batch-major: entry b*H + h is batch b, head h.",
            "A reshape of (B, H, T, S) to (B*H, T, S) keeps the batch outermost: no "
            "transpose is needed.",
        ),
        _Mistake(
            _torch_mask_model(broadcast=False),
            "A mask shared by the heads, (B, 1, T, S), is not copied to every head: "
            "PyTorch wants one (T, S) slice per batch and head, B*H of them.",
            "np.broadcast_to can repeat the head axis of size 1 to num_heads.",
        ),
        _Mistake(
            _torch_mask_model(additive=True),
            "A float additive mask (0 and -inf); the exercise asks for the boolean "
            "attn_mask, True = blocked.",
            "PyTorch accepts both kinds; the boolean one keeps the conversion exact.",
        ),
    )


def _torch_mask_cases(rng: np.random.Generator) -> list[_Case]:
    def case(mask: np.ndarray, tag: str, num_heads: int | None = None) -> _Case:
        kwargs = {} if num_heads is None else {"num_heads": num_heads}
        label = f"mask {mask.shape}" + (f", num_heads={num_heads}" if num_heads else "")
        return _Case(f"{label}: {tag}", (mask,), kwargs)

    return [
        case(mha.causal_mask(4), "causal (T, S)"),
        case(_mixed_mask(rng, 3, 5), "random (T, S)"),
        case(_mixed_mask(rng, 2, 3, 4, 4), "one mask per head", 3),
        case(_mixed_mask(rng, 3, 1, 2, 5), "shared by the heads", 2),
        case(mha.padding_mask([2, 4], max_len=4) & mha.causal_mask(4), "padding and causal", 3),
    ]


# --------------------------------------------------------------------------- target_mask
# Chapter 7: the translator's decoder self-attention mask, from the token ids.


def _target_mask(tokens: Any, pad_id: int) -> np.ndarray:
    """(B, 1, T, T): query t may read key u iff u <= t and token u is not padding."""
    tokens = np.asarray(tokens)
    causal = mha.causal_mask(tokens.shape[1])  # (T, T)
    return mha.combine_masks(causal, mha.padding_mask(tokens=tokens, pad_id=pad_id))


def _target_model(*, causal: bool = True, padding: str = "keys", diagonal: int = 0,
                  invert: bool = False, squeeze: bool = False,
                  pad_zero: bool = False) -> Callable[..., np.ndarray]:
    def model(tokens: Any, pad_id: int) -> np.ndarray:
        tokens = np.asarray(tokens)
        size = tokens.shape[1]
        real = tokens != (0 if pad_zero else pad_id)  # (B, T)
        mask = np.ones((tokens.shape[0], 1, size, size), dtype=bool)
        if causal:
            mask &= np.tril(np.ones((size, size), dtype=bool), k=diagonal)
        if padding == "keys":
            mask &= real[:, None, None, :]
        elif padding == "queries":
            mask &= real[:, None, :, None]
        mask = ~mask if invert else mask
        return mask[:, 0] if squeeze else mask

    return model


def _target_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _target_model(padding="queries"),
            "The padding is applied along the queries (the mask is transposed for it): "
            "the rows of the pads are blocked, while the real queries can still read "
            "the pads.",
            "Padding hides keys: the pad positions are columns of the mask, "
            "(B, 1, 1, T).",
        ),
        _Mistake(
            _target_model(padding="none"),
            "Only the causal mask: the queries may read the padding.",
            "tgt_in of a short sentence ends in pads: which keys must no query read?",
        ),
        _Mistake(
            _target_model(causal=False),
            "Only the padding mask: the queries may read the future.",
            "In training the decoder sees the whole target: what keeps step t from "
            "reading word t + 1?",
        ),
        _Mistake(
            _target_model(diagonal=-1),
            "Off by one: the diagonal is blocked, so a step cannot read its own token.",
            "Step t reads the tokens 0 .. t, its own included.",
        ),
        _Mistake(
            _target_model(invert=True),
            "An inverted mask: True marks the blocked positions; in mha, True = may "
            "attend.",
            "Revisit mha's mask convention (True = may attend).",
        ),
        _Mistake(
            _target_model(squeeze=True),
            "Shape (B, T, T): the mask needs a head axis, (B, 1, T, T), to broadcast "
            "over the heads of the scores (B, H, T, T).",
            "Revisit how NumPy aligns (B, T, T) with (B, H, T, T): from the right.",
        ),
        _Mistake(
            _target_model(pad_zero=True),
            "Padding is recognised by the id 0, whatever pad_id says.",
            "The padding id is an argument: compare the tokens with it.",
        ),
    )


def _target_cases(rng: np.random.Generator) -> list[_Case]:
    batch = np.array([[1, 5, 7, 2, 0, 0], [1, 3, 2, 0, 0, 0], [1, 4, 4, 6, 5, 2]])
    other_pad = np.array([[1, 6, 6, 3], [1, 3, 3, 3]])
    return [
        _Case("tokens (3, 6), pad_id=0: two padded sentences", (batch, 0)),
        _Case("tokens (2, 4), pad_id=3", (other_pad, 3)),
        _Case("tokens (1, 1), pad_id=0: <s> alone", (np.array([[1]]), 0)),
        _Case("tokens (2, 5), pad_id=0: no padding", (rng.integers(1, 9, size=(2, 5)), 0)),
    ]
