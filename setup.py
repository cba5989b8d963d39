"""Build hook: the shipped recipes live in `recipes/` at the top of the repository (where users browse them); a
built wheel carries a copy as package data `tapecli/recipe/shipped/`, so `--recipe c4` works after any install.
Everything else about the package is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithRecipes(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads recipes/ in the checkout itself (tapecli.recipe.files)
        target = Path(self.build_lib, "tapecli", "recipe", "shipped")
        target.mkdir(parents=True, exist_ok=True)
        for recipe in sorted(Path(__file__).parent.joinpath("recipes").glob("*.yaml")):
            shutil.copyfile(recipe, target / recipe.name)


setup(cmdclass={"build_py": BuildWithRecipes})
