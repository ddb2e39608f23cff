"""What decoding with a KV cache costs and saves: memory in bytes, work in multiply-adds.

Plain arithmetic (no NumPy arrays, no torch), in the specification layer so that a
chapter can print these numbers beside the ones it measures. The multiply-add counts
are checked against ``torch.utils.flop_counter.FlopCounterMode`` running
:class:`mha.modules.MultiHeadAttention` (in ``tests/test_cost.py``: the tests may
use torch, this module does not).

Shape names as in :mod:`mha`: H heads, Hkv key/value heads (``H`` for multi-head
attention, fewer for grouped-query attention), Dh head width, D model width, B batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from mha._checks import check_divisible, check_non_negative_int, check_positive_int

__all__ = [
    "CACHE_TABLE_MODELS",
    "DEEPSEEK_V2",
    "DEEPSEEK_V3",
    "LLAMA_2_7B",
    "LLAMA_3_70B",
    "PUBLISHED_MODELS",
    "PublishedMLAModel",
    "PublishedModel",
    "cache_bytes_per_token",
    "cached_values_per_token",
    "decode_macs_with_cache",
    "decode_macs_without_cache",
    "kv_cache_bytes",
    "kv_values_per_token",
    "mla_values_per_token",
    "sequence_cache_bytes",
]


def kv_cache_bytes(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    context_length: int,
    *,
    batch_size: int = 1,
    bytes_per_value: int = 2,
    window: int | None = None,
) -> int:
    """Bytes of the keys and values a decoder keeps for ``context_length`` positions.

    ``2 * num_layers * num_kv_heads * head_dim * min(context_length, window)
    * batch_size * bytes_per_value``: every layer stores one key and one value vector of
    ``head_dim`` numbers per key/value head and position. Queries are never cached (a
    position's query is used once, when that position is computed).

    Parameters
    ----------
    num_layers : int
        Attention layers that cache (a decoder-only model: all of them).
    num_kv_heads : int
        ``Hkv``: the heads whose keys and values are stored. Grouped-query attention saves
        memory here, by the factor ``num_heads / num_kv_heads``.
    head_dim : int
        ``Dh``, numbers per head and position.
    context_length : int
        Positions decoded so far (0 is allowed: an empty cache).
    batch_size : int
        Sequences decoded together; each has its own cache.
    bytes_per_value : int
        2 for float16 / bfloat16 (the default), 4 for float32, 1 for 8-bit formats.
    window : int, optional
        Sliding-window attention: a position attends to at most ``window`` positions,
        so a rolling buffer of ``window`` positions is enough, however long the context.

    Returns
    -------
    int
        The size in bytes (exact: every factor is an integer).

    Raises
    ------
    ValueError
        If an argument is not a positive integer (``context_length``: non-negative).
    """
    num_layers = check_positive_int(num_layers, "num_layers")
    num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
    head_dim = check_positive_int(head_dim, "head_dim")
    context_length = check_non_negative_int(context_length, "context_length")
    batch_size = check_positive_int(batch_size, "batch_size")
    bytes_per_value = check_positive_int(bytes_per_value, "bytes_per_value")
    cached = (
        context_length
        if window is None
        else min(context_length, check_positive_int(window, "window"))
    )
    # 2: one key and one value vector per layer, key/value head and cached position.
    return 2 * num_layers * num_kv_heads * head_dim * cached * batch_size * bytes_per_value


@dataclass(frozen=True)
class PublishedModel:
    """The attention shape of a published decoder, as its authors give it.

    Attributes
    ----------
    name : str
    num_layers : int
        Decoder layers, each with one self-attention.
    d_model : int
        ``D``.
    num_heads : int
        ``H``, query heads per layer.
    num_kv_heads : int
        ``Hkv``, key/value heads per layer (``H``: multi-head attention).
    head_dim : int
        ``Dh``. These models all have ``D = H * Dh``; the field is separate because
        not every model does.
    window : int or None
        Sliding-window size, or None for attention over the whole context.
    source : str
        Where the numbers come from: the paper table or the official configuration.
    """

    name: str
    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    window: int | None
    source: str

    def __post_init__(self) -> None:
        for field in ("num_layers", "d_model", "num_heads", "num_kv_heads", "head_dim"):
            check_positive_int(getattr(self, field), field)
        if self.window is not None:
            check_positive_int(self.window, "window")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"{self.name}: num_kv_heads={self.num_kv_heads} must divide "
                f"num_heads={self.num_heads}"
            )

    @property
    def group_size(self) -> int:
        """Query heads sharing one key/value head, ``H / Hkv`` (1: multi-head attention)."""
        return self.num_heads // self.num_kv_heads

    def kv_cache_bytes(
        self, context_length: int, *, batch_size: int = 1, bytes_per_value: int = 2
    ) -> int:
        """:func:`kv_cache_bytes` for this model's layers, heads and window."""
        return kv_cache_bytes(
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
            context_length,
            batch_size=batch_size,
            bytes_per_value=bytes_per_value,
            window=self.window,
        )


# Every number below was checked against the source named; a model whose numbers could
# not be checked there was left out rather than guessed.
PUBLISHED_MODELS: tuple[PublishedModel, ...] = (
    PublishedModel(
        "GPT-3 175B", num_layers=96, d_model=12288, num_heads=96, num_kv_heads=96,
        head_dim=128, window=None,
        source="Brown et al. (2020), Language Models are Few-Shot Learners, Table 2.1 "
        "(n_layers, d_model, n_heads, d_head); multi-head attention",
    ),
    PublishedModel(
        "Llama 2 7B", num_layers=32, d_model=4096, num_heads=32, num_kv_heads=32,
        head_dim=128, window=None,
        source="Meta's params.json for Llama 2 7B (dim 4096, n_heads 32, n_layers 32, "
        "no n_kv_heads: as many as n_heads); Touvron et al. (2023), Llama 2, Table 1: "
        "only 34B and 70B use GQA",
    ),
    PublishedModel(
        "Llama 2 70B", num_layers=80, d_model=8192, num_heads=64, num_kv_heads=8,
        head_dim=128, window=None,
        source="Meta's params.json for Llama 2 70B (dim 8192, n_heads 64, n_kv_heads 8, "
        "n_layers 80); Touvron et al. (2023), Llama 2, Table 1 (GQA)",
    ),
    PublishedModel(
        "Llama 3 8B", num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, window=None,
        source="meta-llama/llama-models, models/sku_list.py, Llama 3 8b model_args "
        "(dim 4096, n_layers 32, n_heads 32, n_kv_heads 8)",
    ),
    PublishedModel(
        "Llama 3 70B", num_layers=80, d_model=8192, num_heads=64, num_kv_heads=8,
        head_dim=128, window=None,
        source="meta-llama/llama-models, models/sku_list.py, Llama 3 70b model_args "
        "(dim 8192, n_layers 80, n_heads 64, n_kv_heads 8)",
    ),
    PublishedModel(
        "Llama 3.1 405B", num_layers=126, d_model=16384, num_heads=128, num_kv_heads=8,
        head_dim=128, window=None,
        source="meta-llama/llama-models, models/sku_list.py, Llama 3.1 405b model_args "
        "(dim 16384, n_layers 126, n_heads 128, n_kv_heads 8)",
    ),
    PublishedModel(
        "Mistral 7B", num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, window=4096,
        source="Jiang et al. (2023), Mistral 7B, Table 1 (dim, n_layers, head_dim, "
        "n_heads, n_kv_heads, window_size)",
    ),
)  # fmt: skip


def _layer_macs(
    d_model: int,
    num_heads: int,
    num_kv_heads: int | None,
    batch_size: int,
    queries: int,
    new_keys: int,
    keys: int,
) -> int:
    """Multiply-adds of one attention call: ``queries`` new query positions, ``new_keys``
    positions projected to keys and values, ``keys`` positions attended to."""
    d_model = check_positive_int(d_model, "d_model")
    head_dim = check_divisible(d_model, num_heads)
    num_kv_heads = (
        num_heads if num_kv_heads is None else check_positive_int(num_kv_heads, "num_kv_heads")
    )
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_kv_heads must divide num_heads, got num_heads={num_heads}, "
            f"num_kv_heads={num_kv_heads}"
        )
    batch_size = check_positive_int(batch_size, "batch_size")
    kv_dim = num_kv_heads * head_dim
    projections = (
        queries * d_model * d_model  # W_q: (T, D) @ (D, D)
        + 2 * new_keys * d_model * kv_dim  # W_k, W_v: (S_new, D) @ (D, Hkv Dh)
        + queries * d_model * d_model  # W_o: (T, D) @ (D, D)
    )
    # Q K^T: (T, Dh) @ (Dh, S) and weights V: (T, S) @ (S, Dh), in each of the H query
    # heads (a shared key/value head is read by every query head of its group).
    attention = 2 * num_heads * queries * keys * head_dim
    return batch_size * (projections + attention)


