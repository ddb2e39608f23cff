"""mha.flash_attention: tiles and an online softmax give the same attention.

Oracles: :func:`mha.scaled_dot_product_attention` (the specification, whole score
matrix), ``torch.nn.functional.scaled_dot_product_attention``, and the log-sum-exp
computed directly as ``log(sum(exp(scores)))`` over the allowed keys.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numerics import matmul_tolerance

import mha
from mha import (
    TileTrace,
    causal_mask,
    combine_masks,
    flash_attention,
    padding_mask,
    peak_memory_bytes,
    scaled_dot_product_attention,
)

ATOL = 1e-12


def qkv(lead=(2, 3), T=10, S=10, Dh=4, Dv=5, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(*lead, T, Dh)) * scale
    k = rng.normal(size=(*lead, S, Dh))
    v = rng.normal(size=(*lead, S, Dv))
    return q, k, v


def direct_logsumexp(q, k, mask=None):
    """``log(sum_s exp(score_s))`` over the allowed keys, without any shift (the test
    scores are small, so exp cannot overflow); rows with nothing allowed are NaN here
    and checked separately."""
    scaled = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])  # (..., T, S)
    allowed = np.ones(scaled.shape, bool) if mask is None else np.broadcast_to(mask, scaled.shape)
    total = np.sum(np.exp(scaled) * allowed, axis=-1)  # (..., T)
    log_total = np.log(total, out=np.full(total.shape, np.nan), where=total > 0)
    return log_total, allowed.any(axis=-1)


def check_against_spec(q, k, v, mask=None, **kwargs):
    context, logsumexp = flash_attention(q, k, v, mask, **kwargs)
    spec_mask = mask
    if kwargs.get("causal"):
        causal = causal_mask(q.shape[-2], num_keys=k.shape[-2])
        spec_mask = combine_masks(mask, causal)
    expected, _ = scaled_dot_product_attention(q, k, v, spec_mask)
    assert context.shape == expected.shape and logsumexp.shape == q.shape[:-1]
    np.testing.assert_allclose(context, expected, rtol=0, atol=ATOL)
    direct, any_allowed = direct_logsumexp(q, k, spec_mask)
    np.testing.assert_allclose(logsumexp[any_allowed], direct[any_allowed], rtol=0, atol=ATOL)
    assert np.all(np.isneginf(logsumexp[~any_allowed]))
    assert np.all(context[~any_allowed] == 0)
    return context, logsumexp


# ------------------------------------------------------------------- equal to the spec


@pytest.mark.parametrize("tile_size", [1, 2, 3, 4, 7, 10, 16, 64])
@pytest.mark.parametrize(("T", "S"), [(10, 10), (7, 13), (13, 7), (1, 1), (1, 9)])
def test_equals_the_specification_for_any_tile_size(tile_size, T, S) -> None:
    # 3, 4 and 7 do not divide 10, 13 or 7; 16 and 64 exceed both lengths.
    check_against_spec(*qkv(T=T, S=S, seed=T * 100 + S), tile_size=tile_size)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 1, 3)])
def test_any_leading_batch_and_head_dims(lead) -> None:
    check_against_spec(*qkv(lead=lead, T=9, S=11), tile_size=4)


@pytest.mark.parametrize("tile_size", [1, 3, 4, 64])
def test_random_mask_including_rows_with_nothing_to_attend_to(tile_size) -> None:
    q, k, v = qkv(T=10, S=13)
    mask = np.random.default_rng(1).random((2, 3, 10, 13)) < 0.4
    mask[0, 1, 2] = False  # one query row that may attend to nothing
    mask[1, :, 7] = False
    context, logsumexp = check_against_spec(q, k, v, mask, tile_size=tile_size)
    assert np.all(context[0, 1, 2] == 0) and np.isneginf(logsumexp[0, 1, 2])
    assert np.all(context[1, :, 7] == 0) and np.all(np.isneginf(logsumexp[1, :, 7]))
    assert not np.isnan(context).any() and not np.isnan(logsumexp).any()


def test_masks_that_broadcast() -> None:
    q, k, v = qkv(lead=(3, 2), T=6, S=9)
    lengths = np.array([9, 4, 0])  # the last sequence has no real key at all
    check_against_spec(q, k, v, padding_mask(lengths), tile_size=4)  # (B, 1, 1, S)
    check_against_spec(q, k, v, causal_mask(6, num_keys=9), tile_size=4)  # (T, S)
    row_mask = np.random.default_rng(2).random((1, 2, 6, 1)) < 0.5  # whole rows
    check_against_spec(q, k, v, row_mask, tile_size=4)


@pytest.mark.parametrize("tile_size", [1, 3, 4, 5, 16])
@pytest.mark.parametrize(("T", "S"), [(10, 10), (7, 13), (1, 6)])
def test_causal_flag_equals_the_causal_mask(tile_size, T, S) -> None:
    q, k, v = qkv(T=T, S=S, seed=3)
    by_flag = check_against_spec(q, k, v, causal=True, tile_size=tile_size)
    by_mask = flash_attention(q, k, v, causal_mask(T, num_keys=S), tile_size=tile_size)
    for a, b in zip(by_flag, by_mask, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=ATOL)


def test_causal_flag_combines_with_a_padding_mask() -> None:
    q, k, v = qkv(T=8, S=8, lead=(2, 3))
    pad = padding_mask(np.array([8, 5]))  # (B, 1, 1, S)
    check_against_spec(q, k, v, pad, causal=True, tile_size=3)


def test_no_keys_and_no_queries() -> None:
    q, k, v = qkv(T=4, S=0)
    context, logsumexp = flash_attention(q, k, v, tile_size=2)
    assert context.shape == (2, 3, 4, 5) and np.all(context == 0)
    assert np.all(np.isneginf(logsumexp))
    q, k, v = qkv(T=0, S=5)
    context, logsumexp = flash_attention(q, k, v, causal=True)
    assert context.shape == (2, 3, 0, 5) and logsumexp.shape == (2, 3, 0)


def test_extreme_scores_stay_finite_where_the_plain_formula_is() -> None:
    # Scores around +-1e4 to 1e5: exp overflows unless each tile is measured against
    # the running maximum, and underflows to 0 for all but the largest score.
    q, k, v = qkv(T=12, S=12, scale=1e4, seed=5)
    expected, _ = scaled_dot_product_attention(q, k, v)
    assert np.isfinite(expected).all()
    for tile_size in (1, 5, 64):
        context, logsumexp = flash_attention(q, k, v, tile_size=tile_size)
        assert np.isfinite(context).all() and np.isfinite(logsumexp).all()
        np.testing.assert_allclose(context, expected, rtol=1e-9, atol=1e-9)
        # The log-sum-exp is dominated by the largest score, which it can't be below;
        # but the tiles sum q @ k.T in another order than the whole product does, so
        # "below" means by more than their rounding (one ulp at 3.7e4 is 7.3e-12).
        k_t = np.swapaxes(k, -1, -2)
        scaled = q @ k_t / 2.0  # sqrt(Dh) = 2
        largest = scaled.max(axis=-1)
        rounding = matmul_tolerance(q, k_t).max(axis=-1) / 2.0
        assert np.all(logsumexp >= largest - rounding)
        assert np.all(logsumexp <= largest + math.log(12) + rounding)


def test_nan_propagates_and_is_not_turned_into_zeros() -> None:
    q, k, v = qkv(T=6, S=6)
    q[0, 0, 1, 0] = np.nan
    context, logsumexp = flash_attention(q, k, v, tile_size=4)
    assert np.isnan(context[0, 0, 1]).all() and np.isnan(logsumexp[0, 0, 1])
    assert not np.isnan(np.delete(context[0, 0], 1, axis=0)).any()


def rows_whose_tiles_read(position: int, T: int, S: int, tile_size: int) -> set[int]:
    """The query rows of every row of tiles whose tile holding key ``position`` is
    computed under ``causal=True`` (not skipped: some query of the row of tiles may see
    one of its keys), by the definition in flash_attention's docstring."""
    k0 = position // tile_size * tile_size
    rows = set()
    for q0 in range(0, T, tile_size):
        q1 = min(q0 + tile_size, T)
        if k0 <= q1 - 1 + S - T:
            rows |= set(range(q0, q1))
    return rows


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize(("T", "S"), [(8, 8), (5, 9)])
def test_a_bad_value_under_causal_reaches_only_the_tiles_read(bad, T, S) -> None:
    """The documented difference (flash_attention's Notes): with causal=True a NaN or
    inf in v at key j reaches the rows that may see j, plus the rows of the tiles that
    read j, which depend on tile_size; the whole-matrix formula and torch multiply
    every value by its weight (0 * nan, 0 * inf are NaN) and give NaN in every row that
    may not see j. With the same causal mask passed as ``mask``, no tile is skipped and
    the rows holding NaN are the formula's."""
    q, k, v = qkv(lead=(), T=T, S=S, Dv=3, seed=5)
    j = S - 2  # the queries that may see key j: the last two
    v[j, 1] = bad
    sees = {t for t in range(T) if j <= t + S - T}
    mask = causal_mask(T, num_keys=S)
    with np.errstate(invalid="ignore"):  # 0 * nan and 0 * inf: the input under test
        spec, _ = scaled_dot_product_attention(q, k, v, mask)
    torch_out = F.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)),
                                               attn_mask=torch.from_numpy(mask)).numpy()
    for whole in (spec, torch_out):  # every row that may not see j is NaN
        assert set(np.flatnonzero(np.isnan(whole).any(-1))) >= set(range(T)) - sees
    for tile_size in range(1, T + 1):
        with np.errstate(invalid="ignore"):
            context, _ = flash_attention(q, k, v, tile_size=tile_size, causal=True)
        not_finite = set(np.flatnonzero(~np.isfinite(context).all(-1)))
        assert not_finite == sees | rows_whose_tiles_read(j, T, S, tile_size), tile_size
        # the rows that may see j: NaN or inf in both, where the formula has it
        for t in sees:
            assert np.array_equal(np.isfinite(context[t]), np.isfinite(spec[t]))  # exact
        with np.errstate(invalid="ignore"):
            masked, _ = flash_attention(q, k, v, mask, tile_size=tile_size)
        assert np.array_equal(np.isnan(masked).any(-1), np.isnan(spec).any(-1))  # exact
    if (T, S, bad) == (8, 8, np.nan):  # the case of issue 32: NaN at position 6
        got = {t: set(np.flatnonzero(np.isnan(flash_attention(q, k, v, tile_size=t,
                                                              causal=True)[0]).any(-1)))
               for t in (1, 2, 3, 4, 8)}  # fmt: skip
        assert got == {1: {6, 7}, 2: {6, 7}, 3: {6, 7}, 4: {4, 5, 6, 7}, 8: set(range(8))}


