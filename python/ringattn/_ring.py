"""The distributed op: ring attention across a torch.distributed process group (ringattn.torch's
``shard``, ``ring_attention`` and ``unshard``).

Each rank holds the rows of one layout (the CLI's sharding: contiguous, zigzag, striped,
doc-zigzag or auto); ``ring_attention`` calls the C ABI's ring (capi/ringattn_c.h,
ringattn_ring_fwd / ringattn_ring_bwd), which runs the C++ ring (schedule, hop skipping, documents,
windows, early stop) and moves K/V blocks and dK/dV accumulators either through this module's
communicator, the group's own point-to-point over its CPU backend (gloo; a CUDA tensor's blocks
are staged through host memory by the library), or, for CUDA tensors, GPU to GPU over an NCCL
communicator of ringattn's own (made once per group and device from a unique id sent over the
group, cached, destroyed with the group or at exit). Every rank's local checks are agreed before
the first exchange, so a rank that passes something else makes every rank raise, naming it."""

import ctypes
import datetime
import socket
import weakref
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from . import _lib
from ._call import _Descs, _args, _check_packing, _check_scale, _check_tensor, _check_window, _host_cu_seqlens

_ERROR_BYTES = 1024


def _from_address(address, nbytes):
    """A uint8 tensor holding a copy of the nbytes at address. The exchanges copy into and out of
    tensors of torch's own memory, so that no tensor gloo holds refers to the library's buffers or
    to a Python object (a host memcpy per hop, small beside the transfer itself)."""
    t = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes:
        ctypes.memmove(t.data_ptr(), address, nbytes)
    return t


def _to_address(address, t):
    if t.numel():
        ctypes.memmove(address, t.data_ptr(), t.numel())


def _write_error(error, size, exc):
    text = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")[: max(0, size - 1)]
    ctypes.memmove(error, text + b"\0", len(text) + 1)


class _GroupComm:
    """ringattn_communicator over a process group: channel c's messages carry tag c."""

    def __init__(self, group, timeout):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.global_ranks = [dist.get_global_rank(group, r) if group is not None else r for r in range(self.size)]
        self.timeout = timeout
        self.pending = {}
        self._callbacks = (_lib.POST(self._post), _lib.WAIT(self._wait), _lib.ALLGATHER(self._allgather))
        self.struct = _lib.Communicator(None, self.rank, self.size, *self._callbacks)

    def close(self):
        """Breaks the reference cycle through the callbacks once the call is over, so that the
        communicator (and the group it names) goes at once rather than at the next collection."""
        self.pending.clear()
        self._callbacks = self.struct = self.group = None

    def _post(self, ctx, channel, to, send, send_bytes, frm, recv, recv_bytes, error, error_size):
        try:
            works, landing = [], None
            if recv_bytes:
                landing = torch.empty(recv_bytes, dtype=torch.uint8)
                works.append(dist.irecv(landing, src=self.global_ranks[frm], group=self.group, tag=channel))
            if send_bytes:
                works.append(dist.isend(_from_address(send, send_bytes), dst=self.global_ranks[to], group=self.group,
                                        tag=channel))
            self.pending[channel] = (works, landing, recv)
            return 0
        except BaseException as e:  # noqa: BLE001 - an exception cannot cross ctypes: the library raises it
            _write_error(error, error_size, e)
            return 1

    def _wait(self, ctx, channel, error, error_size):
        works, landing, recv = self.pending.pop(channel, ((), None, None))
        try:
            for w in works:
                if self.timeout is None:
                    w.wait()
                else:
                    w.wait(self.timeout)
            if landing is not None:
                _to_address(recv, landing)
            return 0
        except BaseException as e:  # noqa: BLE001
            _write_error(error, error_size, e)
            return 1

    def _allgather(self, ctx, send, recv, nbytes, error, error_size):
        try:
            parts = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(self.size)]
            dist.all_gather(parts, _from_address(send, nbytes), group=self.group)
            _to_address(recv, torch.cat(parts))
            return 0
        except BaseException as e:  # noqa: BLE001
            _write_error(error, error_size, e)
            return 1