def decode_macs_with_cache(
    d_model: int,
    num_heads: int,
    position: int,
    *,
    num_kv_heads: int | None = None,
    batch_size: int = 1,
) -> int:
    """Multiply-adds of one self-attention layer computing position ``position`` (the
    sequence already has ``position`` earlier positions) with a KV cache.

    Only the new position is projected; its query attends to the ``S = position + 1``
    cached keys and values (the earlier ones and its own)::

        B * ( D*D                  W_q, one position
            + 2 * D * Hkv*Dh       W_k and W_v, one position
            + 2 * H * S * Dh       q K^T and weights V, in every query head
            + D*D )                W_o, one position

    with ``Dh = D / H``. The work grows linearly with ``position``.

    Only matrix products are counted (one multiply-add = 2 FLOPs, as
    ``FlopCounterMode`` counts): biases, the scaling by ``1/sqrt(Dh)``, masking and the
    softmax are not, nor the copies that append to the cache.

    Parameters
    ----------
    d_model, num_heads : int
        ``D`` and ``H``; ``H`` must divide ``D``.
    position : int
        Earlier positions, ``>= 0``.
    num_kv_heads : int, optional
        ``Hkv`` for grouped-query attention (default ``H``).
    batch_size : int
        ``B``.

    Returns
    -------
    int
    """
    position = check_non_negative_int(position, "position")
    return _layer_macs(d_model, num_heads, num_kv_heads, batch_size, 1, 1, position + 1)


