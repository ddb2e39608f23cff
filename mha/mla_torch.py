"""Multi-head latent attention (DeepSeek-V2/V3) as a PyTorch module, with its latent
cache and the absorbed inference form.

The torch twin of :mod:`mha.mla`, written again here, not imported (the tests compare
the two): :class:`MultiHeadLatentAttention` and :class:`MLACache` have the
specification's names and shapes. :func:`module_from_params` and :func:`params_fields`
copy weights between the two without importing the specification: they read and
write plain arrays by name.

Shapes as in :mod:`mha.mla`: ``Rq`` query latent, ``Rkv`` KV latent, ``Dn`` per-head
key part without position, ``Dr`` the RoPE part, ``Dv`` value head.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from mha._checks import check_positive_int

__all__ = ["MLACache", "MultiHeadLatentAttention", "module_from_params", "params_fields"]

_LAYOUTS = ("interleaved", "rotate_half")


def _rope(x: Tensor, positions: Tensor, base: float, layout: str) -> Tensor:
    """Turn pair ``i`` of the last dim by ``position * base^(-2i / Dr)``: adjacent
    features paired (``"interleaved"``) or ``i`` with ``i + Dr/2`` (``"rotate_half"``).
    ``positions`` broadcasts to ``x``'s ``(..., L)``; angles in float64."""
    width = x.shape[-1]
    two_i = torch.arange(0, width, 2, dtype=torch.float64, device=x.device)  # (Dr/2,)
    frequencies = torch.pow(torch.tensor(float(base), dtype=torch.float64), -two_i / width)
    angles = positions.to(torch.float64)[..., None] * frequencies  # (..., L, Dr/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if layout == "interleaved":
        first, second = x[..., 0::2], x[..., 1::2]  # (..., L, Dr/2) each
        turned = torch.stack((first * cos - second * sin, first * sin + second * cos), dim=-1)
        return turned.flatten(-2)  # (..., L, Dr/2, 2) -> (..., L, Dr)
    first, second = x[..., : width // 2], x[..., width // 2 :]
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


class MLACache:
    """The latent cache: per token one normalised KV latent and one rotated RoPE key,
    shared by every head (the torch twin of :class:`mha.mla.MLACache`).

    Attributes
    ----------
    latent : Tensor, shape (B, S, Rkv), or None while empty
    k_rope : Tensor, shape (B, S, Dr), or None while empty
    """

    def __init__(self) -> None:
        self.latent: Tensor | None = None
        self.k_rope: Tensor | None = None

    @property
    def length(self) -> int:
        """``S``, the number of tokens cached."""
        return 0 if self.latent is None else self.latent.shape[1]

    def append(self, latent: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Store new latents and RoPE keys after the cached ones; return all of them,
        ``(B, S_all, Rkv)`` and ``(B, S_all, Dr)``."""
        if self.latent is not None:
            new = (latent.shape[0], latent.shape[2], k_rope.shape[2])
            old = (self.latent.shape[0], self.latent.shape[2], self.k_rope.shape[2])
            if new != old:
                raise ValueError(
                    f"new latent {tuple(latent.shape)} and k_rope {tuple(k_rope.shape)} do "
                    f"not fit the cached {tuple(self.latent.shape)} and "
                    f"{tuple(self.k_rope.shape)}: B, Rkv and Dr must agree"
                )
            latent = torch.cat([self.latent, latent], dim=1)  # along S
            k_rope = torch.cat([self.k_rope, k_rope], dim=1)
        self.latent, self.k_rope = latent, k_rope
        return latent, k_rope


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention: keys and values rebuilt per head from one cached
    latent per token, plus one RoPE key shared by the heads (DeepSeek-V2, section 2.1).

    Parameters
    ----------
    d_model, num_heads : int
        ``D`` and ``H``.
    kv_lora_rank : int
        ``Rkv``, the width of the cached latent (512 in DeepSeek-V2 and V3).
    qk_nope_head_dim, qk_rope_head_dim, v_head_dim : int
        ``Dn``, ``Dr`` (even), ``Dv`` (128, 64, 128 in both models).
    q_lora_rank : int, optional
        ``Rq`` (1536 in both); None: queries projected from ``x`` directly.
    rope_base : float
    rope_layout : "interleaved" or "rotate_half"
    eps : float
        The RMSNorms' epsilon.
    softmax_scale : float, optional
        Default ``1 / sqrt(Dn + Dr)``; DeepSeek-V3 under YaRN multiplies it by
        ``mscale**2`` (:func:`mha.mla_params.mla_softmax_scale`).

    Attributes
    ----------
    W_dq, W_uq, W_qr, W_dkv, W_kr, W_uk, W_uv, W_o : nn.Linear
        Bias-free; the names of :class:`mha.mla_params.MLAParams` (``W_dq`` is None without
        a query latent). PyTorch stores ``(out, in)``.
    q_norm, kv_norm : nn.RMSNorm
        On the query latent (None without one) and on the KV latent.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        rope_base: float = 10000.0,
        rope_layout: str = "interleaved",
        eps: float = 1e-6,
        softmax_scale: float | None = None,
    ):
        super().__init__()
        d_model = check_positive_int(d_model, "d_model")
        self.num_heads = heads = check_positive_int(num_heads, "num_heads")
        rkv = check_positive_int(kv_lora_rank, "kv_lora_rank")
        self.qk_nope_head_dim = dn = check_positive_int(qk_nope_head_dim, "qk_nope_head_dim")
        self.qk_rope_head_dim = dr = check_positive_int(qk_rope_head_dim, "qk_rope_head_dim")
        self.v_head_dim = dv = check_positive_int(v_head_dim, "v_head_dim")
        rq = None if q_lora_rank is None else check_positive_int(q_lora_rank, "q_lora_rank")
        if dr % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE turns pairs), got {dr}")
        if rope_layout not in _LAYOUTS:
            raise ValueError(f"rope_layout must be one of {_LAYOUTS}, got {rope_layout!r}")
        for name, value in (("rope_base", rope_base), ("eps", eps),
                            ("softmax_scale", 1.0 if softmax_scale is None else softmax_scale)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                0 < value < math.inf
            ):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        self.d_model, self.q_lora_rank, self.kv_lora_rank = d_model, rq, rkv
        self.rope_base, self.rope_layout, self.eps = float(rope_base), rope_layout, float(eps)
        self.softmax_scale = (
            1.0 / math.sqrt(dn + dr) if softmax_scale is None else float(softmax_scale)
        )
        q_in = d_model if rq is None else rq
        self.W_dq = None if rq is None else nn.Linear(d_model, rq, bias=False)
        self.q_norm = None if rq is None else nn.RMSNorm(rq, eps=eps)
        self.W_uq = nn.Linear(q_in, heads * dn, bias=False)
        self.W_qr = nn.Linear(q_in, heads * dr, bias=False)
        self.W_dkv = nn.Linear(d_model, rkv, bias=False)
        self.kv_norm = nn.RMSNorm(rkv, eps=eps)
        self.W_kr = nn.Linear(d_model, dr, bias=False)
        self.W_uk = nn.Linear(rkv, heads * dn, bias=False)
        self.W_uv = nn.Linear(rkv, heads * dv, bias=False)
        self.W_o = nn.Linear(heads * dv, d_model, bias=False)

    def absorbed_weights(self) -> tuple[Tensor, Tensor]:
        """``W_uq_uk`` ``(H, Rq, Rkv)`` (``(H, D, Rkv)`` without a query latent) and
        ``W_uv_o`` ``(H, Rkv, D)``: ``W_uk`` folded into the query projection and
        ``W_uv`` into the output projection, per head. Recomputed at each call; a
        deployed model computes them once."""
        heads, dn, dv = self.num_heads, self.qk_nope_head_dim, self.v_head_dim
        w_uq = self.W_uq.weight.view(heads, dn, -1)  # (H*Dn, Rq) -> (H, Dn, Rq)
        w_uk = self.W_uk.weight.view(heads, dn, -1)  # (H*Dn, Rkv) -> (H, Dn, Rkv)
        w_uv = self.W_uv.weight.view(heads, dv, -1)  # (H*Dv, Rkv) -> (H, Dv, Rkv)
        w_o = self.W_o.weight.view(self.d_model, heads, dv)  # (D, H*Dv) -> (D, H, Dv)
        w_uq_uk = torch.einsum("hnq,hnr->hqr", w_uq, w_uk)  # sum over Dn -> (H, Rq, Rkv)
        w_uv_o = torch.einsum("hvr,dhv->hrd", w_uv, w_o)  # sum over Dv -> (H, Rkv, D)
        return w_uq_uk, w_uv_o

    def _check(self, x, positions, mask, causal, cache, absorbed) -> tuple[Tensor, Tensor | None]:
        """Check the arguments; return the positions and the mask (or None)."""
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point or x.ndim != 3:
            kind = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be a float tensor (B, T, D), got {kind}")
        batch, length, d_model = x.shape
        if d_model != self.d_model:
            raise ValueError(f"x has {d_model} features (shape {tuple(x.shape)}) but the "
                             f"module's d_model is {self.d_model}")  # fmt: skip
        if cache is not None and not isinstance(cache, MLACache):
            raise ValueError(f"cache must be an mha.mla_torch.MLACache, got "
                             f"{type(cache).__name__}")  # fmt: skip
        for name, flag in (("causal", causal), ("absorbed", absorbed)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        past = 0 if cache is None else cache.length
        if past and cache.latent.shape[0] != batch:
            raise ValueError(f"x has batch size {batch} but the cache holds "
                             f"{cache.latent.shape[0]} sequences")  # fmt: skip
        if positions is None:
            positions = torch.arange(past, past + length, device=x.device)  # (T,)
        if not isinstance(positions, Tensor) or positions.dtype.is_floating_point or (
            positions.dtype.is_complex or positions.dtype == torch.bool
        ):
            kind = positions.dtype if isinstance(positions, Tensor) else type(positions).__name__
            raise ValueError(f"positions must be an integer tensor, got {kind}")
        if tuple(positions.shape) not in ((length,), (batch, length), (1, length)):
            raise ValueError(f"positions must have shape (T,) = ({length},) or (B, T) = "
                             f"({batch}, {length}), got {tuple(positions.shape)}")  # fmt: skip
        if positions.numel() and int(positions.min()) < 0:
            raise ValueError(f"positions must be >= 0, got {int(positions.min())}")
        num_keys = past + length
        full = None
        if causal:  # the new tokens are the last T of S: the diagonal at the bottom right
            full = torch.ones(length, num_keys, dtype=torch.bool, device=x.device).tril(past)
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
                raise ValueError(f"mask must be a boolean tensor (True = may attend), got {kind}")
            target = (batch, self.num_heads, length, num_keys)
            if not 2 <= mask.ndim <= 4 or any(
                got not in (1, want) for got, want in zip(mask.shape[::-1], target[::-1],
                                                          strict=False)
            ):
                raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to "
                                 f"(B, H, T, S) = {target}")  # fmt: skip
            full = mask if full is None else full & mask
        return positions, full

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = True,
        cache: MLACache | None = None,
        absorbed: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Self-attention of the new tokens ``x`` over the cached ones and themselves.

        Parameters
        ----------
        x : Tensor, shape (B, T, D)
        positions : integer Tensor, shape (T,) or (B, T), optional
            Default ``cache.length + arange(T)``.
        mask : bool Tensor, optional
            True = may attend, broadcastable to ``(B, H, T, S)``; ANDed with the causal
            mask.
        causal : bool
            Default True: new token ``t`` sees the cached tokens and the new ones up to
            itself.
        cache : MLACache, optional
            Receives the new latents and RoPE keys.
        absorbed : bool
            False: rebuild per-head keys and values from the latents (the plain form).
            True: fold ``W_uk`` into the query and ``W_uv`` into the output and attend
            to the latents directly (the inference form): the same numbers.

        Returns
        -------
        output : Tensor, shape (B, T, D)
        weights : Tensor, shape (B, H, T, S)
            Zero rows where the mask allows nothing.
        """
        positions, mask = self._check(x, positions, mask, causal, cache, absorbed)
        batch, length, _ = x.shape
        heads, dn, dr, dv = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, \
            self.v_head_dim  # fmt: skip
        q_positions = positions if positions.ndim == 1 else positions[:, None, :]  # (B, 1, T)
        # Queries, through the normalised query latent when there is one.
        q_in = x if self.W_dq is None else self.q_norm(self.W_dq(x))  # (B, T, Rq)
        q_rope = self.W_qr(q_in).view(batch, length, heads, dr).transpose(1, 2)  # (B, H, T, Dr)
        q_rope = _rope(q_rope, q_positions, self.rope_base, self.rope_layout)
        # What is cached: the normalised latent and the turned RoPE key, once per token.
        latent = self.kv_norm(self.W_dkv(x))  # (B, T, Rkv)
        k_rope = _rope(self.W_kr(x), positions, self.rope_base, self.rope_layout)  # (B, T, Dr)
        if cache is not None:
            latent, k_rope = cache.append(latent, k_rope)  # (B, S, Rkv), (B, S, Dr)
        num_keys = latent.shape[1]
        if absorbed:
            w_uq_uk, w_uv_o = self.absorbed_weights()
            q_absorbed = torch.einsum("btq,hqr->bhtr", q_in, w_uq_uk)  # (B, H, T, Rkv)
            # The two parts of each score: against the latent, and against the RoPE key.
            scores = torch.einsum("bhtr,bsr->bhts", q_absorbed, latent) + torch.einsum(
                "bhtk,bsk->bhts", q_rope, k_rope
            )  # (B, H, T, S)
        else:
            q_nope = self.W_uq(q_in).view(batch, length, heads, dn).transpose(1, 2)
            k_nope = self.W_uk(latent).view(batch, num_keys, heads, dn).transpose(1, 2)
            values = self.W_uv(latent).view(batch, num_keys, heads, dv).transpose(1, 2)
            keys = torch.cat([k_nope, k_rope[:, None].expand(-1, heads, -1, -1)], dim=-1)
            queries = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, Dn + Dr)
            scores = queries @ keys.transpose(-1, -2)  # (B, H, T, S)
        scores = scores * self.softmax_scale
        if mask is not None:
            scores = scores.masked_fill(~mask, -math.inf)
            allowed = mask.expand_as(scores).any(dim=-1, keepdim=True)
            # softmax of an all -inf row is NaN: such a row attends to nothing, zeros.
            weights = torch.where(allowed, torch.softmax(scores, dim=-1), 0.0)
        else:
            weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
        if absorbed:
            context_latent = weights @ latent[:, None]  # (B, H, T, S) @ (B, 1, S, Rkv)
            output = torch.einsum("bhtr,hrd->btd", context_latent, w_uv_o)  # (B, T, D)
        else:
            context = weights @ values  # (B, H, T, Dv)
            output = self.W_o(context.transpose(1, 2).reshape(batch, length, heads * dv))
        return output, weights


# ------------------------------------------------------- weights to and from arrays


def _linear_names(module: MultiHeadLatentAttention) -> dict[str, nn.Module | None]:
    return {"W_dq": module.W_dq, "q_norm": module.q_norm, "W_uq": module.W_uq,
            "W_qr": module.W_qr, "W_dkv": module.W_dkv, "kv_norm": module.kv_norm,
            "W_kr": module.W_kr, "W_uk": module.W_uk, "W_uv": module.W_uv,
            "W_o": module.W_o}  # fmt: skip


def module_from_params(params: Any) -> MultiHeadLatentAttention:
    """A module with the weights of the specification's :class:`mha.mla_params.MLAParams`.

    Reads ``params.config()`` and ``params.weights()`` (arrays ``(D_in, D_out)``, stored
    transposed here), so this layer need not import the specification. The module has
    the arrays' dtype (float64 for an exact comparison).
    """
    config, weights = params.config(), params.weights()
    module = MultiHeadLatentAttention(**config)
    dtype = torch.from_numpy(np.asarray(weights["W_dkv"])).dtype
    module.to(dtype)
    with torch.no_grad():
        for name, layer in _linear_names(module).items():
            array = weights[name]
            if (layer is None) != (array is None):
                raise ValueError(f"params.{name} is {'None' if array is None else 'an array'} "
                                 "but the configuration says otherwise")  # fmt: skip
            if layer is None:
                continue
            tensor = torch.as_tensor(np.asarray(array), dtype=dtype)
            tensor = tensor if tensor.ndim == 1 else tensor.T  # (in, out) -> (out, in)
            if tensor.shape != layer.weight.shape:
                raise ValueError(f"params.{name} has shape {tuple(array.shape)}, the module "
                                 f"needs {tuple(layer.weight.shape[::-1])}")  # fmt: skip
            layer.weight.copy_(tensor)
    return module


def params_fields(module: MultiHeadLatentAttention) -> dict[str, Any]:
    """The fields of :class:`mha.mla_params.MLAParams` for this module's weights:
    ``MLAParams(**params_fields(module))`` (NumPy arrays, ``(D_in, D_out)``)."""
    if not isinstance(module, MultiHeadLatentAttention):
        raise ValueError(f"module must be a MultiHeadLatentAttention, got "
                         f"{type(module).__name__}")  # fmt: skip
    fields: dict[str, Any] = {
        "num_heads": module.num_heads, "qk_nope_head_dim": module.qk_nope_head_dim,
        "qk_rope_head_dim": module.qk_rope_head_dim, "v_head_dim": module.v_head_dim,
        "rope_base": module.rope_base, "rope_layout": module.rope_layout, "eps": module.eps,
        "softmax_scale": module.softmax_scale,
    }  # fmt: skip
    for name, layer in _linear_names(module).items():
        if layer is None:
            fields[name] = None
            continue
        weight = layer.weight.detach().cpu().numpy().copy()
        fields[name] = weight if weight.ndim == 1 else weight.T  # (out, in) -> (in, out)
    return fields