def _comm(group, timeout):
    """A communicator for one call. Not cached: a reference to the group kept past
    destroy_process_group makes gloo end the process at exit."""
    return _GroupComm(group, timeout)


def _check_group(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ringattn: torch.distributed is not initialized; call torch.distributed."
                           "init_process_group (under torchrun) before the distributed op")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None (got {type(group).__name__})")
    return group if group is not None else dist.group.WORLD


def _check_host_backend(g):
    """The ring's exchanges move host memory (a CUDA tensor's blocks are staged through it), so the
    group needs a backend for CPU tensors. The same on every rank, raised before any exchange."""
    get = getattr(g, "_get_backend", None)
    if get is not None:
        try:
            get(torch.device("cpu"))
            return
        except RuntimeError:
            pass
    else:
        name = str(dist.get_backend(g))
        if "gloo" in name or "mpi" in name:
            return
    raise ValueError(f"the group's backend is {dist.get_backend(g)!r}, which moves no CPU tensors; ringattn's ring "
                     "exchanges host memory (CUDA tensors' K/V blocks are staged through it), so the group needs a "
                     "CPU backend too: init_process_group('cpu:gloo,cuda:nccl') or dist.new_group(backend='gloo') "
                     "(the ranks' agreement goes over it even when NCCL moves the blocks)")


TRANSPORTS = ("auto", "nccl", "group")
_NCCL_TIMEOUT_S = 600.0  # an NCCL communicator's bound on each wait when the call gives no timeout
_nccl = weakref.WeakKeyDictionary()  # group -> [the ringattn_nccl handle, or None: the group's own exchanges]


def _destroy_handle(slot):
    handle, slot[0] = slot[0], None
    if handle:
        err = ctypes.create_string_buffer(_ERROR_BYTES)
        _lib.lib().ringattn_nccl_destroy(handle, err, _ERROR_BYTES)


def _gpu_of(q):
    """What this rank reports for the NCCL decision: whether its library has NCCL, its host and
    its GPU ("cpu" for tensors not on CUDA, None when this rank refuses its own call)."""
    has = bool(_lib.features() & _lib.FEATURE_NCCL)
    if q is None or q.device.type != "cuda":
        return has, socket.gethostname(), None if q is None else "cpu"
    props = torch.cuda.get_device_properties(q.device)
    return has, socket.gethostname(), str(getattr(props, "uuid", q.device))


def _nccl_refusal(every):
    """Why the ranks cannot use NCCL (every: each rank's _gpu_of), or None."""
    for r, (has, _, gpu) in enumerate(every):
        if gpu == "cpu":
            return f"transport='nccl' moves GPU memory but rank {r}'s tensors are not on a CUDA device"
        if not has:
            return f"transport='nccl' but rank {r}'s ringattn library was built without NCCL"
    seen = {}
    for r, (_, host, gpu) in enumerate(every):
        if (host, gpu) in seen:
            return (f"transport='nccl' but ranks {seen[host, gpu]} and {r} share GPU {gpu} of host {host}; NCCL needs "
                    "a GPU of its own for every rank (transport='group' runs them over the group)")
        seen[host, gpu] = r
    return None


