"""RoPE's scalings in PyTorch (:mod:`mha.rope_scaling_torch`) against Hugging Face
``transformers``, and dynamic NTK as ``transformers`` runs it inside a model.

What ``tests/test_positions_beyond_training.py`` proves already, and this file does not
repeat:

* the NumPy scalings (:mod:`mha.rope_scaling`) equal
  ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (linear, dynamic, yarn,
  llama3) on the grid of bases, head sizes and factors used here, and static NTK its
  formula;
* T5's buckets, NumPy and torch, equal ``T5Attention._relative_position_bucket`` for
  every relative position from -300 to 300, exactly, and ``mha.t5_relative_bias``
  equals ``T5Attention.compute_bias``. The sign convention is the same on both sides:
  ``relative_position = key position - query position`` (Hugging Face's
  ``memory_position - context_position``), so a key before its query has a negative
  offset, the only side a causal decoder's buckets tell apart; the ``compute_bias``
  comparison, which builds the offsets itself, is what pins that sign.

There the torch twins are compared with the NumPy ones in one configuration each,
which leaves most of their branches unchecked (the torch YaRN's truncated ramp and
default attention factor, dynamic NTK at or below the training length, Llama 3.1's
default ramp ends). Here every torch twin meets ``transformers`` on the whole grid:

* ``inv_freq``: ``transformers`` computes it in float32 even when asked for float64,
  so the two agree to ``RTOL_HF`` relative; the attention factors are Python floats on
  both sides, ``REL_FACTOR`` relative;
* static NTK, which ``transformers`` lacks, against its formula
  ``base' = base * s^(Dh / (Dh - 2))``, written out here;
* dynamic NTK inside ``LlamaRotaryEmbedding``: ``transformers`` calls its "dynamic"
  function with ``seq_len = max(position_ids) + 1`` (a tensor: the largest position
  plus one, not the number of tokens in the call), recomputes the frequencies only
  when that exceeds the longest length seen so far, and goes back to the trained ones
  when a sequence shorter than the training length comes. ``mha``'s
  ``rope_dynamic_ntk(..., seq_len=l)`` is a function of one length: it equals the
  module's frequencies with ``l`` the longest length since the last reset.

``transformers`` is imported on first use (:func:`hf`), as in ``test_hf_oracles.py``.
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from numerics import EPS32

from mha import rope_scaling
from mha import rope_scaling_torch as rst

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RTOL_HF = 1e-6  # float32 frequencies in transformers: a few float32 ulps (1.2e-7 each)
REL_FACTOR = 1e-12  # attention factors: the same float64 formula, written twice

# The NumPy functions meet transformers on a larger grid (tests/test_positions_beyond_
# training.py); the torch twins, the same code in another library, on its corners.
BASES = [10000.0, 500000.0]
HEAD_DIMS = [8, 128]
FACTORS = [2.0, 32.0]
TRAINING_LENGTH = 4096

grid = pytest.mark.parametrize(
    ("base", "head_dim", "factor"),
    [(b, d, f) for b in BASES for d in HEAD_DIMS for f in FACTORS],
)


@functools.cache
def hf() -> SimpleNamespace:
    """The pieces of ``transformers`` used here, imported on first use (it takes
    seconds): only the process that runs these tests pays, once."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never download
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return SimpleNamespace(
        LlamaConfig=LlamaConfig,
        LlamaRotaryEmbedding=LlamaRotaryEmbedding,
        ROPE_INIT_FUNCTIONS=ROPE_INIT_FUNCTIONS,
    )


def llama_config(rope_type: str, head_dim: int, base: float, max_position_embeddings: int,
                 **params):  # fmt: skip
    """A one-head ``LlamaConfig`` whose head is the rotary width (what every
    initialisation function reads: ``head_dim``, ``max_position_embeddings`` and
    ``rope_parameters``; ``partial_rotary_factor`` left at 1)."""
    return hf().LlamaConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_type": rope_type, "rope_theta": base, **params},
    )


def theirs(rope_type, head_dim, base, max_position_embeddings, seq_len=None, **params):
    """``transformers``' ``(inv_freq, attention_factor)``, the frequencies as float64."""
    config = llama_config(rope_type, head_dim, base, max_position_embeddings, **params)
    inv_freq, factor = hf().ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)
    assert inv_freq.dtype == torch.float32  # hence RTOL_HF
    return inv_freq.double(), factor


def assert_matches(ours: rst.ScaledRope, expected, rtol: float = RTOL_HF) -> None:
    inv_freq, factor = expected
    assert ours.inv_freq.dtype == torch.float64 and ours.inv_freq.shape == inv_freq.shape
    torch.testing.assert_close(ours.inv_freq, inv_freq, rtol=rtol, atol=0.0)
    assert ours.attention_factor == pytest.approx(factor, rel=REL_FACTOR, abs=0.0)


