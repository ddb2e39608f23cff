"""When two floats may be compared exactly, and how close they must be otherwise.

The tests run on CPUs whose kernels differ (``make portability`` simulates two), so:

* **Exact** (``==``, ``array_equal``, ``torch.equal``) only where the same computation
  is repeated, or the values are exact by construction: masks and ids, copies and
  reshapes, zeros of a row with nothing to attend to, powers of two.
* **A tolerance** wherever two code paths sum in another order: a tile against the
  whole product, the KV cache against the full prefix, torch against NumPy, a slice
  against the whole array. The tolerance is sized to the magnitudes involved
  (:func:`matmul_tolerance`), not picked to make the test pass.
* **Tokens** chosen by an argmax over logits computed two ways agree only if every
  choice is clear: :func:`assert_same_greedy_tokens` checks the logit margin, so that
  a failure says "near-tie" or "the cache changes the logits", not just "differs".
"""

from __future__ import annotations

import numpy as np
import torch

EPS64 = float(np.finfo(np.float64).eps)  # 2.2e-16, one ulp at 1.0
EPS32 = float(np.finfo(np.float32).eps)  # 1.2e-7


def matmul_tolerance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise bound on how far two summation orders of ``a @ b`` can be apart.

    Each order is within ``k * u * (|a| @ |b|)`` of the exact product (``k`` terms,
    unit roundoff ``u = eps / 2``), so two orders (a tile against the whole product,
    one BLAS kernel against another) are within ``k * eps * (|a| @ |b|)``.
    """
    k = a.shape[-1]
    return k * np.finfo(np.result_type(a, b)).eps * (np.abs(a) @ np.abs(b))


def assert_matmul_close(actual: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``actual`` is ``a @ b`` up to the order of its sums (:func:`matmul_tolerance`)."""
    expected = a @ b
    bound = matmul_tolerance(a, b)
    over = np.abs(actual - expected) > bound
    assert not over.any(), (
        f"{int(over.sum())} of {over.size} entries differ from a @ b by more than "
        f"k eps (|a| @ |b|); largest difference {np.max(np.abs(actual - expected)):.3g}"
    )


def assert_same_greedy_tokens(model, src, bos_id: int, eos_id: int, atol: float) -> None:
    """Greedy decoding with and without the KV cache picks the same tokens, and for a
    reason that holds on any CPU.

    ``atol`` bounds how far the two paths' logits may be apart (a few hundred ulps of
    the logits' magnitude). Checked in order:

    1. while the two prefixes agree, the logits agree to ``atol`` (else the cache is
       wrong: that is a bug, not rounding);
    2. every choice's margin over the runner-up exceeds ``2 * atol`` (else a near-tie:
       another CPU may choose the other token, and the test's data must change);
    3. so the tokens are equal, exactly (ids: exact by construction).
    """
    from mha.translator import greedy_decode, greedy_margins

    with torch.no_grad():
        cached, cached_logits = greedy_decode(model, src, bos_id, eos_id, return_logits=True)
        plain, plain_logits = greedy_decode(
            model, src, bos_id, eos_id, use_cache=False, return_logits=True
        )
    steps = min(cached.shape[1], plain.shape[1])
    # Step t of a row is comparable while both paths wrote the same tokens before it.
    same_before = torch.ones(cached.shape[0], steps, dtype=torch.bool)
    same_before[:, 1:] = (cached[:, : steps - 1] == plain[:, : steps - 1]).cummin(dim=1).values
    margins = greedy_margins(cached, cached_logits, eos_id)[:, :steps]
    live = same_before & torch.isfinite(margins)
    gap = (cached_logits[:, :steps] - plain_logits[:, :steps]).abs().amax(dim=-1)  # (B, L)
    worst = float(gap[live].max())
    assert worst <= atol, (
        f"the cache changes the logits by {worst:.3g} (> {atol:g}) on the same prefix: "
        "a wrong cache, not rounding"
    )
    closest = float(margins[live].min())
    row, step = (margins == closest).nonzero()[0].tolist()
    assert closest > 2 * atol, (
        f"near-tie: row {row}, step {step} chose its token by a margin of only "
        f"{closest:.3g} (<= 2 x {atol:g}); another CPU may choose the runner-up"
    )
    assert torch.equal(cached, plain)  # ids; implied by the two checks above
