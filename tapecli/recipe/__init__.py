"""Recipes: the typed configuration of a `tape` run, loaded from YAML and `key=value` overrides.

    tapecli/recipe/schema.py   the sections and their checks (`Recipe`, `load_recipe`)
    tapecli/recipe/values.py   type-checking values and applying `key=value` overrides
    tapecli/recipe/files.py    where recipe YAML comes from (a path, or a shipped name)
    recipes/ (repository top)  the shipped recipes (a wheel carries them as tapecli/recipe/shipped/); `tape recipes`
                               lists them
"""

from tapecli.recipe.files import list_recipes, recipe_text
from tapecli.recipe.schema import Recipe, load_recipe

__all__ = ["Recipe", "list_recipes", "load_recipe", "recipe_text"]
