"""What both ops of ringattn.torch share (the single-process op in torch.py, the distributed op in
_ring.py): the tensors' descriptors for the C ABI, the call's args with torch's stream and caching
allocator, and the checks of the keyword arguments."""

import ctypes
import functools
import math
import struct

import torch
import torch.utils.dlpack

from . import _lib

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_CODES = {
    torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16),
    torch.int32: (0, 32), torch.int64: (0, 64),
}
_ERROR_BYTES = 1024


# A descriptor (_lib.Tensor, DLPack's DLTensor: data, device, ndim, dtype, shape, strides,
# byte_offset) followed by its shape and strides, packed into one buffer by one struct call: the
# host's cost per call is mostly these descriptors, and ctypes structures cost several times more.
_DESC = "=QiiiBBHQQQ"
assert struct.calcsize(_DESC) == ctypes.sizeof(_lib.Tensor), "ringattn: the descriptor layout does not match"


_HEAD = struct.calcsize(_DESC)


@functools.lru_cache(maxsize=None)
def _packer(ndim):
    return struct.Struct(f"{_DESC}{ndim}q{ndim}q")


def _device_of(t):
    """DLPack's device type and id; 0 (no device ringattn knows) for others, which the library refuses."""
    if t.is_cuda:
        return _lib.CUDA, t.get_device()
    return (_lib.CPU, 0) if t.is_cpu else (0, 0)


class _Descs:
    """Descriptors of tensors (their addresses, for the C ABI's pointer arguments), kept alive with
    the tensors for one call (the ring's calls; the op passes torch's own DLTensors, _pack_call)."""

    def __init__(self):
        self._keep = []

    def __call__(self, t):
        if t is None:
            return None
        n = t.dim()
        p = _packer(n)
        buf = ctypes.create_string_buffer(p.size)
        at = ctypes.addressof(buf)
        code, bits = _CODES[t.dtype]
        p.pack_into(buf, 0, t.data_ptr(), *_device_of(t), n, code, bits, 1, at + _HEAD, at + _HEAD + 8 * n, 0,
                    *t.shape, *t.stride())
        self._keep += [t, buf]
        return at


# Scratch on a GPU from torch's caching allocator, in the order of the call's stream (the library
# gives memory back once its work is queued; the allocator reuses it only after that work on the
# same stream). The library makes the call's device current before it allocates, so the callbacks
# go to the allocator's raw entry points (what torch.cuda.caching_allocator_alloc calls after its
# device guard and argument checks, a few microseconds a call less), where this torch has them.
_RAW_ALLOC = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc", None)
_RAW_DELETE = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete", None)


@_lib.ALLOCATE
def _torch_allocate(ctx, nbytes, stream):
    try:
        if _RAW_ALLOC is not None:
            return _RAW_ALLOC(nbytes, stream or 0)
        return torch.cuda.caching_allocator_alloc(nbytes, device=ctx - 1, stream=stream or 0)
    except Exception:  # noqa: BLE001 - an exception cannot cross ctypes; the library reports the null
        return None


@_lib.DEALLOCATE
def _torch_deallocate(ctx, ptr, nbytes, stream):
    try:
        (_RAW_DELETE or torch.cuda.caching_allocator_delete)(ptr)
    except Exception:  # noqa: BLE001 - nothing to report to: the memory stays with torch
        pass


_ALLOCATORS = {}


def _cuda_allocator(index):
    if index not in _ALLOCATORS:
        _ALLOCATORS[index] = _lib.Allocator(index + 1, _torch_allocate, _torch_deallocate)
    return _ALLOCATORS[index]


def _host_cu_seqlens(cu_seqlens):
    """The library reads the boundaries on the host: a CUDA tensor is copied (a synchronization)."""
    return cu_seqlens if cu_seqlens is None or cu_seqlens.device.type == "cpu" else cu_seqlens.cpu()


def _args(descs, cu_seqlens, causal, window_left, window_right, softmax_scale, max_seqlen, deterministic,
          device):
    a = _lib.Args()
    a.abi_version = _lib.ABI_VERSION
    a.causal = int(causal)
    a.window_left, a.window_right = window_left, window_right
    a.has_softmax_scale, a.softmax_scale = 1, softmax_scale
    a.cu_seqlens = descs(cu_seqlens) if cu_seqlens is not None else None
    a.max_seqlen = max_seqlen
    a.deterministic = int(deterministic)
    a.stream = None
    a.allocator = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        a.stream = torch.cuda.current_stream(index).cuda_stream or None
        a.allocator = ctypes.pointer(_cuda_allocator(index))
    return a


