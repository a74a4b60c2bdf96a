"""The custom ops under torch.compile and torch.library.opcheck; bad inputs' messages as text."""

import ctypes
import re

import pytest
import torch

import ringattn.torch as rt
from ringattn import _lib
from conftest import DEVICE, close, make, reference


def loss_fn(q, k, v, cu_seqlens=None):
    out, lse = rt.attention(q, k, v, causal=True, window=(5, 0), cu_seqlens=cu_seqlens, return_lse=True)
    return (out.float() ** 2).sum() + lse.sum()


@pytest.mark.parametrize("backend,packed", [("inductor", False), ("aot_eager", True)])
def test_compile_fullgraph_forward_and_backward(backend, packed):
    torch._dynamo.reset()
    cu = torch.tensor([0, 9, 10, 23], dtype=torch.int32) if packed else None
    shapes = ((23, 4, 32), (23, 2, 32)) if packed else ((2, 23, 4, 32), (2, 23, 2, 32))
    base = [make(s, torch.float32) for s in (shapes[0], shapes[1], shapes[1])]
    eager = [t.clone().requires_grad_() for t in base]
    compiled = [t.clone().requires_grad_() for t in base]
    loss_fn(*eager, cu).backward()
    f = torch.compile(loss_fn, fullgraph=True, backend=backend)
    f(*compiled, cu).backward()
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5)
    r = [t.detach().double().requires_grad_() for t in base]
    r_out, r_lse = reference(*r, True, (5, 0), None, cu)
    ((r_out ** 2).sum() + r_lse.sum()).backward()
    for name, a, b in zip(("dq", "dk", "dv"), compiled, r):
        close(a.grad, b.grad, (2e-4, 2e-4), name)


def op_samples():
    q, k = make((1, 7, 4, 16), torch.float32), make((1, 9, 2, 16), torch.float32)
    v = make((1, 9, 2, 16), torch.float32)
    yield (q, k, v, None, True, -1, -1, 0.25, 0, False, False)
    yield (q[:, :, :2], k[:, :, :1], v[:, :, :1], None, False, 3, 2, 0.5, 0, True, True)
    n = 13
    qp, kp = make((n, 2, 64), torch.bfloat16), make((n, 1, 64), torch.bfloat16)
    yield (qp, kp, kp.clone(), torch.tensor([0, 1, 5, 13], dtype=torch.int32), True, -1, 0, 0.3, 8, False, True)


