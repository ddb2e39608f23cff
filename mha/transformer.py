"""The encoder-decoder Transformer of "Attention Is All You Need", built on
:class:`mha.modules.MultiHeadAttention`.

Feed-forward network, encoder and decoder layers (post-norm as in the paper, or
pre-norm), and the whole model with embeddings, the positions (the paper's sinusoidal
encoding, read from :mod:`mha.positional`: it is data, not the attention under test;
or RoPE or ALiBi inside self-attention, from :mod:`mha.modules`) and the output layer.
The tests check the layers against PyTorch's ``nn.TransformerEncoderLayer`` /
``nn.TransformerDecoderLayer`` / ``nn.Transformer`` with copied weights (see
:mod:`mha.convert`).

Shape legend: B batch, H heads, T target length, S source length, D d_model,
V vocabulary size. Masks: boolean, ``True`` = may attend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mha._checks import check_non_negative_int, check_positive_int
from mha.modules import KVCache, MultiHeadAttention, alibi_bias
from mha.positional import sinusoidal_positional_encoding

__all__ = [
    "POSITIONS",
    "AttentionMaps",
    "DecoderLayer",
    "EncoderLayer",
    "FeedForward",
    "Transformer",
    "source_mask",
    "target_mask",
]


#: The position schemes a :class:`Transformer` can use (its ``positions`` argument).
POSITIONS = ("sinusoidal", "rope", "alibi")

# --------------------------------------------------------------------------- masks
# Torch versions of mha.masks for token-id batches, so a model builds its masks on the
# tokens' device without a NumPy round trip. Same convention: True = may attend.


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
    _check_tokens(src, "src")
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
    _check_tokens(tgt_in, "tgt_in")
    size = tgt_in.shape[1]
    causal = torch.ones(size, size, dtype=torch.bool, device=tgt_in.device).tril()  # (T, T)
    padding = (tgt_in != pad_id)[:, None, None, :]  # (B, T) -> (B, 1, 1, T)
    return padding & causal  # (B, 1, 1, T) & (T, T) -> (B, 1, T, T)


def _check_tokens(tokens: Tensor, name: str) -> None:
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name} must be a (B, L) tensor of token ids, got shape {shape}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")


# ------------------------------------------------------------------------ layers


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``W_2 relu(W_1 x + b_1) + b_2``.

    Parameters
    ----------
    d_model : int
        Input and output width D.
    d_ff : int
        Hidden width (the paper uses 4 D).
    dropout : float
        Dropout on the hidden activations (as ``nn.TransformerEncoderLayer``).
    bias : bool
        Whether both linear maps have biases.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        d_model = check_positive_int(d_model, "d_model")
        d_ff = check_positive_int(d_ff, "d_ff")  # nn.Linear(D, True) would be 1 wide
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, L, D) -> (B, L, D)``, each position independently."""
        hidden = F.relu(self.linear1(x))  # (B, L, D) @ (D, d_ff) -> (B, L, d_ff)
        return self.linear2(self.dropout(hidden))  # (B, L, d_ff) @ (d_ff, D) -> (B, L, D)



