"""One place that turns a recipe's `data` section into datasets: `build_datasets(recipe, tokenizer, cache_dir)`.

Every dataset yields `(input_ids, labels)` LongTensors of `data.seq_len`, labels already shifted for next-token
prediction and -100 where no loss is taken. The kinds: `text` (tapecli.data.text), `pairs` (tapecli.data.pairs),
`addition` (tapecli.data.arithmetic), `scrolls` (tapecli.data.scrolls) and the synthetic tasks `selective-copy`,
`grid-1d`, `grid-2d` (tapecli.data.synthetic).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tapecli.recipe import Recipe


def build_datasets(recipe: Recipe, tokenizer: Any, cache_dir: Path) -> tuple[Any, Any | None]:
    """(train, validation or None) for `data.kind`."""
    d, seed = recipe.data, recipe.train.seed
    if d.kind == "addition":
        from tapecli.data.arithmetic import build_addition_datasets

        train, val, _ = build_addition_datasets(d, seed)
        return train, val
    if d.kind in ("selective-copy", "grid-1d", "grid-2d"):
        from tapecli.data.synthetic import build_synthetic_datasets

        return build_synthetic_datasets(recipe)
    if d.kind == "pairs":
        from tapecli.data.pairs import build_pair_datasets

        return build_pair_datasets(d.source, tokenizer, d.seq_len, d.val_fraction, seed,
                                   prompt_field=d.prompt_field, target_field=d.target_field)
    if d.kind == "scrolls":
        from tapecli.data.scrolls import build_scrolls_datasets

        return build_scrolls_datasets(d.task, d.source, tokenizer, d.seq_len, d.val_fraction, d.compat)
    from tapecli.data.text import build_text_datasets

    return build_text_datasets(d.source, tokenizer, d.seq_len, d.val_fraction, seed, text_field=d.text_field,
                               cache_dir=cache_dir)
