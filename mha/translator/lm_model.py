"""A decoder-only (causal) Transformer language model with a choice of position scheme.

Embedding, a stack of pre-norm :class:`mha.layers.EncoderLayer` whose self-attention
is causal, a final LayerNorm and the output layer. The embeddings and the position
scheme are :class:`mha.transformer.TokenModel`'s, as in the translator's Transformer;
where the model learns the order of its tokens is the one thing that varies between
the arms of the length study (:data:`mha.transformer.POSITION_SCHEMES`; in a causal model
``"alibi_directional"`` is plain ALiBi, since no attention looks both ways):

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

from torch import Tensor, nn

from mha._checks import check_positive_int
from mha.layers import EncoderLayer
from mha.masks_torch import causal_mask
from mha.transformer import TokenModel

__all__ = ["CausalLM"]


class CausalLM(TokenModel):
    """Causal Transformer language model over one vocabulary.

    Parameters
    ----------
    vocab_size : int
        V.
    d_model, num_heads, num_layers, d_ff : int
        Width, heads, depth, feed-forward hidden width.
    position_scheme : str
        One of :data:`mha.transformer.POSITION_SCHEMES` (see the module docstring).
    max_len : int
        Rows of the sinusoidal table: the longest input with ``"sinusoidal"`` (the
        other schemes take any length and ignore it).

    Notes
    -----
    Embeddings as :class:`mha.transformer.TokenModel`'s: initialised at
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
        position_scheme: str = "none",
        max_len: int = 128,
    ):
        vocab_size = check_positive_int(vocab_size, "vocab_size")
        num_layers = check_positive_int(num_layers, "num_layers")
        super().__init__(d_model, num_heads, max_len, position_scheme)
        (self.embedding,) = self._new_embeddings(vocab_size)
        self.layers = nn.ModuleList(
            EncoderLayer(self.d_model, self.num_heads, d_ff, norm_first=True)
            for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(self.d_model)  # pre-norm leaves the stream un-normalised
        self.output = nn.Linear(self.d_model, vocab_size)

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
        # 1. Embed: (B, T) -> (B, T, D), plus the table (T, D) for the absolute scheme.
        x = self._embed(tokens, self.embedding, "tokens")
        size = tokens.shape[1]
        # 2. The causal mask (T, T), True = may attend, and the relative schemes' inputs.
        causal = causal_mask(size, device=tokens.device)
        score_bias, rope_positions = self._position_inputs(size, size, causal=True, x=x)
        # 3. The layers, then the final norm and the output layer.
        for layer in self.layers:
            x, _ = layer(x, causal, score_bias=score_bias, rope_positions=rope_positions)
        return self.output(self.final_norm(x))  # (B, T, D) @ (D, V) -> (B, T, V)
