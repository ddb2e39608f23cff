"""The checkers that give each chapter exercises of its own subject (issue 24).

As in test_exercises.py, every candidate is written here, independently of the models in
``mha.exercises``: correct but unusual answers (einsum, loops, torch tensors) must pass,
and each typical wrong answer must get its own diagnosis and no other's. The references
that ``mha.exercises`` writes itself (mha exports no function of that name) are checked
against PyTorch or against the mha code that does the same step inside a larger function.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mha
from mha import exercises
from mha.translator.training import sequence_loss as torch_sequence_loss


def run(capsys: pytest.CaptureFixture[str], name: str, candidate: Callable) -> tuple[bool, str]:
    verdict = exercises.check(name, candidate)
    return bool(verdict), " ".join(capsys.readouterr().out.split())


# --------------------------------------------------------------------------- chapter 3


def pe_loops(max_len, d_model, dtype=np.float64):
    table = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos, 2 * i], table[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return table


def pe_complex(max_len, d_model, dtype=np.float64):
    """exp(i angle): the real part is the cosine, the imaginary part the sine."""
    angles = np.outer(np.arange(max_len), 10000.0 ** (-np.arange(0, d_model, 2) / d_model))
    turns = np.exp(1j * angles)
    return np.stack([turns.imag, turns.real], axis=-1).reshape(max_len, d_model)


def pe_variant(swap=False, per_pair=False, halves=False, start=0, multiply=False,
               dtype_out=np.float64):
    def candidate(max_len, d_model, dtype=np.float64):
        pos = np.arange(start, start + max_len)[:, None]
        j = np.arange(d_model // 2)
        exponent = (j if per_pair else 2 * j) / d_model
        angles = pos * 10000**exponent if multiply else pos / 10000**exponent
        a, b = (np.cos(angles), np.sin(angles)) if swap else (np.sin(angles), np.cos(angles))
        if halves:
            return np.hstack([a, b]).astype(dtype_out)
        return np.stack([a, b], axis=-1).reshape(max_len, d_model).astype(dtype_out)

    return candidate


def pe_per_column(max_len, d_model, dtype=np.float64):
    """Column j at pos / 10000^(j/D): the formula's 2i read as the column's index."""
    table = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for j in range(d_model):
            angle = pos / 10000 ** (j / d_model)
            table[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return table


def norm_loops(x, sublayer_out, gamma, beta, eps=1e-5):
    out = np.empty(np.shape(x))
    for index in np.ndindex(*np.shape(x)[:-1]):
        y = x[index] + sublayer_out[index]
        mean = sum(y) / len(y)
        var = sum((v - mean) ** 2 for v in y) / len(y)
        out[index] = [g * (v - mean) / math.sqrt(var + eps) + b
                      for v, g, b in zip(y, gamma, beta, strict=True)]
    return out


def norm_torch(x, sublayer_out, gamma, beta, eps=1e-5):
    y = torch.from_numpy(x + sublayer_out)
    return F.layer_norm(y, y.shape[-1:], torch.from_numpy(gamma), torch.from_numpy(beta), eps)


def norm_variant(order="post", axis=-1, ddof=0, eps_outside=False):
    def ln(y, gamma, beta, eps):
        mean = y.mean(axis=axis, keepdims=True)
        std = y.std(axis=axis, keepdims=True, ddof=ddof)
        spread = std + eps if eps_outside else np.sqrt(std**2 + eps)
        return gamma * (y - mean) / spread + beta

    def candidate(x, sublayer_out, gamma, beta, eps=1e-5):
        if order == "pre":
            return x + ln(sublayer_out, gamma, beta, eps)
        if order == "none":
            return ln(sublayer_out, gamma, beta, eps)
        if order == "swapped":
            return ln(x + sublayer_out, beta, gamma, eps)
        if order == "plain":
            return ln(x + sublayer_out, np.ones_like(gamma), np.zeros_like(beta), eps)
        return ln(x + sublayer_out, gamma, beta, eps)

    return candidate


# --------------------------------------------------------------------------- chapter 5


def cross_loops(x, memory, params, num_heads, mask=None):
    """Heads one by one, each with its own slices of the weights; biases may be None."""
    def linear(a, w, b):
        return a @ w if b is None else a @ w + b

    head_dim = params.W_q.shape[1] // num_heads
    q, k, v = (linear(x, params.W_q, params.b_q), linear(memory, params.W_k, params.b_k),
               linear(memory, params.W_v, params.b_v))
    contexts, weights = [], []
    for h in range(num_heads):
        cols = slice(h * head_dim, (h + 1) * head_dim)
        scores = np.einsum("btd,bsd->bts", q[..., cols], k[..., cols]) / math.sqrt(head_dim)
        if mask is not None:
            scores = np.where(mask[:, 0], scores, -np.inf)
        w = mha.softmax(scores)
        contexts.append(w @ v[..., cols])
        weights.append(w)
    return linear(np.concatenate(contexts, -1), params.W_o, params.b_o), np.stack(weights, 1)


def cross_scaled(divisor=None, use_mask=True, plain_biases=False):
    """A learner's cross-attention, heads by hand; ``divisor(x, memory, head_dim)``
    replaces sqrt(head_dim) (None: no scaling); ``plain_biases``: x @ W + b, always."""
    def candidate(x, memory, params, num_heads, mask=None):
        def linear(a, w, b):
            return a @ w + b if plain_biases else (a @ w if b is None else a @ w + b)

        head_dim = params.W_q.shape[1] // num_heads
        q = mha.split_heads(linear(x, params.W_q, params.b_q), num_heads)
        k = mha.split_heads(linear(memory, params.W_k, params.b_k), num_heads)
        v = mha.split_heads(linear(memory, params.W_v, params.b_v), num_heads)
        scores = np.einsum("bhtd,bhsd->bhts", q, k)
        if divisor is not None:
            scores = scores / divisor(x, memory, head_dim)
        if use_mask and mask is not None:
            scores = np.where(mask, scores, -np.inf)
        weights = mha.softmax(scores)
        return linear(mha.merge_heads(weights @ v), params.W_o, params.b_o), weights

    return candidate


def cross_variant(roles="cross", causal=False, no_w_o=False, v_with_w_k=False):
    def candidate(x, memory, params, num_heads, mask=None):
        if roles == "self":
            memory = x
        elif roles == "swapped":
            x, memory = memory, x
        if causal:
            tril = np.tril(np.ones((x.shape[1], memory.shape[1]), dtype=bool))
            mask = tril if mask is None else mask & tril
        steps = mha.multi_head_attention_steps(
            x, memory, memory, params if not v_with_w_k else _with_w_v(params), num_heads,
            mask)
        return (steps.merged if no_w_o else steps.output), steps.weights

    return candidate


def _with_w_v(params):
    import dataclasses

    return dataclasses.replace(params, W_v=params.W_k, b_v=params.b_k)


def torch_mask_loops(mask, num_heads=None):
    mask = np.asarray(mask)
    if mask.ndim == 2:
        return mask == False  # noqa: E712 - elementwise
    batch, heads, target_len, source_len = mask.shape
    out = np.zeros((batch * num_heads, target_len, source_len), dtype=bool)
    for b in range(batch):
        for h in range(num_heads):
            out[b * num_heads + h] = ~mask[b, h if heads > 1 else 0]
    return out


def torch_mask_variant(invert=True, head_major=False, broadcast=True, additive=False):
    def candidate(mask, num_heads=None):
        blocked = ~mask if invert else mask
        if mask.ndim == 4:
            if broadcast:
                blocked = np.repeat(blocked, num_heads // blocked.shape[1], axis=1)
            if head_major:
                blocked = blocked.transpose(1, 0, 2, 3)
            blocked = blocked.reshape(-1, *blocked.shape[-2:])
        return np.where(blocked, -np.inf, 0.0) if additive else blocked

    return candidate


# --------------------------------------------------------------------------- chapter 6


def entropy_torch(weights):
    w = torch.from_numpy(np.asarray(weights))
    return -torch.special.xlogy(w, w).sum(-1)


def entropy_loops(weights):
    weights = np.asarray(weights)
    out = np.zeros(weights.shape[:-1])
    for index in np.ndindex(*weights.shape[:-1]):
        out[index] = -sum(w * math.log(w) for w in weights[index] if w > 0)
    return out


def entropy_variant(guard=True, sign=-1, log=np.log, axis=-1, mean=False, keepdims=False):
    def candidate(weights):
        terms = weights * log(np.where(weights > 0, weights, 1.0)) if guard else (
            weights * log(weights))
        total = terms.mean(axis=axis, keepdims=keepdims) if mean else terms.sum(
            axis=axis, keepdims=keepdims)
        return sign * total

    return candidate


# --------------------------------------------------------------------------- chapter 7


def loss_torch(logits, tgt_out, pad_id, label_smoothing=0.0):
    """The training loop's loss, returned as a float as the exercise asks (a tensor is
    refused: see the table of mistakes)."""
    return torch_sequence_loss(torch.from_numpy(logits), torch.from_numpy(tgt_out), pad_id,
                               label_smoothing).item()


def loss_loops(logits, tgt_out, pad_id, label_smoothing=0.0):
    total, count = 0.0, 0
    for b in range(tgt_out.shape[0]):
        for t in range(tgt_out.shape[1]):
            if tgt_out[b, t] == pad_id:
                continue
            z = logits[b, t]
            top = max(z)
            log_sum = top + math.log(sum(math.exp(v - top) for v in z))
            logp = [v - log_sum for v in z]
            smooth = -sum(logp) / len(logp)
            total += (1 - label_smoothing) * -logp[tgt_out[b, t]] + label_smoothing * smooth
            count += 1
    return total / count


def loss_variant(all_positions=False, divide_all=False, others=False, no_smoothing=False,
                 naive=False, raw=False, total=False, per_sentence=False, pad=None,
                 log10=False):
    def candidate(logits, tgt_out, pad_id, label_smoothing=0.0):
        eps = 0.0 if no_smoothing else label_smoothing
        if raw:
            logp = logits
        elif naive:
            logp = np.log(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True))
        elif log10:
            logp = np.log10(mha.softmax(logits))
        else:
            logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
        nll = -np.take_along_axis(logp, tgt_out[..., None], -1)[..., 0]
        vocab = logp.shape[-1]
        spread = (-logp.sum(-1) - nll) / (vocab - 1) if others else -logp.mean(-1)
        per = (1 - eps) * nll + eps * spread
        keep = np.ones(tgt_out.shape, bool) if all_positions else tgt_out != (
            pad_id if pad is None else pad)
        if total:
            return float((per * keep).sum())
        if per_sentence:
            return float(np.mean([per[b][keep[b]].mean() for b in range(len(per))]))
        denominator = tgt_out.size if divide_all else keep.sum()
        return (per * keep).sum() / denominator

    return candidate


def loss_shifted(shift):
    """The log-softmax shifted by ``shift(logits)`` instead of each position's maximum."""
    def candidate(logits, tgt_out, pad_id, label_smoothing=0.0):
        z = logits - shift(logits)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        nll = -np.take_along_axis(logp, tgt_out[..., None], -1)[..., 0]
        per = (1 - label_smoothing) * nll - label_smoothing * logp.mean(-1)
        return float(per[tgt_out != pad_id].mean())

    return candidate


