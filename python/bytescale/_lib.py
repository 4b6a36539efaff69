"""Finding and loading libbytescale.so, and the C functions' signatures (include/bytescale/api.h).

Everything the package calls is the library's flat API: opaque handles, plain integers and doubles,
and arrays this package allocates with NumPy and the library fills. No struct layout is shared with
C except BsPlanInfo, BsPlanStats and BsSimInfo, whose size the library checks on every call.
"""

import ctypes
import ctypes.util
import os
import pathlib

import numpy as np


class Error(Exception):
    """A failure the library reported, or an argument it would refuse; the message says which
    argument or file and why (the C library's bs_errmsg() text)."""


LIB_NAME = "libbytescale.so.0"  # the SONAME: the ABI this package was written against


def _locate():
    """Where libbytescale.so.0 is, in the order docs/python.md gives: $BYTESCALE_LIB, the package's
    own copy (pip copies the library in when it installs the package), the system's loader paths."""
    env = os.environ.get("BYTESCALE_LIB")
    if env:
        if not os.path.isfile(env):
            raise ImportError(f"BYTESCALE_LIB={env}: no such file (it names libbytescale.so.0 itself)")
        return env
    own = pathlib.Path(__file__).with_name(LIB_NAME)
    if own.is_file():
        return str(own)
    found = ctypes.util.find_library("bytescale")  # ldconfig's cache: make install into /usr/local + ldconfig
    if found:
        return found
    raise ImportError(
        "bytescale: libbytescale.so.0 not found: install the package with pip after building or installing the "
        "C library (README.md, 'The Python package'), or set BYTESCALE_LIB=/path/to/libbytescale.so.0")


path = _locate()
lib = ctypes.CDLL(path)

i32, i64, u64, f64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_double
c_int, c_str, c_size, handle, buf = ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p


class PlanInfo(ctypes.Structure):
    """BsPlanInfo (api.h), field for field."""
    _fields_ = [(name, i64) for name in ("n_ranks", "pp", "capacity", "n_seqs", "n_tokens", "n_items", "n_segs",
                                         "n_refs", "n_barriers", "n_delayed")] + \
               [(name, f64) for name in ("makespan", "lower_bound", "hdp_bound")] + \
               [("policy", ctypes.c_char * 24)]


class PlanStats(ctypes.Structure):
    """BsPlanStats (api.h), field for field."""
    _fields_ = [(name, i64) for name in ("n_packs", "n_rings", "idle_ranks", "n_long", "n_offload")] + \
               [(name, f64) for name in ("busy_min", "busy_median", "busy_max", "ring_bytes", "offload_min",
                                         "offload_mean", "offload_max")]


class SimInfo(ctypes.Structure):
    """BsSimInfo (api.h), field for field."""
    _fields_ = [(name, i64) for name in ("n_gpus", "n_ranks", "pp", "n_res", "n_rings", "n_ops")] + \
               [(name, f64) for name in ("step_time", "compute_end", "sync_time", "optimizer_time", "tokens",
                                         "tokens_per_s", "model_flops", "mfu", "ring_bytes", "offload_bytes",
                                         "exposed_comm", "exposed_offload")]


