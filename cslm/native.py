"""The C++ evaluator of Moses's in-process mode, from Python: `NativeModel` scores padded n-gram rows as
cslm/cpp/cslm_local.cc's LocalModel does, through the library cslm/_native (cslm/cpp/cslm_native.cc, built
by `pip install`; ctypes, no Python headers).

`cslm serve --self-normalized` on a CPU scores with it (`Engine.use_evaluator`): per n-gram one output row
over a cached last hidden layer, the histories one at a time (with int8 layers, up to sixteen together; a
call's rows split over threads), where torch batches them into matrix products; on a decoder's requests it is
the faster of the two (docs/moses-feature.md, "The server beside the decoder on CPU cores").
"""

from __future__ import annotations

import ctypes
import importlib.util

import numpy as np

from mtcommon.errors import UserError

_ERR = 1024  # bytes of an error message from the library


def library_path() -> str | None:
    """Where the built library is, or None where the install built none (no C++ compiler)."""
    spec = importlib.util.find_spec("cslm._native")
    return spec.origin if spec is not None and spec.origin else None


_lib = None


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        path = library_path()
        if path is None:
            raise UserError("the C++ evaluator (cslm/_native) is not built: reinstall with a C++ compiler "
                            "(pip install -e .), or score with torch (cslm serve --evaluator torch)")
        lib = ctypes.CDLL(path)
        size_t, p = ctypes.c_size_t, ctypes.c_void_p
        lib.cslm_native_open.restype = p
        lib.cslm_native_open.argtypes = [ctypes.c_char_p, size_t, ctypes.c_char_p, ctypes.c_char_p, size_t]
        lib.cslm_native_facts.argtypes = [p, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(size_t),
                                          ctypes.POINTER(size_t)]
        lib.cslm_native_score.restype = ctypes.c_int
        lib.cslm_native_score.argtypes = [p, p, size_t, ctypes.c_int, p, ctypes.c_uint, ctypes.c_char_p, size_t]
        lib.cslm_native_cache_counts.argtypes = [p, ctypes.POINTER(size_t), ctypes.POINTER(size_t)]
        lib.cslm_native_close.argtypes = [p]
        lib.cslm_native_kernels.restype = ctypes.c_char_p
        lib.cslm_native_kernels.argtypes = [ctypes.c_char_p, size_t]
        lib.cslm_native_plan.argtypes = [size_t, ctypes.c_uint64, ctypes.c_uint, ctypes.POINTER(size_t),
                                         ctypes.POINTER(size_t)]
        _lib = lib
    return _lib


def kernels() -> str:
    """The vector instructions the evaluator's kernels use here: "amx" (AVX-512, with int8's products in AMX
    tiles), "avx512", "avx2" or "baseline": the CPU's widest, at most what the environment's CSLM_KERNELS names
    (cslm_local.h, LocalModel::Kernels)."""
    err = ctypes.create_string_buffer(_ERR)
    name = _library().cslm_native_kernels(err, _ERR)
    if name is None:
        raise UserError(err.value.decode(errors="replace"))
    return name.decode()


def plan(count: int, row_ns: int, threads: int) -> tuple[int, int]:
    """How the evaluator shares out a call of `count` rows where a row has taken `row_ns` nanoseconds (0: not
    timed yet) and `threads` may score: (threads in all, rows a thread takes at a time); cslm_native_plan."""
    wanted, chunk = ctypes.c_size_t(), ctypes.c_size_t()
    _library().cslm_native_plan(count, row_ns, threads, ctypes.byref(wanted), ctypes.byref(chunk))
    return wanted.value, chunk.value


class NativeModel:
    """A model directory loaded by the C++ evaluator. A call of many rows is scored by the calling thread and
    up to `threads` - 1 helper threads (one per 0.1 ms of the rows' work, as the last calls' rows took), each
    taking a few rows at a time as it is free. Calls may come from several threads at once. Every thread has
    its own working memory; all share one cache of `history_slots` last hidden layers (0: none). `precision`:
    the layers after the first in "fp32" or "int8" (cslm_local.h, "Precision")."""

    def __init__(self, model_dir: str, history_slots: int, threads: int = 1, precision: str = "fp32"):
        self._handle = None
        lib = _library()
        err = ctypes.create_string_buffer(_ERR)
        handle = lib.cslm_native_open(model_dir.encode(), history_slots, precision.encode(), err, _ERR)
        if not handle:
            raise UserError(err.value.decode(errors="replace") or f"{model_dir}: cannot load")
        self._lib, self._handle, self.model_dir, self.history_slots = lib, handle, model_dir, history_slots
        self.precision = precision
        self.kernels = kernels()  # the vector instructions it computes with
        self.threads = max(1, threads)
        row, vocab, per_thread = ctypes.c_uint(), ctypes.c_size_t(), ctypes.c_size_t()
        lib.cslm_native_facts(handle, ctypes.byref(row), ctypes.byref(vocab), ctypes.byref(per_thread))
        # ids per row, words, and the rows per thread past which a call is no cheaper per row
        self.row_size, self.vocab_size, self.rows_per_thread = row.value, vocab.value, per_thread.value

    def score(self, rows: np.ndarray, normalized: bool) -> np.ndarray:
        """(N, row_size) ids (history oldest first, the predicted word last) -> (N,) float32: o_w - ln Z if
        `normalized`, else o_w (cslm_local.h, LocalModel::Score)."""
        if rows.dtype == np.int32:  # the engine's padded rows, not copied (a negative id reads as one too large)
            rows = rows.view(np.uint32)
        rows = np.ascontiguousarray(rows, dtype=np.uint32)
        if rows.ndim != 2 or rows.shape[1] != self.row_size:
            raise ValueError(f"rows must be (N, {self.row_size}) ids, got shape {rows.shape}")
        out = np.empty(len(rows), np.float32)
        err = ctypes.create_string_buffer(_ERR)
        if self._lib.cslm_native_score(self._handle, rows.ctypes.data, len(rows), int(normalized),
                                       out.ctypes.data, self.threads, err, _ERR):
            raise ValueError(err.value.decode(errors="replace"))
        return out

    @property
    def full_rows(self) -> int:
        """Rows of a call that keep every thread busy: a larger call is no cheaper per row."""
        return self.rows_per_thread * self.threads

    def cache_counts(self) -> tuple[int, int]:
        """(hits, misses) of the hidden-layer caches over the calls returned so far."""
        hits, misses = ctypes.c_size_t(), ctypes.c_size_t()
        self._lib.cslm_native_cache_counts(self._handle, ctypes.byref(hits), ctypes.byref(misses))
        return hits.value, misses.value

    def close(self) -> None:
        if self._handle:
            self._lib.cslm_native_close(self._handle)
            self._handle = None

    def __del__(self):
        self.close()