def decode_macs_without_cache(
    d_model: int,
    num_heads: int,
    position: int,
    *,
    num_kv_heads: int | None = None,
    batch_size: int = 1,
) -> int:
    """Multiply-adds of one self-attention layer computing position ``position`` with no
    cache: one causal pass over all ``T = position + 1`` positions, as
    :meth:`mha.transformer.Transformer.decode` does without a cache, of which only the
    last row is used::

        B * ( T * D*D              W_q, every position
            + 2 * T * D * Hkv*Dh   W_k and W_v, every position
            + 2 * H * T*T * Dh     Q K^T and weights V, the full (T, T) square
            + T * D*D )            W_o, every position

    with ``Dh = D / H``. The causal mask only sets scores to ``-inf`` after they are
    computed, so the whole square is counted. The work grows quadratically with
    ``position``. It is exactly ``T`` times :func:`decode_macs_with_cache`: the pass
    repeats, for each of the ``T`` positions, the work the cached step does for one.

    Only matrix products are counted, as in :func:`decode_macs_with_cache`; the
    parameters are the same.
    """
    position = check_non_negative_int(position, "position")
    length = position + 1
    return _layer_macs(d_model, num_heads, num_kv_heads, batch_size, length, length, length)


# ------------------------------------------------ cached values: MHA, GQA and MLA


def kv_values_per_token(num_kv_heads: int, head_dim: int) -> int:
    """Numbers one token leaves in one layer's cache under multi-head or grouped-query
    attention: one key and one value vector per key/value head, ``2 * Hkv * Dh``."""
    num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
    return 2 * num_kv_heads * check_positive_int(head_dim, "head_dim")


def mla_values_per_token(kv_lora_rank: int, qk_rope_head_dim: int) -> int:
    """Numbers one token leaves in one layer's cache under multi-head latent attention:
    the KV latent and the RoPE key shared by every head, ``Rkv + Dr``, whatever the
    number of heads (:class:`mha.mla.MLACache`)."""
    kv_lora_rank = check_positive_int(kv_lora_rank, "kv_lora_rank")
    return kv_lora_rank + check_positive_int(qk_rope_head_dim, "qk_rope_head_dim")


@dataclass(frozen=True)
class PublishedMLAModel:
    """The attention shape of a published decoder with multi-head latent attention.

    Attributes
    ----------
    name : str
    num_layers, d_model, num_heads : int
    q_lora_rank : int or None
        ``Rq`` (the paper's ``d_c'``), the query latent; None if the queries are not
        compressed.
    kv_lora_rank : int
        ``Rkv`` (``d_c``), the cached KV latent.
    qk_nope_head_dim, qk_rope_head_dim, v_head_dim : int
        ``Dn`` (``d_h``), ``Dr`` (``d_h^R``) and ``Dv`` (``d_h``).
    source : str
    """

    name: str
    num_layers: int
    d_model: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    source: str

    def __post_init__(self) -> None:
        for field in ("num_layers", "d_model", "num_heads", "kv_lora_rank",
                      "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):  # fmt: skip
            check_positive_int(getattr(self, field), field)
        if self.q_lora_rank is not None:
            check_positive_int(self.q_lora_rank, "q_lora_rank")

    @property
    def expanded_values_per_token(self) -> int:
        """What one token would take in one layer's cache if the per-head keys and
        values the plain form rebuilds were cached instead: ``H * (Dn + Dr + Dv)``."""
        heads = self.num_heads
        return heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)


