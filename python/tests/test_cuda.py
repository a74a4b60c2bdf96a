"""What the op promises on a GPU beyond its results (RINGATTN_TEST_DEVICE=cuda; skipped on CPU):
it runs on torch's current stream, takes its scratch from torch's caching allocator, leaves the
calling thread's device as it found it, and an error leaves no CUDA error behind."""

import pytest
import torch

import ringattn.torch as rt
from conftest import DEVICE, TOL, close, make, reference

pytestmark = pytest.mark.skipif(DEVICE.type != "cuda", reason="needs RINGATTN_TEST_DEVICE=cuda")
BF16 = torch.bfloat16


def test_runs_on_the_current_stream():
    """Inputs written on a side stream behind a long kernel and the op called there, with no host
    synchronization in between: only a call queued on the side stream reads them written."""
    side = torch.cuda.Stream()
    shape_q, shape_k = (1, 300, 8, 128), (1, 300, 2, 128)
    src = [make(s, BF16) for s in (shape_q, shape_k, shape_k)]
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        big = torch.randn(4096, 4096, device=DEVICE)
        for _ in range(8):  # tens of milliseconds of work ahead of the copies on `side`
            big = torch.tanh(big @ big)
        q, k, v = (torch.empty_like(t) for t in src)
        for dst, t in zip((q, k, v), src):
            dst.copy_(t)
        out = rt.attention(q, k, v, causal=True)
    side.synchronize()
    close(out, reference(*src, True)[0], (TOL[BF16][0], TOL[BF16][0]), "out on a side stream")


def test_scratch_comes_from_torch():
    """A bf16 call's fp32 scratch (out's state, the backward's fp32 gradients) is torch's memory:
    the caching allocator's peak grows by at least that much during the call."""
    q, k, v = (make((1, 512, 8, 64), BF16).requires_grad_() for _ in range(3))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = rt.attention(q, k, v, causal=True)
    torch.cuda.synchronize()
    fp32_state = q.numel() * 4
    assert torch.cuda.max_memory_allocated() - base >= fp32_state + out.numel() * 2
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base >= 3 * fp32_state


def test_device_left_as_found_and_errors_leave_no_cuda_error():
    before = torch.cuda.current_device()
    q = make((1, 9, 2, 1024), torch.float32)  # no CUDA kernel takes head_dim 1024
    with pytest.raises(ValueError, match="head_dim=1024"):
        rt.attention(q, q, q)
    assert torch.cuda.current_device() == before
    x = make((1, 17, 2, 64), BF16)
    close(rt.attention(x, x, x), reference(x, x, x)[0], (TOL[BF16][0], TOL[BF16][0]), "out after an error")
    torch.cuda.synchronize()  # a sticky error left behind would surface here


def test_lse_matches_and_is_fp32_on_the_device():
    q, k, v = make((2, 65, 4, 128), BF16), make((2, 65, 1, 128), BF16), make((2, 65, 1, 128), BF16)
    out, lse = rt.attention(q, k, v, causal=True, return_lse=True)
    assert lse.device == q.device and lse.dtype == torch.float32 and lse.shape == (2, 4, 65)
    r_out, r_lse = reference(q, k, v, True)
    close(lse, r_lse, (TOL[BF16][0], TOL[BF16][0]), "lse")
