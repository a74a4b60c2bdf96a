"""The distributed op (ringattn.torch.shard / ring_attention / unshard) under torchrun with gloo,
on CPU tensors or (RINGATTN_TEST_DEVICE=cuda) CUDA tensors, ranks sharing the GPUs: each test
launches python/tests/ring_worker.py on 1-4 processes with a fresh seed and asserts that every
rank passed (the worker asserts each case against the float64 reference)."""

import os
import random
import subprocess
import sys

import pytest

from conftest import DEVICE

WORKER = os.path.join(os.path.dirname(__file__), "ring_worker.py")



def launch(mode, ranks, timeout=600):
    seed = random.randrange(1 << 30)
    env = dict(os.environ, RINGATTN_TEST_SEED=str(seed), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", WORKER, mode]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p, seed


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_per_token_parity_with_the_single_process_op(ranks):
    p, seed = launch("parity", ranks)
    assert p.returncode == 0, f"seed {seed}:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    assert f"cases passed on {ranks} ranks" in p.stdout, p.stdout


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_disagreeing_ranks_all_raise_naming_the_rank(ranks):
    p, seed = launch("refusals", ranks)
    assert p.returncode == 0, f"seed {seed}:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    assert f"ring refusals: 6 cases passed on {ranks} ranks" in p.stdout, p.stdout


def test_torch_compile_fullgraph_matches_eager():
    p, seed = launch("compiled", 2)
    assert p.returncode == 0, f"seed {seed}:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    assert "ring compiled: 2 cases passed on 2 ranks" in p.stdout, p.stdout


def test_a_rank_that_leaves_ends_the_call_on_the_others():
    p, seed = launch("dies", 3, timeout=120)
    assert p.returncode == 0, f"seed {seed}:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    for r in (0, 2):
        assert f"rank {r}: the call ended with an error after rank 1 left: ringattn: rank {r}: the caller's " \
               "communicator failed" in p.stdout, p.stdout


@pytest.mark.parametrize("ranks", [1, 2])
def test_transports_agree_bitwise_and_nccl_is_refused_where_it_cannot_run(ranks):
    p, seed = launch("transports", ranks, timeout=300)
    assert p.returncode == 0, f"seed {seed}:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    assert f"ring transports: " in p.stdout and f"cases passed on {ranks} ranks" in p.stdout, p.stdout


@pytest.mark.skipif(DEVICE.type != "cuda", reason="a group of NCCL alone needs a GPU")
def test_a_group_without_a_cpu_backend_is_refused_by_name():
    p, seed = launch("no-host-backend", 1, timeout=300)
    assert p.returncode == 0, f"seed {seed}:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    assert "ring no-host-backend: 1 cases passed on 1 ranks" in p.stdout, p.stdout


# The C ABI's ring calls on their own (for hosts other than this package): status and text.
import ctypes  # noqa: E402

import torch  # noqa: E402

import ringattn.torch as rt  # noqa: E402
from ringattn import _lib  # noqa: E402


def ring_call(comm, layout=0, q=None):
    q = torch.randn(1, 6, 2, 8) if q is None else q
    out, lse = torch.empty_like(q), torch.empty(q.size(0), q.size(2), q.size(1))
    d = rt._Descs()
    a = rt._args(d, None, False, -1, -1, 8 ** -0.5, 0, False, torch.device("cpu"))
    r = None
    if comm is not None:
        r = _lib.RingArgs()
        r.layout, r.comm, r.caller_error = layout, ctypes.pointer(comm), None
    err = ctypes.create_string_buffer(1024)
    rc = _lib.lib().ringattn_ring_fwd(ctypes.byref(a), ctypes.byref(r) if r is not None else None, d(q), d(q), d(q),
                                      d(out), d(lse), err, 1024)
    return rc, err.value.decode(), out, lse


def test_ring_c_abi_refuses_with_text():
    assert ring_call(None)[:2] == (_lib.INVALID_ARGUMENT, "ring is missing (a null pointer)")
    assert ring_call(_lib.Communicator(None, 3, 2))[:2] == (
        _lib.INVALID_ARGUMENT, "communicator rank is 3; it must be 0 to 1 (size 2)")
    assert ring_call(_lib.Communicator(None, 0, 2))[:2] == (
        _lib.INVALID_ARGUMENT, "communicator has no post function (a null pointer) with size 2")
    assert ring_call(_lib.Communicator(None, 0, 1), layout=7)[:2] == (
        _lib.INVALID_ARGUMENT, "ranks stopped before the first hop: rank 0: layout is 7; allowed are -1 (auto), "
        "0 (contiguous), 1 (zigzag), 2 (striped) and 3 (doc-zigzag)")
    rc, text, _, _ = ring_call(_lib.Communicator(None, 0, 1), q=torch.ones(1, 6, 2, 8, dtype=torch.int32))
    assert (rc, text) == (_lib.INVALID_ARGUMENT, "ranks stopped before the first hop: rank 0: q has dtype int32; "
                          "allowed are bfloat16, float16 and float32")


def test_ring_of_one_equals_the_single_process_op():
    q = torch.randn(2, 9, 2, 8)
    rc, text, out, lse = ring_call(_lib.Communicator(None, 0, 1), layout=-1, q=q)
    assert rc == _lib.OK, text
    want, want_lse = rt.attention(q, q, q, return_lse=True)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-6, rtol=1e-5)


