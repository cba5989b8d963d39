"""`tape recipes`: list the shipped recipes or print one."""

from __future__ import annotations

import typer


def recipes(name: str = typer.Argument(None, help="Show this recipe's YAML (with its comments) instead of the list.")
            ) -> None:
    """List the shipped recipes, or print one.

    The shipped recipes are the YAML files in `recipes/` at the top of tape's repository (an installed tape carries a
    copy). Use a name with `--recipe` from any directory, e.g. `tape pretrain --recipe arithmetic-smoke --out runs/x`.

    Copy one to edit it: `tape recipes c4 > my.yaml`.
    """
    from rich.console import Console
    from rich.table import Table

    from tapecli.recipe import list_recipes, recipe_text

    if name:
        typer.echo(recipe_text(name), nl=False)
        return
    table = Table(show_header=True, header_style="bold")
    table.add_column("recipe")
    table.add_column("what it is")
    for recipe_name, description in list_recipes():
        table.add_row(recipe_name, description)
    Console().print(table)

