"""Evaluate trained runs of a generated task on splits changed by recipe overrides, e.g. grid navigation's
OOD-sparse split at 512 tokens instead of the recipe's 256:

    python scripts/eval_split.py RUN --set eval.sparse_grid=[512,128,0.8] --splits ood-sparse --out eval-sparse512

Each RUN's own recipe.yaml, with the overrides, says what the splits are; the results go to RUN/<out>/ (resumable,
as `tape eval synthetic`'s) and one line per run is printed. `tape eval synthetic` evaluates the recipe's splits as
they are; this is the same evaluation (tapecli.eval.synthetic.evaluate_synthetic) on other ones.
"""

from __future__ import annotations

import argparse

from tapecli.eval.synthetic import evaluate_synthetic
from tapecli.recipe import load_recipe
from tapecli.store.door import open_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run directories of a generated task")
    parser.add_argument("--set", action="append", default=[], help="a recipe override, e.g. eval.sparse_grid=[...]")
    parser.add_argument("--splits", default="iid,ood-dense,ood-sparse", help="splits to evaluate, comma-separated")
    parser.add_argument("--samples", type=int, default=100, help="sequences per split")
    parser.add_argument("--out", default="eval-split", help="folder under each run for the results")
    args = parser.parse_args()
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    for run in args.runs:
        recipe = load_recipe(f"{run}/recipe.yaml", args.set)
        model = open_model(run, device="cpu", dtype="fp32").model
        results = evaluate_synthetic(model, recipe, f"{run}/{args.out}", splits=splits, samples=args.samples,
                                     show_progress=False)
        for split, s in results["splits"].items():
            extra = f", per object token {s['object_accuracy']:.3f}" if "object_accuracy" in s else ""
            print(f"{run}: {split}: whole sequence {s['accuracy']:.3f}, per token {s['token_accuracy']:.3f}{extra}",
                  flush=True)


if __name__ == "__main__":
    main()