def test_float32_stays_float32() -> None:
    q, k, v = (x.astype(np.float32) for x in qkv())
    context, logsumexp = flash_attention(q, k, v, tile_size=3)
    assert context.dtype == logsumexp.dtype == np.float32
    expected, _ = scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(context, expected, rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- PyTorch


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tile_size", [1, 4, 64])
def test_matches_torch_sdpa(causal, tile_size) -> None:
    q, k, v = qkv(lead=(2, 4), T=11, S=11, Dh=8, Dv=8, seed=7)
    mask = np.random.default_rng(8).random((2, 1, 11, 11)) < 0.7
    mask[1, 0, 4] = False  # nothing to attend to: F.sdpa gives zeros, logsumexp -inf
    context, logsumexp = flash_attention(q, k, v, mask, causal=causal, tile_size=tile_size)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    allowed = torch.from_numpy(mask)
    if causal:
        allowed = allowed & torch.ones(11, 11, dtype=torch.bool).tril()
    expected = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=allowed)
    np.testing.assert_allclose(context, expected.numpy(), rtol=0, atol=ATOL)
    scores = (tq @ tk.transpose(-1, -2) / math.sqrt(8)).masked_fill(~allowed, -math.inf)
    np.testing.assert_allclose(logsumexp, torch.logsumexp(scores, -1).numpy(), rtol=0, atol=ATOL)
    if causal:
        by_flag = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)  # T = S here
        no_mask, _ = flash_attention(q, k, v, causal=True, tile_size=tile_size)
        np.testing.assert_allclose(no_mask, by_flag.numpy(), rtol=0, atol=ATOL)