def test_shard_positions_cover_the_sequence_and_refuse_by_name():
    for layout in ("contiguous", "zigzag", "striped", "doc-zigzag", "auto"):
        for world in (1, 3, 4):
            got = torch.cat([rt.shard_positions(10, r, world, layout, causal=True)[0] for r in range(world)])
            assert sorted(got.tolist()) == list(range(10)), (layout, world, got)
    assert rt.shard_positions(10, 1, 2, "zigzag")[0].tolist() == [2, 3, 4, 5, 6]  # chunks 1 and 2 of [0,2) [2,5) [5,7) [7,10)
    assert rt.shard_positions(8, 0, 2, "auto", causal=True)[1] == "zigzag"
    for args, text in (((10, 2, 2), "rank is 2; it must be 0 to 1 (world 2)"), ((0, 0, 2), "seq_len is 0; it must be >= 1"),
                       ((10, 0, 0), "world is 0; it must be >= 1")):
        with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
            rt.shard_positions(*args)
    with pytest.raises(ValueError, match=r"layout='ring'; allowed are 'auto', 'contiguous'"):
        rt.shard_positions(10, 0, 2, "ring")


def nccl_create(comm, device=0, timeout_s=60.0):
    out, err = ctypes.c_void_p(), ctypes.create_string_buffer(1024)
    rc = _lib.lib().ringattn_nccl_create(ctypes.pointer(comm), device, timeout_s, ctypes.byref(out), err, 1024)
    return rc, err.value.decode(), out.value


def test_nccl_communicators_refuse_with_text():
    one = _lib.Communicator(None, 0, 1)
    assert nccl_create(one, timeout_s=0.0)[:2] == (
        _lib.INVALID_ARGUMENT, "ranks stopped before the first hop: rank 0: timeout_s is 0; it must be a finite number "
        "of seconds > 0")
    err = ctypes.create_string_buffer(1024)
    assert _lib.lib().ringattn_nccl_destroy(None, err, 1024) == _lib.OK
    if not _lib.features() & _lib.FEATURE_NCCL:
        assert nccl_create(one) == (
            _lib.INVALID_ARGUMENT, "ranks stopped before the first hop: rank 0: this ringattn_c was built without NCCL; "
            "rebuild it with RINGATTN_CUDA=ON where NCCL is found (set NCCL_ROOT), or pass ring.nccl NULL", None)
        # A pointer that cannot be a communicator of this library is refused before it is read.
        q = torch.randn(1, 6, 2, 8)
        out, lse = torch.empty_like(q), torch.empty(1, 2, 6)
        d = rt._Descs()
        a = rt._args(d, None, False, -1, -1, 8 ** -0.5, 0, False, torch.device("cpu"))
        r = _lib.RingArgs(0, ctypes.pointer(one), None, 0x1234)
        rc = _lib.lib().ringattn_ring_fwd(ctypes.byref(a), ctypes.byref(r), d(q), d(q), d(q), d(out), d(lse), err, 1024)
        assert (rc, err.value.decode()) == (
            _lib.INVALID_ARGUMENT, "ranks stopped before the first hop: rank 0: ring.nccl is given but this ringattn_c "
            "was built without NCCL (ringattn_nccl_create refuses); pass ring.nccl NULL")
        return
    count = torch.cuda.device_count()
    rc, text, _ = nccl_create(one, device=count + 3)
    assert (rc, text) == (_lib.INVALID_ARGUMENT, f"ranks stopped before the first hop: rank 0: device is {count + 3}; "
                          f"this process sees {count} CUDA device(s), so it must be 0 to {count - 1}")
    if count == 0:  # built with NCCL, run where no GPU is seen: the refusal above is all there is
        return
    rc, text, handle = nccl_create(one)
    assert rc == _lib.OK and handle, text
    try:
        rc, text, _, _ = ring_call_nccl(one, handle, torch.randn(1, 6, 2, 8))
        assert (rc, text) == (_lib.INVALID_ARGUMENT, "ranks stopped before the first hop: rank 0: ring.nccl moves GPU "
                              "memory but q is on cpu; pass CUDA tensors, or ring.nccl NULL for CPU tensors")
        q = torch.randn(2, 9, 2, 8, device="cuda")
        rc, text, out, lse = ring_call_nccl(one, handle, q)
        assert rc == _lib.OK, text
        want, want_lse = rt.attention(q, q, q, return_lse=True)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)
    finally:
        assert _lib.lib().ringattn_nccl_destroy(handle, err, 1024) == _lib.OK, err.value.decode()


def ring_call_nccl(comm, handle, q):
    out, lse = torch.full_like(q, float("nan")), torch.full((q.size(0), q.size(2), q.size(1)), float("nan"),
                                                             device=q.device)
    d = rt._Descs()
    a = rt._args(d, None, False, -1, -1, 8 ** -0.5, 0, False, q.device)
    r = _lib.RingArgs(-1, ctypes.pointer(comm), None, handle)
    err = ctypes.create_string_buffer(1024)
    rc = _lib.lib().ringattn_ring_fwd(ctypes.byref(a), ctypes.byref(r), d(q), d(q), d(q), d(out), d(lse), err, 1024)
    if q.is_cuda:
        torch.cuda.synchronize()
    return rc, err.value.decode(), out, lse
