"""Training recipes: every setting of a shipped model's training, in one TOML file each.

A recipe is one or more stages; a stage names its trainer, its data (paths relative to a data
folder, the dev file only scored, never trained on) and the trainer's settings, checked against
that trainer's config before anything runs. A stage with ``continues = true`` starts from the
previous stage's result; an ``lm``, ``open`` or ``diffusion`` stage with ``continues = "adapter"`` trains
that result's adapter further (more epochs of one model, one adapter in the end), over that
stage's own base unless it names one. A stage may name the device its run used, when it is not
the recipe's.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from training.recipes.trainers import TRAINERS

RECIPES_DIR = Path(__file__).parent
TrainerName = Literal["lm", "open", "tiny", "diffusion", "lud", "low_rank"]


class RecipeError(ValueError):
    """A recipe that does not exist, does not parse, or names settings its trainer lacks."""


class Stage(BaseModel):
    """One training run of a recipe."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trainer: TrainerName
    train: str | None = Field(default=None, description="training corpus, relative to the data folder (a trainer that trains needs one)")
    dev: str | None = Field(default=None, description="dev corpus scored during training (never trained on)")
    continues: bool | Literal["adapter"] = Field(
        default=False, description="true: start from the previous stage's result; \"adapter\": train its adapter further")
    device: str | None = Field(default=None, description="where this stage of the model card's run trained, when not the recipe's device")
    settings: dict[str, object] = Field(default_factory=dict, description="the trainer's config fields")

    @model_validator(mode="after")
    def _known_settings(self) -> "Stage":
        trainer = TRAINERS[self.trainer]
        allowed = trainer.setting_names()
        unknown = sorted(set(self.settings) - allowed)
        if unknown:
            raise ValueError(f"trainer {self.trainer!r} has no setting {', '.join(unknown)} (it has: {', '.join(sorted(allowed))})")
        trainer.validate(self.settings)
        if self.train is None and trainer.needs_data:
            raise ValueError(f"trainer {self.trainer!r} needs a training corpus: set train")
        if self.continues and self.continued_field is None:
            what = "train a previous stage's adapter further" if self.continues == "adapter" else "continue a previous stage"
            raise ValueError(f"trainer {self.trainer!r} cannot {what}")
        return self

    @property
    def continued_field(self) -> str | None:
        """The trainer's config field that takes the previous stage's result (None: none does)."""
        trainer = TRAINERS[self.trainer]
        return trainer.adapter_field if self.continues == "adapter" else trainer.continues_field


class Recipe(BaseModel):
    """How one model is trained, stage by stage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    device: str = Field(default="cpu", description="where the model card's run trained (--device overrides)")
    stages: list[Stage] = Field(min_length=1)

    @model_validator(mode="after")
    def _first_stage_starts(self) -> "Recipe":
        if self.stages[0].continues:
            raise ValueError("the first stage has no previous stage to continue")
        return self


def recipe_names() -> list[str]:
    """The recipes in the repository, by name."""
    return sorted(path.stem for path in RECIPES_DIR.glob("*.toml"))


def load_recipe(name_or_path: str | Path) -> Recipe:
    """A recipe by name (``training/recipes/NAME.toml``) or from a TOML file, validated."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        if str(name_or_path) not in recipe_names():
            raise RecipeError(f"unknown recipe {str(name_or_path)!r}; recipes: {', '.join(recipe_names())}")
        path = RECIPES_DIR / f"{name_or_path}.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise RecipeError(f"cannot read recipe {path}: {error.strerror}") from error
    except tomllib.TOMLDecodeError as error:
        raise RecipeError(f"recipe {path} is not valid TOML: {error}") from error
    try:
        return Recipe.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'recipe'}: {e['msg']}" for e in error.errors())
        raise RecipeError(f"recipe {path}: {problems}") from error
