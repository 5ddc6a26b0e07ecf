"""The memory allocator a training process runs under.

A training step allocates and frees tensors whose sizes change with every batch. glibc's malloc
keeps much of that freed memory instead of reusing it: a mixed-precision Gemma run grew by about
a gigabyte a step until the kernel killed it at 24 GB. jemalloc with its decay turned off
(``MALLOC_CONF`` below) reuses it: the same run stayed near 11 GB and its steps were faster
(docs/training.md, "Memory"). The allocator is chosen when a process starts (``LD_PRELOAD``), so
:func:`run_under_jemalloc` starts the command again under jemalloc when the library is installed
(Debian: ``libjemalloc2``) and the process is not under it yet; ``PADELLM_ALLOCATOR=system``
keeps the system allocator.

Kept pages still pile up: batches of ever new shapes (document windows' long rows) leave freed
runs of pages that no later tensor fits, about 20-45 MB a step, until a 24 GB machine thrashed
(docs/training.md). :class:`MemoryCeiling` hands them back to the kernel when the process's
anonymous memory passes half the machine's: a purge every 80-160 steps on 24 GB, whose price is
faulting one step's pages in again.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from dataclasses import dataclass
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
#: jemalloc's control that purges the unused pages of every arena (``MALLCTL_ARENAS_ALL`` is 4096).
PURGE_ALL_ARENAS = b"arena.4096.purge"
#: The share of the machine's memory above which a training process hands its freed pages back.
CEILING_SHARE = 0.5


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


def anonymous_memory() -> int | None:
    """This process's resident anonymous memory in bytes (``None`` where ``/proc`` has no answer)."""
    return _proc_field(Path("/proc/self/status"), "RssAnon:")


def machine_memory() -> int | None:
    """The machine's memory in bytes (``None`` where ``/proc`` has no answer)."""
    return _proc_field(Path("/proc/meminfo"), "MemTotal:")


def _proc_field(path: Path, field: str) -> int | None:
    """A ``kB`` field of a ``/proc`` file, in bytes."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith(field)), None)


def release_freed_memory() -> bool:
    """Hand the freed pages the allocator keeps back to the kernel (jemalloc: purge every arena;
    glibc: trim its heaps); whether the allocator did."""
    libc = ctypes.CDLL(None)
    if current_allocator() == "jemalloc":
        return libc.mallctl(PURGE_ALL_ARENAS, None, None, None, ctypes.c_size_t(0)) == 0
    trim = getattr(libc, "malloc_trim", None)
    return trim is not None and trim(ctypes.c_size_t(0)) == 1


@dataclass
class MemoryCeiling:
    """Keeps a process's anonymous memory under ``limit`` bytes by handing the allocator's freed
    pages back whenever :meth:`check` finds it above; ``None``: no limit."""

    limit: int | None
    releases: int = 0

    @classmethod
    def of_machine(cls, share: float = CEILING_SHARE) -> "MemoryCeiling":
        """A ceiling at ``share`` of this machine's memory."""
        total = machine_memory()
        return cls(int(total * share) if total else None)

    def check(self) -> bool:
        """Release the freed pages if the process is above the limit; whether it was."""
        used = anonymous_memory()
        if self.limit is None or used is None or used <= self.limit:
            return False
        release_freed_memory()
        self.releases += 1
        log.info("anonymous memory %.1f GB above the ceiling of %.1f GB: freed pages handed back, %.1f GB now",
                 used / 2**30, self.limit / 2**30, (anonymous_memory() or 0) / 2**30)
        return True
