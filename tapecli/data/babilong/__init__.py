"""BABILong (Kuratov et al. 2024, booydar/babilong) offline: bAbI's reasoning tasks qa1-qa5 hidden in long distractor
text.

Modules: `world` (bAbI's world simulator and the five tasks' stories, with each rule and where it departs from bAbI),
`prompts` (BABILong's prompts and template, verbatim), `samples` (a story hidden in RULER's noise sentences or an
essay, sized with the model's tokenizer, its facts at a chosen depth), `official` (BABILong's own data files, read from
a local folder), `training` (prompt/answer rows and the `babilong` data kind for training small models) and `example`
(the tokenizer of the CPU-sized example).
"""
