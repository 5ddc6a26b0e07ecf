"""Model versions: the engine's name and a short hash of its model folder, so results of a
retrained model are told apart from the old ones."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from ner_service.engine.defaults import DEFAULT_DECODER, DEFAULT_STRATEGY
from ner_service.engine.ner_model import CONFIG_FILE, resolve_ner_model


def _hashed_files(folder: Path) -> list[Path]:
    """The adapter files; a self-contained model (no adapter) is hashed by its weights."""
    adapter = sorted(folder.glob("adapter_*"))
    return adapter or sorted(folder.glob("*.safetensors"))


@lru_cache(maxsize=16)
def _folder_version(folder: Path) -> str:
    config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    config.pop("metrics", None)  # re-evaluating a model does not change its outputs
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for path in _hashed_files(folder):
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return f"{config['name']}-{digest.hexdigest()[:10]}"


def model_version_of_path(folder: str | Path) -> str:
    """``<name>-<hash>`` of a model folder (or shipped model name), without loading the model."""
    return _folder_version(resolve_ner_model(folder).resolve())


def model_version(engine) -> str:
    """``<name>-<hash>`` of a loaded :class:`~ner_service.engine.NEREngine` (from ``engine.ner_model.path``)."""
    return model_version_of_path(engine.ner_model.path)


def results_version(version: str, strategy: str = DEFAULT_STRATEGY, labels: list | None = None, decoder: str | None = None,
                    flat_ner: bool = True) -> str:
    """The key results are stored under: the model version, plus the strategy when it is not the
    default, plus the decoder when a job named another than the default, plus ``+overlapping``
    when its entities may overlap, plus a digest of the labels asked when a job named them
    (results for other labels are other results)."""
    key = version if strategy == DEFAULT_STRATEGY else f"{version}+{strategy}"
    if decoder not in (None, DEFAULT_DECODER):
        key = f"{key}+{decoder}"
    if not flat_ner:
        key = f"{key}+overlapping"
    if labels is None:
        return key
    digest = hashlib.sha256(json.dumps(labels, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:12]
    return f"{key}+labels-{digest}"

