"""Attention masks in PyTorch: the torch twin of :mod:`mha.masks`, for the models.

The causal mask, the sliding window (with attention sinks), and the masks of ``(B, L)``
token-id tensors, so that a model builds
its masks on the tokens' device without a NumPy round trip. Same convention: ``True`` =
may attend. Written again here, not imported: the tests compare the two.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mha._checks import check_non_negative_int, check_positive_int, check_queries_and_keys

__all__ = ["causal_mask", "check_token_ids", "sliding_window_mask", "source_mask", "target_mask"]


def causal_mask(
    size: int, num_keys: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    """Causal mask, as ``mha.causal_mask``: query ``t`` may attend to the keys up to it.

    Parameters
    ----------
    size : int
        ``T``, the number of queries.
    num_keys : int, optional
        ``S >= T`` when the queries are the last ``T`` of ``S`` positions. Default ``T``.
    device : torch.device or str, optional

    Returns
    -------
    Tensor
        ``(T, S)`` bool, the diagonal aligned to the bottom right; broadcasts against
        ``(B, H, T, S)``.
    """
    size, num_keys = check_queries_and_keys(size, num_keys)
    ones = torch.ones(size, num_keys, dtype=torch.bool, device=device)  # (T, S)
    return ones.tril(diagonal=num_keys - size)


def sliding_window_mask(
    size: int,
    window: int,
    num_keys: int | None = None,
    *,
    num_sinks: int = 0,
    device: torch.device | str | None = None,
) -> Tensor:
    """Sliding-window mask with optional attention sinks, as ``mha.sliding_window_mask``:
    query ``t`` (at position ``S - T + t``) may attend to the ``window`` positions ending
    at itself, and to the first ``num_sinks`` positions up to itself.

    Returns
    -------
    Tensor
        ``(T, S)`` bool, aligned to the bottom right; broadcasts against ``(B, H, T, S)``.
    """
    size, num_keys = check_queries_and_keys(size, num_keys)
    window = check_positive_int(window, "window")
    num_sinks = check_non_negative_int(num_sinks, "num_sinks")
    queries = torch.arange(num_keys - size, num_keys, device=device)  # (T,)
    keys = torch.arange(num_keys, device=device)  # (S,)
    behind = queries[:, None] - keys[None, :]  # (T, 1) - (1, S) -> (T, S): how far back
    in_band = (behind >= 0) & (behind < window)  # (T, S)
    sink = (keys < num_sinks)[None, :] & (behind >= 0)  # (1, S) & (T, S) -> (T, S)
    return in_band | sink


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
    causal = causal_mask(tgt_in.shape[1], device=tgt_in.device)  # (T, T)
    padding = (tgt_in != pad_id)[:, None, None, :]  # (B, T) -> (B, 1, 1, T)
    return padding & causal  # (B, 1, 1, T) & (T, T) -> (B, 1, T, T)


def check_token_ids(tokens: Tensor, name: str) -> None:
    """Refuse anything but a ``(B, L)`` integer tensor of token ids, naming it ``name``."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name} must be a (B, L) tensor of token ids, got shape {shape}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
