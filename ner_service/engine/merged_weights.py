"""A model merged from its LoRA adapter, kept in the cache in the dtype it runs in.

Loading a shipped model reads its public base (stored in float32), converts it to the dtype it
runs in and merges the adapter: about 0.4 s of a cold start on the 2-core machines, the same
work every time. The first load of a model in a dtype writes the merged weights once, as a
safetensors file under the cache (``merged/``); later loads read that file instead. The key holds
the adapter's files, the base's weights and config (sizes and times), the dtype and the library
versions, so any change is a new file and an older one is never read; the adapter is named by
its files' real paths, so a folder of links to a model's files shares its merge. Only a model
that loads as this package's own Gemma 3 class (:mod:`.gemma3_model`) is kept (a bfloat16 copy of
Gemma 3 270M is 536 MB, a float32 one 1.07 GB), and only the :data:`MAX_KEPT` used last.
``PADELLM_MERGED_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ner_service.engine.model_loading import cache_key, cache_root

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)

#: The environment variable that turns the cache off (``0``).
SWITCH = "PADELLM_MERGED_CACHE"
#: What a kept file holds; a new layout is a new key.
LAYOUT = "merged-state-dict-1"
#: The files of an adapter and of a base whose change changes the merged weights.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
BASE_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")
#: Merged models kept at most (the shipped Gemma 3 models are four); the least recently used go first.
MAX_KEPT = 4


def enabled() -> bool:
    return os.environ.get(SWITCH, "1") != "0"


def _stats(folder: Path, names: tuple[str, ...]) -> list[str]:
    """Each file's real path, size and time."""
    files = [(folder / name).resolve() for name in names if (folder / name).is_file()]
    return [f"{path}:{path.stat().st_size}:{path.stat().st_mtime_ns}" for path in files]


def kept_path(adapter: Path, base: Path, dtype: "torch.dtype") -> Path:
    """Where the merge of ``adapter`` into the base folder ``base`` in ``dtype`` is kept."""
    import safetensors
    import torch

    parts = [LAYOUT, *_stats(adapter, ADAPTER_FILES), *_stats(base, BASE_FILES), str(dtype), torch.__version__, safetensors.__version__]
    return cache_root() / "merged" / f"{adapter.name}-{cache_key(parts)}.safetensors"


def mark_used(path: Path) -> None:
    """Note that ``path`` was read (its time orders what :func:`keep` removes first)."""
    try:
        os.utime(path)
    except OSError:
        pass


def keep(model: "nn.Module", path: Path) -> None:
    """Write ``model``'s weights to ``path`` (a tied output layer once); a failure to write (a
    read-only or full disk) only costs the next start the merge."""
    from safetensors.torch import save_file

    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items() if not (tied and name == "lm_head.weight")}
    staging = path.with_name(f".partial-{os.getpid()}-{path.name}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(state, str(staging))
        staging.rename(path)
    except OSError as error:  # a read-only cache (an image's): every start merges
        log.info("merged weights not kept in %s: %s", path, error)
        try:
            staging.unlink(missing_ok=True)
        except OSError:
            pass
        return
    kept = sorted(path.parent.glob("*.safetensors"), key=lambda file: file.stat().st_mtime, reverse=True)
    for stale in kept[MAX_KEPT:]:
        stale.unlink(missing_ok=True)
