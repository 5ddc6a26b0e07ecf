"""The trainers a recipe stage can name, each with its config dataclass (in :mod:`training.configs`,
which does not import torch: reading a recipe does not load it) and its entry point (imported when it runs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from importlib import import_module
from typing import Any

from pydantic import TypeAdapter, ValidationError


def _imported(target: str) -> Any:
    module, name = target.split(":")
    return getattr(import_module(module), name)


@dataclass(frozen=True)
class StageTrainer:
    """A trainer: its config dataclass and entry point (``module:name``), and the config field
    that takes the previous stage's result (None: it cannot continue one), and the one that takes
    its adapter to train further (None: it cannot)."""

    config_class: str
    entry: str
    continues_field: str | None
    adapter_field: str | None = None
    #: Fields a run fills, never a recipe: where the data is, where to write, on what device.
    set_by_run: frozenset[str] = frozenset({"train", "dev", "output", "device"})

    @property
    def config(self) -> type:
        return _imported(self.config_class)

    @property
    def needs_data(self) -> bool:
        """Whether the trainer reads a training corpus (its config requires ``train``)."""
        return any(f.name == "train" and f.default is MISSING for f in fields(self.config))

    def setting_names(self) -> set[str]:
        """The config fields a recipe may set."""
        return {f.name for f in fields(self.config)} - self.set_by_run

    def make_config(self, values: Mapping[str, object]) -> Any:
        """The config of ``values``; ValueError with every problem when they do not fit."""
        try:
            return TypeAdapter(self.config).validate_python(dict(values))
        except ValidationError as error:
            raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())) from None

    def validate(self, settings: Mapping[str, object]) -> None:
        """Raise ValueError unless ``settings`` fit the config (the run's fields left out)."""
        required = {f.name: "-" for f in fields(self.config)
                    if f.default is MISSING and f.default_factory is MISSING and f.name not in settings}
        self.make_config({**required, **settings})

    def run(self, config: Any) -> dict:
        return _imported(self.entry)(config)


TRAINERS: dict[str, StageTrainer] = {
    "lm": StageTrainer("training.configs:TrainConfig", "training.trainer:train", "base", "init_adapter"),
    "open": StageTrainer("training.configs:OpenTrainConfig", "training.open_trainer:train_open", "base", "init_adapter"),
    "tiny": StageTrainer("training.configs:TinyConfig", "training.tiny_model:train_tiny_model", None),
    "diffusion": StageTrainer("training.configs:DiffusionConfig", "training.diffusion:train_diffusion", "init", "init_adapter"),
    "lud": StageTrainer("training.configs:LUDConfig", "training.lexical_units:train_lud", "model"),
    "low_rank": StageTrainer("training.configs:LowRankConfig", "training.low_rank:store_low_rank", "model"),
}
