"""Running a recipe: each stage's settings become its trainer's config, and the trainer runs.

The data paths, the output folder, the device and the model name come from the run, not from
the recipe, so that one recipe trains on any machine; ``limit``, ``max_steps`` and ``eval_limit``
shrink every stage (a smoke run: the tests train every recipe on a few sentences this way).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from training.recipes.recipe import Recipe, RecipeError
from training.recipes.trainers import TRAINERS


@dataclass(frozen=True)
class RecipeRun:
    """Where a recipe reads and writes: ``data`` holds the corpora its stages name; the last
    stage writes ``output``, stage i of n < i writes ``output``-stage{i}."""

    data: Path
    output: Path
    device: str | None = None
    limit: int | None = None
    max_steps: int | None = None
    #: Dev texts each stage scores (0: none); None keeps each stage's own ``eval_limit``.
    eval_limit: int | None = None
    resume: bool = False

    def stage_output(self, index: int, stages: int) -> Path:
        return self.output if index == stages else self.output.with_name(f"{self.output.name}-stage{index}")


@dataclass(frozen=True)
class StageResult:
    """A finished stage: where it wrote, and its trainer's summary."""

    output: Path
    summary: dict


def stage_configs(recipe: Recipe, run: RecipeRun) -> list[Any]:
    """Every stage's trainer config for this run (checked before the first stage starts)."""
    configs, previous = [], None
    for index, stage in enumerate(recipe.stages, 1):
        trainer = TRAINERS[stage.trainer]
        names = {f.name for f in fields(trainer.config)}
        values: dict[str, object] = dict(stage.settings)
        values |= {"output": str(run.stage_output(index, len(recipe.stages))), "device": run.device or stage.device or recipe.device}
        if stage.train is not None:
            values["train"] = str(_data_file(run.data, stage.train))
        if stage.dev is not None:
            values["dev"] = str(_data_file(run.data, stage.dev))
        if "name" in names:
            values.setdefault("name", recipe.name)
        if stage.continues:
            values[stage.continued_field] = str(previous)
        if stage.continues == "adapter" and trainer.continues_field not in stage.settings:
            values[trainer.continues_field] = getattr(configs[-1], trainer.continues_field)  # the adapter's own base
        for field_name, value in (("limit", run.limit), ("max_steps", run.max_steps), ("eval_limit", run.eval_limit), ("resume", run.resume or None)):
            if value is not None and field_name in names:
                values[field_name] = value
        configs.append(trainer.make_config(values))
        previous = values["output"]
    return configs


def run_recipe(recipe: Recipe, run: RecipeRun, on_stage: Callable[[int, Any], None] | None = None) -> list[StageResult]:
    """Train every stage in order; the recipe is saved as ``recipe.json`` beside the result."""
    results = []
    for index, (stage, config) in enumerate(zip(recipe.stages, stage_configs(recipe, run)), 1):
        if on_stage is not None:
            on_stage(index, config)
        summary = TRAINERS[stage.trainer].run(config)
        results.append(StageResult(Path(config.output), summary))
    run.output.mkdir(parents=True, exist_ok=True)
    (run.output / "recipe.json").write_text(json.dumps(recipe.model_dump(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return results


def _data_file(data: Path, relative: str) -> Path:
    path = data / relative
    if not path.exists():  # a file, or a folder of corpora (the open trainer's)
        raise RecipeError(f"data file {path} not found (--data names the folder that holds {relative})")
    return path
