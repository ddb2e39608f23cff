"""Chapter 11's exercises (11_longer_than_trained): t5_bucket, window_keys and yarn_ramp.

* ``t5_bucket(distance, num_buckets, max_distance)``: T5's causal bucket of a key
  ``distance`` positions back (``mha.t5_relative_position_bucket`` of ``-distance``);
* ``window_keys(t, window, num_sinks)``: the positions a query at ``t`` may attend to
  under a sliding window with attention sinks (row ``t`` of
  ``mha.sliding_window_mask``);
* ``yarn_ramp(head_dim, training_length, base, beta_fast, beta_slow)``: YaRN's weight
  of the interpolated frequency, per pair (what ``mha.rope_yarn`` blends with).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import mha

from ._core import _Case, _Mistake

# --------------------------------------------------------------------------- t5_bucket


def _t5_bucket(distance: Any, num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """T5's causal bucket of keys ``distance >= 0`` positions back."""
    return mha.t5_relative_position_bucket(
        -np.asarray(distance), bidirectional=False, num_buckets=num_buckets,
        max_distance=max_distance,
    )  # fmt: skip


def _t5_parts(distance: Any, num_buckets: int, max_distance: int):
    n = np.asarray(distance).astype(np.int64)
    exact = num_buckets // 2
    growth = np.log(np.maximum(n, exact) / exact) / np.log(max_distance / exact)
    return n, exact, growth


def _t5_mistakes() -> tuple[_Mistake, ...]:
    def no_cap(distance, num_buckets=32, max_distance=128):
        n, exact, growth = _t5_parts(distance, num_buckets, max_distance)
        far = exact + np.floor(growth * (num_buckets - exact)).astype(np.int64)
        return np.where(n < exact, n, far)

    def rounded(distance, num_buckets=32, max_distance=128):
        n, exact, growth = _t5_parts(distance, num_buckets, max_distance)
        far = exact + np.round(growth * (num_buckets - exact)).astype(np.int64)
        return np.where(n < exact, n, np.minimum(far, num_buckets - 1))

    def rounded_up(distance, num_buckets=32, max_distance=128):
        n, exact, growth = _t5_parts(distance, num_buckets, max_distance)
        far = exact + np.ceil(growth * (num_buckets - exact)).astype(np.int64)
        return np.where(n < exact, n, np.minimum(far, num_buckets - 1))

    def all_exact(distance, num_buckets=32, max_distance=128):
        n = np.asarray(distance).astype(np.int64)
        return np.minimum(n, num_buckets - 1)

    def unscaled_log(distance, num_buckets=32, max_distance=128):
        n, exact, _ = _t5_parts(distance, num_buckets, max_distance)
        far = exact + np.floor(np.log(np.maximum(n, exact) / exact)).astype(np.int64)
        return np.where(n < exact, n, np.minimum(far, num_buckets - 1))

    def signed(distance, num_buckets=32, max_distance=128):
        return mha.t5_relative_position_bucket(
            np.asarray(distance), bidirectional=False, num_buckets=num_buckets,
            max_distance=max_distance,
        )  # fmt: skip

    return (
        _Mistake(no_cap, "Distances past max_distance get buckets beyond the last one.",
                 "Every distance from max_distance on shares bucket num_buckets - 1."),
        _Mistake(rounded, "The logarithmic bucket is rounded to the nearest, not down.",
                 "A bucket holds the distances from its start up to the next one's."),
        _Mistake(rounded_up, "The logarithmic bucket is rounded up, not down.",
                 "A bucket holds the distances from its start up to the next one's."),
        _Mistake(all_exact, "Every distance has a bucket of its own (no logarithmic part).",
                 "Only the first num_buckets // 2 distances are exact."),
        _Mistake(unscaled_log, "ln(n / E) is not divided by ln(max_distance / E) and "
                 "multiplied by the number of logarithmic buckets.",
                 "The log part maps E .. max_distance onto the buckets E .. N - 1."),
        _Mistake(signed, "Every distance lands in bucket 0: the sign is reversed.",
                 "A key d positions back is at relative position -d (key minus query)."),
    )  # fmt: skip


def _t5_cases(rng: np.random.Generator) -> list[_Case]:
    cases = []
    for buckets, reach in ((32, 128), (16, 64), (8, 20)):
        distance = np.concatenate([np.arange(0, 3 * reach, 3), rng.integers(0, 4 * reach, 10)])
        cases.append(_Case(f"{buckets} buckets, max_distance {reach}, distances up to "
                           f"{int(distance.max())}", (distance, buckets, reach)))  # fmt: skip
    return cases


# --------------------------------------------------------------------------- window_keys


def _window_keys(t: int, window: int, num_sinks: int = 0) -> np.ndarray:
    """The key positions a query at ``t`` sees: the last ``window`` up to ``t`` and the
    first ``num_sinks``, in increasing order."""
    mask = mha.sliding_window_mask(t + 1, window, num_sinks=num_sinks)  # (t+1, t+1)
    return np.flatnonzero(mask[t])


