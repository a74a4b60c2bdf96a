"""ringattn.torch.attention on CPU against the float64 reference: forward, lse, gradients."""

import pytest
import torch

import ringattn.torch as rt
from conftest import DEVICE, TOL, close, make, reference, refused_here

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# (batch, q_len, kv_len, q_heads, kv_heads, head_dim, causal, window, dtype)
CASES = [
    (2, 7, 7, 4, 4, 8, False, (-1, -1), F32),
    (1, 1, 1, 1, 1, 16, True, (-1, -1), F32),
    (1, 1, 33, 8, 1, 64, True, (-1, -1), BF16),      # decode, GQA 8
    (2, 5, 17, 4, 2, 16, True, (-1, -1), BF16),      # chunked prefill, GQA 2
    (1, 29, 29, 3, 1, 32, False, (3, 2), F16),       # window both sides, GQA 3
    (1, 31, 31, 6, 3, 128, True, (4, 0), BF16),      # causal window
    (1, 9, 9, 2, 2, 256, False, (0, 5), F32),        # head dim 256
    (1, 13, 20, 4, 4, 96, False, (-1, 3), F16),      # right edge only, q_len < kv_len
    (1, 9, 4, 2, 1, 8, True, (-1, -1), F32),         # q_len > kv_len: the first rows see no key
    (1, 1001, 1001, 2, 1, 64, True, (-1, -1), BF16),  # odd length
    (2, 7, 7, 8, 8, 40, True, (-1, -1), F16),
]


def run_case(q, k, v, causal, window, dout, cu_seqlens=None, **kw):
    out, lse = rt.attention(q, k, v, causal=causal, window=window, cu_seqlens=cu_seqlens, return_lse=True, **kw)
    out.backward(dout)
    return out, lse


def check_against_reference(q, k, v, causal, window, cu_seqlens=None, **kw):
    dtype = q.dtype
    if refused_here(dtype, q.size(-1)):
        with pytest.raises(ValueError, match=f"head_dim={q.size(-1)} is not supported by the CUDA"):
            rt.attention(q, k, v, causal=causal, window=window, cu_seqlens=cu_seqlens, **kw)
        return
    dout = make(q.shape, dtype)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out, lse = run_case(*leaves, causal, window, dout, cu_seqlens, **kw)
    assert out.dtype == dtype and out.shape == q.shape
    assert lse.dtype == torch.float32
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
    r_out, r_lse = reference(*ref_in, causal, window, kw.get("softmax_scale"), cu_seqlens)
    r_out.backward(dout.double().cpu())
    assert lse.shape == r_lse.shape
    tol_fwd, tol_bwd = (TOL[dtype][0], TOL[dtype][0]), (TOL[dtype][1], TOL[dtype][1])
    close(out, r_out, tol_fwd, "out")
    empty, lse = torch.isinf(r_lse), lse.cpu()
    assert torch.equal(torch.isinf(lse), empty), "rows that see no key have lse -inf, the others a finite lse"
    close(lse[~empty], r_lse[~empty], (TOL[torch.float32][0] * 10, TOL[torch.float32][0] * 10) if dtype == F32
          else tol_fwd, "lse")
    for name, x, r in zip(("dq", "dk", "dv"), leaves, ref_in):
        assert x.grad.dtype == dtype and x.grad.shape == x.shape, name
        close(x.grad, r.grad, tol_bwd, name)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}_q{}_kv{}_h{}x{}_d{}_{}_w{}_{}_{}".format(
    c[0], c[1], c[2], c[3], c[4], c[5], "causal" if c[6] else "full", c[7][0], c[7][1], str(c[8])[6:]))
def test_batched(case):
    b, t, s, hq, hkv, d, causal, window, dtype = case
    q, k, v = make((b, t, hq, d), dtype), make((b, s, hkv, d), dtype), make((b, s, hkv, d), dtype)
    check_against_reference(q, k, v, causal, window)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(dtype, causal):
    for d in (8, 24, 64, 128, 256):
        q, k, v = make((1, 11, 2, d), dtype), make((1, 11, 1, d), dtype), make((1, 11, 1, d), dtype)
        check_against_reference(q, k, v, causal, (-1, -1))


def test_softmax_scale():
    q, k, v = make((1, 6, 2, 16), F32), make((1, 6, 2, 16), F32), make((1, 6, 2, 16), F32)
    check_against_reference(q, k, v, True, (-1, -1), softmax_scale=0.37)


# Packed documents: (boundaries, q_heads, kv_heads, head_dim, causal, window, dtype)
PACKED = [
    ([0, 1, 8, 9, 30], 4, 2, 16, True, (-1, -1), F32),   # one-token documents
    ([0, 1, 8, 9, 30], 4, 4, 32, False, (-1, -1), BF16),
    ([0, 3, 3, 10], 2, 1, 8, True, (2, 0), F16),          # an empty document
    ([0, 1], 1, 1, 64, False, (-1, -1), F32),             # a single one-token document
    ([0, 12, 13, 40, 41], 8, 1, 64, False, (3, 1), BF16),
]