# ----------------------------------------------------------------------------- trace


def test_causal_skips_the_tiles_above_the_diagonal() -> None:
    # T = S = 4 tiles: row of tiles i needs tiles 0..i, i + 1 tiles, so
    # 1 + 2 + 3 + 4 = 10 computed and the 6 above the diagonal skipped.
    trace = TileTrace()
    flash_attention(*qkv(T=16, S=16), causal=True, tile_size=4, trace=trace)
    assert (trace.num_computed, trace.num_skipped) == (10, 6)
    # S - T = 8 more keys (2 tiles) shift the diagonal right: i + 3 tiles each,
    # 3 + 4 + 5 + 6 = 18 computed of 4 * 6 = 24.
    flash_attention(*qkv(T=16, S=24), causal=True, tile_size=4, trace=trace)
    assert (trace.num_computed, trace.num_skipped) == (18, 6)
    # Without causal every tile is computed.
    flash_attention(*qkv(T=16, S=24), tile_size=5, trace=trace)
    assert (trace.num_computed, trace.num_skipped) == (4 * 5, 0)


@pytest.mark.parametrize(("T", "S", "tile_size"), [(10, 10, 4), (7, 13, 3), (5, 9, 2), (9, 9, 1)])
def test_a_tile_is_skipped_exactly_when_the_causal_mask_blocks_all_of_it(T, S, tile_size) -> None:
    trace = TileTrace()
    flash_attention(*qkv(T=T, S=S), causal=True, tile_size=tile_size, trace=trace)
    allowed = causal_mask(T, num_keys=S)
    tiles = [(q0, k0) for q0 in range(0, T, tile_size) for k0 in range(0, S, tile_size)]
    assert [(s.queries[0], s.keys[0]) for s in trace.steps] == tiles  # processing order
    for step in trace.steps:
        (q0, q1), (k0, k1) = step.queries, step.keys
        assert (q1, k1) == (min(q0 + tile_size, T), min(k0 + tile_size, S))
        assert step.skipped == (not allowed[q0:q1, k0:k1].any())