def _window_mistakes() -> tuple[_Mistake, ...]:
    def one_more(t, window, num_sinks=0):
        return _window_keys(t, window + 1, num_sinks)

    def sinks_twice(t, window, num_sinks=0):
        recent = np.arange(max(t - window + 1, 0), t + 1)
        return np.concatenate([np.arange(min(num_sinks, t + 1)), recent])

    def future_sinks(t, window, num_sinks=0):
        recent = np.arange(max(t - window + 1, 0), t + 1)
        return np.union1d(np.arange(num_sinks), recent)

    def no_sinks(t, window, num_sinks=0):
        return _window_keys(t, window)

    return (
        _Mistake(one_more, "The window holds window + 1 keys.",
                 "The window is the query itself and the window - 1 keys before it."),
        _Mistake(sinks_twice, "A sink inside the window is listed twice.",
                 "Each position appears once, in increasing order."),
        _Mistake(future_sinks, "Sinks after the query are kept (early queries).",
                 "A causal query never sees a key after itself, sink or not."),
        _Mistake(no_sinks, "The sinks are missing.",
                 "The first num_sinks positions stay visible to every query."),
    )  # fmt: skip


def _window_cases(rng: np.random.Generator) -> list[_Case]:
    settings = [(0, 4, 1), (2, 4, 4), (3, 4, 2), (9, 4, 2), (40, 32, 4), (100, 28, 4),
                (5, 1, 1), (int(rng.integers(50, 90)), 8, 0)]  # fmt: skip
    return [_Case(f"t={t}, window={w}, num_sinks={k}", (t, w, k)) for t, w, k in settings]


# --------------------------------------------------------------------------- yarn_ramp


def _yarn_ramp(
    head_dim: int, training_length: int, base: float = 10000.0, beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> np.ndarray:  # fmt: skip
    """Per pair, YaRN's weight of the interpolated frequency ``theta_i / s``."""
    trained = mha.rope_default(head_dim, base).inv_freq  # (Dh/2,)
    factor = 4.0  # any s > 1: the ramp does not depend on it
    scaled = mha.rope_yarn(head_dim, factor, training_length, base,
                           beta_fast=beta_fast, beta_slow=beta_slow).inv_freq  # fmt: skip
    return (trained - scaled) / (trained - trained / factor)  # theta' = theta (1 - r) + theta/s r


def _pair_turning(turns: float, head_dim: int, training_length: int, base: float) -> float:
    return head_dim * math.log(training_length / (2 * math.pi * turns)) / (2 * math.log(base))


def _ramp_between(head_dim: int, low: float, high: float) -> np.ndarray:
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    return np.clip((np.arange(head_dim // 2) - low) / (high - low), 0.0, 1.0)


def _yarn_mistakes() -> tuple[_Mistake, ...]:
    def in_turns(head_dim, training_length, base=10000.0, beta_fast=32.0, beta_slow=1.0):
        theta = mha.rope_default(head_dim, base).inv_freq
        turns = training_length * theta / (2 * math.pi)  # (Dh/2,)
        return np.clip((beta_fast - turns) / (beta_fast - beta_slow), 0.0, 1.0)

    def reversed_ramp(head_dim, training_length, base=10000.0, beta_fast=32.0, beta_slow=1.0):
        return 1.0 - _yarn_ramp(head_dim, training_length, base, beta_fast, beta_slow)

    def not_rounded(head_dim, training_length, base=10000.0, beta_fast=32.0, beta_slow=1.0):
        low = _pair_turning(beta_fast, head_dim, training_length, base)
        high = _pair_turning(beta_slow, head_dim, training_length, base)
        return _ramp_between(head_dim, low, high)

    def no_two_pi(head_dim, training_length, base=10000.0, beta_fast=32.0, beta_slow=1.0):
        def index(turns):
            return head_dim * math.log(training_length / turns) / (2 * math.log(base))

        return _ramp_between(head_dim, math.floor(index(beta_fast)), math.ceil(index(beta_slow)))

    return (
        _Mistake(in_turns, "The ramp is linear in the turns r, as the paper writes it; "
                 "mha and transformers ramp linearly in the pair index.",
                 "Find the (fractional) pair index that turns beta times, then ramp in i."),
        _Mistake(reversed_ramp, "The ramp is reversed: fast pairs interpolated, slow kept.",
                 "Pairs that turn many times within L have seen every angle: keep them."),
        _Mistake(not_rounded, "The two ends are not rounded to whole pairs.",
                 "Round low down and high up (the paper's code does; truncate=True)."),
        _Mistake(no_two_pi, "The turns forget the 2 pi: a wavelength is 2 pi / theta.",
                 "Pair i turns L * theta_i / (2 pi) times within L positions."),
    )  # fmt: skip


def _yarn_cases(rng: np.random.Generator) -> list[_Case]:
    settings = [(8, 32, 10000.0, 32.0, 1.0), (64, 4096, 10000.0, 32.0, 1.0),
                (128, 8192, 500000.0, 32.0, 1.0), (128, 4096, 10000.0, 16.0, 2.0),
                (32, 512, 10000.0, 32.0, 1.0)]  # fmt: skip
    return [_Case(f"head_dim {d}, L {n}, base {b:g}, betas {f:g}/{s:g}", (d, n, b, f, s))
            for d, n, b, f, s in settings]  # fmt: skip