@pytest.mark.parametrize("case", PACKED, ids=lambda c: f"docs{len(c[0]) - 1}_h{c[1]}x{c[2]}_d{c[3]}_{c[4]}_{c[5]}")
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_packed(case, index):
    cu, hq, hkv, d, causal, window, dtype = case
    n = cu[-1]
    # int64 boundaries on the inputs' device (copied to the host inside the op), int32 on the CPU.
    cu_seqlens = torch.tensor(cu, dtype=index, device=DEVICE if index == torch.int64 else "cpu")
    q, k, v = make((n, hq, d), dtype), make((n, hkv, d), dtype), make((n, hkv, d), dtype)
    check_against_reference(q, k, v, causal, window, cu_seqlens=cu_seqlens, max_seqlen=max(
        b - a for a, b in zip(cu, cu[1:])))


def test_non_contiguous_inputs():
    """Strided views are taken as they are (a head-dim stride other than 1 is copied once)."""
    dtype = BF16
    q = make((2, 4, 9, 64), dtype).transpose(1, 2)               # [B, T, H, D] over [B, H, T, D] memory
    kv = make((2, 12, 2, 2, 64), dtype)
    k, v = kv[:, 1:, 0], kv[:, 1:, 1]                             # slices of one buffer, 3-d strides
    check_against_reference(q, k, v, True, (-1, -1))
    qt = make((2, 9, 3, 64), F32)[..., ::2]                       # head-dim stride 2
    kt = make((2, 9, 64, 3), F32).transpose(-1, -2)[..., :32]      # head-dim stride 3
    check_against_reference(qt, kt, make((2, 9, 3, 32), F32), False, (2, 2))


@pytest.mark.parametrize("packed", [False, True])
def test_lse_gradient(packed):
    """A loss that uses lse gets its gradient (correct, not dropped)."""
    dtype = F32
    if packed:
        cu_seqlens, shape_q, shape_k = torch.tensor([0, 5, 6, 19]), (19, 4, 16), (19, 2, 16)
    else:
        cu_seqlens, shape_q, shape_k = None, (2, 7, 4, 16), (2, 11, 2, 16)
    x = [make(s, dtype).requires_grad_() for s in (shape_q, shape_k, shape_k)]
    w_out, w_lse = make(shape_q, dtype), None
    out, lse = rt.attention(*x, causal=True, cu_seqlens=cu_seqlens, return_lse=True)
    w_lse = make(lse.shape, torch.float32)
    ((out * w_out).sum() + (lse * w_lse).sum()).backward()
    r = [t.detach().double().requires_grad_() for t in x]
    r_out, r_lse = reference(*r, True, (-1, -1), None, cu_seqlens)
    ((r_out * w_out.double().cpu()).sum() + (r_lse * w_lse.double().cpu()).sum()).backward()
    for name, a, b in zip(("dq", "dk", "dv"), x, r):
        close(a.grad, b.grad, (2e-4, 2e-4), name)


def test_only_lse_in_the_loss():
    x = [make(s, F32).requires_grad_() for s in ((1, 5, 2, 8), (1, 5, 2, 8), (1, 5, 2, 8))]
    _, lse = rt.attention(*x, return_lse=True)
    lse.sum().backward()
    r = [t.detach().double().requires_grad_() for t in x]
    reference(*r)[1].sum().backward()
    for name, a, b in zip(("dq", "dk"), x, r):
        close(a.grad, b.grad, (2e-4, 2e-4), name)
    assert r[2].grad is None and torch.equal(x[2].grad, torch.zeros_like(x[2])), "lse does not depend on v"


@pytest.mark.parametrize("packed", [False, True])
def test_deterministic_gradients_bitwise(packed):
    cu = torch.tensor([0, 40, 41, 97]) if packed else None
    shape_q, shape_k = ((97, 8, 64), (97, 2, 64)) if packed else ((2, 97, 8, 64), (2, 97, 2, 64))
    inputs = [make(s, BF16) for s in (shape_q, shape_k, shape_k)]
    dout = make(shape_q, BF16)
    grads = []
    for _ in range(2):
        x = [t.clone().requires_grad_() for t in inputs]
        rt.attention(*x, causal=True, cu_seqlens=cu, deterministic=True).backward(dout)
        grads.append([t.grad for t in x])
    for a, b in zip(*grads):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_return_lse_false_returns_the_output_only():
    q = make((1, 4, 2, 8), F32)
    out = rt.attention(q, q, q)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape


def test_concurrent_calls_from_threads():
    """The op holds no shared mutable state: calls from several threads give each call's own result."""
    from concurrent.futures import ThreadPoolExecutor
    inputs = [[make((1, 33, 4, 32), F32), make((1, 33, 2, 32), F32), make((1, 33, 2, 32), F32)] for _ in range(4)]
    alone = [rt.attention(*x, causal=True) for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda x: rt.attention(*x, causal=True), inputs * 2))
    for i, out in enumerate(together):
        assert torch.equal(out, alone[i % 4])