class EncoderLayer(nn.Module):
    """Transformer encoder layer: self-attention then feed-forward, each with a residual.

    Post-norm (the paper, default): ``x = norm(x + sublayer(x))``.
    Pre-norm (``norm_first=True``): ``x = x + sublayer(norm(x))`` — trains more easily in
    deep stacks; the stack then needs a final LayerNorm (``Transformer`` adds it).

    Parameters
    ----------
    d_model, num_heads, d_ff : int
        Width, heads, feed-forward hidden width.
    dropout : float
        Dropout on attention weights, the FFN hidden layer and each sublayer output.
    norm_first : bool
        Pre-norm instead of post-norm.
    layer_norm_eps : float
        LayerNorm epsilon (PyTorch's default 1e-5).
    bias : bool
        Biases in all linear maps and LayerNorms.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout, bias=bias)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        bias: Tensor | None = None,
        rope_positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Encode ``x``.

        Parameters
        ----------
        x : Tensor
            ``(B, S, D)``.
        mask : Tensor, optional
            bool, True = may attend, broadcastable to ``(B, H, S, S)`` (usually source
            padding ``(B, 1, 1, S)``).
        need_weights : bool
            Return the self-attention weights ``(B, H, S, S)``.
        bias, rope_positions : Tensor, optional
            Positions inside the self-attention (ALiBi's bias ``(H, S, S)``, RoPE's
            positions ``(S,)``): see :meth:`MultiHeadAttention.forward`.

        Returns
        -------
        x : Tensor
            ``(B, S, D)``.
        weights : Tensor or None
        """
        if self.norm_first:
            h = self.norm1(x)
            attended, weights = self.self_attn(
                h, h, h, mask, need_weights, bias=bias, rope_positions=rope_positions
            )
            x = x + self.dropout1(attended)
            x = x + self.dropout2(self.feed_forward(self.norm2(x)))
        else:
            attended, weights = self.self_attn(
                x, x, x, mask, need_weights, bias=bias, rope_positions=rope_positions
            )
            x = self.norm1(x + self.dropout1(attended))
            x = self.norm2(x + self.dropout2(self.feed_forward(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """Transformer decoder layer: masked self-attention, cross-attention, feed-forward.

    Same residual/norm arrangement and parameters as :class:`EncoderLayer`, with a third
    sublayer: cross-attention whose queries come from the decoder and whose keys and
    values are the encoder output (``memory``).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout, bias=bias)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None = None,
        cross_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: tuple[KVCache, KVCache] | None = None,
        self_bias: Tensor | None = None,
        rope_positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Decode ``x`` while attending to ``memory``.

        Parameters
        ----------
        x : Tensor
            ``(B, T, D)`` decoder input.
        memory : Tensor
            ``(B, S, D)`` encoder output.
        self_mask : Tensor, optional
            bool, broadcastable to ``(B, H, T, T)`` (causal AND target padding).
        cross_mask : Tensor, optional
            bool, broadcastable to ``(B, H, T, S)`` (source padding ``(B, 1, 1, S)``).
        need_weights : bool
            Return the attention weights.
        cache : (KVCache, KVCache), optional
            The self-attention cache of the earlier positions, and the (fixed) cache
            of the projected memory; ``x`` then holds the new positions only.
        self_bias, rope_positions : Tensor, optional
            Positions inside the self-attention only (ALiBi's causal bias ``(H, T,
            S)``, RoPE's positions ``(T,)`` of the new positions): see
            :meth:`MultiHeadAttention.forward`. Cross-attention gets neither.

        Returns
        -------
        x : Tensor
            ``(B, T, D)``.
        self_weights : Tensor or None
            ``(B, H, T, T)``.
        cross_weights : Tensor or None
            ``(B, H, T, S)``.
        """
        self_cache, cross_cache = (None, None) if cache is None else cache
        positions = {"bias": self_bias, "rope_positions": rope_positions}
        if self.norm_first:
            h = self.norm1(x)
            attended, self_weights = self.self_attn(
                h, h, h, self_mask, need_weights, self_cache, **positions
            )
            x = x + self.dropout1(attended)
            h = self.norm2(x)
            attended, cross_weights = self.cross_attn(
                h, memory, memory, cross_mask, need_weights, cross_cache
            )
            x = x + self.dropout2(attended)
            x = x + self.dropout3(self.feed_forward(self.norm3(x)))
        else:
            attended, self_weights = self.self_attn(
                x, x, x, self_mask, need_weights, self_cache, **positions
            )
            x = self.norm1(x + self.dropout1(attended))
            attended, cross_weights = self.cross_attn(
                x, memory, memory, cross_mask, need_weights, cross_cache
            )
            x = self.norm2(x + self.dropout2(attended))
            x = self.norm3(x + self.dropout3(self.feed_forward(x)))
        return x, self_weights, cross_weights


# -------------------------------------------------------------------- transformer


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


class Transformer(nn.Module):
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
        Longest source or target sequence (size of the positional-encoding table).
    pad_id : int
        Padding token id in both vocabularies; masks are derived from it.
    norm_first : bool
        Pre-norm layers (plus a final LayerNorm after each stack).
    layer_norm_eps : float
        LayerNorm epsilon.
    positions : str
        Where the model learns the order of the tokens, one of :data:`POSITIONS`:
        ``"sinusoidal"`` (the paper: a fixed table added to the embeddings),
        ``"rope"`` (RoPE: the queries and keys of every self-attention rotated by their
        positions, :func:`mha.modules.apply_rope`; needs an even head_dim) or
        ``"alibi"`` (ALiBi: ``-slope * distance`` added to the self-attention scores,
        :func:`mha.modules.alibi_bias`, symmetric in the encoder and causal in the
        decoder). With RoPE and ALiBi no table is added to the embeddings, and the
        cross-attention gets no position information (its queries and keys come from
        two different sequences).

    Attributes
    ----------
    config : dict
        The constructor arguments above, by name, exactly as this model was built with
        them: ``Transformer(**model.config)`` builds the same architecture, and a
        checkpoint stores this dict (see :func:`mha.translator.save_checkpoint`).

    Notes
    -----
    Embeddings are multiplied by ``sqrt(d_model)`` (as in the paper) and initialised with
    standard deviation ``d_model**-0.5``, so the scaled embedding has entries of size ~1,
    like the sinusoidal encoding they are added to. Initialised at N(0, 1), the scaled
    embedding would be ``sqrt(d_model)`` times larger and drown the position signal.
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
        positions: str = "sinusoidal",
    ):
        super().__init__()
        # Refuse floats and bools (True would silently mean one layer, or a vocabulary
        # of one word) before they reach nn.Embedding, range() or nn.Linear.
        src_vocab_size = check_positive_int(src_vocab_size, "src_vocab_size")
        tgt_vocab_size = check_positive_int(tgt_vocab_size, "tgt_vocab_size")
        d_model = check_positive_int(d_model, "d_model")
        num_heads = check_positive_int(num_heads, "num_heads")
        num_encoder_layers = check_non_negative_int(num_encoder_layers, "num_encoder_layers")
        num_decoder_layers = check_non_negative_int(num_decoder_layers, "num_decoder_layers")
        d_ff = check_positive_int(d_ff, "d_ff")
        max_len = check_positive_int(max_len, "max_len")
        pad_id = check_non_negative_int(pad_id, "pad_id")
        if not isinstance(positions, str) or positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        if positions == "rope" and d_model % num_heads == 0 and d_model // num_heads % 2:
            raise ValueError(
                f"positions='rope' rotates pairs of dimensions: head_dim = d_model / "
                f"num_heads = {d_model // num_heads} must be even (d_model={d_model}, "
                f"num_heads={num_heads})"
            )
        # The architecture is recorded as given, not read back from the submodules later
        # (which once forgot layer_norm_eps). Plain Python types: it goes into JSON.
        self.config: dict[str, object] = {
            "src_vocab_size": src_vocab_size,
            "tgt_vocab_size": tgt_vocab_size,
            "d_model": d_model,
            "num_heads": num_heads,
            "num_encoder_layers": num_encoder_layers,
            "num_decoder_layers": num_decoder_layers,
            "d_ff": d_ff,
            "dropout": float(dropout),
            "max_len": max_len,
            "pad_id": pad_id,
            "norm_first": bool(norm_first),
            "layer_norm_eps": float(layer_norm_eps),
            "positions": positions,
        }
        self.d_model = d_model
        self.num_heads = num_heads
        self.max_len = max_len
        self.pad_id = pad_id
        self.positions = positions
        self.src_embedding = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, d_model)
        for embedding in (self.src_embedding, self.tgt_embedding):
            nn.init.normal_(embedding.weight, mean=0.0, std=d_model**-0.5)
        # A function of (max_len, d_model) only: a buffer (moves with .to()), not a
        # parameter, and not saved in checkpoints. None with RoPE or ALiBi.
        encoding = None
        if positions == "sinusoidal":
            table = torch.from_numpy(sinusoidal_positional_encoding(max_len, d_model))
            encoding = table.to(torch.get_default_dtype())
        self.register_buffer("positional_encoding", encoding, persistent=False)
        self.embedding_dropout = nn.Dropout(dropout)
        layer_args = (d_model, num_heads, d_ff, dropout, norm_first, layer_norm_eps)
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

    def _embed(
        self, tokens: Tensor, embedding: nn.Embedding, name: str, start: int = 0
    ) -> Tensor:
        """Embed ``tokens[:, start:]``, which sit at positions ``start, start + 1, ...``."""
        _check_tokens(tokens, name)
        length = tokens.shape[1]
        if length > self.max_len:
            raise ValueError(
                f"{name} has length {length} > max_len={self.max_len} (shape {tuple(tokens.shape)})"
            )
        # (B, L) -> (B, L, D), plus (L, D) broadcast over the batch
        x = embedding(tokens[:, start:]) * math.sqrt(self.d_model)
        if self.positional_encoding is not None:  # RoPE and ALiBi act in attention
            x = x + self.positional_encoding[start:length]
        return self.embedding_dropout(x)

    def _self_attention_positions(
        self, size: int, num_keys: int, causal: bool, x: Tensor
    ) -> dict[str, Tensor | None]:
        """The position inputs of a self-attention whose queries are the last ``size``
        of ``num_keys`` positions: ALiBi's bias ``(H, T, S)`` or RoPE's positions
        ``(T,)`` (absolute, so a cached decoder rotates each new query at its place);
        nothing for the sinusoidal table, which is already in ``x``."""
        bias = rope = None
        if self.positions == "alibi" and size > 0:  # no new position: nothing to bias
            bias = alibi_bias(
                self.num_heads, size, num_keys, causal, dtype=x.dtype, device=x.device
            )  # (H, T, S)
        elif self.positions == "rope":
            rope = torch.arange(num_keys - size, num_keys, device=x.device)  # (T,)
        return {"bias": bias, "rope_positions": rope}

    def new_cache(self) -> list[tuple[KVCache, KVCache]]:
        """Empty caches for :meth:`decode`: per decoder layer, one for the growing
        self-attention keys and values, one (``fixed``) for the projected memory."""
        return [(KVCache(), KVCache(fixed=True)) for _ in self.decoder_layers]

    def encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Run the encoder.

        Parameters
        ----------
        src : Tensor
            ``(B, S)`` source token ids (``pad_id`` for padding).
        need_weights : bool
            Collect each layer's self-attention weights.

        Returns
        -------
        memory : Tensor
            ``(B, S, D)``.
        enc_weights : list of Tensor
            One ``(B, H, S, S)`` per layer, or empty when ``need_weights`` is False.
        """
        x = self._embed(src, self.src_embedding, "src")
        mask = source_mask(src, self.pad_id)  # (B, 1, 1, S)
        size = src.shape[1]
        positions = self._self_attention_positions(size, size, causal=False, x=x)
        enc_weights = []
        for layer in self.encoder_layers:
            x, weights = layer(x, mask, need_weights, **positions)
            if need_weights:
                enc_weights.append(weights)
        return self.encoder_norm(x), enc_weights

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src: Tensor,
        need_weights: bool = False,
        cache: list[tuple[KVCache, KVCache]] | None = None,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Run the decoder and the output projection.

        Parameters
        ----------
        tgt_in : Tensor
            ``(B, T)`` decoder input ids (target shifted right, starting with BOS).
        memory : Tensor
            ``(B, S, D)`` from :meth:`encode`.
        src : Tensor
            ``(B, S)`` the source ids, for the cross-attention padding mask.
        need_weights : bool
            Collect each layer's attention weights.
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
        _check_tokens(src, "src")
        if memory.ndim != 3 or memory.shape[:2] != src.shape or memory.shape[2] != self.d_model:
            raise ValueError(
                f"memory must have shape (B, S, d_model) = {(*src.shape, self.d_model)} to "
                f"match src {tuple(src.shape)}, got {tuple(memory.shape)}"
            )
        _check_tokens(tgt_in, "tgt_in")
        if tgt_in.shape[0] != src.shape[0]:
            raise ValueError(
                f"tgt_in and src must have the same batch size, got shapes "
                f"tgt_in {tuple(tgt_in.shape)}, src {tuple(src.shape)}"
            )
        start = cache[0][0].length if cache else 0  # positions already cached
        x = self._embed(tgt_in, self.tgt_embedding, "tgt_in", start)
        self_mask = target_mask(tgt_in, self.pad_id)[:, :, start:]  # (B, 1, T - L, T)
        cross_mask = source_mask(src, self.pad_id)  # (B, 1, 1, S)
        size = tgt_in.shape[1]
        # The new positions start..size-1 attend to all of 0..size-1.
        positions = self._self_attention_positions(size - start, size, causal=True, x=x)
        self_weights, cross_weights = [], []
        caches = cache if cache is not None else [None] * len(self.decoder_layers)
        for layer, layer_cache in zip(self.decoder_layers, caches, strict=True):
            x, sw, cw = layer(
                x, memory, self_mask, cross_mask, need_weights, layer_cache,
                self_bias=positions["bias"], rope_positions=positions["rope_positions"],
            )
            if need_weights:
                self_weights.append(sw)
                cross_weights.append(cw)
        logits = self.output(self.decoder_norm(x))  # (B, T, D) @ (D, V) -> (B, T, V)
        return logits, self_weights, cross_weights

    def forward(
        self, src: Tensor, tgt_in: Tensor, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """Encode ``src`` and decode ``tgt_in`` (teacher forcing).

        Parameters
        ----------
        src : Tensor
            ``(B, S)`` source ids.
        tgt_in : Tensor
            ``(B, T)`` decoder input ids.
        need_weights : bool
            Also return every layer's attention weights.

        Returns
        -------
        logits : Tensor
            ``(B, T, V)``; with ``need_weights``, ``(logits, AttentionMaps)``.
        """
        memory, enc_weights = self.encode(src, need_weights)
        logits, self_weights, cross_weights = self.decode(tgt_in, memory, src, need_weights)
        if need_weights:
            return logits, AttentionMaps(enc_weights, self_weights, cross_weights)
        return logits