def _nccl_handle(g, q, transport, timeout):
    """(the NCCL communicator of `g` or None for the group's own exchanges, this rank's refusal of
    the transport or None). Decided on the group's first call with transport 'auto' or 'nccl', by
    every rank from what every rank reports (so the same on every rank, and taken part in by a rank
    that refuses its own call, q None): 'auto' takes NCCL when every rank's tensors are on CUDA,
    every rank's library has NCCL and no two ranks share a GPU; 'nccl' is refused otherwise, with
    the reason. Made on the device of that first call and cached for the group; a call on another
    device is refused by the library."""
    slot = _nccl.get(g)
    if slot is not None and (slot[0] or transport == "auto"):
        return slot[0], None
    every = [None] * dist.get_world_size(g)
    dist.all_gather_object(every, _gpu_of(q), group=g)
    if any(gpu is None for _, _, gpu in every):
        return None, None  # a rank refused its call (every rank raises its text): decided on the next one
    refusal = _nccl_refusal(every)
    if slot is None:
        slot = _nccl[g] = [None]
        weakref.finalize(g, _destroy_handle, slot)  # at exit too
    if refusal is not None:
        return None, refusal if transport == "nccl" else None
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    comm = _comm(g, timeout)
    err = ctypes.create_string_buffer(_ERROR_BYTES)
    out = ctypes.c_void_p()
    seconds = timeout.total_seconds() if timeout is not None else _NCCL_TIMEOUT_S
    try:
        rc = _lib.lib().ringattn_nccl_create(ctypes.pointer(comm.struct), index, seconds, ctypes.byref(out), err,
                                             _ERROR_BYTES)
    finally:
        comm.close()
    _lib.check(rc, err)
    slot[0] = out.value
    return out.value, None


def _drop_nccl(g):
    """Ends the communicator a failed call used (the library refuses it afterwards); the group's
    next call decides again."""
    slot = _nccl.pop(g, None)
    if slot is not None:
        _destroy_handle(slot)


def _layout_code(layout):
    if layout not in _lib.LAYOUTS:
        raise ValueError(f"layout={layout!r}; allowed are " + ", ".join(repr(k) for k in _lib.LAYOUTS))
    return _lib.LAYOUTS[layout]


def _check_timeout(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        timeout = datetime.timedelta(seconds=timeout)
    if not isinstance(timeout, datetime.timedelta) or timeout.total_seconds() <= 0:
        raise ValueError(f"timeout={timeout!r}; it must be None (the group's timeout) or a positive number of seconds "
                         "or datetime.timedelta")
    return timeout


def positions(seq_len, rank, world, layout="zigzag", *, causal=False, window=(-1, -1), cu_seqlens=None):
    """The global positions of rank `rank`'s rows under `layout` (a LongTensor, in local order), and
    the layout taken ("auto" picks by the mask and the documents as the CLI does)."""
    code = _layout_code(layout)
    left, right = _check_window(window, bool(causal))
    d = _Descs()
    cu = _host_cu_seqlens(cu_seqlens)
    a = _args(d, cu, causal, left, right, 1.0, 0, False, torch.device("cpu"))
    err = ctypes.create_string_buffer(_ERROR_BYTES)
    count, chosen = ctypes.c_int64(0), ctypes.c_int32(0)
    f = _lib.lib().ringattn_shard_positions
    _lib.check(f(ctypes.byref(a), code, seq_len, rank, world, None, 0, ctypes.byref(count), ctypes.byref(chosen), err,
                 _ERROR_BYTES), err)
    out = torch.empty(count.value, dtype=torch.int64)
    ptr = ctypes.cast(out.data_ptr(), ctypes.POINTER(ctypes.c_int64)) if count.value else None
    _lib.check(f(ctypes.byref(a), code, seq_len, rank, world, ptr, count.value, ctypes.byref(count),
                 ctypes.byref(chosen), err, _ERROR_BYTES), err)
    name = {v: k for k, v in _lib.LAYOUTS.items()}[chosen.value]
    return out, name


def _check_seq_dim(x, seq_dim, what):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor (got {type(x).__name__})")
    if not isinstance(seq_dim, int) or isinstance(seq_dim, bool) or not -x.dim() <= seq_dim < x.dim():
        raise ValueError(f"seq_dim={seq_dim!r} for a tensor of shape {list(x.shape)}; it must be an axis of it")
    return seq_dim % x.dim()


def shard(x, group=None, *, layout="zigzag", seq_dim=1, cu_seqlens=None, causal=False, window=(-1, -1)):
    """This rank's rows of the whole sequence `x` (every rank passes the same x) along seq_dim, in
    the layout's local order: what ring_attention takes. No communication."""
    g = _check_group(group)
    seq_dim = _check_seq_dim(x, seq_dim, "x")
    pos, _ = positions(x.size(seq_dim), dist.get_rank(g), dist.get_world_size(g), layout, causal=causal,
                       window=window, cu_seqlens=cu_seqlens)
    return x.index_select(seq_dim, pos.to(x.device))


class _Unshard(torch.autograd.Function):
    """All rows from every rank's shard; the gradient of a rank's rows sums every rank's gradient."""

    @staticmethod
    def forward(ctx, x, g, seq_dim, every_pos, seq_len):
        world, rank = dist.get_world_size(g), dist.get_rank(g)
        most = max(p.numel() for p in every_pos)
        shape = list(x.shape)
        shape[seq_dim] = most
        padded = x.new_zeros(shape)
        padded.narrow(seq_dim, 0, x.size(seq_dim)).copy_(x)
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded.contiguous(), group=g)
        shape[seq_dim] = seq_len
        out = x.new_empty(shape)
        for p, part in zip(every_pos, parts):
            out.index_copy_(seq_dim, p.to(x.device), part.narrow(seq_dim, 0, p.numel()))
        ctx.g, ctx.seq_dim, ctx.mine = weakref.ref(g), seq_dim, every_pos[rank].to(x.device)
        return out

    @staticmethod
    def backward(ctx, grad):
        g = ctx.g()
        if g is None:
            raise RuntimeError("ringattn: the process group of this unshard was destroyed before its backward")
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=g)
        return total.index_select(ctx.seq_dim, ctx.mine), None, None, None, None


