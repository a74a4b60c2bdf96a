"""The C ABI of capi/ringattn_c.h through ctypes: the structs field for field and the loader.

Nothing here imports torch; ringattn.torch fills the descriptors from tensors."""

import ctypes
import os
import pathlib

ABI_VERSION = 3
FEATURE_CUDA, FEATURE_NCCL = 1, 2  # ringattn_c_features bits
OK, INVALID_ARGUMENT, RUNTIME_ERROR = 0, 1, 2
CPU, CUDA = 1, 2  # DLPack device types


class Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class Tensor(ctypes.Structure):
    """DLPack's DLTensor: strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", Device),
        ("ndim", ctypes.c_int32),
        ("dtype", DType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


ALLOCATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
DEALLOCATE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


class Allocator(ctypes.Structure):
    _fields_ = [("ctx", ctypes.c_void_p), ("allocate", ALLOCATE), ("deallocate", DEALLOCATE)]


class Args(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_int32),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("has_softmax_scale", ctypes.c_int32),
        ("softmax_scale", ctypes.c_double),
        ("cu_seqlens", ctypes.c_void_p),  # a Tensor's address
        ("max_seqlen", ctypes.c_int64),
        ("deterministic", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("allocator", ctypes.POINTER(Allocator)),
    ]


POST = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p,
                        ctypes.c_size_t, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                        ctypes.c_size_t)
WAIT = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t)
ALLGATHER = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_void_p, ctypes.c_size_t)


class Communicator(ctypes.Structure):
    """ringattn_communicator: the caller's exchanges and allgather (ringattn.torch's process group)."""

    _fields_ = [("ctx", ctypes.c_void_p), ("rank", ctypes.c_int32), ("size", ctypes.c_int32), ("post", POST),
                ("wait", WAIT), ("allgather", ALLGATHER)]


class RingArgs(ctypes.Structure):
    _fields_ = [("layout", ctypes.c_int32), ("comm", ctypes.POINTER(Communicator)),
                ("caller_error", ctypes.c_char_p), ("nccl", ctypes.c_void_p)]


LAYOUTS = {"auto": -1, "contiguous": 0, "zigzag": 1, "striped": 2, "doc-zigzag": 3}


_LIB_NAME = "libringattn_c.so"
_lib = None


def library_path():
    """RINGATTN_C_LIBRARY when set (a build tree's capi/libringattn_c.so), else the installed copy."""
    return os.environ.get("RINGATTN_C_LIBRARY") or str(pathlib.Path(__file__).with_name(_LIB_NAME))


def lib():
    """The loaded library (once per process; its functions release the GIL while they run)."""
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not os.path.exists(path):
        raise RuntimeError(
            f"ringattn: the native library {path} does not exist; install the package with "
            "`pip install .` from the repository, or set RINGATTN_C_LIBRARY to a built libringattn_c.so")
    handle = ctypes.CDLL(path)
    handle.ringattn_c_abi_version.restype = ctypes.c_int32
    found = handle.ringattn_c_abi_version()
    if found != ABI_VERSION:
        raise RuntimeError(f"ringattn: {path} has C ABI version {found} but this package needs {ABI_VERSION}; "
                           "reinstall the package")
    p = ctypes.c_void_p  # a Tensor's or the args' address (ringattn.torch packs them itself)
    handle.ringattn_attention_fwd.argtypes = [p, p, p, p, p, p, ctypes.c_char_p, ctypes.c_size_t]
    handle.ringattn_attention_fwd.restype = ctypes.c_int32
    handle.ringattn_attention_bwd.argtypes = [p] * 10 + [ctypes.c_char_p, ctypes.c_size_t]
    handle.ringattn_attention_bwd.restype = ctypes.c_int32
    ring = [ctypes.POINTER(Args), ctypes.POINTER(RingArgs)]
    handle.ringattn_ring_fwd.argtypes = ring + [p] * 5 + [ctypes.c_char_p, ctypes.c_size_t]
    handle.ringattn_ring_fwd.restype = ctypes.c_int32
    handle.ringattn_ring_bwd.argtypes = ring + [p] * 9 + [ctypes.c_char_p, ctypes.c_size_t]
    handle.ringattn_ring_bwd.restype = ctypes.c_int32
    i64p = ctypes.POINTER(ctypes.c_int64)
    handle.ringattn_shard_positions.argtypes = [ctypes.POINTER(Args), ctypes.c_int32, ctypes.c_int64, ctypes.c_int32,
                                                ctypes.c_int32, i64p, ctypes.c_int64, i64p,
                                                ctypes.POINTER(ctypes.c_int32), ctypes.c_char_p, ctypes.c_size_t]
    handle.ringattn_shard_positions.restype = ctypes.c_int32
    handle.ringattn_c_features.restype = ctypes.c_int32
    handle.ringattn_nccl_create.argtypes = [ctypes.POINTER(Communicator), ctypes.c_int32, ctypes.c_double,
                                            ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t]
    handle.ringattn_nccl_create.restype = ctypes.c_int32
    handle.ringattn_nccl_destroy.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    handle.ringattn_nccl_destroy.restype = ctypes.c_int32
    _lib = handle
    return _lib


def features():
    """The FEATURE_* bits this library was built with."""
    return int(lib().ringattn_c_features())


def check(rc, error):
    """Raises the status of a call as a Python exception carrying the library's text."""
    if rc == OK:
        return
    text = error.value.decode("utf-8", "replace")
    if rc == INVALID_ARGUMENT:
        raise ValueError(text)
    raise RuntimeError(f"ringattn: {text}")
