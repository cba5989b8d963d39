"""The `tape` command line: the root group (`app`, tapecli/cli/app.py) and the table of its commands below.

The commands are plain functions with typed Typer signatures, one module per group: train.py (pretrain, finetune,
extend-context), eval.py (the `tape eval` group; its long-context evaluations in eval_long.py and
eval_benchmarks.py), analyze.py (the `tape analyze` group), models.py (export, tokenizer), recipes.py,
experiments.py (sweep, demo, bench, doctor), pe.py (the `tape pe` group: check, new, list). This table is the one
place that names them, orders them and groups them in `tape --help`.

Aliases: the design card's names `tape eval-addition`, `tape eval-scrolls`, `tape passkey` and `tape perplexity` are
the `tape eval` commands themselves (the same function registered again, hidden from the command list; the `eval`
group's help names them), so their options, defaults and outputs cannot drift apart.

Entry points: the `tape` script (`main`), `python -m tapecli ...`, `python -m tapecli.cli ...` and
`torchrun --nproc_per_node N -m tapecli.cli pretrain ...`.
"""

from __future__ import annotations

from tapecli.cli import eval as evaluate
from tapecli.cli import (
    eval_benchmarks,  # noqa: F401  (registers the long-context evaluations on eval_app: eval_long's, then its own)
    experiments,
    models,
    pe,
    recipes,
    train,
)
from tapecli.cli.analyze import analyze_app
from tapecli.cli.app import app
from tapecli.cli.eval import eval_app

_TRAIN, _EVAL, _FILES, _EXPERIMENTS = "Train", "Evaluate", "Models, tokenizers and recipes", "Experiments"

for name, command, panel in [
    ("pretrain", train.pretrain, _TRAIN),
    ("finetune", train.finetune, _TRAIN),
    ("extend-context", train.extend_context, _TRAIN),
    ("export", models.export, _FILES),
    ("recipes", recipes.recipes, _FILES),
    ("sweep", experiments.sweep, _EXPERIMENTS),
    ("demo", experiments.demo, _EXPERIMENTS),
    ("bench", experiments.bench, _EXPERIMENTS),
    ("doctor", experiments.doctor, _EXPERIMENTS),
]:
    app.command(name, rich_help_panel=panel)(command)
app.add_typer(eval_app, name="eval", rich_help_panel=_EVAL)
app.add_typer(analyze_app, name="analyze", rich_help_panel=_EVAL)
app.add_typer(models.tokenizer_app, name="tokenizer", rich_help_panel=_FILES)
app.add_typer(pe.pe_app, name="pe", rich_help_panel=_EXPERIMENTS)

# alias -> the `tape eval` command it runs
ALIASES = {"eval-addition": "addition", "eval-scrolls": "scrolls", "passkey": "passkey", "perplexity": "perplexity"}
for alias, command in [("eval-addition", evaluate.eval_addition), ("eval-scrolls", evaluate.eval_scrolls),
                       ("passkey", evaluate.eval_passkey), ("perplexity", evaluate.eval_perplexity)]:
    app.command(alias, hidden=True, help=f"The same as `tape eval {ALIASES[alias]}`.\n\n{command.__doc__}")(command)

__all__ = ["ALIASES", "app", "main"]


def main() -> None:
    from tapecli import stops

    stops.keep_ignoring_stops()  # this process is the command: once its work is done, a stop has nothing to stop
    app()