# ============================================ the torch twins against transformers


@grid
def test_torch_linear_matches_transformers(base, head_dim, factor):
    expected = theirs("linear", head_dim, base, TRAINING_LENGTH, factor=factor)
    assert_matches(rst.rope_linear(head_dim, factor, base), expected)


@grid
def test_torch_dynamic_ntk_matches_transformers_below_at_and_past_the_training_length(
    base, head_dim, factor
):
    """``transformers`` reads the training length from ``max_position_embeddings`` and
    takes ``max(seq_len, L)``: up to ``L`` the frequencies are RoPE's as trained."""
    trained = rst.rope_default(head_dim, base).inv_freq
    for seq_len in [1, TRAINING_LENGTH - 1, TRAINING_LENGTH, TRAINING_LENGTH + 1,
                    3 * TRAINING_LENGTH, 40 * TRAINING_LENGTH]:  # fmt: skip
        ours = rst.rope_dynamic_ntk(head_dim, factor, TRAINING_LENGTH, seq_len, base)
        expected = theirs("dynamic", head_dim, base, TRAINING_LENGTH, seq_len=seq_len,
                          factor=factor)  # fmt: skip
        assert_matches(ours, expected)
        if seq_len <= TRAINING_LENGTH:  # the NTK factor is exactly 1: the same computation
            assert torch.equal(ours.inv_freq, trained)
        else:  # every pair but the first (base^0 = 1) slowed
            assert ours.inv_freq[0] == 1.0 and (ours.inv_freq[1:] < trained[1:]).all()


YARN_VARIANTS = [
    {},  # the paper's: beta 32 and 1, 0.1 ln(s) + 1
    {"beta_fast": 64.0, "beta_slow": 2.0},
    {"beta_fast": 8.0, "beta_slow": 0.25},
    {"mscale": 0.707, "mscale_all_dim": 1.0},  # DeepSeek-V2's pair
    {"mscale": 1.0, "mscale_all_dim": 0.5},
    {"mscale": 0.707},  # alone: ignored, the paper's factor (transformers' rule)
    {"attention_factor": 1.25},
    {"truncate": False},  # gpt-oss
]


@grid
def test_torch_yarn_matches_transformers(base, head_dim, factor):
    """``max_position_embeddings = s * L``, ``original_max_position_embeddings = L``.

    With ``truncate=False`` the ramp's ends are fractional and ``transformers`` places
    each pair on it in float32 (an error of ~1e-7 of the ramp); near the interpolated
    end that weighs ``s - 1`` times the result, hence ``2 * EPS32 * s`` there."""
    for params in YARN_VARIANTS:
        ours = rst.rope_yarn(head_dim, factor, TRAINING_LENGTH, base, **params)
        expected = theirs("yarn", head_dim, base, int(factor * TRAINING_LENGTH), factor=factor,
                          original_max_position_embeddings=TRAINING_LENGTH, **params)  # fmt: skip
        rtol = RTOL_HF if params.get("truncate", True) else 2 * EPS32 * factor
        assert_matches(ours, expected, rtol=rtol)


@grid
def test_torch_llama3_matches_transformers(base, head_dim, factor):
    """Llama 3.1's ramp ends (1, 4) at two training lengths, and other ends."""
    for length, low, high in [(TRAINING_LENGTH, 1.0, 4.0), (8192, 1.0, 4.0), (1024, 2.0, 8.0),
                              (512, 0.5, 16.0)]:  # fmt: skip
        if (low, high) == (1.0, 4.0):  # the defaults, by not naming them
            ours = rst.rope_llama3(head_dim, factor, length, base)
        else:
            ours = rst.rope_llama3(head_dim, factor, length, base,
                                   low_freq_factor=low, high_freq_factor=high)  # fmt: skip
        expected = theirs("llama3", head_dim, base, int(factor * length), factor=factor,
                          original_max_position_embeddings=length,
                          low_freq_factor=low, high_freq_factor=high)  # fmt: skip
        assert_matches(ours, expected)


