"""The encoder-decoder Transformer of "Attention Is All You Need".

The whole model: embeddings, the position scheme, the encoder and decoder stacks of
:mod:`mha.layers`, and the output layer, with a KV cache for decoding. Positions are
the paper's sinusoidal table (read from the specification's :mod:`mha.positional`:
the one place a torch module imports the specification, for data, not for the
attention under test) or RoPE, ALiBi or T5's learned bias inside self-attention
(:mod:`mha.positional_torch`). The tests check it against PyTorch's
``nn.Transformer`` with copied weights (see :mod:`mha.convert`).

Shape legend: B batch, H heads, T target length, S source length, D d_model,
V vocabulary size. Masks: boolean, ``True`` = may attend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mha._checks import (
    check_divisible,
    check_non_negative_int,
    check_positive_int,
    check_rope_head_dim,
)
from mha.kv_cache_torch import KVCache
from mha.layers import DecoderLayer, EncoderLayer
from mha.masks_torch import check_token_ids, source_mask, target_mask
from mha.positional import sinusoidal_positional_encoding
from mha.positional_torch import alibi_bias, alibi_bias_directional, t5_relative_bias

__all__ = [
    "POSITION_SCHEMES", "T5_MAX_DISTANCE", "T5_NUM_BUCKETS", "AttentionMaps", "TokenModel",
    "Transformer",
]


#: Where a model learns the order of its tokens: the ``position_scheme`` argument of every
#: :class:`TokenModel` (the :class:`Transformer`, the translator's causal LM).
POSITION_SCHEMES = ("none", "sinusoidal", "rope", "alibi", "alibi_directional", "t5")

#: T5's bucket layout for ``"t5"``: its published defaults (``relative_attention_num_buckets``,
#: ``relative_attention_max_distance``), one bucket per distance below 8 (16 causal), then
#: logarithmic buckets, the last one holding every distance from about 128 on.
T5_NUM_BUCKETS, T5_MAX_DISTANCE = 32, 128


@dataclass
class AttentionMaps:
    """Attention weights of every layer of a :class:`Transformer`, one tensor per layer.

    Attributes
    ----------
    encoder : list of Tensor
        ``(B, H, S, S)`` encoder self-attention.
    decoder_self : list of Tensor
        ``(B, H, T, T)`` masked decoder self-attention.
    cross : list of Tensor
        ``(B, H, T, S)`` decoder-to-encoder attention.
    """

    encoder: list[Tensor]
    decoder_self: list[Tensor]
    cross: list[Tensor]


class TokenModel(nn.Module):
    """What every model here shares: token embeddings and one position scheme.

    A base class: :class:`Transformer` and ``mha.translator.lm_model.CausalLM`` extend
    it with their layers. It checks the shared arguments, builds the embeddings
    (:meth:`_new_embeddings`), embeds a batch of token ids (:meth:`_embed`) and gives a
    self-attention its position inputs (:meth:`_position_inputs`).

    Parameters
    ----------
    d_model, num_heads : int
        Width and heads of every attention (``d_model`` divisible by ``num_heads``).
    max_len : int
        Rows of the sinusoidal table: with ``"sinusoidal"`` the longest input; the
        other schemes take any length.
    position_scheme : str
        One of :data:`POSITION_SCHEMES`:
        ``"none"`` (NoPE: no position information but what a causal mask gives),
        ``"sinusoidal"`` (the paper: a fixed table added to the embeddings),
        ``"rope"`` (RoPE: the queries and keys of every self-attention rotated by their
        positions, :func:`mha.positional_torch.apply_rope`; needs an even head_dim),
        ``"alibi"`` (ALiBi: ``-slope * distance`` added to the self-attention scores,
        :func:`mha.positional_torch.alibi_bias`, symmetric where attention looks both
        ways and causal where it is causal) or ``"alibi_directional"`` (the same, but
        attention that looks both ways gets different slopes to the left and to the
        right, :func:`mha.positional_torch.alibi_bias_directional`, so it tells a
        sentence from its mirror image; causal attention gets plain ALiBi) or ``"t5"``
        (T5's learned bias: a table of one value per bucket of distance and head,
        :func:`mha.positional_torch.t5_relative_bias`, added to the self-attention
        scores like ALiBi's; causal buckets where attention is causal, bidirectional
        ones where it looks both ways; :data:`T5_NUM_BUCKETS` and
        :data:`T5_MAX_DISTANCE`, T5's defaults). Only ``"sinusoidal"`` touches the
        embeddings; cross-attention never gets position
        information (its queries and keys come from two different sequences).

    Notes
    -----
    Embeddings are multiplied by ``sqrt(d_model)`` (as in the paper) and initialised with
    standard deviation ``d_model**-0.5``, so the scaled embedding has entries of size ~1,
    like the sinusoidal encoding they are added to. Initialised at N(0, 1), the scaled
    embedding would be ``sqrt(d_model)`` times larger and drown the position signal.

    ``"t5"``'s tables (:meth:`_new_t5_tables`) are the only position parameters: one
    ``(num_buckets, H)`` table per self-attention stack, shared by its layers, as T5
    shares the one its first layer owns. The bias is added to the *scaled* scores
    ``q . k / sqrt(Dh)`` (T5 adds it to unscaled ones and folds ``1 / sqrt(Dh)`` into
    ``W_q``'s initialisation): trained from scratch, the table learns values on this
    scale.
    """

    def __init__(self, d_model: int, num_heads: int, max_len: int, position_scheme: str):
        super().__init__()
        self.d_model = check_positive_int(d_model, "d_model")
        self.num_heads = check_positive_int(num_heads, "num_heads")
        self.max_len = check_positive_int(max_len, "max_len")
        if not isinstance(position_scheme, str) or position_scheme not in POSITION_SCHEMES:
            raise ValueError(
                f"position_scheme must be one of {POSITION_SCHEMES}, got {position_scheme!r}"
            )
        check_divisible(self.d_model, self.num_heads)
        if position_scheme == "rope":
            check_rope_head_dim(self.d_model, self.num_heads)
        self.position_scheme = position_scheme
        # A function of (max_len, d_model) only: a buffer (moves with .to()), not a
        # parameter, and not saved in checkpoints. None unless "sinusoidal".
        encoding = None
        if position_scheme == "sinusoidal":
            table = torch.from_numpy(sinusoidal_positional_encoding(max_len, d_model))
            encoding = table.to(torch.get_default_dtype())
        self.register_buffer("positional_encoding", encoding, persistent=False)
        self.register_parameter("relative_bias_causal", None)  # "t5": _new_t5_tables
        self.register_parameter("relative_bias_bidirectional", None)

    def _new_t5_tables(self, *, causal: bool, bidirectional: bool) -> None:
        """With ``"t5"``, T5's tables ``(num_buckets, H)``: one for the causal
        self-attention and/or one for the one that looks both ways, at
        ``N(0, d_model**-0.5)`` as Hugging Face initialises T5's (``_init_weights``; a
        zero table would start the model as NoPE). A subclass calls it after building
        every other weight, so the same seed gives those the values it gives under the
        other schemes."""
        if self.position_scheme != "t5":
            return
        for name, wanted in (("causal", causal), ("bidirectional", bidirectional)):
            if wanted:
                table = torch.empty(T5_NUM_BUCKETS, self.num_heads)
                nn.init.normal_(table, mean=0.0, std=self.d_model**-0.5)
                setattr(self, f"relative_bias_{name}", nn.Parameter(table))

    def _new_embeddings(self, *vocab_sizes: int) -> list[nn.Embedding]:
        """One embedding per vocabulary, all built, then all initialised at
        ``N(0, d_model**-0.5)`` (in this order: it fixes which random numbers each gets)."""
        embeddings = [nn.Embedding(size, self.d_model) for size in vocab_sizes]
        for embedding in embeddings:
            nn.init.normal_(embedding.weight, mean=0.0, std=self.d_model**-0.5)
        return embeddings

    def _embed(
        self, tokens: Tensor, embedding: nn.Embedding, name: str, start: int = 0
    ) -> Tensor:
        """Embed ``tokens[:, start:]``, which sit at positions ``start, start + 1, ...``:
        ``(B, L)`` ids -> ``(B, L - start, D)``, scaled, plus the table's rows."""
        check_token_ids(tokens, name)
        length = tokens.shape[1]
        if self.positional_encoding is not None and length > self.max_len:
            raise ValueError(
                f"{name} has length {length} > max_len={self.max_len} (shape {tuple(tokens.shape)})"
            )
        # (B, L) -> (B, L, D), plus (L, D) broadcast over the batch
        x = embedding(tokens[:, start:]) * math.sqrt(self.d_model)
        if self.positional_encoding is not None:  # the other schemes act in attention
            x = x + self.positional_encoding[start:length]
        return x

    def _position_inputs(
        self, size: int, num_keys: int, causal: bool, x: Tensor
    ) -> tuple[Tensor | None, Tensor | None]:
        """``(score_bias, rope_positions)`` for a self-attention whose queries are the
        last ``size`` of ``num_keys`` positions: ALiBi's or T5's bias ``(H, T, S)`` or
        RoPE's positions ``(T,)`` (absolute, so a cached decoder rotates each new query at
        its place); neither for NoPE, nor for the sinusoidal table, which is already in
        ``x``."""
        score_bias = rope_positions = None
        if self.position_scheme == "t5" and size > 0:  # the same table in every layer
            table = self.relative_bias_causal if causal else self.relative_bias_bidirectional
            score_bias = t5_relative_bias(
                table.to(x.dtype), size, num_keys, bidirectional=not causal,
                max_distance=T5_MAX_DISTANCE,
            )  # (H, T, S)
        elif self.position_scheme == "alibi_directional" and not causal and size > 0:
            score_bias = alibi_bias_directional(
                self.num_heads, size, dtype=x.dtype, device=x.device
            )  # (H, T, T): attention that looks both ways
        elif self.position_scheme.startswith("alibi") and size > 0:  # no new position: no bias
            score_bias = alibi_bias(
                self.num_heads, size, num_keys, causal, dtype=x.dtype, device=x.device
            )  # (H, T, S)
        elif self.position_scheme == "rope":
            rope_positions = torch.arange(num_keys - size, num_keys, device=x.device)  # (T,)
        return score_bias, rope_positions


class Transformer(TokenModel):
    """The encoder-decoder Transformer of "Attention Is All You Need", small by default.

    Parameters
    ----------
    src_vocab_size, tgt_vocab_size : int
        Vocabulary sizes of the source and target languages.
    d_model, num_heads, d_ff : int
        Width, heads per attention, feed-forward hidden width.
    num_encoder_layers, num_decoder_layers : int
        Depth of each stack.
    dropout : float
        Dropout after the embeddings and inside every layer.
    max_len : int
        Rows of the sinusoidal table (the longest source or target with
        ``"sinusoidal"``); greedy decoding writes at most ``max_len - 1`` tokens.
    pad_id : int
        Padding token id in both vocabularies; masks are derived from it.
    norm_first : bool
        Pre-norm layers (plus a final LayerNorm after each stack).
    layer_norm_eps : float
        LayerNorm epsilon.
    position_scheme : str
        Where the model learns the order of the tokens, one of :data:`POSITION_SCHEMES` (see
        :class:`TokenModel`): in the encoder's self-attention, which looks both ways,
        and in the decoder's, which is causal.

    Attributes
    ----------
    config : dict
        The constructor arguments above, by name, exactly as this model was built with
        them: ``Transformer(**model.config)`` builds the same architecture, and a
        checkpoint stores this dict (see :func:`mha.translator.save_checkpoint`).

    Notes
    -----
    Embeddings: see :class:`TokenModel`.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 32,
        num_heads: int = 2,
        num_encoder_layers: int = 1,
        num_decoder_layers: int = 1,
        d_ff: int = 64,
        dropout: float = 0.0,
        max_len: int = 64,
        pad_id: int = 0,
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        position_scheme: str = "sinusoidal",
    ):
        # Refuse floats and bools (True would silently mean one layer, or a vocabulary
        # of one word) before they reach nn.Embedding, range() or nn.Linear.
        src_vocab_size = check_positive_int(src_vocab_size, "src_vocab_size")
        tgt_vocab_size = check_positive_int(tgt_vocab_size, "tgt_vocab_size")
        num_encoder_layers = check_non_negative_int(num_encoder_layers, "num_encoder_layers")
        num_decoder_layers = check_non_negative_int(num_decoder_layers, "num_decoder_layers")
        d_ff = check_positive_int(d_ff, "d_ff")
        pad_id = check_non_negative_int(pad_id, "pad_id")
        super().__init__(d_model, num_heads, max_len, position_scheme)
        d_model = self.d_model
        # The architecture is recorded as given, not read back from the submodules later
        # (which once forgot layer_norm_eps). Plain Python types: it goes into JSON.
        self.config: dict[str, object] = {
            "src_vocab_size": src_vocab_size,
            "tgt_vocab_size": tgt_vocab_size,
            "d_model": d_model,
            "num_heads": self.num_heads,
            "num_encoder_layers": num_encoder_layers,
            "num_decoder_layers": num_decoder_layers,
            "d_ff": d_ff,
            "dropout": float(dropout),
            "max_len": self.max_len,
            "pad_id": pad_id,
            "norm_first": bool(norm_first),
            "layer_norm_eps": float(layer_norm_eps),
            "position_scheme": position_scheme,
        }
        self.pad_id = pad_id
        self.src_embedding, self.tgt_embedding = self._new_embeddings(
            src_vocab_size, tgt_vocab_size
        )
        self.embedding_dropout = nn.Dropout(dropout)
        layer_args = (d_model, self.num_heads, d_ff, dropout, norm_first, layer_norm_eps)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(*layer_args) for _ in range(num_encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(*layer_args) for _ in range(num_decoder_layers)
        )
        # Pre-norm leaves the residual stream un-normalised: normalise once at the end.
        # (Post-norm layers already end in a LayerNorm, as in the paper.)
        if norm_first:
            self.encoder_norm: nn.Module = nn.LayerNorm(d_model, eps=layer_norm_eps)
            self.decoder_norm: nn.Module = nn.LayerNorm(d_model, eps=layer_norm_eps)
        else:
            self.encoder_norm = nn.Identity()
            self.decoder_norm = nn.Identity()
        self.output = nn.Linear(d_model, tgt_vocab_size)
        # T5 gives each stack its own table (the encoder's first layer and the decoder's).
        self._new_t5_tables(causal=True, bidirectional=True)

    def new_cache(self) -> list[tuple[KVCache, KVCache]]:
        """Empty caches for :meth:`decode`: per decoder layer, one for the growing
        self-attention keys and values, one (``fixed``) for the projected memory."""
        return [(KVCache(), KVCache(fixed=True)) for _ in self.decoder_layers]

    def encode(
        self, src: Tensor, *, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        """Run the encoder. Options after the tensors are passed by keyword.

        Parameters
        ----------
        src : Tensor
            ``(B, S)`` source token ids (``pad_id`` for padding).
        need_weights : bool
            Collect each layer's self-attention weights. Default False, as in the
            layers (only :class:`~mha.modules.MultiHeadAttention` defaults to True, as
            ``torch.nn.MultiheadAttention`` does).

        Returns
        -------
        memory : Tensor
            ``(B, S, D)``.
        enc_weights : list of Tensor
            One ``(B, H, S, S)`` per layer, or empty when ``need_weights`` is False.
        """
        x = self.embedding_dropout(self._embed(src, self.src_embedding, "src"))
        mask = source_mask(src, self.pad_id)  # (B, 1, 1, S)
        size = src.shape[1]
        score_bias, rope_positions = self._position_inputs(size, size, causal=False, x=x)
        enc_weights = []
        for layer in self.encoder_layers:
            x, weights = layer(x, mask, need_weights=need_weights, score_bias=score_bias,
                               rope_positions=rope_positions)  # fmt: skip
            if need_weights:
                enc_weights.append(weights)
        return self.encoder_norm(x), enc_weights

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src: Tensor,
        *,
        need_weights: bool = False,
        cache: list[tuple[KVCache, KVCache]] | None = None,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Run the decoder and the output projection. Options after the tensors are
        passed by keyword.

        Parameters
        ----------
        tgt_in : Tensor
            ``(B, T)`` decoder input ids (target shifted right, starting with ``<s>``).
        memory : Tensor
            ``(B, S, D)`` from :meth:`encode`.
        src : Tensor
            ``(B, S)`` the source ids, for the cross-attention padding mask.
        need_weights : bool
            Collect each layer's attention weights (default False, as :meth:`encode`).
        cache : list, optional
            From :meth:`new_cache`, holding the first ``L`` positions of ``tgt_in``
            (the whole prefix is passed every time; its padding is needed for the
            mask): only positions ``L ..`` are computed, their keys and values are
            cached, and the memory is projected once, at the first call.

        Returns
        -------
        logits : Tensor
            ``(B, T, V)`` unnormalised next-token scores (``(B, T - L, V)`` with a
            cache: the new positions only).
        self_weights : list of Tensor
            One ``(B, H, T, T)`` per layer (empty unless ``need_weights``).
        cross_weights : list of Tensor
            One ``(B, H, T, S)`` per layer (empty unless ``need_weights``).
        """
        check_token_ids(src, "src")
        if not isinstance(memory, Tensor):
            raise ValueError(f"memory must be a torch.Tensor, got {type(memory).__name__}")
        if memory.ndim != 3 or memory.shape[:2] != src.shape or memory.shape[2] != self.d_model:
            raise ValueError(
                f"memory must have shape (B, S, d_model) = {(*src.shape, self.d_model)} to "
                f"match src {tuple(src.shape)}, got {tuple(memory.shape)}"
            )
        if memory.dtype != self.output.weight.dtype:
            raise ValueError(
                f"memory has dtype {memory.dtype}, but the model's weights are "
                f"{self.output.weight.dtype}: pass the memory this model's encode returned"
            )
        if cache is not None and not _is_model_cache(cache, len(self.decoder_layers)):
            raise ValueError(
                f"cache must be the list model.new_cache() returns, one pair of "
                f"mha.kv_cache_torch.KVCache per decoder layer ({len(self.decoder_layers)}), "
                f"got {type(cache).__name__}"
                + (f" of {len(cache)}" if isinstance(cache, list | tuple) else "")
            )
        check_token_ids(tgt_in, "tgt_in")
        if tgt_in.shape[0] != src.shape[0]:
            raise ValueError(
                f"tgt_in and src must have the same batch size, got shapes "
                f"tgt_in {tuple(tgt_in.shape)}, src {tuple(src.shape)}"
            )
        start = cache[0][0].length if cache else 0  # positions already cached
        if tgt_in.shape[1] < start:  # as many: no new position, no logits (allowed)
            raise ValueError(
                f"tgt_in has {tgt_in.shape[1]} positions but the cache already holds {start}: "
                "pass the whole prefix, the cached positions included"
            )
        x = self.embedding_dropout(self._embed(tgt_in, self.tgt_embedding, "tgt_in", start))
        self_mask = target_mask(tgt_in, self.pad_id)[:, :, start:]  # (B, 1, T - L, T)
        cross_mask = source_mask(src, self.pad_id)  # (B, 1, 1, S)
        size = tgt_in.shape[1]
        # The new positions start..size-1 attend to all of 0..size-1.
        score_bias, rope_positions = self._position_inputs(size - start, size, causal=True, x=x)
        self_weights, cross_weights = [], []
        caches = cache if cache is not None else [None] * len(self.decoder_layers)
        for layer, layer_cache in zip(self.decoder_layers, caches, strict=True):
            x, sw, cw = layer(
                x, memory, self_mask, cross_mask, need_weights=need_weights,
                cache=layer_cache, self_score_bias=score_bias, rope_positions=rope_positions,
            )
            if need_weights:
                self_weights.append(sw)
                cross_weights.append(cw)
        logits = self.output(self.decoder_norm(x))  # (B, T, D) @ (D, V) -> (B, T, V)
        return logits, self_weights, cross_weights

    def forward(
        self, src: Tensor, tgt_in: Tensor, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """Encode ``src`` and decode ``tgt_in`` (teacher forcing). Options after the
        tensors are passed by keyword.

        Parameters
        ----------
        src : Tensor
            ``(B, S)`` source ids.
        tgt_in : Tensor
            ``(B, T)`` decoder input ids.
        need_weights : bool
            Also return every layer's attention weights (default False, as
            :meth:`encode`).

        Returns
        -------
        logits : Tensor
            ``(B, T, V)``; with ``need_weights``, ``(logits, AttentionMaps)``.
        """
        memory, enc_weights = self.encode(src, need_weights=need_weights)
        logits, self_weights, cross_weights = self.decode(
            tgt_in, memory, src, need_weights=need_weights
        )
        if need_weights:
            return logits, AttentionMaps(enc_weights, self_weights, cross_weights)
        return logits


def _is_model_cache(cache: object, num_layers: int) -> bool:
    """Whether ``cache`` is shaped as :meth:`Transformer.new_cache` returns it."""
    return (
        isinstance(cache, list)
        and len(cache) == num_layers
        and all(isinstance(pair, tuple | list) and len(pair) == 2
                and all(isinstance(c, KVCache) for c in pair) for pair in cache)
    )