@pytest.mark.parametrize("i", range(3))
def test_opcheck_forward(i):
    args = list(op_samples())[i]
    args = [a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    torch.library.opcheck(torch.ops.ringattn.attention_fwd.default, tuple(args))


@pytest.mark.parametrize("i", range(3))
def test_opcheck_backward(i):
    q, k, v, cu, causal, wl, wr, scale, max_seqlen, det, _ = list(op_samples())[i]
    out, lse = torch.ops.ringattn.attention_fwd(q, k, v, cu, causal, wl, wr, scale, max_seqlen, det, False)
    dout = make(q.shape, q.dtype)
    torch.library.opcheck(torch.ops.ringattn.attention_bwd.default,
                          (dout, q, k, v, out, lse, cu, causal, wl, wr, scale, max_seqlen, det))


F32 = torch.float32


def t4(b=1, t=5, h=2, d=8, dtype=F32):
    return make((b, t, h, d), dtype)


def t3(n=6, h=2, d=8, dtype=F32):
    return make((n, h, d), dtype)


BAD = [
    # (q, k, v, kwargs, exception, message)
    (t4(dtype=torch.int32), t4(), t4(), {}, TypeError,
     "q has dtype torch.int32; allowed are torch.bfloat16, torch.float16 and torch.float32"),
    (t4(), t4(dtype=torch.float16), t4(), {}, TypeError,
     "k has dtype torch.float16 but q has torch.float32; q, k and v must have one dtype"),
    ([1.0], t4(), t4(), {}, TypeError, "q must be a torch.Tensor (got list)"),
    (t3(), t4(), t4(), {}, ValueError,
     "q has 3 dimensions (shape [6, 2, 8]); q must be [batch, seq_len, heads, head_dim]"),
    (t4(), t4(), t4(), {"cu_seqlens": torch.tensor([0, 5])}, ValueError,
     "q has 4 dimensions (shape [1, 5, 2, 8]); q must be [total_tokens, heads, head_dim] with cu_seqlens"),
    (t4(h=3), t4(h=2), t4(h=2), {}, ValueError,
     "q has 3 heads and k has 2; q_heads must be a multiple of kv_heads (grouped-query attention)"),
    (t4(d=8), t4(d=16), t4(d=16), {}, ValueError, "k has head_dim 16 but q has 8; they must be equal"),
    (t4(), t4(t=5), t4(t=6), {}, ValueError, "v has shape [1, 6, 2, 8] but k has [1, 5, 2, 8]; they must be equal"),
    (t4(b=2), t4(b=1), t4(b=1), {}, ValueError, "k has batch 1 but q has 2; they must be equal"),
    (t4(t=0), t4(), t4(), {}, ValueError, "q has shape [1, 0, 2, 8]; every dimension must be >= 1"),
    (t4(), t4(), t4(), {"window": (-2, 0)}, ValueError,
     "window=(-2, 0): left -2 is out of range; a side is -1 (unbounded) or >= 0"),
    (t4(), t4(), t4(), {"window": 4}, ValueError, "window=4; it must be a pair of ints (left, right)"),
    (t4(), t4(), t4(), {"causal": True, "window": (4, 3)}, ValueError,
     "window=(4, 3) with causal=True: with causal the right edge is the diagonal, so right must be 0 or -1"),
    (t4(), t4(), t4(), {"softmax_scale": float("nan")}, ValueError,
     "softmax_scale=nan; it must be None (1/sqrt(head_dim)) or a finite number"),
    (t4(), t4(), t4(), {"max_seqlen": 5}, ValueError,
     "max_seqlen=5 without cu_seqlens; it is only meaningful with packed documents"),
    (t3(), t3(), t3(), {"cu_seqlens": torch.tensor([0.0, 6.0])}, TypeError,
     "cu_seqlens has dtype torch.float32; allowed are torch.int32 and torch.int64"),
    (t3(), t3(), t3(), {"cu_seqlens": torch.tensor([0])}, ValueError,
     "cu_seqlens has shape [1]; it must be [docs + 1] with at least one document"),
    (t3(n=6), t3(n=7), t3(n=7), {"cu_seqlens": torch.tensor([0, 6])}, ValueError,
     "k has 7 tokens but q has 6; with cu_seqlens q, k and v hold the same packed documents"),
    # Values of cu_seqlens: checked inside the op (by the library).
    (t3(), t3(), t3(), {"cu_seqlens": torch.tensor([1, 6])}, ValueError,
     "cu_seqlens[0] is 1; the boundaries must start at 0"),
    (t3(), t3(), t3(), {"cu_seqlens": torch.tensor([0, 4, 3, 6])}, ValueError,
     "cu_seqlens decreases at index 2 (3 after 4); the boundaries must not decrease"),
    (t3(), t3(), t3(), {"cu_seqlens": torch.tensor([0, 2, 5])}, ValueError,
     "cu_seqlens ends at 5 but q has 6 tokens; the last boundary must be total_tokens"),
    (t3(), t3(), t3(), {"cu_seqlens": torch.tensor([0, 2, 6]), "max_seqlen": 3}, ValueError,
     "max_seqlen is 3 but the longest document (cu_seqlens) has 4 tokens; it must be at least that"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: re.sub(r"\W+", "_", c[5][:40]))
def test_bad_input_message(case):
    q, k, v, kw, exc, message = case
    with pytest.raises(exc) as e:
        rt.attention(q, k, v, **kw)
    assert message in str(e.value)
    # Nothing is left behind: the next call works.
    x = t4()
    close(rt.attention(x, x, x), reference(x, x, x)[0], (2e-5, 2e-5), "out after an error")


def test_cu_seqlens_values_checked_under_compile():
    torch._dynamo.reset()
    f = torch.compile(lambda q, cu: rt.attention(q, q, q, cu_seqlens=cu), fullgraph=True, backend="aot_eager")
    q = t3(n=6)
    close(f(q, torch.tensor([0, 2, 6])), reference(q, q, q, cu_seqlens=torch.tensor([0, 2, 6]))[0], (2e-5, 2e-5), "out")
    with pytest.raises(ValueError, match=re.escape("cu_seqlens decreases at index 2 (4 after 5)")):
        f(q, torch.tensor([0, 5, 4, 6]))


def c_call(args, q, k, v, out, lse):
    d = rt._Descs()
    err = ctypes.create_string_buffer(512)
    rc = _lib.lib().ringattn_attention_fwd(ctypes.byref(args), d(q), d(k), d(v), d(out), d(lse), err, 512)
    return rc, err.value.decode()


def c_args(**kw):
    a = rt._args(rt._Descs(), None, False, -1, -1, 0.5, 0, False, DEVICE)
    for key, val in kw.items():
        setattr(a, key, val)
    return a


def test_c_abi_refuses_with_text():
    """The C ABI checks on its own (for hosts other than this package): status and text, no throw."""
    q = t4()
    out, lse = torch.empty_like(q), torch.empty(1, 2, 5, device=DEVICE)
    assert c_call(c_args(abi_version=99), q, q, q, out, lse) == (
        _lib.INVALID_ARGUMENT, "args.abi_version is 99 but this library is ABI version 3; rebuild the caller against "
        "its ringattn_c.h")
    rc, text = c_call(c_args(), q[..., ::2], q[..., ::2], q[..., ::2], out[..., ::2], lse)
    assert rc == _lib.INVALID_ARGUMENT
    assert text == "q has stride 2 along head_dim (shape [1, 5, 2, 4]); the head dim must be contiguous (stride 1)"
    assert c_call(c_args(), q, q, q, out, torch.empty(1, 5, 2, device=DEVICE)) == (
        _lib.INVALID_ARGUMENT, "lse has shape [1, 5, 2]; it must be [1, 2, 5] (batch, q_heads, q_len)")
    assert c_call(c_args(), q, q, q, out.half(), lse) == (
        _lib.INVALID_ARGUMENT, "out is fp16 but q is fp32; they must be equal")
    rc, _ = c_call(c_args(), q, q, q, out, lse)
    assert rc == _lib.OK
    close(out, reference(q, q, q, scale=0.5)[0], (2e-5, 2e-5), "out")


def test_eager_path_taken_outside_modes_and_not_inside():
    """Plain tensors outside any dispatch mode take the eager path (no custom-op dispatch); under a
    dispatch mode (fake tensors, a user's mode) the custom op runs, and gives the eager result."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    q, k, v = make((1, 5, 2, 16), torch.float32), make((1, 7, 1, 16), torch.float32), make((1, 7, 1, 16), torch.float32)
    assert rt._takes_eager_path(q, k, v)
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record():
        assert not rt._takes_eager_path(q, k, v)
        out = rt.attention(q, k, v, causal=True)
    assert any("ringattn.attention_fwd" in s for s in seen), seen
    assert torch.equal(out, rt.attention(q, k, v, causal=True))
    with FakeTensorMode():
        assert not rt._takes_eager_path(torch.empty(1), torch.empty(1), torch.empty(1))