# name: (result type, argument types). Handles and arrays are void pointers: an array argument is
# always an array this package made with the dtype the header gives (see _ptr).
_SIGNATURES = {
    "bs_errmsg": (c_str, []),
    "bs_error_clear": (None, []),
    "bs_version": (c_str, []),
    "bs_blas_coretype": (c_str, []),
    "bs_policy_count": (c_int, []),
    "bs_policy_name": (c_str, [c_int, ctypes.POINTER(c_str)]),
    "bs_policy_no_train": (c_str, [c_int]),
    "bs_model_count": (c_int, []),
    "bs_model_name": (c_str, [c_int]),
    "bs_hardware_count": (c_int, []),
    "bs_hardware_name": (c_str, [c_int]),
    "bs_cost_derive": (handle, [c_str, c_str, i64, i64, i64, i64]),
    "bs_cost_load": (handle, [c_str]),
    "bs_cost_free": (None, [handle]),
    "cost_item_time": (f64, [handle, buf, c_int, c_int, f64]),
    "cost_save": (c_int, [handle, c_str]),
    "bs_batch_sample": (i64, [c_str, u64, i64, i64, buf, i64]),
    "bs_plan_lengths": (handle, [buf, i64, c_str, i64, i64, i64, i64, c_int, handle]),
    "bs_plan_read": (handle, [c_str, handle]),
    "bs_plan_write": (c_int, [handle, c_str]),
    "bs_plan_free": (None, [handle]),
    "bs_plan_info": (c_int, [handle, ctypes.POINTER(PlanInfo), c_size]),
    "bs_plan_stats": (c_int, [handle, handle, ctypes.POINTER(PlanStats), c_size]),
    "bs_plan_sequences": (c_int, [handle, buf, buf, buf]),
    "bs_plan_items": (c_int, [handle, buf, buf, buf, buf, buf, buf, buf]),
    "bs_plan_segments": (c_int, [handle, buf, buf, buf]),
    "bs_plan_members": (c_int, [handle, buf]),
    "bs_plan_schedules": (c_int, [handle, buf, buf, buf]),
    "bs_plan_peers": (c_int, [handle, buf, buf, buf]),
    "bs_plan_owners": (c_int, [handle, buf]),
    "bs_plan_ulysses": (c_int, [handle, buf]),
    "bs_plan_chunks": (i64, [handle, i64, buf, buf, buf, buf, buf, i64]),
    "bs_simulate": (handle, [handle, c_str, c_str, i64, i64, handle]),
    "bs_sim_free": (None, [handle]),
    "bs_sim_info": (c_int, [handle, ctypes.POINTER(SimInfo), c_size]),
    "bs_sim_resources": (c_int, [handle, buf, buf, buf, buf]),
    "bs_sim_trace": (c_int, [handle, c_str, i64]),
}

for _name, (_res, _args) in _SIGNATURES.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        raise ImportError(f"bytescale: {path} does not export {_name}: it is not the library this package was "
                          f"written for (bytescale 0.1 or later)") from None
    _fn.restype, _fn.argtypes = _res, _args


def errmsg():
    return lib.bs_errmsg().decode("utf-8", "replace")


def check(rc):
    """A call's status (0, a count, or a handle); raise Error with the library's message on failure."""
    if rc is None or (isinstance(rc, int) and rc < 0):
        raise Error(errmsg())
    return rc


def text(value, name):
    """A str (or path) argument as bytes for C."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if "\0" in value:
        raise Error(f"{name}: the text holds a NUL character")
    return value.encode("utf-8")


def integer(value, name):
    """An integer argument for an int64_t parameter: the library checks the range and names the
    argument; here only what C cannot see (a non-integer, or a value that would not fit 64 bits)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    v = value.__index__()
    if not -2**63 <= v < 2**63:
        raise Error(f"{name}: {v} is out of range")
    return v


def number(value, name, lo, hi):
    """A real-number argument in [lo, hi] as a float: TypeError for what is not a real number (a
    string, None, a bool), Error for NaN or a value out of the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    v = float(value)
    if not lo <= v <= hi:  # NaN too
        raise Error(f"{name}: {v} is out of range [{lo:g}, {hi:g}]")
    return v


def int_array(values, name):
    """A one-dimensional sequence of integers as a C-contiguous int64 array: TypeError for other
    shapes or element types (floats are never truncated), Error for values that do not fit 64 bits."""
    a = np.asarray(values)
    if a.ndim != 1:
        raise TypeError(f"{name} must be a one-dimensional sequence of integers, got {a.ndim} dimensions")
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.dtype.kind == "u" and a.max() > np.iinfo(np.int64).max:
        raise Error(f"{name}: {a.max()} is out of range")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers (that fit 64 bits), got {a.dtype} values")
    return np.ascontiguousarray(a, dtype=np.int64)


def positive_lengths(a, name):
    """Error naming the first length < 1 of the int64 array a, as the library words it."""
    bad = np.flatnonzero(a < 1)
    if bad.size:
        raise Error(f"{name}[{bad[0]}] is {a[bad[0]]}: every length must be >= 1")
    return a


def ptr(a):
    """The address of a C-contiguous NumPy array for a `buf` argument (None stays NULL)."""
    if a is None:
        return None
    assert a.flags["C_CONTIGUOUS"]
    return a.ctypes.data


def new(n, dtype):
    return np.empty(int(n), dtype=dtype)
