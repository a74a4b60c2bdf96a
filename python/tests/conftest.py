"""Shared by the Python tests: the float64 reference (an explicit softmax over the masked scores)
and per-dtype tolerances. Inputs are fresh random tensors on every run, on RINGATTN_TEST_DEVICE
(default cpu; `cuda` runs the same tests on the GPU's kernels); the reference runs on the CPU."""

import os

import pytest
import torch

DEVICE = torch.device(os.environ.get("RINGATTN_TEST_DEVICE", "cpu"))
if DEVICE.type == "cuda" and not torch.cuda.is_available():
    raise RuntimeError(f"RINGATTN_TEST_DEVICE={DEVICE} but torch sees no CUDA device")

torch.set_num_threads(2)

# (output and lse, gradients), absolute and relative, against the float64 reference.
TOL = {torch.float32: (2e-5, 2e-4), torch.float16: (2e-3, 1e-2), torch.bfloat16: (1.6e-2, 6e-2)}


def visible(t, s, causal, window, offset, docs=None):
    """[t, s] bool: key j visible to query i (positions i + offset and j), FlashAttention's rules."""
    left, right = window
    pq = torch.arange(t).unsqueeze(1) + offset
    pk = torch.arange(s).unsqueeze(0)
    m = torch.ones(t, s, dtype=torch.bool)
    if causal or right >= 0:
        m &= pk <= pq + (0 if causal else right)
    if left >= 0:
        m &= pk >= pq - left
    if docs is not None:
        m &= docs.unsqueeze(1) == docs.unsqueeze(0)
    return m


def reference(q, k, v, causal=False, window=(-1, -1), scale=None, cu_seqlens=None):
    """out, lse in float64 (differentiable in q, k, v); layouts as rt.attention's."""
    packed = cu_seqlens is not None
    if packed:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    q, k, v = (x.double().cpu() for x in (q, k, v))
    t, s, d = q.size(1), k.size(1), q.size(-1)
    g = q.size(2) // k.size(2)
    k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    scale = d ** -0.5 if scale is None else scale
    docs = None
    if packed:
        cu = cu_seqlens.long().cpu()
        docs = torch.repeat_interleave(torch.arange(cu.numel() - 1), cu[1:] - cu[:-1])
    mask = visible(t, s, causal, window, 0 if packed else s - t, docs)
    scores = torch.einsum("bthd,bshd->bhts", q, k) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).unsqueeze(-1))
    out = torch.einsum("bhts,bshd->bthd", p, v)
    if packed:
        return out[0], lse[0]
    return out, lse


def close(got, want, tol, what):
    atol, rtol = tol
    got, want = got.double().cpu(), want.double().cpu()
    scale = max(1.0, want[torch.isfinite(want)].abs().max().item() if want.numel() else 1.0)
    torch.testing.assert_close(got, want, atol=atol * scale, rtol=rtol, equal_nan=False, msg=lambda m: f"{what}: {m}")


def cuda_takes(dtype, head_dim):
    """Whether the CUDA kernels take this head dim (bf16/fp16: 64, 128, 256; fp32 the SIMT path up to 256)."""
    return head_dim in (64, 128, 256) if dtype in (torch.bfloat16, torch.float16) else head_dim <= 256


def refused_here(dtype, head_dim):
    """On the GPU, a head dim no CUDA kernel takes: the op must refuse it with ValueError naming it."""
    return DEVICE.type == "cuda" and not cuda_takes(dtype, head_dim)


def make(shape, dtype, scale=1.0):
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype).to(DEVICE)


@pytest.fixture(autouse=True)
def _fresh_seed():
    torch.seed()  # fresh random inputs on every run
