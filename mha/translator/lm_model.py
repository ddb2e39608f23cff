"""A decoder-only (causal) Transformer language model with a choice of position scheme.

Embedding, a stack of pre-norm :class:`mha.layers.EncoderLayer` whose self-attention
is causal, a final LayerNorm and the output layer. Where the model learns the order of
its tokens is the one thing that varies (:data:`LM_POSITIONS`):

* ``"none"`` (NoPE): nothing but the causal mask. A query at position ``t`` attends to
  ``t + 1`` keys, so the model can still count (a uniform average over the prefix
  shrinks like ``1 / (t + 1)``), but nothing says which key is where;
* ``"sinusoidal"``: the fixed table of "Attention Is All You Need"
  (:func:`mha.positional.sinusoidal_positional_encoding`, ``max_len`` rows) added to
  the embeddings; the model refuses inputs longer than ``max_len``;
* ``"rope"``: queries and keys of every self-attention rotated by their positions
  (``rope_positions``, :func:`mha.positional_torch.apply_rope`);
* ``"alibi"``: ALiBi's causal bias ``-slope_h * (i - j)`` on the scores, with the
  paper's slopes (``score_bias``, :func:`mha.positional_torch.alibi_bias`).

None of the schemes has parameters, so the same seed gives the same weights whatever
the scheme.

Shape legend: B batch, T length, D d_model, H heads, V vocabulary size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mha._checks import check_divisible, check_positive_int, check_rope_head_dim
from mha.layers import EncoderLayer
from mha.positional import sinusoidal_positional_encoding
from mha.positional_torch import alibi_bias
from mha.token_masks import check_token_ids

__all__ = ["LM_POSITIONS", "CausalLM"]

#: The position schemes of :class:`CausalLM`.
LM_POSITIONS = ("none", "sinusoidal", "rope", "alibi")


class CausalLM(nn.Module):
    """Causal Transformer language model over one vocabulary.

    Parameters
    ----------
    vocab_size : int
        V.
    d_model, num_heads, num_layers, d_ff : int
        Width, heads, depth, feed-forward hidden width.
    positions : str
        One of :data:`LM_POSITIONS` (see the module docstring).
    max_len : int
        Rows of the sinusoidal table: the longest input with ``"sinusoidal"`` (the
        other schemes take any length and ignore it).

    Notes
    -----
    As :class:`mha.transformer.Transformer`: embeddings initialised at
    ``N(0, d_model**-0.5)`` and multiplied by ``sqrt(d_model)``, entries of size ~1 like
    the sinusoidal table's.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        d_ff: int = 128,
        positions: str = "none",
        max_len: int = 128,
    ):
        super().__init__()
        vocab_size = check_positive_int(vocab_size, "vocab_size")
        d_model = check_positive_int(d_model, "d_model")
        num_heads = check_positive_int(num_heads, "num_heads")
        num_layers = check_positive_int(num_layers, "num_layers")
        max_len = check_positive_int(max_len, "max_len")
        if not isinstance(positions, str) or positions not in LM_POSITIONS:
            raise ValueError(f"positions must be one of {LM_POSITIONS}, got {positions!r}")
        check_divisible(d_model, num_heads)
        if positions == "rope":
            check_rope_head_dim(d_model, num_heads)
        self.d_model, self.num_heads, self.max_len = d_model, num_heads, max_len
        self.positions = positions
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)
        table = None
        if positions == "sinusoidal":  # data, not a parameter: a buffer
            table = torch.from_numpy(sinusoidal_positional_encoding(max_len, d_model))
            table = table.to(torch.get_default_dtype())
        self.register_buffer("positional_encoding", table, persistent=False)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, norm_first=True) for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(d_model)  # pre-norm leaves the stream un-normalised
        self.output = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: Tensor) -> Tensor:
        """Next-token logits at every position.

        Parameters
        ----------
        tokens : Tensor
            ``(B, T)`` token ids; ``T <= max_len`` with ``"sinusoidal"``.

        Returns
        -------
        Tensor
            ``(B, T, V)``: row ``t`` scores token ``t + 1`` from tokens ``0 .. t``.
        """
        check_token_ids(tokens, "tokens")
        size = tokens.shape[1]
        # 1. Embed: (B, T) -> (B, T, D), plus the table (T, D) for the absolute scheme.
        x = self.embedding(tokens) * math.sqrt(self.d_model)
        if self.positional_encoding is not None:
            if size > self.max_len:
                raise ValueError(
                    f"tokens has length {size} > max_len={self.max_len} (the sinusoidal "
                    f"table's rows), shape {tuple(tokens.shape)}"
                )
            x = x + self.positional_encoding[:size]
        # 2. The causal mask (T, T), True = may attend, and the relative schemes' inputs.
        causal = torch.ones(size, size, dtype=torch.bool, device=tokens.device).tril()
        score_bias = rope_positions = None
        if self.positions == "alibi":
            score_bias = alibi_bias(self.num_heads, size, dtype=x.dtype, device=x.device)
        elif self.positions == "rope":
            rope_positions = torch.arange(size, device=tokens.device)  # (T,)
        # 3. The layers, then the final norm and the output layer.
        for layer in self.layers:
            x, _ = layer(x, causal, score_bias=score_bias, rope_positions=rope_positions)
        return self.output(self.final_norm(x))  # (B, T, D) @ (D, V) -> (B, T, V)
