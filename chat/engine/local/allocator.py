"""glibc's malloc told to give a big buffer back to the system when it is freed.

torch takes a tensor's memory from malloc. glibc serves a request over its mmap threshold with
a mapping of its own, unmapped at free; but each such free raises the threshold to that size
(up to 32 MB), so after the first long prompt every later KV buffer, prefill activation and
prefix-store copy of up to 32 MB comes from the heap arenas instead. Freed there, it stays in
the process (an arena gives back only its top, and the generation worker's arena is not the main
one), and RSS keeps the high-water of the worst moment: measured in docs/operations.md's memory
table, with the other candidates (MALLOC_ARENA_MAX, jemalloc) on the same load.

Setting the threshold once fixes it (glibc stops moving it), which is what MALLOC_MMAP_THRESHOLD_
in the environment does too: an operator's own value there is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # malloc.h
# Buffers from this size get a mapping of their own: a row's KV layer, a prefill's activations.
# Below it, the decode step's small tensors stay on the heap, where reuse is cheap.
MMAP_THRESHOLD_BYTES = 1024 * 1024
ENVIRONMENT = "MALLOC_MMAP_THRESHOLD_"


def return_big_buffers() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD_BYTES, unless the environment already set
    one or the C library is not glibc; whether it was set here."""
    if ENVIRONMENT in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): nothing to tell it
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        log.warning("malloc's mmap threshold could not be set; memory may stay at its peak")
        return False
    return True
