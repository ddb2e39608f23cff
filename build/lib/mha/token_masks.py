"""Attention masks from batches of token ids, in PyTorch, for the Transformer.

Torch versions of :mod:`mha.masks` for ``(B, L)`` token-id tensors, so that a model
builds its masks on the tokens' device without a NumPy round trip. Same convention:
``True`` = may attend.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["source_mask", "target_mask"]


def source_mask(src: Tensor, pad_id: int) -> Tensor:
    """Key-padding mask from token ids: real tokens may be attended to, padding may not.

    Parameters
    ----------
    src : Tensor
        ``(B, S)`` integer token ids.
    pad_id : int
        The id used for padding.

    Returns
    -------
    Tensor
        ``(B, 1, 1, S)`` bool, True where ``src != pad_id``; broadcasts against
        ``(B, H, T, S)``. Equals ``mha.masks.padding_mask(tokens=src, pad_id=pad_id)``.
    """
    check_token_ids(src, "src")
    return (src != pad_id)[:, None, None, :]  # (B, S) -> (B, 1, 1, S)


def target_mask(tgt_in: Tensor, pad_id: int) -> Tensor:
    """Decoder self-attention mask: causal AND target padding.

    Parameters
    ----------
    tgt_in : Tensor
        ``(B, T)`` integer decoder input ids.
    pad_id : int
        The id used for padding.

    Returns
    -------
    Tensor
        ``(B, 1, T, T)`` bool: query ``t`` may attend to key ``u`` iff ``u <= t`` and
        ``tgt_in[:, u] != pad_id``. Equals ``mha.masks.combine_masks(causal_mask(T),
        padding_mask(tokens=tgt_in, pad_id=pad_id))``.
    """
    check_token_ids(tgt_in, "tgt_in")
    size = tgt_in.shape[1]
    causal = torch.ones(size, size, dtype=torch.bool, device=tgt_in.device).tril()  # (T, T)
    padding = (tgt_in != pad_id)[:, None, None, :]  # (B, T) -> (B, 1, 1, T)
    return padding & causal  # (B, 1, 1, T) & (T, T) -> (B, 1, T, T)


def check_token_ids(tokens: Tensor, name: str) -> None:
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name} must be a (B, L) tensor of token ids, got shape {shape}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
