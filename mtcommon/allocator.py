"""The C library's allocator, set once per process by `moses-rnn`: large freed blocks kept for reuse.

By default glibc serves a block above 32 MB (and, once such blocks were freed, any block above the size
last freed) with a fresh mmap and hands it back to the kernel when it is freed. A tensor of that size
allocated at every step (a beam's gathered attention context, a block of logits) then faults in fresh,
zeroed pages every time: on the 2-core Xeon of docs/benchmarks.md a 49 MB gather took 24 ms this way,
against 2.8 ms from the heap. `reuse_freed_memory` lets the allocator keep such blocks (at most
KEEP_FREED_BYTES of freed memory above what the process uses), and the next step's tensors reuse them.
`cslm` leaves it unset: its server hands a flood's payloads back as they are answered, and its
tensors gained nothing measured from it. No torch here: the command line calls it before it imports
anything heavy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# glibc's M_MMAP_THRESHOLD (blocks up to this size come from the heap) and M_TRIM_THRESHOLD (up to this much
# freed memory at the heap's top stays there), both set to it
KEEP_FREED_BYTES = 256 << 20
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h


def reuse_freed_memory(keep: int = KEEP_FREED_BYTES) -> bool:
    """Let glibc's malloc keep freed blocks of up to `keep` bytes for reuse; True where it took the setting,
    False elsewhere (another C library, another system), where nothing changes."""
    if sys.platform != "linux":
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, ctypes.c_int(keep))) & bool(mallopt(M_TRIM_THRESHOLD, ctypes.c_int(keep)))