def unshard(x_local, group=None, *, layout="zigzag", seq_dim=1, cu_seqlens=None, causal=False, window=(-1, -1)):
    """The whole sequence on every rank from each rank's rows (shard's inverse): out, a gradient,
    or the LSE (seq_dim=2 for [batch, heads, len], 1 for [heads, tokens]). Differentiable."""
    g = _check_group(group)
    seq_dim = _check_seq_dim(x_local, seq_dim, "x_local")
    world = dist.get_world_size(g)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([x_local.size(seq_dim)], dtype=torch.int64), group=g)
    seq_len = int(sum(int(s) for s in sizes))
    every = [positions(seq_len, r, world, layout, causal=causal, window=window, cu_seqlens=cu_seqlens)[0]
             for r in range(world)]
    for r, (p, s) in enumerate(zip(every, sizes)):
        if p.numel() != int(s):
            raise ValueError(f"rank {r} holds {int(s)} rows but the {layout} layout of {seq_len} rows over {world} "
                             f"ranks gives it {p.numel()}; unshard what shard made with the same layout")
    return _Unshard.apply(x_local, g, seq_dim, every, seq_len)


def _local_checks(q, k, v, packed, transport):
    """This rank's own refusal of its tensors and transport (the text every rank raises), or None."""
    try:
        if not isinstance(transport, str) or transport not in TRANSPORTS:
            raise ValueError(f"transport={transport!r}; allowed are " + ", ".join(repr(t) for t in TRANSPORTS))
        for name, t in (("q", q), ("k", k), ("v", v)):
            _check_tensor(name, t)
            if t.device.type not in ("cpu", "cuda"):
                raise ValueError(f"{name} is on {t.device}; allowed are cpu and cuda tensors")
            if t.device != q.device:
                raise ValueError(f"{name} is on {t.device} but q is on {q.device}; q, k and v must be on one device")
        want = 3 if packed else 4
        layout = "[local_tokens, heads, head_dim] with cu_seqlens" if packed else "[batch, local_len, heads, head_dim]"
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.dim() != want:
                raise ValueError(f"{name} has {t.dim()} dimensions (shape {list(t.shape)}); {name} must be {layout}")
        return None
    except (TypeError, ValueError) as e:
        return str(e)


def _ring_args(group, layout, timeout, nccl=None):
    """The ring's arguments and the communicator they point at (kept alive for the call)."""
    _check_host_backend(group)
    comm = _comm(group, timeout)
    r = _lib.RingArgs()
    r.layout = layout
    r.comm = ctypes.pointer(comm.struct)
    r.caller_error = None
    r.nccl = nccl
    return r, comm


