"""Training recipes (``padellm-ner train --recipe NAME``): one TOML file per shipped model."""

from training.recipes.recipe import Recipe, RecipeError, Stage, load_recipe, recipe_names
from training.recipes.run import RecipeRun, StageResult, run_recipe, stage_configs
from training.recipes.trainers import TRAINERS, StageTrainer

__all__ = ["TRAINERS", "Recipe", "RecipeError", "RecipeRun", "Stage", "StageResult", "StageTrainer", "load_recipe", "recipe_names", "run_recipe",
           "stage_configs"]