def target_loops(tokens, pad_id):
    batch, size = tokens.shape
    return np.array([[[[s <= t and tokens[b, s] != pad_id for s in range(size)]
                       for t in range(size)]] for b in range(batch)])


def target_variant(causal=True, padding="keys", k=0, invert=False, squeeze=False, pad=None):
    def candidate(tokens, pad_id):
        real = tokens != (pad_id if pad is None else pad)
        size = tokens.shape[1]
        mask = np.ones((len(tokens), 1, size, size), dtype=bool)
        if causal:
            mask = mask & np.tril(np.ones((size, size), dtype=bool), k=k)
        if padding == "keys":
            mask = mask & real[:, None, None, :]
        elif padding == "queries":
            mask = mask & real[:, None, :, None]
        mask = ~mask if invert else mask
        return mask[:, 0] if squeeze else mask

    return candidate


# --------------------------------------------------------------------------- chapter 8


def repeat_torch(x, num_heads):
    t = torch.from_numpy(x)
    return t.repeat_interleave(num_heads // t.shape[1], dim=1)


def repeat_loops(x, num_heads):
    group = num_heads // x.shape[1]
    return np.stack([x[:, h // group] for h in range(num_heads)], axis=1)


def repeat_einsum(x, num_heads):
    """A one-hot (H, Hkv) matrix picks each query head's key/value head."""
    kv_heads = x.shape[1]
    pick = np.eye(kv_heads)[np.arange(num_heads) // (num_heads // kv_heads)]  # (H, Hkv)
    return np.einsum("hg,bgsd->bhsd", pick, x)


def decode_torch(q, k_cache, v_cache, k_new, v_new):
    q, k_cache, v_cache, k_new, v_new = map(torch.from_numpy, (q, k_cache, v_cache, k_new, v_new))
    keys, values = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)
    return F.scaled_dot_product_attention(q, keys, values), keys, values


def decode_loops(q, k_cache, v_cache, k_new, v_new):
    """One batch and head at a time, the new position attended to as a separate term."""
    batch, heads, _, head_dim = q.shape
    keys = np.concatenate([k_cache, k_new], axis=2)
    values = np.concatenate([v_cache, v_new], axis=2)
    context = np.zeros_like(q)
    for b in range(batch):
        for h in range(heads):
            scores = [float(q[b, h, 0] @ key) / math.sqrt(head_dim) for key in keys[b, h]]
            top = max(scores)
            exps = [math.exp(s - top) for s in scores]
            context[b, h, 0] = sum(e * v for e, v in zip(exps, values[b, h], strict=True))
            context[b, h, 0] /= sum(exps)
    return context, keys, values


def decode_variant(axis=2, prepend=False, forget_new=False, cache_unused=False, keep_old=False,
                   swap=False, unscaled=False, wrong_axis=False, context_only=False,
                   naive=False, top_left=False, shift=None):
    def candidate(q, k_cache, v_cache, k_new, v_new):
        if swap:
            k_new, v_new = v_new, k_new
        parts_k, parts_v = [k_cache, k_new], [v_cache, v_new]
        if prepend:
            parts_k, parts_v = parts_k[::-1], parts_v[::-1]
        keys, values = np.concatenate(parts_k, axis=axis), np.concatenate(parts_v, axis=axis)
        read_k, read_v = keys, values
        if forget_new:
            read_k, read_v = k_cache, v_cache
        if cache_unused:
            read_k, read_v = k_new, v_new
        scores = np.einsum("bhtd,bhsd->bhts", q, read_k) if axis == 2 else q @ np.swapaxes(
            read_k, -1, -2)
        scores = scores if unscaled else scores / np.sqrt(q.shape[-1])
        if top_left:  # the causal mask of a square block, cut to the one query's row
            scores = np.where(np.tril(np.ones(scores.shape[-2:], dtype=bool)), scores, -np.inf)
        if naive:
            weights = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
        elif shift is not None:  # by the whole array's maximum, or by each row's mean
            top = scores.max() if shift == "global" else scores.mean(-1, keepdims=True)
            weights = np.exp(scores - top) / np.exp(scores - top).sum(-1, keepdims=True)
        else:
            weights = mha.softmax(scores, axis=-2 if wrong_axis else -1)
        context = weights @ read_v
        if context_only:
            return context
        return (context, k_cache, v_cache) if keep_old else (context, keys, values)

    return candidate


# --------------------------------------------------------------------------- chapter 9


def merge_loops(m_a, l_a, a_a, m_b, l_b, a_b):
    """Row by row, with Python floats; a tile with nothing allowed is skipped."""
    m, l, a = np.empty_like(m_a), np.empty_like(l_a), np.empty_like(a_a)  # noqa: E741
    for index in np.ndindex(*m_a.shape):
        parts = [(mx, lx, ax[index]) for mx, lx, ax in
                 ((m_a[index], l_a[index], a_a), (m_b[index], l_b[index], a_b))
                 if mx != -math.inf]
        top = max((p[0] for p in parts), default=-math.inf)
        m[index] = top
        l[index] = sum(math.exp(mx - top) * lx for mx, lx, _ in parts)
        a[index] = sum((math.exp(mx - top) * ax for mx, _, ax in parts),
                       np.zeros(a_a.shape[-1]))
    return m, l, a


def merge_torch(m_a, l_a, a_a, m_b, l_b, a_b):
    """Through the log-sum-exp of each tile, in torch: log l + m, then logaddexp."""
    m_a, l_a, a_a, m_b, l_b, a_b = map(torch.from_numpy, (m_a, l_a, a_a, m_b, l_b, a_b))
    m = torch.maximum(m_a, m_b)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w_a, w_b = torch.exp(m_a - safe), torch.exp(m_b - safe)  # exp(-inf) = 0
    return m, w_a * l_a + w_b * l_b, w_a[..., None] * a_a + w_b[..., None] * a_b


def merge_variant(rescale="right", a_scaled=True, guard=True, keep="both", expand=True):
    def candidate(m_a, l_a, a_a, m_b, l_b, a_b):
        if keep == "larger":
            pick = m_a >= m_b
            return (np.where(pick, m_a, m_b), np.where(pick, l_a, l_b),
                    np.where(pick[..., None], a_a, a_b))
        m = np.maximum(m_a, m_b)
        if rescale == "none":
            f_a = f_b = 1.0
        elif rescale == "inverted":
            f_a, f_b = np.exp(m - m_a), np.exp(m - m_b)
        elif guard:
            f_a = np.exp(m_a - np.where(np.isneginf(m), 0, m))
            f_b = np.exp(m_b - np.where(np.isneginf(m), 0, m))
        else:
            f_a, f_b = np.exp(m_a - m), np.exp(m_b - m)
        l = f_a * l_a + f_b * l_b  # noqa: E741
        if not a_scaled:
            return m, l, a_a + a_b
        if not expand:
            return m, l, f_a * a_a + f_b * a_b
        return m, l, np.expand_dims(f_a, -1) * a_a + np.expand_dims(f_b, -1) * a_b

    return candidate


CORRECT = [
    ("sinusoidal_positional_encoding", mha.sinusoidal_positional_encoding),
    ("sinusoidal_positional_encoding", pe_loops),
    ("sinusoidal_positional_encoding", pe_complex),
    ("add_and_norm", norm_loops),
    ("add_and_norm", norm_torch),
    ("cross_attention", cross_loops),
    ("cross_attention", lambda x, memory, params, num_heads, mask=None:
        mha.multi_head_attention(x, memory, memory, params, num_heads, mask)),
    ("to_torch_attn_mask", mha.to_torch_attn_mask),
    ("to_torch_attn_mask", torch_mask_loops),
    ("score_std", lambda head_dim, q_std=1.0, k_std=1.0: (head_dim * q_std**2 * k_std**2) ** 0.5),
    ("score_std", lambda head_dim, q_std=1.0, k_std=1.0: np.float32(
        math.sqrt(head_dim) * q_std * k_std)),
    ("attention_entropy", entropy_torch),
    ("attention_entropy", entropy_loops),
    ("sequence_loss", loss_torch),
    ("sequence_loss", loss_loops),
    ("target_mask", target_loops),
    ("target_mask", lambda tokens, pad_id: mha.masks_torch.target_mask(
        torch.from_numpy(tokens), pad_id)),
    ("repeat_kv_heads", repeat_torch),
    ("repeat_kv_heads", repeat_loops),
    ("repeat_kv_heads", repeat_einsum),
    ("decode_step", decode_torch),
    ("decode_step", decode_loops),
    ("decode_step", decode_variant(axis=-2)),
    ("merge_tiles", merge_loops),
    ("merge_tiles", merge_torch),
    ("merge_tiles", merge_variant()),
]


@pytest.mark.parametrize(("name", "candidate"), CORRECT,
                         ids=lambda c: getattr(c, "__name__", c))
def test_correct_unusual_answers_pass(capsys, name: str, candidate: Callable) -> None:
    verdict, out = run(capsys, name, candidate)
    assert verdict is True, out
    assert out.startswith(f"{name}: correct on ")


MISTAKES: dict[str, dict[str, tuple[Callable, str]]] = {
    "sinusoidal_positional_encoding": {
        "swapped": (pe_variant(swap=True), "sin and cos are swapped"),
        "per column": (pe_per_column, "Each column gets its own frequency"),
        "per pair": (pe_variant(per_pair=True), "the exponent counts the pairs"),
        "float32": (pe_variant(dtype_out=np.float32), "smaller float type than mha's"),
        "list": (lambda n, d, dtype=np.float64: pe_loops(n, d).tolist(),
                 "is not a NumPy float64 array"),
        "halves": (pe_variant(halves=True), "All sines first"),
        "from 1": (pe_variant(start=1), "The positions start at 1"),
        "multiplied": (pe_variant(multiply=True), "multiplied by 10000^(2i/D)"),
    },
    "add_and_norm": {
        "pre-norm": (norm_variant(order="pre"), "x + LayerNorm(sublayer_out)"),
        "no residual": (norm_variant(order="none"), "No residual"),
        "positions": (norm_variant(axis=-2), "Normalised over the positions"),
        "ddof": (norm_variant(ddof=1), "divided by D - 1"),
        "eps outside": (norm_variant(eps_outside=True), "eps is added to the standard"),
        "swapped": (norm_variant(order="swapped"), "gamma and beta are swapped"),
        "plain": (norm_variant(order="plain"), "gamma and beta are not used"),
    },
    "cross_attention": {
        "self": (cross_variant(roles="self"), "Self-attention: the keys and values come"),
        "swapped": (cross_variant(roles="swapped"), "The roles are swapped"),
        "causal": (cross_variant(causal=True), "A causal mask is added"),
        "no W_o": (cross_variant(no_w_o=True), "W_o forgotten"),
        "W_k for values": (cross_variant(v_with_w_k=True), "projected with W_k"),
        "output only": (lambda *a, **k: cross_loops(*a, **k)[0], "Only the output"),
        "no scaling": (cross_scaled(divisor=None), "No 1/sqrt(head_dim) scaling"),
        "sqrt(D_mem)": (cross_scaled(lambda x, m, dh: math.sqrt(m.shape[-1])),
                        "divided by sqrt(D_mem), the memory's width"),
        "sqrt(D)": (cross_scaled(lambda x, m, dh: math.sqrt(x.shape[-1])),
                    "divided by sqrt(D), the width of x"),
        "mask ignored": (cross_scaled(lambda x, m, dh: math.sqrt(dh), use_mask=False),
                         "The mask has no effect"),
        "None biases": (cross_scaled(lambda x, m, dh: math.sqrt(dh), plain_biases=True),
                        "Fails when the biases are None"),
    },
    "to_torch_attn_mask": {
        "not inverted": (torch_mask_variant(invert=False), "Not inverted"),
        "head-major": (torch_mask_variant(head_major=True), "head-major"),
        "not broadcast": (torch_mask_variant(broadcast=False), "is not copied to every head"),
        "additive": (torch_mask_variant(additive=True), "A float additive mask"),
        "tensor": (lambda mask, num_heads=None: torch.from_numpy(
            torch_mask_loops(mask, num_heads)), "is not a NumPy boolean array"),
    },
    "score_std": {
        "variance": (lambda d, q_std=1.0, k_std=1.0: d * (q_std * k_std) ** 2,
                     "This is the variance"),
        "stds ignored": (lambda d, q_std=1.0, k_std=1.0: d**0.5, "are ignored"),
        "sqrt of all": (lambda d, q_std=1.0, k_std=1.0: (d * q_std * k_std) ** 0.5,
                        "sqrt(Dh q_std k_std)"),
        "linear": (lambda d, q_std=1.0, k_std=1.0: d * q_std * k_std, "not like Dh"),
        "sum": (lambda d, q_std=1.0, k_std=1.0: d**0.5 * (q_std + k_std), "(q_std + k_std)"),
        "0-d array": (lambda d, q_std=1.0, k_std=1.0: np.array(math.sqrt(d) * q_std * k_std),
                      "is not a Python or NumPy float"),
        "tensor": (lambda d, q_std=1.0, k_std=1.0: torch.tensor(math.sqrt(d) * q_std * k_std),
                   "is not a Python or NumPy float"),
        "isqrt": (lambda d, q_std=1.0, k_std=1.0: math.isqrt(d) * q_std * k_std,
                  "rounded down to an integer"),
        "int(sqrt)": (lambda d, q_std=1.0, k_std=1.0: int(math.sqrt(d)) * q_std * k_std,
                      "rounded down to an integer"),
    },
    "attention_entropy": {
        "0 log 0": (entropy_variant(guard=False), "0 * -inf = NaN"),
        "sign": (entropy_variant(sign=1), "The sign is wrong"),
        "bits": (entropy_variant(log=np.log2), "Bits instead of nats"),
        "queries": (entropy_variant(axis=-2), "over the queries"),
        "mean": (entropy_variant(mean=True), "averaged over the keys"),
        "keepdims": (entropy_variant(keepdims=True), "the key axis was kept"),
        **{f"log(w + {eps})": (lambda w, eps=eps: -(w * np.log(w + eps)).sum(-1),
                               "added inside the logarithm") for eps in (1e-6, 1e-8, 1e-9)},
    },
    "sequence_loss": {
        "pads counted": (loss_variant(all_positions=True), "The padded positions are counted"),
        "mean over all": (loss_variant(divide_all=True), "divides by every position"),
        "V - 1": (loss_variant(others=True), "V - 1 wrong words only"),
        "no smoothing": (loss_variant(no_smoothing=True), "label_smoothing is ignored"),
        "overflow": (loss_variant(naive=True), "exp overflows before the log"),
        "raw logits": (loss_variant(raw=True), "used as log-probabilities"),
        "sum": (loss_variant(total=True), "The sum over the real positions"),
        "per sentence": (loss_variant(per_sentence=True), "The mean of each sentence's mean"),
        "pad 0": (loss_variant(pad=0), "recognised by the id 0"),
        "log10": (loss_variant(log10=True), "Logarithms in base 10"),
        "tensor": (lambda *a, **k: torch.tensor(loss_loops(*a, **k)), "is not a float"),
        "0-d array": (lambda *a, **k: np.array(loss_loops(*a, **k)), "is not a float"),
        "float32": (lambda *a, **k: np.float32(loss_loops(*a, **k)), "smaller float type than"),
        "global max": (loss_shifted(lambda z: z.max()), "the whole batch's, is subtracted"),
        "mean": (loss_shifted(lambda z: z.mean(axis=-1, keepdims=True)),
                 "shifted by its mean, not its maximum"),
    },
    "target_mask": {
        "padding on queries": (target_variant(padding="queries"), "along the queries"),
        "causal only": (target_variant(padding="none"), "Only the causal mask"),
        "padding only": (target_variant(causal=False), "Only the padding mask"),
        "diagonal": (target_variant(k=-1), "the diagonal is blocked"),
        "inverted": (target_variant(invert=True), "An inverted mask"),
        "no head axis": (target_variant(squeeze=True), "Shape (B, T, T)"),
        "pad 0": (target_variant(pad=0), "recognised by the id 0"),
    },
    "repeat_kv_heads": {
        "tiled": (lambda x, num_heads: np.tile(x, (1, num_heads // x.shape[1], 1, 1)),
                  "Tiled instead of repeated"),
        "tiled torch": (lambda x, num_heads: torch.from_numpy(x).repeat(
            1, num_heads // x.shape[1], 1, 1), "Tiled instead of repeated"),
        "positions": (lambda x, num_heads: np.repeat(x, num_heads // x.shape[1], axis=2),
                      "Repeated along the positions"),
        "features": (lambda x, num_heads: np.repeat(x, num_heads // x.shape[1], axis=-1),
                     "Repeated along the features"),
        "H times": (lambda x, num_heads: np.repeat(x, num_heads, axis=1),
                    "copied num_heads times"),
        "flattened": (lambda x, num_heads: np.repeat(x, num_heads // x.shape[1]),
                      "np.repeat without an axis"),
        "reversed": (lambda x, num_heads: repeat_loops(x, num_heads)[:, ::-1],
                     "reverse order"),
    },
    "decode_step": {
        "forgets the new position": (decode_variant(forget_new=True),
                                     "The new position is forgotten"),
        "cache unused": (decode_variant(cache_unused=True), "The cache is not read"),
        "wrong axis": (decode_variant(axis=1), "Appended along the heads"),
        "prepended": (decode_variant(prepend=True), "The new position is put first"),
        "old caches": (decode_variant(keep_old=True), "returned as they came in"),
        "k and v swapped": (decode_variant(swap=True), "k_new and v_new are swapped"),
        "unscaled": (decode_variant(unscaled=True), "No 1/sqrt(head_dim) scaling"),
        "overflow": (decode_variant(naive=True), "exp overflows"),
        "softmax axis": (decode_variant(wrong_axis=True), "over the single query"),
        "context only": (decode_variant(context_only=True), "Only the context is returned"),
        "top-left mask": (decode_variant(top_left=True), "Only the first position is read"),
        "global max": (decode_variant(shift="global"),
                       "one constant is subtracted from the whole array"),
        "mean": (decode_variant(shift="mean"), "shifted by its mean, not its maximum"),
    },
    "merge_tiles": {
        "no rescaling": (merge_variant(rescale="none"), "No rescaling"),
        "inverted": (merge_variant(rescale="inverted"), "The rescaling is inverted"),
        "a not rescaled": (merge_variant(a_scaled=False), "Only l is rescaled"),
        "nan": (merge_variant(guard=False), "exp(-inf - (-inf)) is NaN"),
        "larger only": (merge_variant(keep="larger"), "Only the tile with the larger"),
        "no new axis": (merge_variant(expand=False), "without a new last axis"),
    },
}


@pytest.mark.parametrize(
    ("name", "mistake"), [(name, m) for name, table in MISTAKES.items() for m in table]
)
def test_each_mistake_gets_its_own_message(capsys, name: str, mistake: str) -> None:
    table = MISTAKES[name]
    candidate, phrase = table[mistake]
    verdict, out = run(capsys, name, candidate)
    assert verdict is False
    assert "Likely mistake: " in out and phrase in out, out
    others = [other for other, (_, p) in table.items() if p != phrase and p in out]
    assert not others, f"{mistake} also printed the diagnosis of {others}: {out}"
    assert "[" not in out.split("Likely mistake")[1]  # no array is ever printed


def test_every_chapter_checker_is_tested_here() -> None:
    assert set(MISTAKES) == {name for name, _ in CORRECT}


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("axis", [1, -1])
def test_appending_along_the_wrong_axis_is_named_by_its_error(capsys, axis, framework):
    """It raises on every case, so no output tells it apart: the error it raises does."""
    def appends(q, k_cache, v_cache, k_new, v_new):
        if framework == "torch":
            k_cache, k_new = torch.from_numpy(k_cache), torch.from_numpy(k_new)
            keys = torch.cat([k_cache, k_new], dim=axis)
        else:
            keys = np.concatenate([k_cache, k_new], axis=axis)
        return decode_torch(q, k_cache, v_cache, k_new, v_new)[0], keys, keys

    verdict, out = run(capsys, "decode_step", appends)
    assert verdict is False
    assert "Likely mistake: Appended along the wrong axis" in out, out


# --------------------------------------------------------------------------- the references


def test_add_and_norm_is_layer_norm_of_the_sum() -> None:
    rng = np.random.default_rng(0)
    x, sub = rng.normal(size=(2, 3, 8)), rng.normal(size=(2, 3, 8))
    norm = torch.nn.LayerNorm(8).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.normal_()
        want = norm(torch.from_numpy(x + sub)).numpy()
    got = exercises._EXERCISES["add_and_norm"].reference(
        x, sub, norm.weight.detach().numpy(), norm.bias.detach().numpy())
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_sequence_loss_is_the_translators() -> None:
    reference = exercises._EXERCISES["sequence_loss"].reference
    for case in exercises._EXERCISES["sequence_loss"].cases(np.random.default_rng(1)):
        logits, tgt_out, pad_id = case.args
        smoothing = case.kwargs.get("label_smoothing", 0.0)
        want = float(loss_torch(logits, tgt_out, pad_id, smoothing))
        assert math.isclose(reference(logits, tgt_out, pad_id, smoothing), want,
                            rel_tol=1e-9), case.label


def test_target_mask_is_the_translators() -> None:
    reference = exercises._EXERCISES["target_mask"].reference
    for case in exercises._EXERCISES["target_mask"].cases(np.random.default_rng(2)):
        tokens, pad_id = case.args
        want = mha.masks_torch.target_mask(torch.from_numpy(tokens), pad_id).numpy()
        assert np.array_equal(reference(tokens, pad_id), want)  # masks: exact


def test_repeat_kv_heads_is_what_sdpa_enable_gqa_reads() -> None:
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(2, h, 5, 4)) for h in (6, 2, 2))
    repeat = exercises._EXERCISES["repeat_kv_heads"].reference
    ours, _ = mha.scaled_dot_product_attention(q, repeat(k, 6), repeat(v, 6))
    theirs = F.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)),
                                            enable_gqa=True)
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-12, atol=1e-12)


def test_decode_steps_rebuild_the_cache_of_multi_head_attention() -> None:
    """Five steps from an empty cache give mha.KVCache's heads and the causal pass."""
    rng = np.random.default_rng(4)
    params, num_heads = mha.AttentionParams.init(8, seed=5), 2
    x = rng.normal(size=(1, 5, 8))
    steps = mha.multi_head_attention_steps(x, x, x, params, num_heads,
                                           mask=mha.causal_mask(5))
    decode = exercises._EXERCISES["decode_step"].reference
    k_cache = v_cache = np.zeros((1, num_heads, 0, 4))
    contexts = []
    for t in range(5):
        context, k_cache, v_cache = decode(
            steps.q_heads[:, :, t:t + 1], k_cache, v_cache,
            steps.k_heads[:, :, t:t + 1], steps.v_heads[:, :, t:t + 1])
        contexts.append(context)
    np.testing.assert_allclose(np.concatenate(contexts, axis=2), steps.context,
                               rtol=1e-12, atol=1e-12)
    cache = mha.KVCache()
    for t in range(5):
        xt = x[:, t:t + 1]
        mha.multi_head_attention(xt, xt, xt, params, num_heads, cache=cache)
    # one projection of all 5 positions vs 5 of one: equal up to the last bit
    np.testing.assert_allclose(k_cache, cache.k_heads, rtol=1e-12, atol=1e-12)


def test_score_std_is_the_spread_of_random_dot_products() -> None:
    rng = np.random.default_rng(6)
    q = rng.normal(scale=2.0, size=(40000, 16))
    k = rng.normal(scale=0.25, size=(40000, 16))
    spread = (q * k).sum(-1).std()
    want = exercises._EXERCISES["score_std"].reference(16, q_std=2.0, k_std=0.25)
    assert abs(spread / want - 1) < 0.03  # 40000 samples: about 0.4% standard error


def test_entropy_reference_is_torchs_xlogy() -> None:
    w = mha.softmax(np.where(mha.causal_mask(4), np.arange(16.0).reshape(4, 4), -np.inf))
    got = exercises._EXERCISES["attention_entropy"].reference(w)
    np.testing.assert_allclose(got, entropy_torch(w).numpy(), rtol=1e-12, atol=1e-12)


def test_merging_two_key_tiles_gives_flash_attention() -> None:
    """Tiles of keys 0-4 and 5-10, merged, give mha.flash_attention's context and
    log-sum-exp over all 11 keys."""
    rng = np.random.default_rng(7)
    q, k, v = rng.normal(size=(3, 2, 4, 11, 3))  # (B, T or S, Dh)
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(3)  # (B, T, S)
    split = [np.s_[..., :5], np.s_[..., 5:]]
    stats = []
    for cols in split:
        z = scores[cols]
        m = z.max(axis=-1)
        e = np.exp(z - m[..., None])
        stats += [m, e.sum(-1), e @ v[..., cols[-1], :]]
    m, l, a = exercises._EXERCISES["merge_tiles"].reference(*stats)  # noqa: E741
    context, logsumexp = mha.flash_attention(q, k, v, tile_size=4)
    np.testing.assert_allclose(a / l[..., None], context, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m + np.log(l), logsumexp, rtol=1e-12, atol=1e-12)


def test_an_empty_cache_is_a_case(capsys) -> None:
    def needs_a_cache(q, k_cache, v_cache, k_new, v_new):
        if k_cache.shape[2] == 0:
            raise IndexError("index 0 is out of bounds for axis 2 with size 0")
        return decode_torch(q, k_cache, v_cache, k_new, v_new)

    verdict, out = run(capsys, "decode_step", needs_a_cache)
    assert verdict is False and "an empty cache" in out




# --------------------------------------------------------------------------- chapter 10
# Their own tables: CORRECT and MISTAKES above are read when the tests above are defined.


def absorbed_loops(q_in, W_uq, W_uk, num_heads):
    """Head by head: (q_in @ W_uq_h) @ W_uk_h^T, the product left to right."""
    dn = W_uq.shape[1] // num_heads
    heads = []
    for h in range(num_heads):
        cols = slice(h * dn, (h + 1) * dn)
        heads.append(np.einsum("btn,rn->btr", q_in @ W_uq[:, cols], W_uk[:, cols]))
    return np.stack(heads, axis=1)


def absorbed_torch(q_in, W_uq, W_uk, num_heads):
    q_in, W_uq, W_uk = map(torch.from_numpy, (q_in, W_uq, W_uk))
    uq = W_uq.unflatten(1, (num_heads, -1))  # (Rq, H, Dn)
    uk = W_uk.unflatten(1, (num_heads, -1))  # (Rkv, H, Dn)
    return torch.einsum("btq,qhn,rhn->bhtr", q_in, uq, uk)


def absorbed_variant(split="blocks", fold=True, one_for_all=False):
    """``split="strided"``: head h takes columns h, h + H, ...; ``fold=False``: W_uk left
    out; ``one_for_all``: one product over all heads' columns, given to every head."""
    def candidate(q_in, W_uq, W_uk, num_heads):
        if one_for_all:
            return np.stack([q_in @ W_uq @ W_uk.T] * num_heads, axis=1)
        dn = W_uq.shape[1] // num_heads
        heads = []
        for h in range(num_heads):
            cols = slice(h, None, num_heads) if split == "strided" else slice(h * dn,
                                                                            (h + 1) * dn)
            q = q_in @ W_uq[:, cols]
            heads.append(q @ W_uk[:, cols].T if fold else q)
        return np.stack(heads, axis=1)

    return candidate


def per_channel_loops(k, bits):
    """Channel by channel over the last two axes, in Python floats."""
    k = np.asarray(k)
    out = np.empty_like(k)
    top = 2 ** (bits - 1) - 1
    for index in np.ndindex(*k.shape[:-2]):
        for c in range(k.shape[-1]):
            column = k[index][:, c]
            spread = max(abs(float(v)) for v in column)
            scale = spread / top if spread else 1.0
            out[index][:, c] = [round(float(v) / scale) * scale for v in column]
    return out


def per_channel_torch(k, bits):
    """torch.round rounds half to even, as np.round; a zero channel keeps scale 0 but
    is divided by a clamped scale, so it stays 0."""
    k = torch.from_numpy(np.asarray(k))
    scale = k.abs().amax(dim=-2, keepdim=True) / (2 ** (bits - 1) - 1)
    return torch.round(k / scale.clamp_min(torch.finfo(k.dtype).tiny)) * scale


def per_channel_variant(dim=-2, top=None, rounding=np.round, guard=True):
    """``top(bits)``: the largest code; ``dim=None``: one scale for the whole array."""
    def candidate(k, bits):
        k = np.asarray(k)
        largest = (2 ** (bits - 1) - 1) if top is None else top(bits)
        spread = np.abs(k).max() if dim is None else np.abs(k).max(axis=dim, keepdims=True)
        if guard:
            spread = np.where(spread == 0, 1.0, spread)
        scale = spread / largest
        with np.errstate(divide="ignore", invalid="ignore"):
            return (rounding(k / scale) * scale).astype(k.dtype)

    return candidate


CORRECT_10 = [
    ("absorbed_query", absorbed_loops),
    ("absorbed_query", absorbed_torch),
    ("absorbed_query", absorbed_variant()),
    ("absorbed_query", lambda q_in, W_uq, W_uk, num_heads:
        q_in[:, None] @ mha.absorb(_absorbable(W_uq, W_uk, num_heads)).W_uq_uk),
    ("quantize_per_channel", per_channel_loops),
    ("quantize_per_channel", per_channel_torch),
    ("quantize_per_channel", per_channel_variant()),
    ("quantize_per_channel", lambda k, bits: mha.dequantize(
        mha.quantize(k, bits, axis=-2, symmetric=True))),
]


def _absorbable(W_uq, W_uk, num_heads):
    """MLAParams holding these W_uq, W_uk (the rest of any shape that fits), so that
    mha.absorb folds them."""
    import dataclasses

    rq, dn = W_uq.shape[0], W_uq.shape[1] // num_heads
    params = mha.MLAParams.init(3, num_heads, kv_lora_rank=W_uk.shape[0], q_lora_rank=rq,
                                qk_nope_head_dim=dn, qk_rope_head_dim=2, v_head_dim=1)
    return dataclasses.replace(params, W_uq=W_uq, W_uk=W_uk)


MISTAKES_10: dict[str, dict[str, tuple[Callable, str]]] = {
    "absorbed_query": {
        "strided heads": (absorbed_variant(split="strided"), "The heads are split as a tile"),
        "one for all": (absorbed_variant(one_for_all=True), "Every head got the same query"),
        "not folded": (absorbed_variant(fold=False), "W_uk was not folded in"),
    },
    "quantize_per_channel": {
        "per token": (per_channel_variant(dim=-1), "Per token: each token got one scale"),
        "per tensor": (per_channel_variant(dim=None), "One scale for the whole array"),
        "2**(bits-1)": (per_channel_variant(top=lambda b: 2 ** (b - 1)),
                        "The largest code is 2**(bits - 1)"),
        "unsigned": (per_channel_variant(top=lambda b: 2**b - 1), "the unsigned range"),
        # k / scale is within a rounding error of a code at each channel's largest
        # entry: truncating it is told apart only written as the model writes it.
        "truncated": (per_channel_variant(rounding=lambda a: a.astype(int)),
                      "truncated toward zero"),
        "nan": (per_channel_variant(guard=False), "A channel that is zero in every token"),
    },
}


@pytest.mark.parametrize(("name", "candidate"), CORRECT_10,
                         ids=lambda c: getattr(c, "__name__", c))
def test_chapter_10_correct_unusual_answers_pass(capsys, name: str, candidate: Callable) -> None:
    verdict, out = run(capsys, name, candidate)
    assert verdict is True, out
    assert out.startswith(f"{name}: correct on ")


@pytest.mark.parametrize(
    ("name", "mistake"), [(name, m) for name, table in MISTAKES_10.items() for m in table]
)
def test_chapter_10_each_mistake_gets_its_own_message(capsys, name: str, mistake: str) -> None:
    candidate, phrase = MISTAKES_10[name][mistake]
    verdict, out = run(capsys, name, candidate)
    assert verdict is False
    assert "Likely mistake: " in out and phrase in out, out
    others = [other for other, (_, p) in MISTAKES_10[name].items() if p != phrase and p in out]
    assert not others, f"{mistake} also printed the diagnosis of {others}: {out}"
    assert "[" not in out.split("Likely mistake")[1]  # no array is ever printed


def test_chapter_10_checkers_are_all_tested_here() -> None:
    assert set(MISTAKES_10) == {name for name, _ in CORRECT_10} == set(
        exercises.names("10_compressed_cache"))
    assert not set(MISTAKES_10) & set(MISTAKES)  # each chapter's checkers in one table


def test_absorbed_query_is_what_scores_the_latent() -> None:
    """The absorbed query against the latent gives the position-free scores of the
    plain form: q_nope_h . k_nope_h, from mha.mla_steps, in every head."""
    params = mha.MLAParams.init(6, 3, kv_lora_rank=4, q_lora_rank=5, qk_nope_head_dim=2,
                                qk_rope_head_dim=2, v_head_dim=2, seed=8)
    x = np.random.default_rng(8).normal(size=(2, 4, 6))
    steps = mha.mla_steps(x, params)
    query = exercises._EXERCISES["absorbed_query"].reference(
        steps.q_latent, params.W_uq, params.W_uk, 3)  # (B, H, T, Rkv)
    nope_scores = steps.q_nope @ steps.k_nope.swapaxes(-1, -2)  # (B, H, T, S)
    np.testing.assert_allclose(query @ steps.latent[:, None].swapaxes(-1, -2), nope_scores,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_quantize_per_channel_is_torchs_fake_quantisation(bits) -> None:
    """torch's per-channel fake quantisation, codes -(2**(bits-1) - 1) .. 2**(bits-1) - 1
    and zero point 0, gives the same keys (float32, as torch computes it)."""
    k = np.random.default_rng(9).normal(size=(3, 10, 4)).astype(np.float32)
    k[..., 2] *= 20  # an outlier channel
    top = 2 ** (bits - 1) - 1
    scale = np.abs(k).max(axis=-2) / top  # (3, 4): one per channel of each head
    theirs = torch.fake_quantize_per_channel_affine(
        torch.from_numpy(k).transpose(0, 1).reshape(10, 12),  # (S, heads * channels)
        torch.from_numpy(scale.ravel()), torch.zeros(12, dtype=torch.int32), 1, -top, top)
    ours = exercises._EXERCISES["quantize_per_channel"].reference(k, bits)
    np.testing.assert_allclose(ours, theirs.reshape(10, 3, 4).transpose(0, 1).numpy(),
                               rtol=1e-6, atol=1e-6 * float(scale.max()))


# --------------------------------------------------------------------------- chapter 12
# Each typical mistake of the backward pass, written here as a learner writes it.


def softmax_backward_jacobian(weights, d_weights, axis=-1):
    """The Jacobian built for every slice and multiplied by dp: slow but right."""
    p = np.moveaxis(np.asarray(weights), axis, -1)
    dp = np.moveaxis(np.asarray(d_weights), axis, -1)
    jacobian = p[..., :, None] * np.eye(p.shape[-1]) - p[..., :, None] * p[..., None, :]
    return np.moveaxis((jacobian @ dp[..., None])[..., 0], -1, axis)


def softmax_backward_torch(weights, d_weights, axis=-1):
    """autograd's vector-Jacobian product through torch.softmax, from log(p) as scores
    (a blocked entry, p = 0, is a score of -inf: softmax(log p) = p)."""
    p = torch.from_numpy(np.asarray(weights, dtype=np.float64))
    z = p.log().requires_grad_(True)
    torch.softmax(z, dim=axis).backward(torch.from_numpy(np.asarray(d_weights, np.float64)))
    grad = torch.nan_to_num(z.grad, nan=0.0)  # a row of -inf only: nothing to attend to
    return grad.numpy().astype(np.asarray(weights).dtype)


def softmax_backward_variant(kind="right"):
    def candidate(weights, d_weights, axis=-1):
        p, dp = np.asarray(weights), np.asarray(d_weights)
        if kind == "diagonal":
            return p * dp
        if kind == "no keepdims":
            return p * (dp - np.einsum("...i,...i->...", p, dp)) if axis == -1 else \
                p * (dp - (p * dp).sum(axis))
        dot = (p * dp).sum(axis=-1 if kind == "last axis" else axis, keepdims=True)
        if kind == "plus":
            return p * dp + p * dot
        if kind == "no p":
            return dp - dot
        if kind == "mean":
            return p * (dp - dp.mean(axis=axis, keepdims=True))
        if kind == "everything":
            return p * (dp - (p * dp).sum())
        if kind == "axis 0":
            return p * (dp - (p * dp).sum(axis=0, keepdims=True))
        return p * dp - p * dot

    return candidate


def head_backward_torch(q, k, v, weights, d_context):
    """autograd twice: through P v with the saved weights as a constant (dv), and through
    a softmax of scores whose softmax they are, log(weights) (dZ; a row of -inf only,
    nothing to attend to, gives NaN there, which is 0); then dq, dk by hand from dZ."""
    p = torch.from_numpy(np.asarray(weights, np.float64))
    d_o = torch.from_numpy(np.asarray(d_context, np.float64))
    tv = torch.from_numpy(np.asarray(v, np.float64)).requires_grad_(True)
    (p @ tv).backward(d_o)
    z = p.log().requires_grad_(True)
    torch.softmax(z, dim=-1).backward(d_o @ tv.detach().transpose(-1, -2))
    dz = torch.nan_to_num(z.grad, nan=0.0).numpy()
    c = 1 / math.sqrt(q.shape[-1])
    dq = c * np.einsum("...ts,...sd->...td", dz, k)
    dk = c * np.einsum("...ts,...td->...sd", dz, q)
    dtype = np.asarray(q).dtype
    return dq.astype(dtype), dk.astype(dtype), tv.grad.numpy().astype(dtype)


def head_backward_loops(q, k, v, weights, d_context):
    """Query by query, key by key, over the flattened leading axes."""
    lead = q.shape[:-2]
    T, S = weights.shape[-2:]
    q2, k2, v2 = (a.reshape(-1, *a.shape[-2:]) for a in (q, k, v))
    p2, d2 = weights.reshape(-1, T, S), d_context.reshape(-1, *d_context.shape[-2:])
    dq, dk, dv = np.zeros_like(q2), np.zeros_like(k2), np.zeros_like(v2)
    c = 1 / math.sqrt(q.shape[-1])
    for b in range(q2.shape[0]):
        for t in range(T):
            dp = np.array([d2[b, t] @ v2[b, s] for s in range(S)])
            dz = p2[b, t] * (dp - p2[b, t] @ dp)
            for s in range(S):
                dv[b, s] += p2[b, t, s] * d2[b, t]
                dq[b, t] += c * dz[s] * k2[b, s]
                dk[b, s] += c * dz[s] * q2[b, t]
    return (dq.reshape(*lead, *q.shape[-2:]), dk.reshape(*lead, *k.shape[-2:]),
            dv.reshape(*lead, *v.shape[-2:]))


def head_backward_variant(dv_t=True, dk_t=True, z="right", sum_axis=-1, scale_q=True,
                          scale_k=True, dh=False, scale_v=False):
    def candidate(q, k, v, weights, d_context):
        c = 1 / (q.shape[-1] if dh else math.sqrt(q.shape[-1]))
        swap = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
        dv = (swap(weights) if dv_t else weights) @ d_context
        if scale_v:
            dv = c * dv
        dp = d_context @ swap(v)
        if z == "diagonal":
            dz = weights * dp
        else:
            dz = dp - (weights * dp).sum(axis=sum_axis, keepdims=True)
            if z != "no p":
                dz = weights * dz
        dq = (c if scale_q else 1) * dz @ k
        dk = (c if scale_k else 1) * (swap(dz) if dk_t else dz) @ q
        return dq, dk, dv

    return candidate


def tile_backward_torch(q_tile, k_tile, v_tile, d_out, logsumexp, row_dot):
    """torch, with delta taken as given and the weights from the log-sum-exp."""
    q, k, v, d_o, lse, d_row = (torch.from_numpy(np.asarray(a, np.float64)) for a in
                                (q_tile, k_tile, v_tile, d_out, logsumexp, row_dot))
    c = q.shape[-1] ** -0.5
    p = torch.exp(c * q @ k.transpose(-1, -2) - lse[..., None])
    dz = p * (d_o @ v.transpose(-1, -2) - d_row[..., None])
    dtype = np.asarray(q_tile).dtype
    return tuple(a.numpy().astype(dtype) for a in
                 (c * dz @ k, c * dz.transpose(-1, -2) @ q, p.transpose(-1, -2) @ d_o))


def tile_backward_variant(weights="lse", sums="given", scale_scores=True, scale_grads=True,
                          dk_t=True):
    def candidate(q_tile, k_tile, v_tile, d_out, logsumexp, row_dot):
        c = 1 / math.sqrt(q_tile.shape[-1])
        z = np.einsum("...td,...sd->...ts", q_tile, k_tile)
        if scale_scores:
            z = z * c
        if weights == "tile softmax":
            e = np.exp(z - z.max(axis=-1, keepdims=True))
            p = e / e.sum(axis=-1, keepdims=True)
        elif weights == "divide":
            p = np.exp(z) / np.exp(logsumexp)[..., None]
        else:
            p = np.exp(z - logsumexp[..., None])
        dv = np.einsum("...ts,...tv->...sv", p, d_out)
        dp = np.einsum("...tv,...sv->...ts", d_out, v_tile)
        d = (p * dp).sum(-1) if sums == "tile" else row_dot
        dz = p * (dp - d[..., None])
        g = c if scale_grads else 1.0
        dq = g * np.einsum("...ts,...sd->...td", dz, k_tile)
        dk = g * (np.einsum("...ts,...td->...sd", dz, q_tile) if dk_t else dz @ q_tile)
        return dq, dk, dv

    return candidate


CORRECT_12 = [
    ("softmax_backward", softmax_backward_jacobian),
    ("softmax_backward", softmax_backward_torch),
    ("softmax_backward", softmax_backward_variant()),
    ("softmax_backward", mha.softmax_backward),
    ("head_backward", head_backward_loops),
    ("head_backward", head_backward_torch),
    ("head_backward", head_backward_variant()),
    ("tile_backward", tile_backward_torch),
    ("tile_backward", tile_backward_variant()),
]

MISTAKES_12: dict[str, dict[str, tuple[Callable, str]]] = {
    "softmax_backward": {
        "diagonal": (softmax_backward_variant("diagonal"), "Only the Jacobian's diagonal"),
        "plus": (softmax_backward_variant("plus"), "The correction is added"),
        "no p": (softmax_backward_variant("no p"), "The factor p is missing"),
        "mean": (softmax_backward_variant("mean"), "The plain mean of dp"),
        "last axis": (softmax_backward_variant("last axis"),
                      "runs along the last axis whatever axis says"),
        "axis 0": (softmax_backward_variant("axis 0"), "summed along axis 0"),
        "everything": (softmax_backward_variant("everything"), "summed over the whole array"),
        "no keepdims": (softmax_backward_variant("no keepdims"), "lost their axis"),
    },
    "head_backward": {
        "dv transpose": (head_backward_variant(dv_t=False), "dv = P dO"),
        "dk transpose": (head_backward_variant(dk_t=False), "dk = c dZ q"),
        "diagonal": (head_backward_variant(z="diagonal"), "Only the Jacobian's diagonal"),
        "leak": (head_backward_variant(z="no p"), "A blocked key leaks gradient"),
        "wrong axis": (head_backward_variant(sum_axis=-2), "summed over the queries"),
        "scale in dq": (head_backward_variant(scale_q=False), "forgotten in dq"),
        "scale in dk": (head_backward_variant(scale_k=False), "forgotten in dk"),
        "1/Dh": (head_backward_variant(dh=True), "instead of 1/sqrt(Dh)"),
        "scale on dv": (head_backward_variant(scale_v=True), "dv is scaled"),
    },
    "tile_backward": {
        "tile softmax": (tile_backward_variant(weights="tile softmax"),
                         "a softmax over the tile's keys"),
        "tile sums": (tile_backward_variant(sums="tile"), "replaces delta"),
        "unscaled scores": (tile_backward_variant(scale_scores=False),
                            "scores are not scaled"),
        "unscaled grads": (tile_backward_variant(scale_grads=False), "dq and dk lack"),
        "overflow": (tile_backward_variant(weights="divide"), "overflows for large scores"),
        "dk transpose": (tile_backward_variant(dk_t=False), "dk = c dZ q"),
    },
}


@pytest.mark.parametrize(("name", "candidate"), CORRECT_12,
                         ids=lambda c: getattr(c, "__name__", c))
def test_chapter_12_correct_unusual_answers_pass(capsys, name: str, candidate: Callable) -> None:
    verdict, out = run(capsys, name, candidate)
    assert verdict is True, out
    assert out.startswith(f"{name}: correct on ")


@pytest.mark.parametrize(
    ("name", "mistake"), [(name, m) for name, table in MISTAKES_12.items() for m in table]
)
def test_chapter_12_each_mistake_gets_its_own_message(capsys, name: str, mistake: str) -> None:
    candidate, phrase = MISTAKES_12[name][mistake]
    verdict, out = run(capsys, name, candidate)
    assert verdict is False
    assert "Likely mistake: " in out and phrase in out, out
    others = [other for other, (_, p) in MISTAKES_12[name].items() if p != phrase and p in out]
    assert not others, f"{mistake} also printed the diagnosis of {others}: {out}"
    assert "[" not in out.split("Likely mistake")[1]  # no array is ever printed


def test_chapter_12_checkers_are_all_tested_here() -> None:
    assert set(MISTAKES_12) == {name for name, _ in CORRECT_12} == set(
        exercises.names("12_how_attention_learns"))
    assert not set(MISTAKES_12) & (set(MISTAKES) | set(MISTAKES_10))


def test_head_backward_is_autograd_of_the_head() -> None:
    """The reference, given the weights the forward saved, is autograd's gradient of
    F.scaled_dot_product_attention with the same mask."""
    rng = np.random.default_rng(12)
    q, k, v = rng.normal(size=(3, 2, 4, 5, 3))
    d_context = rng.normal(size=(2, 4, 5, 3))
    mask = mha.causal_mask(5)
    _, weights = mha.scaled_dot_product_attention(q, k, v, mask)
    got = exercises._EXERCISES["head_backward"].reference(q, k, v, weights, d_context)
    leaves = [torch.from_numpy(a).requires_grad_(True) for a in (q, k, v)]
    F.scaled_dot_product_attention(*leaves, attn_mask=torch.from_numpy(mask)).backward(
        torch.from_numpy(d_context))
    for ours, leaf in zip(got, leaves, strict=True):
        np.testing.assert_allclose(ours, leaf.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_tiles_of_the_tile_backward_add_up_to_flash_attention_backward() -> None:
    """Summed over every tile of a walk without a mask (T and S not multiples of the
    tile size), the reference's additions give mha.flash_attention_backward."""
    rng = np.random.default_rng(13)
    T, S, n = 7, 9, 4
    q, d_out = rng.normal(size=(2, 2, T, 4))
    k, v = rng.normal(size=(2, 2, S, 4))
    out, lse = mha.flash_attention(q, k, v, tile_size=n)
    row_dot = np.sum(d_out * out, axis=-1)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    tile = exercises._EXERCISES["tile_backward"].reference
    for q0 in range(0, T, n):
        for k0 in range(0, S, n):
            rows, cols = slice(q0, q0 + n), slice(k0, k0 + n)
            a, b, c = tile(q[:, rows], k[:, cols], v[:, cols], d_out[:, rows], lse[:, rows],
                           row_dot[:, rows])
            dq[:, rows] += a
            dk[:, cols] += b
            dv[:, cols] += c
    want = mha.flash_attention_backward(q, k, v, out, lse, d_out, tile_size=n)
    for ours, theirs in zip((dq, dk, dv), want, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- chapter 11


def t5_bucket_loops(distance, num_buckets=32, max_distance=128):
    """T5's causal bucket, one distance at a time, in plain Python."""
    exact = num_buckets // 2
    out = []
    for n in np.ravel(distance).tolist():
        if n < exact:
            out.append(n)
        else:
            grown = math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact)
            out.append(min(exact + int(grown), num_buckets - 1))
    return np.array(out).reshape(np.shape(distance))


def t5_bucket_variant(kind="right"):
    def candidate(distance, num_buckets=32, max_distance=128):
        n = np.asarray(distance, dtype=float)
        exact = num_buckets // 2
        if kind == "no half":  # every bucket logarithmic past num_buckets exact ones
            exact = num_buckets
        ratio = np.log(np.maximum(n, exact) / exact) / np.log(max_distance / exact)
        step = {"ceil": np.ceil, "round": np.round}.get(kind, np.floor)
        far = exact + step(ratio * (num_buckets - exact))
        if kind != "uncapped":
            far = np.minimum(far, num_buckets - 1)
        return np.where(n < exact, n, far).astype(int)

    return candidate


def window_keys_loops(t, window, num_sinks=0):
    return np.array([j for j in range(t + 1) if j > t - window or j < num_sinks])


def window_keys_variant(kind):
    def candidate(t, window, num_sinks=0):
        first = t - window + (0 if kind == "wide" else 1)
        keys = [j for j in range(max(first, 0), t + 1)]
        sinks = list(range(num_sinks)) if kind == "future" else list(range(min(num_sinks, t + 1)))
        if kind == "none":
            sinks = []
        if kind == "twice":
            return np.array(sinks + keys)
        return np.array(sorted(set(sinks) | set(keys)))

    return candidate


def yarn_ramp_formula(head_dim, training_length, base=10000.0, beta_fast=32.0, beta_slow=1.0):
    """The ramp written out: the pair index turning beta times, rounded out, clipped."""

    def index(turns):
        return head_dim * math.log(training_length / (2 * math.pi * turns)) / (2 * math.log(base))

    low = max(math.floor(index(beta_fast)), 0)
    high = min(math.ceil(index(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    return np.array([min(max((i - low) / (high - low), 0.0), 1.0) for i in range(head_dim // 2)])


def yarn_ramp_variant(kind):
    def candidate(head_dim, training_length, base=10000.0, beta_fast=32.0, beta_slow=1.0):
        theta = base ** (-np.arange(0, head_dim, 2) / head_dim)
        if kind == "turns":  # the paper's ramp, linear in r
            r = training_length * theta / (2 * math.pi)
            return np.clip((beta_fast - r) / (beta_fast - beta_slow), 0, 1)
        ramp = yarn_ramp_formula(head_dim, training_length, base, beta_fast, beta_slow)
        return 1 - ramp  # "reversed"

    return candidate


CORRECT_11 = [
    ("t5_bucket", t5_bucket_loops),
    ("t5_bucket", t5_bucket_variant()),
    ("window_keys", window_keys_loops),
    ("window_keys", window_keys_variant("right")),
    ("yarn_ramp", yarn_ramp_formula),
]

MISTAKES_11: dict[str, dict[str, tuple[Callable, str]]] = {
    "t5_bucket": {
        "uncapped": (t5_bucket_variant("uncapped"), "buckets beyond the last one"),
        "ceil": (t5_bucket_variant("ceil"), "rounded up, not down"),
        "round": (t5_bucket_variant("round"), "rounded to the nearest"),
        "no half": (t5_bucket_variant("no half"), "a bucket of its own"),
        "sign": (lambda d, n=32, m=128: t5_bucket_loops(np.zeros_like(d), n, m), "bucket 0"),
    },
    "window_keys": {
        "wide": (window_keys_variant("wide"), "window + 1 keys"),
        "twice": (window_keys_variant("twice"), "listed twice"),
        "future": (window_keys_variant("future"), "Sinks after the query"),
        "none": (window_keys_variant("none"), "sinks are missing"),
    },
    "yarn_ramp": {
        "turns": (yarn_ramp_variant("turns"), "linear in the turns"),
        "reversed": (yarn_ramp_variant("reversed"), "The ramp is reversed"),
    },
}


@pytest.mark.parametrize(("name", "candidate"), CORRECT_11,
                         ids=lambda c: getattr(c, "__name__", c))
def test_chapter_11_correct_unusual_answers_pass(capsys, name: str, candidate: Callable) -> None:
    verdict, out = run(capsys, name, candidate)
    assert verdict is True, out
    assert out.startswith(f"{name}: correct on ")


@pytest.mark.parametrize(
    ("name", "mistake"), [(name, m) for name, table in MISTAKES_11.items() for m in table]
)
def test_chapter_11_each_mistake_gets_its_own_message(capsys, name: str, mistake: str) -> None:
    candidate, phrase = MISTAKES_11[name][mistake]
    verdict, out = run(capsys, name, candidate)
    assert verdict is False
    assert "Likely mistake: " in out and phrase in out, out
    others = [other for other, (_, p) in MISTAKES_11[name].items() if p != phrase and p in out]
    assert not others, f"{mistake} also printed the diagnosis of {others}: {out}"
    assert "[" not in out.split("Likely mistake")[1]  # no array is ever printed


def test_chapter_11_checkers_are_all_tested_here() -> None:
    assert set(MISTAKES_11) == {name for name, _ in CORRECT_11} == set(
        exercises.names("11_longer_than_trained"))
    assert not set(MISTAKES_11) & (set(MISTAKES) | set(MISTAKES_10) | set(MISTAKES_12))


def test_yarn_ramp_blends_the_frequencies_rope_yarn_gives() -> None:
    """theta' = theta (1 - ramp) + theta / s ramp, for any s: the ramp is YaRN's."""
    for head_dim, length in ((8, 32), (64, 4096), (128, 8192)):
        ramp = yarn_ramp_formula(head_dim, length)
        theta = mha.rope_default(head_dim).inv_freq
        for s in (2.0, 8.0):
            np.testing.assert_allclose(mha.rope_yarn(head_dim, s, length).inv_freq,
                                       theta * (1 - ramp) + theta / s * ramp, rtol=1e-12)
