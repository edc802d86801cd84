"""mtcommon.allocator: with the setting, a large block comes from the heap and its pages stay for the next one."""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, ctypes.util, sys
from mtcommon.allocator import reuse_freed_memory

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Mallinfo2
taken = reuse_freed_memory() if sys.argv[1] == "on" else False
size = 64 << 20
block = libc.malloc(size)
ctypes.memset(block, 1, size)
mapped = libc.mallinfo2().hblkhd  # bytes in blocks of their own mmap
libc.free(block)
kept = libc.mallinfo2().fordblks  # freed bytes the allocator still holds
print(taken, mapped >= size, kept >= size)
"""


def glibc_with_mallinfo2() -> bool:
    name = ctypes.util.find_library("c")
    return sys.platform == "linux" and bool(name) and hasattr(ctypes.CDLL(name), "mallinfo2")


@pytest.mark.skipif(not glibc_with_mallinfo2(), reason="glibc >= 2.33 (mallinfo2) only")
def test_a_large_block_is_kept_for_reuse_only_with_the_setting():
    def probe(mode: str) -> str:
        return subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    # by default: a 64 MB block is an mmap of its own, handed back when freed
    assert probe("off").split() == ["False", "True", "False"]
    # with the setting: from the heap, and still held once freed
    assert probe("on").split() == ["True", "False", "True"]