# The call's args (_lib.Args) packed by struct, as the descriptors: the op's calls pack the args
# and every descriptor into one buffer by one struct call (the ring's calls use _args).
_ARGS = "=iiqqi4xdQqi4xQQ"
assert struct.calcsize(_ARGS) == ctypes.sizeof(_lib.Args) and _lib.Args.softmax_scale.offset == 32 \
    and _lib.Args.deterministic.offset == 56 and _lib.Args.allocator.offset == 72, "ringattn: the args layout does not match"
_ARGS_STRUCT = struct.Struct(_ARGS)
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_to_dlpack = torch.utils.dlpack.to_dlpack
# A DLPack capsule's DLManagedTensor, whose first member is the DLTensor: the C ABI's descriptor.
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _stream_and_allocator(t):
    """The current stream of t's GPU and the address of that GPU's allocator (0, 0 on the CPU)."""
    if not t.is_cuda:
        return 0, 0
    index = t.get_device()
    stream = _RAW_STREAM(index) if _RAW_STREAM is not None else torch.cuda.current_stream(index).cuda_stream
    return stream, ctypes.addressof(_cuda_allocator(index))


def _pack_call(cu_seqlens, causal, window_left, window_right, softmax_scale, max_seqlen, deterministic, *ts):
    """The op's call: its args packed by one struct call, the tensors (ts, and cu_seqlens when given)
    described by DLPack (torch's own DLTensor of each, the C ABI's descriptor, without a copy).
    Returns what the call must keep alive (the args' buffer and the capsules, which hold the
    tensors), the args' address and the descriptors' addresses in the order of ts. The stream and
    allocator are ts[0]'s device's."""
    caps = [_to_dlpack(t) for t in ts]
    descs = [_capsule_pointer(c, b"dltensor") for c in caps]
    cu_at = 0
    if cu_seqlens is not None:
        caps.append(_to_dlpack(cu_seqlens))
        cu_at = _capsule_pointer(caps[-1], b"dltensor")
    buf = ctypes.create_string_buffer(_ARGS_STRUCT.size)
    _ARGS_STRUCT.pack_into(buf, 0, _lib.ABI_VERSION, int(causal), window_left, window_right, 1, softmax_scale, cu_at,
                           max_seqlen, int(deterministic), *_stream_and_allocator(ts[0]))
    return (buf, caps), ctypes.addressof(buf), descs


def _check_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (got {type(t).__name__})")
    if t.dtype not in _FLOATS:
        raise TypeError(f"{name} has dtype {t.dtype}; allowed are torch.bfloat16, torch.float16 and torch.float32")


def _check_window(window, causal):
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in window)):
        raise ValueError(f"window={window!r}; it must be a pair of ints (left, right), -1 for an unbounded side")
    left, right = window
    for side, w in (("left", left), ("right", right)):
        if w < -1:
            raise ValueError(f"window={tuple(window)}: {side} {w} is out of range; a side is -1 (unbounded) or >= 0")
    if causal and right > 0:
        raise ValueError(f"window={tuple(window)} with causal=True: with causal the right edge is the diagonal, so "
                         "right must be 0 or -1")
    return left, right


def _check_packing(q, cu_seqlens, max_seqlen):
    """cu_seqlens' type and shape; its values are checked inside the op (so under torch.compile too)."""
    if cu_seqlens is None:
        if max_seqlen is not None:
            raise ValueError(f"max_seqlen={max_seqlen!r} without cu_seqlens; it is only meaningful with packed "
                             "documents")
        return 0
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor (got {type(cu_seqlens).__name__})")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens has dtype {cu_seqlens.dtype}; allowed are torch.int32 and torch.int64")
    if cu_seqlens.dim() != 1 or cu_seqlens.size(0) < 2:
        raise ValueError(f"cu_seqlens has shape {list(cu_seqlens.shape)}; it must be [docs + 1] with at least one "
                         "document")
    if cu_seqlens.device != q.device and cu_seqlens.device.type != "cpu":
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but q is on {q.device}; it must be on q's device "
                         "or on the CPU")
    if max_seqlen is None:
        return 0
    if not isinstance(max_seqlen, int) or isinstance(max_seqlen, bool) or max_seqlen < 1:
        raise ValueError(f"max_seqlen={max_seqlen!r}; it must be None or an int >= 1")
    return max_seqlen


def _check_scale(softmax_scale, head_dim):
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not isinstance(softmax_scale, (int, float)) or isinstance(softmax_scale, bool) \
            or not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale={softmax_scale!r}; it must be None (1/sqrt(head_dim)) or a finite number")
    return float(softmax_scale)