def _transport_of(q, group, transport, timeout):
    """(the NCCL handle of the call or None, this rank's refusal of the transport or None)."""
    return (None, None) if transport == "group" else _nccl_handle(group, q, transport, timeout)


def _call_ring(f, group, nccl, *args):
    """f(*args), the library's status; a failed call on an NCCL communicator ends it."""
    rc = f(*args)
    if rc == _lib.RUNTIME_ERROR and nccl:
        _drop_nccl(group)
    return rc


def _contiguous_dim(t):
    return t if t.size(-1) <= 1 or t.stride(-1) == 1 else t.contiguous()


def _ring_inputs(q, k, v):
    """q with a contiguous head dim; K and V too, and contiguous on a GPU (their blocks travel as
    they lie in device memory; the library copies host ones itself)."""
    if q.device.type == "cuda":
        return _contiguous_dim(q), k.contiguous(), v.contiguous()
    return tuple(_contiguous_dim(t) for t in (q, k, v))


def _lse_shape(q, packed):
    return (q.size(1), q.size(0)) if packed else (q.size(0), q.size(2), q.size(1))


def _ring_fwd(q, k, v, group, layout, cu_seqlens, causal, left, right, scale, max_seqlen, deterministic, timeout,
              transport="auto", caller_error=None):
    packed = cu_seqlens is not None
    d = _Descs()
    a = _args(d, _host_cu_seqlens(cu_seqlens), causal, left, right, scale, max_seqlen, deterministic,
              q.device if q is not None else torch.device("cpu"))
    nccl, refusal = _transport_of(q, group, transport, timeout)
    caller_error = caller_error if caller_error is not None else refusal
    nccl = None if caller_error is not None else nccl
    r, comm = _ring_args(group, layout, timeout, nccl)
    err = ctypes.create_string_buffer(_ERROR_BYTES)
    f = _lib.lib().ringattn_ring_fwd
    try:
        if caller_error is not None:
            r.caller_error = caller_error.encode("utf-8", "replace")
            rc = f(ctypes.byref(a), ctypes.byref(r), None, None, None, None, None, err, _ERROR_BYTES)
            _lib.check(rc, err)
            raise AssertionError("ringattn: the ring accepted a call its caller refused")  # not reached: rc != OK
        q, k, v = _ring_inputs(q, k, v)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(_lse_shape(q, packed), dtype=torch.float32, device=q.device)
        rc = _call_ring(f, group, nccl, ctypes.byref(a), ctypes.byref(r), d(q), d(k), d(v), d(out), d(lse),
                        err, _ERROR_BYTES)
    finally:
        comm.close()
    _lib.check(rc, err)
    return out, lse


def _ring_bwd(dout, q, k, v, out, lse, group, layout, cu_seqlens, causal, left, right, scale, max_seqlen,
              deterministic, timeout, transport="auto"):
    dout, out = (_contiguous_dim(t) for t in (dout, out))
    q, k, v = _ring_inputs(q, k, v)
    dq, dk, dv = (torch.empty(t.shape, dtype=torch.float32, device=t.device) for t in (q, k, v))
    d = _Descs()
    a = _args(d, _host_cu_seqlens(cu_seqlens), causal, left, right, scale, max_seqlen, deterministic, q.device)
    nccl, refusal = _transport_of(q, group, transport, timeout)
    if refusal is not None:  # not reached after a forward that ran: the group decided then
        raise ValueError(refusal)
    r, comm = _ring_args(group, layout, timeout, nccl)
    err = ctypes.create_string_buffer(_ERROR_BYTES)
    try:
        rc = _call_ring(_lib.lib().ringattn_ring_bwd, group, nccl, ctypes.byref(a), ctypes.byref(r),
                        d(dout.to(q.dtype)), d(q), d(k), d(v), d(out), d(lse.contiguous()), d(dq), d(dk), d(dv), err,
                        _ERROR_BYTES)
    finally:
        comm.close()
    _lib.check(rc, err)
    return dq, dk, dv


