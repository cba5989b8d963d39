"""RULER's 13 synthetic long-context tasks, generated offline exactly as the official scripts generate them.

Source: NVIDIA/RULER at main, `scripts/synthetic.yaml` (the 13 task configurations), `scripts/data/synthetic/
{niah,variable_tracking,common_words_extraction,freq_words_extraction,qa}.py` (the generators),
`scripts/data/synthetic/constants.py` (templates, answer prefixes, tokens to generate), `scripts/data/prepare.py`
(the "base" model template: the task template followed by its answer prefix; seed 42) and
`scripts/eval/synthetic/constants.py` (the metric of each family). Each generator here makes the same random draws
in the same order as the official script, so with the same seed and tokenizer the samples are equal character for
character; the haystack is sized to each length with the model's own tokenizer by RULER's binary search.

Modules: `constants` (the official strings and task table), `words` (wonderwords' word lists, as RULER reads them),
`sizing` (the binary search and the per-sample fitting loop the families share), `niah`, `variable_tracking`,
`common_words`, `freq_words`, `qa` (one module per family), `sources` (the essay haystack and the QA files read
from local paths), and `tasks` (`generate(task, length, ...)`, the one entry point).
"""
