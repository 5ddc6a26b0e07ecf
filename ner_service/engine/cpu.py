"""What the machine offers inference, decided in one place for the command line, the engine pool
(the API, spaCy components) and the Celery workers: the dtype a model runs in and the threads of
its matrix products. Torch-free: the command line and the settings resolve ``auto`` without it.

* ``dtype`` ``auto``: bfloat16 on a CPU with bfloat16 instructions (``avx512_bf16`` or
  ``amx_bf16`` in ``/proc/cpuinfo``: recent Intel Xeon and AMD EPYC), float32 on any other CPU
  (which emulates bfloat16 products, several times slower), bfloat16 on a GPU. ``float32`` and
  ``bfloat16`` stay selectable (``--dtype``, ``NER_DTYPE``).
* threads: the CPUs this process may use, the smaller of its affinity mask and its cgroup quota
  (``/sys/fs/cgroup/cpu.max``; a pod limited to 2 CPUs on a 64-core node gets 2, not 64), shared
  out among the processes that share them: a Celery worker process gets 1 (its siblings use the
  other cores), as does any process told so by ``NER_THREADS``. On a 2-core machine busy with
  other work, a sentence took 7-12 s with torch's default two threads against 1.0 s with one
  (issue 78): threads that wait for a core held by another process stall every product.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path

#: What ``--dtype`` and ``NER_DTYPE`` may name.
DTYPES = ("auto", "float32", "bfloat16")
#: The CPU flags of hardware bfloat16 matrix products.
BFLOAT16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CPUINFO = Path("/proc/cpuinfo")
CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
#: The environment variables of the service's settings read here (``ner_service/settings.py`` lists
#: them): the dtype of every entry point, and the inference threads of a process (0 or unset: automatic).
DTYPE_ENV = "NER_DTYPE"
THREADS_ENV = "NER_THREADS"

_configured: int | None = None


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The flags of the first processor in ``cpuinfo`` (none where the file is missing: not Linux)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@lru_cache(maxsize=1)
def cpu_has_bfloat16() -> bool:
    """Whether this machine's CPU multiplies bfloat16 matrices in hardware (AVX512_BF16 or AMX)."""
    return bool(cpu_flags() & BFLOAT16_FLAGS)


def inference_dtype(dtype: str | None = "auto", device: str = "cpu", bfloat16_cpu: bool | None = None) -> str:
    """The dtype name a model runs in for ``dtype`` (``auto`` or None: the fast one on ``device``;
    ``bfloat16_cpu``: whether the CPU has bfloat16 instructions, by default this machine's)."""
    name = "auto" if dtype is None else str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if name != "auto":
        return name
    if not device.startswith("cpu"):
        return "bfloat16"
    return "bfloat16" if (cpu_has_bfloat16() if bfloat16_cpu is None else bfloat16_cpu) else "float32"


def configured_dtype() -> str:
    """The dtype the entry points load models in unless told otherwise: ``NER_DTYPE``, else ``auto``."""
    return os.environ.get(DTYPE_ENV, "").strip() or "auto"


def torch_dtype(dtype: "str | object | None" = "auto", device: str = "cpu"):
    """:func:`inference_dtype` as a ``torch.dtype`` (a ``torch.dtype`` given is returned as it is)."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    return getattr(torch, inference_dtype(dtype, device))  # type: ignore[arg-type]


def cgroup_cpu_quota(v2: Path = CGROUP_V2_MAX, v1: Path = CGROUP_V1) -> float | None:
    """The CPUs this process's cgroup may use (quota over period; None: no limit or no cgroup)."""
    try:
        fields = v2.read_text().split()  # "max 100000" or "200000 100000"
    except OSError:
        fields = []
    if fields:
        try:
            return None if fields[0] == "max" else int(fields[0]) / int(fields[1] if len(fields) > 1 else 100_000)
        except ValueError:
            return None
    try:
        quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
        period_us = int((v1 / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def available_cpus(quota: float | None = None) -> int:
    """The CPUs this process may run on: its affinity mask, capped by its cgroup quota (rounded
    down, at least 1; ``quota`` None: this process's)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota() if quota is None else quota
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return max(1, cpus)


def inference_threads(processes: int = 1, cpus: int | None = None) -> int:
    """Threads for one of ``processes`` processes that share the CPUs (``cpus`` None: this
    process's, :func:`available_cpus`): an equal share, at least 1; ``NER_THREADS`` when set, else
    ``OMP_NUM_THREADS`` (a process started with it asked for that many)."""
    for variable in (THREADS_ENV, "OMP_NUM_THREADS"):
        try:
            fixed = int(os.environ.get(variable, "0") or 0)
        except ValueError:
            fixed = 0
        if fixed > 0:
            return fixed
    return max(1, (available_cpus() if cpus is None else cpus) // max(1, processes))


def configure_threads(threads: int | None = None, processes: int = 1) -> int:
    """Set torch's intra-op threads: ``threads``, else :func:`inference_threads` of ``processes``
    the first time in a process (a later call without ``threads`` keeps what was set, so that a
    worker's setting holds when its pool is built). Returns the threads in use."""
    global _configured
    import torch

    if threads is None and _configured is not None:
        return _configured
    wanted = threads if threads is not None else inference_threads(processes)
    if wanted < 1:
        raise ValueError(f"threads must be at least 1, not {wanted}")
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
    _configured = wanted
    return wanted