# Llama 2 7B and Llama 3 70B: the entries above, so that each number has one source.
LLAMA_2_7B: PublishedModel = next(m for m in PUBLISHED_MODELS if m.name == "Llama 2 7B")
LLAMA_3_70B: PublishedModel = next(m for m in PUBLISHED_MODELS if m.name == "Llama 3 70B")

DEEPSEEK_V2 = PublishedMLAModel(
    "DeepSeek-V2", num_layers=60, d_model=5120, num_heads=128, q_lora_rank=1536,
    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    source="DeepSeek-AI (2024), DeepSeek-V2: A Strong, Economical, and Efficient "
    "Mixture-of-Experts Language Model, arXiv:2405.04434, section 3.1.2 (60 layers, "
    "hidden 5120, n_h 128, d_h 128, d_c 512, d_c' 1536, d_h^R 64); not Hugging Face's "
    "DeepseekV2Config defaults, which are another, smaller model",
)  # fmt: skip

DEEPSEEK_V3 = PublishedMLAModel(
    "DeepSeek-V3", num_layers=61, d_model=7168, num_heads=128, q_lora_rank=1536,
    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    source="DeepSeek-AI (2024/2025), DeepSeek-V3 Technical Report, arXiv:2412.19437, "
    "section 4.2 (61 layers, hidden 7168, n_h 128, d_h 128, d_c 512, d_c' 1536, "
    "d_h^R 64)",
)  # fmt: skip

# The memory table of chapter 10: multi-head, grouped-query and latent attention.
CACHE_TABLE_MODELS: tuple[PublishedModel | PublishedMLAModel, ...] = (
    LLAMA_2_7B, LLAMA_3_70B, DEEPSEEK_V2, DEEPSEEK_V3,
)  # fmt: skip


def cached_values_per_token(model: PublishedModel | PublishedMLAModel) -> int:
    """Numbers one token leaves in one layer's cache: ``2 * Hkv * Dh`` for multi-head and
    grouped-query attention (:func:`kv_values_per_token`), ``Rkv + Dr`` for latent
    attention (:func:`mla_values_per_token`; 576 for DeepSeek-V2 and V3)."""
    if isinstance(model, PublishedMLAModel):
        return mla_values_per_token(model.kv_lora_rank, model.qk_rope_head_dim)
    if isinstance(model, PublishedModel):
        return kv_values_per_token(model.num_kv_heads, model.head_dim)
    raise ValueError(f"model must be a PublishedModel or PublishedMLAModel, got "
                     f"{type(model).__name__}")  # fmt: skip


def cache_bytes_per_token(
    model: PublishedModel | PublishedMLAModel, *, bytes_per_value: int = 2
) -> int:
    """Bytes one token takes in one layer's cache: :func:`cached_values_per_token` times
    ``bytes_per_value`` (2 for float16 / bfloat16, 1 for 8-bit formats, 4 for float32)."""
    bytes_per_value = check_positive_int(bytes_per_value, "bytes_per_value")
    return cached_values_per_token(model) * bytes_per_value


def sequence_cache_bytes(
    model: PublishedModel | PublishedMLAModel,
    num_tokens: int,
    *,
    bytes_per_value: int = 2,
    batch_size: int = 1,
) -> int:
    """Bytes of the whole cache, every layer, for ``batch_size`` sequences of
    ``num_tokens`` tokens: ``num_layers * cached tokens * batch_size *``
    :func:`cache_bytes_per_token`. A sliding window caps the cached tokens, as in
    :func:`kv_cache_bytes` (which this equals for a :class:`PublishedModel`)."""
    num_tokens = check_non_negative_int(num_tokens, "num_tokens")
    batch_size = check_positive_int(batch_size, "batch_size")
    per_token = cache_bytes_per_token(model, bytes_per_value=bytes_per_value)
    window = getattr(model, "window", None)
    cached = num_tokens if window is None else min(num_tokens, window)
    return model.num_layers * cached * batch_size * per_token
