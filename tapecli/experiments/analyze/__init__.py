"""`tape analyze`: where and why a PE fails beyond its training length.

- `position_loss.PositionLoss`: mean token loss (and accuracy) per position, log-binned, with a 95% band over
  sequences and each model's training length marked (`tape analyze position-loss`).
- `attention.AttentionAnalysis`: per layer and head, attention distance, entropy and its growth, sink and local
  mass, from the exact weights streamed chunk by chunk (`tapecli.model.attention.probe`); the maps of a short input;
  each contextual PE's picture (`pictures/`) (`tape analyze attention`).

Both are evaluation protocols run by `tapecli.eval.protocol.run` (models opened through the one door, resumable
samples.jsonl, results.json and PNGs written atomically); their data comes from `sequences.py`, their PNGs from
`plots.py`, their tables from `tables.py`.
"""