def test_the_grid_reaches_kept_ramped_and_interpolated_pairs_for_the_torch_twins():
    """A comparison only catches a wrong ramp where the grid has pairs on each side
    of it and on it: count them (trained frequency over scaled, 1 kept, ``s``
    interpolated), over the YaRN and Llama 3.1 cases above."""
    counts = {"yarn": np.zeros(3, dtype=int), "llama3": np.zeros(3, dtype=int)}
    for base in BASES:
        for head_dim in HEAD_DIMS:
            trained = rst.rope_default(head_dim, base).inv_freq
            for factor in FACTORS:
                for name, scaled in (
                    ("yarn", rst.rope_yarn(head_dim, factor, TRAINING_LENGTH, base)),
                    ("llama3", rst.rope_llama3(head_dim, factor, TRAINING_LENGTH, base)),
                ):
                    ratio = (trained / scaled.inv_freq).numpy()
                    kept = np.isclose(ratio, 1.0, rtol=1e-12)
                    interpolated = np.isclose(ratio, factor, rtol=1e-12)
                    counts[name] += [kept.sum(), (~kept & ~interpolated).sum(),
                                     interpolated.sum()]  # fmt: skip
                    assert (np.diff(ratio) >= -1e-12).all()  # slower pairs, slowed more
    for name, (kept, ramped, interpolated) in counts.items():
        assert kept >= 50 and ramped >= 20 and interpolated >= 50, (name, counts[name])


# ============================================================ static NTK, by its formula


@grid
def test_torch_static_ntk_is_its_formula(base, head_dim, factor):
    """``theta_i = (base * s^(Dh / (Dh - 2)))^(-2i / Dh)``, with Python's ``**``: the
    fastest pair keeps its frequency, the slowest is divided by exactly ``s``."""
    ours = rst.rope_ntk(head_dim, factor, base)
    stretched = base * factor ** (head_dim / (head_dim - 2))
    expected = torch.tensor([stretched ** (-2 * i / head_dim) for i in range(head_dim // 2)],
                            dtype=torch.float64)  # fmt: skip
    assert ours.inv_freq.dtype == torch.float64
    torch.testing.assert_close(ours.inv_freq, expected, rtol=1e-13, atol=0.0)
    assert ours.attention_factor == 1.0
    slowest = base ** (-(head_dim - 2) / head_dim)
    assert ours.inv_freq[-1].item() == pytest.approx(slowest / factor, rel=1e-13)


# ======================================= dynamic NTK as transformers runs it in a model


@pytest.mark.parametrize(("base", "head_dim", "factor"), [(10000.0, 64, 4.0),
                                                          (500000.0, 128, 8.0)])  # fmt: skip
def test_dynamic_ntk_inside_llamas_rotary_embedding(base, head_dim, factor):
    """Call ``LlamaRotaryEmbedding.forward`` with a sequence of position ids, as a model
    would (prefills and one-token decoding steps), and read its ``inv_freq`` buffer
    after each call: it equals ``rope_dynamic_ntk`` (NumPy and torch) at ``l``, the
    longest ``max(position_ids) + 1`` since the last reset."""
    length = 256
    rotary = hf().LlamaRotaryEmbedding(
        llama_config("dynamic", head_dim, base, length, factor=factor)
    )
    x = torch.zeros(1, dtype=torch.float64)  # read for its device and dtype only
    trained = rst.rope_default(head_dim, base).inv_freq
    steps = [  # (position ids of the call, l: the length whose frequencies are in use)
        (torch.arange(length // 2), length // 2),  # within L: as trained
        (torch.tensor([3 * length - 1]), 3 * length),  # one decoding step at 3L - 1: grows
        (torch.arange(2 * length), 3 * length),  # shorter, but past L: kept
        (torch.tensor([5 * length + 6]), 5 * length + 7),  # grows again
        (torch.arange(length // 4), length // 4),  # shorter than L: back to the trained
        (torch.arange(length + 1), length + 1),  # one past L
        (torch.arange(length), length + 1),  # exactly L: not shorter than L, kept
    ]
    for positions, seq_len in steps:
        rotary(x, positions[None])  # (1, T) position ids
        ours = rst.rope_dynamic_ntk(head_dim, factor, length, seq_len, base)
        assert_matches(ours, (rotary.inv_freq.double(), rotary.attention_scaling))
        spec = rope_scaling.rope_dynamic_ntk(head_dim, factor, length, seq_len, base)
        np.testing.assert_allclose(spec.inv_freq, rotary.inv_freq.double().numpy(),
                                   rtol=RTOL_HF, atol=0.0)  # fmt: skip
        if seq_len > length:  # the call's own length gives other frequencies
            count = int(positions.numel())
            if count != seq_len:
                other = rst.rope_dynamic_ntk(head_dim, factor, length, count, base).inv_freq
                assert (other[1:] / ours.inv_freq[1:] - 1).abs().max() > 1e-3
        else:
            torch.testing.assert_close(rotary.inv_freq.double(), trained, rtol=RTOL_HF, atol=0.0)