def test_trace_holds_the_running_max_and_sum_of_each_row() -> None:
    q, k, v = qkv(T=7, S=10)
    mask = np.random.default_rng(4).random((2, 3, 7, 10)) < 0.6
    mask[1, 2, 3] = False
    trace = TileTrace()
    _, logsumexp = flash_attention(q, k, v, mask, tile_size=3, trace=trace)
    assert (trace.tile_size, trace.num_queries, trace.num_keys) == (3, 7, 10)
    scaled = np.where(mask, q @ np.swapaxes(k, -1, -2) / 2.0, -np.inf)  # (2, 3, 7, 10)
    for t in range(7):
        history = trace.row_history(t)
        np.testing.assert_array_equal(history.key_stop, [3, 6, 9, 10])
        assert history.running_max.shape == history.running_sum.shape == (4, 2, 3)
        assert not history.skipped.any()
        for i, stop in enumerate(history.key_stop):
            seen = scaled[..., t, :stop]  # (2, 3, stop): the keys of the tiles so far
            expected_max = seen.max(axis=-1)
            # Tile matmuls may round the last bit differently from the full one.
            np.testing.assert_allclose(history.running_max[i], expected_max, rtol=1e-14)
            shift = np.where(np.isneginf(expected_max), 0.0, expected_max)
            expected_sum = np.exp(seen - shift[..., None]).sum(axis=-1)
            np.testing.assert_allclose(history.running_sum[i], expected_sum, rtol=1e-13)
        # The maximum never falls, and the last one and sum give the log-sum-exp.
        assert np.all(history.running_max[1:] >= history.running_max[:-1])
        last_sum = history.running_sum[-1]
        final = history.running_max[-1] + np.log(np.where(last_sum > 0, last_sum, 1.0))
        np.testing.assert_allclose(final, logsumexp[..., t], rtol=0, atol=ATOL)
    assert np.all(np.isneginf(trace.row_history(3).running_max[:, 1, 2]))