def _ring_grads(fwd, bwd, q, k, cu_seqlens, scale, lse_grad, dout, out, dlse):
    """dq, dk, dv (fp32) of the ring's loss: `bwd(dout)` gives the gradients through out; with the
    LSE in the loss, as the single-process op: d lse_i / d s_ij = P_ij, so dq_i gains scale dlse_i
    (P K)_i (`fwd` with the keys as values) and dk_j gains scale (P^T (dlse q))_j, the dv of a
    backward whose dout is dlse q."""
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = bwd(dout)
    if lse_grad and dlse is not None:
        packed = cu_seqlens is not None
        w = (dlse.transpose(0, 1) if packed else dlse.transpose(1, 2)).unsqueeze(-1).float()
        pk, _ = fwd(q, k, k)
        _, _, ptq = bwd((w * q.float()).to(q.dtype))
        dq = dq + scale * w * pk.float()
        dk = dk + scale * ptq
    return dq, dk, dv


class _RingAttention(torch.autograd.Function):
    """The eager path (no custom op dispatch)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, params, lse_grad):
        out, lse = _ring_fwd(q, k, v, *params[:2], cu_seqlens, *params[2:])
        ctx.save_for_backward(q, k, v, cu_seqlens, out, lse)
        # The group by weak reference: a graph kept past destroy_process_group must not keep the
        # group alive.
        ctx.group, ctx.params, ctx.lse_grad = weakref.ref(params[0]), params[1:], lse_grad
        if not lse_grad:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, cu_seqlens, out, lse = ctx.saved_tensors
        group = ctx.group()
        if group is None:
            raise RuntimeError("ringattn: the process group of this ring_attention call was destroyed before its "
                               "backward")
        layout, causal, left, right, scale, max_seqlen, deterministic, timeout, transport = ctx.params
        rest = (group, layout, cu_seqlens, causal, left, right, scale, max_seqlen, deterministic, timeout, transport)
        dq, dk, dv = _ring_grads(
            lambda a, b, c: _ring_fwd(a, b, c, group, layout, cu_seqlens, *ctx.params[1:]),
            lambda d: _ring_bwd(d, q, k, v, out, lse, *rest), q, k, cu_seqlens, scale, ctx.lse_grad, dout, out, dlse)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


# The custom ops (torch.compile, export): the group by its name, the timeout in seconds (<= 0: the
# group's own).
def _group_named(name):
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def _wait_of(seconds):
    return None if seconds <= 0 else datetime.timedelta(seconds=seconds)


@torch.library.custom_op("ringattn::ring_fwd", mutates_args=())
def ring_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Optional[torch.Tensor],
                group_name: str, layout: int, causal: bool, window_left: int, window_right: int, softmax_scale: float,
                max_seqlen: int, deterministic: bool, timeout_s: float, transport: str,
                lse_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    return _ring_fwd(q, k, v, _group_named(group_name), layout, cu_seqlens, causal, window_left, window_right,
                     softmax_scale, max_seqlen, deterministic, _wait_of(timeout_s), transport)


@ring_fwd_op.register_fake
def _(q, k, v, cu_seqlens, group_name, layout, causal, window_left, window_right, softmax_scale, max_seqlen,
      deterministic, timeout_s, transport, lse_grad):
    return torch.empty_like(q), q.new_empty(_lse_shape(q, cu_seqlens is not None), dtype=torch.float32)


@torch.library.custom_op("ringattn::ring_bwd", mutates_args=())
def ring_bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                lse: torch.Tensor, cu_seqlens: Optional[torch.Tensor], group_name: str, layout: int, causal: bool,
                window_left: int, window_right: int, softmax_scale: float, max_seqlen: int, deterministic: bool,
                timeout_s: float, transport: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _ring_bwd(dout, q, k, v, out, lse, _group_named(group_name), layout, cu_seqlens, causal, window_left,
                     window_right, softmax_scale, max_seqlen, deterministic, _wait_of(timeout_s), transport)


@ring_bwd_op.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens, group_name, layout, causal, window_left, window_right, softmax_scale,
      max_seqlen, deterministic, timeout_s, transport):
    return tuple(torch.empty(t.shape, dtype=torch.float32, device=t.device) for t in (q, k, v))


def _op_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens = inputs[:4]
    ctx.save_for_backward(q, k, v, cu_seqlens, *output)
    ctx.params, ctx.lse_grad = inputs[4:14], inputs[14]
    if not ctx.lse_grad:
        ctx.mark_non_differentiable(output[1])


def _op_backward(ctx, dout, dlse):
    q, k, v, cu_seqlens, out, lse = ctx.saved_tensors
    group_name, layout, causal, left, right, scale, max_seqlen, deterministic, timeout_s, transport = ctx.params
    dq, dk, dv = _ring_grads(
        lambda a, b, c: ring_fwd_op(a, b, c, cu_seqlens, *ctx.params, False),
        lambda d: ring_bwd_op(d, q, k, v, out, lse, cu_seqlens, *ctx.params), q, k, cu_seqlens, scale, ctx.lse_grad,
        dout, out, dlse)
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)) + (None,) * 12


torch.library.register_autograd("ringattn::ring_fwd", _op_backward, setup_context=_op_setup_context)


def ring_attention(q_local, k_local, v_local, *, group=None, layout="zigzag", causal=False, window=(-1, -1),
                   softmax_scale=None, cu_seqlens=None, max_seqlen=None, deterministic=False, return_lse=False,
                   timeout: Optional[float] = None, transport="auto"):
    """Ring attention over the ranks of `group` (default: the world): each rank passes its rows of
    q, k and v ([batch, local_len, heads, dim]; with cu_seqlens, the global document boundaries,
    [local_tokens, heads, dim]) in `layout`'s order (shard), and gets its rows of out (and with
    return_lse=True of lse, fp32 [batch, heads, local_len] / [heads, local_tokens]). Collective:
    every rank calls it with the same arguments, which the ranks check before the first exchange
    (a rank that differs is named in the error every rank raises). Differentiable: each rank's
    gradients are those of the global loss for its rows. Every wait is bounded by `timeout`
    seconds (default: the group's timeout; an NCCL communicator's, 600 s, fixed when it is made).
    `transport`: how K/V blocks move. 'group': the group's own point-to-point (its CPU backend; CUDA
    tensors staged through host memory); 'nccl': CUDA tensors GPU to GPU over an NCCL communicator
    of ringattn's own (every rank needs a GPU of its own; refused otherwise); 'auto' (default):
    'nccl' when every rank's tensors are on CUDA, its library has NCCL and no two ranks share a GPU,
    else 'group'. The group decides once, on its first call that is not 'group' (an exchange with
    every rank), so every rank passes the same transport."""
    g = _check_group(group)
    packed = cu_seqlens is not None
    code = _layout_code(layout)
    left, right = _check_window(window, bool(causal))
    wait = _check_timeout(timeout)
    error = _local_checks(q_local, k_local, v_local, packed, transport)
    max_len, scale = 0, 1.0
    if error is None:
        try:
            max_len = _check_packing(q_local, cu_seqlens, max_seqlen)
            scale = _check_scale(softmax_scale, q_local.size(-1))
        except (TypeError, ValueError) as e:
            error = str(e)
    params = (g, code, bool(causal), left, right, scale, max_len, bool(deterministic), wait, transport)
    if error is not None:
        _ring_fwd(None, None, None, g, code, None, bool(causal), left, right, 1.0, 0, False, wait,
                  transport if transport in TRANSPORTS else "auto", caller_error=error)
    if torch.compiler.is_compiling():
        seconds = wait.total_seconds() if wait is not None else 0.0
        out, lse = ring_fwd_op(q_local, k_local, v_local, cu_seqlens, g.group_name, code, bool(causal), left, right,
                               scale, max_len, bool(deterministic), seconds, transport, bool(return_lse))
    else:
        out, lse = _RingAttention.apply(q_local, k_local, v_local, cu_seqlens, params, bool(return_lse))
    return (out, lse) if return_lse else out
