"""The memory allocator a training process runs under.

A training step allocates and frees tensors whose sizes change with every batch. glibc's malloc
keeps much of that freed memory instead of reusing it: a mixed-precision Gemma run grew by about
a gigabyte a step until the kernel killed it at 24 GB. jemalloc with its decay turned off
(``MALLOC_CONF`` below) reuses it: the same run stayed near 11 GB and its steps were faster
(docs/training.md, "Memory"). The allocator is chosen when a process starts (``LD_PRELOAD``), so
:func:`run_under_jemalloc` starts the command again under jemalloc when the library is installed
(Debian: ``libjemalloc2``) and the process is not under it yet; ``PADELLM_ALLOCATOR=system``
keeps the system allocator.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

#: Where Linux distributions install jemalloc's shared library.
JEMALLOC_LIBRARIES = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
                      "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2", "/usr/local/lib/libjemalloc.so.2")
#: Freed pages are kept for reuse, never handed back: no page faults to refill them each step.
JEMALLOC_SETTINGS = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
#: ``system`` keeps the allocator the process started with.
CHOICE_VARIABLE = "PADELLM_ALLOCATOR"
#: Set in the restarted process, so that a library that fails to load cannot restart it again.
STARTED_VARIABLE = "PADELLM_ALLOCATOR_RESTARTED"


def jemalloc_library() -> Path | None:
    """The installed jemalloc shared library, if any."""
    return next((Path(p) for p in JEMALLOC_LIBRARIES if Path(p).is_file()), None)


def current_allocator() -> str:
    """``jemalloc`` when this process runs under it (its library is mapped), else ``system``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:  # not Linux
        return "system"
    return "jemalloc" if "libjemalloc" in maps else "system"


def run_under_jemalloc() -> None:
    """Replace this process with the same command under jemalloc, when that is installed, wanted
    and not already the case; otherwise return and let the command run as it is."""
    if os.environ.get(CHOICE_VARIABLE) == "system" or os.environ.get(STARTED_VARIABLE) or current_allocator() == "jemalloc":
        return
    library = jemalloc_library()
    if library is None:
        log.info("jemalloc is not installed (Debian: libjemalloc2): training runs under the system allocator, "
                 "whose memory can grow with every step")
        return
    preload = " ".join(filter(None, [str(library), os.environ.get("LD_PRELOAD", "")]))
    environment = dict(os.environ, LD_PRELOAD=preload, MALLOC_CONF=JEMALLOC_SETTINGS, **{STARTED_VARIABLE: "1"})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment)