def test_a_trace_is_cleared_by_each_call() -> None:
    trace = TileTrace()
    flash_attention(*qkv(T=8, S=8), tile_size=2, trace=trace)
    flash_attention(*qkv(T=8, S=8), tile_size=4, trace=trace)
    assert len(trace.steps) == 4 and trace.tile_size == 4
    with pytest.raises(ValueError, match="query must be in 0..7"):
        trace.row_history(8)


# --------------------------------------------------------------------------- memory


def test_peak_memory_grows_linearly_for_tiles_and_quadratically_for_the_formula() -> None:
    lengths = (256, 1024)  # T grows 4x
    flash, plain = [], []
    for T in lengths:
        x = np.random.default_rng(T).normal(size=(T, 16))
        flash.append(peak_memory_bytes(flash_attention, x, x, x, tile_size=64))
        plain.append(peak_memory_bytes(scaled_dot_product_attention, x, x, x))
    # The (T, T) weights alone are 8 MB at T = 1024: a quadratic 16x.
    assert plain[1] >= 1024 * 1024 * 8
    assert plain[1] / plain[0] > 12
    # Tiles: outputs grow with T, the (64, 64) tiles do not; at most linear.
    assert flash[1] / flash[0] < 4.5
    assert flash[1] < plain[1] / 20


def test_peak_memory_of_tiles_does_not_grow_with_the_number_of_keys() -> None:
    # T fixed, S grows 16x: the outputs (T, Dv) and the tiles stay the same size, so a
    # (tile_size, S) strip of scores, which would grow 16x, is caught too.
    rng = np.random.default_rng(0)
    q = rng.normal(size=(64, 16))
    peaks = []
    for S in (256, 4096):
        k, v = rng.normal(size=(S, 16)), rng.normal(size=(S, 16))
        peaks.append(peak_memory_bytes(flash_attention, q, k, v, tile_size=64))
    assert peaks[1] / peaks[0] < 1.5


def test_peak_memory_bytes_counts_what_fn_allocates() -> None:
    def make(n: int) -> np.ndarray:
        a = np.ones(n)  # n * 8 bytes
        b = np.ones(n)  # both alive: 16 n bytes
        del a
        return b

    peak = peak_memory_bytes(make, 100_000)
    assert 1_600_000 <= peak < 1_700_000
    assert peak_memory_bytes(make, n=10) < 10_000
    assert not tracemalloc.is_tracing()  # stopped again, as it was found


def test_peak_memory_bytes_leaves_a_running_tracemalloc_running() -> None:
    tracemalloc.start()
    try:
        earlier = np.ones(1_000_000)  # 8 MB allocated before the call does not count
        peak = peak_memory_bytes(np.ones, 100_000)
        assert 800_000 <= peak < 900_000
        assert tracemalloc.is_tracing()
        del earlier
    finally:
        tracemalloc.stop()


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("tile_size", [0, -1, 2.5, True, "4"])
def test_tile_size_must_be_a_positive_int(tile_size) -> None:
    with pytest.raises(ValueError, match="tile_size must be a positive integer"):
        flash_attention(*qkv(), tile_size=tile_size)


def test_errors_name_the_argument_and_the_shapes() -> None:
    q, k, v = qkv(T=4, S=6)
    with pytest.raises(ValueError, match=r"q and k must have the same last dim.*\(2, 3, 4, 4\)"):
        flash_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match=r"k and v must have the same length S"):
        flash_attention(q, k, v[..., :5, :])
    with pytest.raises(ValueError, match=r"mask with shape \(4, 5\) does not broadcast"):
        flash_attention(q, k, v, np.ones((4, 5), bool))
    with pytest.raises(ValueError, match="mask must be a boolean array"):
        flash_attention(q, k, v, np.ones((4, 6)))
    with pytest.raises(ValueError, match=r"causal=True needs at least .*\(2, 3, 6, 4\)"):
        flash_attention(*qkv(T=6, S=4), causal=True)
    with pytest.raises(ValueError, match="causal must be True or False"):
        flash_attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="trace must be a TileTrace, got list"):
        flash_attention(q, k, v, trace=[])


def test_exported_from_the_package() -> None:
    assert mha.flash_attention is flash_attention
    assert "flash_attention" in mha.__all__ and "peak_memory_bytes" in mha.__all__
