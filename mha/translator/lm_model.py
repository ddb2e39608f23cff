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
  paper's slopes (``score_bias``, :func:`mha.positional_torch.alibi_bias`);
* ``"t5"``: T5's learned bias, one value per head and bucket of distance (causal
  buckets), from one table shared by all layers (``score_bias``,
  :func:`mha.positional_torch.t5_relative_bias`).

Only ``"t5"`` has parameters, its table, built after every other weight: the same seed
gives the same weights whatever the scheme, the table aside.

Past the training length, without retraining: :meth:`CausalLM.forward` takes a RoPE
scaling (``rope_scaling=``, from :mod:`mha.rope_scaling_torch`) and a sliding window
with attention sinks (``window=``, ``num_sinks=``,
:func:`mha.masks_torch.sliding_window_mask`). The window is a mask on the full pass:
every token keeps its position, as in a cache that evicts keys but not positions.

Shape legend: B batch, T length, D d_model, H heads, V vocabulary size.
"""

from __future__ import annotations

from torch import Tensor, nn

from mha._checks import check_positive_int
from mha.layers import EncoderLayer
from mha.masks_torch import causal_mask, sliding_window_mask
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
        self._new_t5_tables(causal=True, bidirectional=False)  # last: see the module

    def forward(
        self,
        tokens: Tensor,
        *,
        rope_scaling: tuple[Tensor, float] | None = None,
        window: int | None = None,
        num_sinks: int = 0,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Next-token logits at every position. Options after ``tokens`` by keyword;
        the defaults are the model as trained.

        Parameters
        ----------
        tokens : Tensor
            ``(B, T)`` token ids; ``T <= max_len`` with ``"sinusoidal"``.
        rope_scaling : (Tensor, float), optional
            ``"rope"`` only: ``(inv_freq, attention_factor)``, e.g.
            ``mha.rope_scaling_torch.rope_yarn(head_dim, s, L)``, in every layer in
            place of RoPE's trained frequencies, the scores multiplied by the factor
            squared (see :meth:`mha.modules.MultiHeadAttention.forward`).
        window : int, optional
            Each query attends to the ``window`` positions ending at itself (and the
            sinks) instead of to its whole prefix.
        num_sinks : int
            With ``window``: the first ``num_sinks`` positions stay visible to every
            query (attention sinks, Xiao et al. 2024).
        need_weights : bool
            Also return every layer's attention weights.

        Returns
        -------
        Tensor
            ``(B, T, V)``: row ``t`` scores token ``t + 1`` from tokens ``0 .. t``.
        weights : list of Tensor
            With ``need_weights``: one ``(B, H, T, T)`` per layer, first layer first.
        """
        if rope_scaling is not None and self.position_scheme != "rope":
            raise ValueError(
                f"rope_scaling needs position_scheme 'rope', got {self.position_scheme!r}"
            )
        if window is None and num_sinks != 0:
            raise ValueError(f"num_sinks={num_sinks!r} needs a window (window=None)")
        # 1. Embed: (B, T) -> (B, T, D), plus the table (T, D) for the absolute scheme.
        x = self._embed(tokens, self.embedding, "tokens")
        size = tokens.shape[1]
        # 2. The mask (T, T), True = may attend: causal, or a causal window with sinks;
        #    and the relative schemes' inputs.
        if window is None:
            mask = causal_mask(size, device=tokens.device)
        else:
            mask = sliding_window_mask(size, window, num_sinks=num_sinks, device=tokens.device)
        score_bias, rope_positions = self._position_inputs(size, size, causal=True, x=x)
        options = {"score_bias": score_bias, "rope_positions": rope_positions,
                   "rope_scaling": rope_scaling, "need_weights": need_weights}  # fmt: skip
        # 3. The layers, then the final norm and the output layer.
        weights = []
        for layer in self.layers:
            x, w = layer(x, mask, **options)  # w: (B, H, T, T) or None
            weights.append(w)
        logits = self.output(self.final_norm(x))  # (B, T, D) @ (D, V) -> (B, T, V)
        return (logits, weights) if need_weights else logits
