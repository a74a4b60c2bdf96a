"""The PyTorch op: `ringattn.torch.attention`, FlashAttention's interface over ringattn's kernels.

Two custom ops, ``ringattn::attention_fwd`` and ``ringattn::attention_bwd`` (torch.library, each
with a fake implementation, so torch.compile traces them without a graph break), the backward
registered as the forward's autograd formula. They call the C ABI (capi/ringattn_c.h) through
ctypes with DLPack-style descriptors of the tensors: no libtorch at build time, one build for
every torch from 2.4 on."""

import ctypes
from typing import Optional, Tuple

import torch

from . import _lib

__all__ = ["attention", "ring_attention", "shard", "unshard", "shard_positions"]

from ._call import (  # noqa: F401 - the names the tests and ringattn._ring use too
    _CODES, _ERROR_BYTES, _FLOATS, _Descs, _args, _check_packing, _check_scale, _check_tensor, _check_window,
    _cuda_allocator, _host_cu_seqlens, _pack_call)


def _head_dim_contiguous(t):
    """The kernels take any strides but the head dim's (which must be 1): others are copied once."""
    return t if t.size(-1) <= 1 or t.stride(-1) == 1 else t.contiguous()


def _lse_shape(q, packed):
    return (q.size(1), q.size(0)) if packed else (q.size(0), q.size(2), q.size(1))


def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Optional[torch.Tensor],
                  causal: bool, window_left: int, window_right: int, softmax_scale: float, max_seqlen: int,
                  deterministic: bool, lse_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    q, k, v = (_head_dim_contiguous(t) for t in (q, k, v))
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(_lse_shape(q, cu_seqlens is not None), dtype=torch.float32, device=q.device)
    keep, a, descs = _pack_call(_host_cu_seqlens(cu_seqlens), causal, window_left, window_right, softmax_scale,
                                max_seqlen, deterministic, q, k, v, out, lse)
    err = ctypes.create_string_buffer(_ERROR_BYTES)
    rc = _lib.lib().ringattn_attention_fwd(a, *descs, err, _ERROR_BYTES)
    _lib.check(rc, err)
    return out, lse


attention_fwd = torch.library.custom_op("ringattn::attention_fwd", mutates_args=())(_attention_fwd)


@attention_fwd.register_fake
def _(q, k, v, cu_seqlens, causal, window_left, window_right, softmax_scale, max_seqlen, deterministic, lse_grad):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), q.new_empty(
        _lse_shape(q, cu_seqlens is not None), dtype=torch.float32)


@torch.library.custom_op("ringattn::attention_bwd", mutates_args=())
def attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor, cu_seqlens: Optional[torch.Tensor], causal: bool, window_left: int,
                  window_right: int, softmax_scale: float, max_seqlen: int,
                  deterministic: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dout, q, k, v, out = (_head_dim_contiguous(t) for t in (dout, q, k, v, out))
    lse = lse if lse.size(-1) <= 1 or lse.stride(-1) == 1 else lse.contiguous()
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    keep, a, descs = _pack_call(_host_cu_seqlens(cu_seqlens), causal, window_left, window_right, softmax_scale,
                                max_seqlen, deterministic, dout, q, k, v, out, lse, dq, dk, dv)
    err = ctypes.create_string_buffer(_ERROR_BYTES)
    rc = _lib.lib().ringattn_attention_bwd(a, *descs, err, _ERROR_BYTES)
    _lib.check(rc, err)
    return dq, dk, dv


@attention_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens, causal, window_left, window_right, softmax_scale, max_seqlen,
      deterministic):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, causal, window_left, window_right, softmax_scale, max_seqlen, deterministic, lse_grad = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, cu_seqlens, out, lse)
    ctx.params = (causal, window_left, window_right, softmax_scale, max_seqlen, deterministic)
    ctx.lse_grad = lse_grad
    if not lse_grad:
        ctx.mark_non_differentiable(lse)


def _lse_rows(dlse, packed):
    """dlse [B, H, T] (packed [H, T]) as a [B, T, H, 1] (packed [T, H, 1]) weight per query row."""
    return (dlse.transpose(0, 1) if packed else dlse.transpose(1, 2)).unsqueeze(-1).float()


def _backward(ctx, dout, dlse):
    q, k, v, cu_seqlens, out, lse = ctx.saved_tensors
    causal, wl, wr, scale, max_seqlen, deterministic = ctx.params
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, cu_seqlens, *ctx.params)
    if ctx.lse_grad and dlse is not None:
        # lse_i = ln sum_j exp(s_ij) with s_ij = scale q_i.k_j, so d lse_i / d s_ij = P_ij: dq_i gains
        # scale dlse_i (P K)_i (attention with the keys as values), dk_j gains scale (P^T (dlse q))_j
        # (the dv of a backward whose dout is dlse q; summed over each group like dv).
        w = _lse_rows(dlse, cu_seqlens is not None)
        pk, _ = attention_fwd(q, k, k, cu_seqlens, causal, wl, wr, scale, max_seqlen, deterministic, False)
        _, _, ptq = attention_bwd((w * q.float()).to(q.dtype), q, k, v, out, lse, cu_seqlens, *ctx.params)
        dq = (dq.float() + scale * w * pk.float()).to(q.dtype)
        dk = (dk.float() + scale * ptq.float()).to(k.dtype)
    return dq, dk, dv, None, None, None, None, None, None, None, None


torch.library.register_autograd("ringattn::attention_fwd", _backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The eager path: the forward op's body called directly and the same autograd formula, without
    the custom op's Python dispatch (about a fifth of the host's time per call). torch.compile,
    export, tensor subclasses and dispatch modes take the custom op (_takes_eager_path)."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _attention_fwd(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, dout, dlse):
        return _backward(ctx, dout, dlse)


def _takes_eager_path(q, k, v):
    if torch.compiler.is_compiling() or not (type(q) is type(k) is type(v) is torch.Tensor):
        return False
    # The stack's length counts the user's modes and the infra modes (fake, proxy, functional).
    return _DISPATCH_MODES is not None and _DISPATCH_MODES() == 0


_DISPATCH_MODES = getattr(torch._C, "_len_torch_dispatch_stack", None)


def _inputs_ok(q, k, v, packed):
    """Whether _check_inputs would pass, in one expression (the common case: no message to build)."""
    T = torch.Tensor
    if not (isinstance(q, T) and isinstance(k, T) and isinstance(v, T) and q.dtype in _FLOATS and k.dtype == q.dtype
            and v.dtype == q.dtype and (q.is_cuda or q.is_cpu) and k.device == q.device and v.device == q.device):
        return False
    qs, ks = q.shape, k.shape
    return (len(qs) == (3 if packed else 4) and len(ks) == len(qs) and v.shape == ks and all(qs) and all(ks)
            and ks[0] == qs[0] and ks[-1] == qs[-1] and qs[-2] % ks[-2] == 0)


def _check_inputs(q, k, v, packed):
    if _inputs_ok(q, k, v, packed):
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; q, k and v must have one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; q, k and v must be on one device")
    if not (q.is_cuda or q.is_cpu):
        raise ValueError(f"q is on {q.device}; ringattn runs cpu and cuda tensors")
    want = 3 if packed else 4
    layout = "[total_tokens, heads, head_dim] with cu_seqlens" if packed else "[batch, seq_len, heads, head_dim]"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != want:
            raise ValueError(f"{name} has {t.dim()} dimensions (shape {list(t.shape)}); {name} must be {layout}")
        if t.numel() == 0:
            raise ValueError(f"{name} has shape {list(t.shape)}; every dimension must be >= 1")
    if v.shape != k.shape:
        raise ValueError(f"v has shape {list(v.shape)} but k has {list(k.shape)}; they must be equal")
    if not packed and k.size(0) != q.size(0):
        raise ValueError(f"k has batch {k.size(0)} but q has {q.size(0)}; they must be equal")
    if packed and k.size(0) != q.size(0):
        raise ValueError(f"k has {k.size(0)} tokens but q has {q.size(0)}; with cu_seqlens q, k and v hold the same "
                         "packed documents (self-attention)")
    if k.size(-1) != q.size(-1):
        raise ValueError(f"k has head_dim {k.size(-1)} but q has {q.size(-1)}; they must be equal")
    if q.size(-2) % k.size(-2) != 0:
        raise ValueError(f"q has {q.size(-2)} heads and k has {k.size(-2)}; q_heads must be a multiple of kv_heads "
                         "(grouped-query attention)")


def attention(q, k, v, *, causal=False, window=(-1, -1), softmax_scale=None, cu_seqlens=None, max_seqlen=None,
              deterministic=False, return_lse=False):
    """Attention in FlashAttention's layout: q [batch, q_len, q_heads, dim], k and v [batch, kv_len,
    kv_heads, dim] (with cu_seqlens: [total_tokens, heads, dim], packed documents, self-attention).

    window is FlashAttention's window_size (left, right), -1 unbounded; the queries are the last
    positions (q_offset = kv_len - q_len). Returns out like q, and with return_lse=True also lse,
    fp32 [batch, q_heads, q_len] ([q_heads, total_tokens] with cu_seqlens), natural log, scale
    included. Differentiable in q, k and v (and through lse); deterministic=True gives bitwise
    reproducible gradients."""
    packed = cu_seqlens is not None
    _check_inputs(q, k, v, packed)
    left, right = _check_window(window, bool(causal))
    max_len = _check_packing(q, cu_seqlens, max_seqlen)
    scale = _check_scale(softmax_scale, q.size(-1))
    if not _takes_eager_path(q, k, v):
        op = attention_fwd
    elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        op = _EagerAttention.apply
    else:  # nothing to differentiate: the body without autograd's bookkeeping
        op = _attention_fwd
    out, lse = op(q, k, v, cu_seqlens, bool(causal), left, right, scale, max_len, bool(deterministic),
                  bool(return_lse))
    return (out, lse) if return_lse else out


# The distributed op (ringattn/_ring.py): ring attention across a torch.distributed process group.
from ._ring import positions as shard_positions, ring_attention, shard, unshard  # noqa: E402
