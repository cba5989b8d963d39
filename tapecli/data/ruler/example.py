"""The data of the CPU-sized RULER example (scripts/ruler_example.sh, recipes/ruler-example.yaml,
docs/results/ruler-cpu.md).

    python -m tapecli.data.ruler.example OUT [--rows-per-length 9000] [--lengths 224,240,256] [--seed 1000]

(`python scripts/ruler_example.py ...` runs the same) writes OUT/tokenizer.model and OUT/train.jsonl:

- tokenizer.model: a small SentencePiece BPE model (tape's lossless options, no dummy prefix) whose user-defined
  symbols are RULER's fixed phrases for niah_single_1 (`SYMBOLS`: the template, the noise sentences, the needle's and
  the answer prefix's words), so a noise line is 6 tokens and a prompt fits a short training length. Trained on
  niah_single_1 prompts drawn with seed SEED - 1 (neither the training seeds nor the evaluation's 42).
- train.jsonl: prompt/target rows for the `pairs` data kind, made by the official generator with this tokenizer
  (`tapecli.data.ruler.training.training_pairs`): ROWS rows at each RULER length (prompt + 128 generated tokens, as
  RULER counts them), with seeds SEED, SEED + 1, ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

TASK = "niah_single_1"
# RULER's fixed text for niah_single_1 (tapecli.data.ruler.constants / niah.py), cut into pieces at the places the
# variable parts (key, value, haystack) go; spaces belong to the piece after them.
SYMBOLS = [
    "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you about "
    "the number afterwards.",
    "The grass is green.", " The sky is blue.", " The sun is yellow.", " Here we go.", " There and back again.",
    "One of the special magic numbers for", " is:",
    "What is the special magic number for", " mentioned in the provided text?",
    " The special magic number for", " mentioned in the provided text is",
]


def train_tokenizer(out: Path, vocab_size: int = 600, seed: int = 999) -> Path:
    """OUT (a .model file): see the module docstring. (Not `tape tokenizer train`: that one takes no user-defined
    symbols and keeps SentencePiece's dummy prefix, which would glue the target's leading space to the prompt.)"""
    from tapecli.data.ruler.tasks import generate
    from tapecli.data.tokenizer import train_symbol_tokenizer

    samples = generate(TASK, 512, lambda text: len(text) // 4, 300, seed=seed)
    lines = [line for s in samples for line in (s.prompt + " " + s.outputs[0]).splitlines()]
    return train_symbol_tokenizer(out, lines, SYMBOLS, vocab_size)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rows-per-length", type=int, default=9000)
    parser.add_argument("--lengths", default="224,240,256")
    parser.add_argument("--seed", type=int, default=1000)
    args = parser.parse_args(argv)

    from tapecli.data.ruler.training import training_pairs, write_jsonl
    from tapecli.data.tokenizer import load_tokenizer

    model = train_tokenizer(args.out / "tokenizer.model", seed=args.seed - 1)
    tokenizer = load_tokenizer(str(model))
    lengths = [int(n) for n in args.lengths.split(",")]
    rows = training_pairs(TASK, lengths, lambda text: len(tokenizer.encode(text)), args.rows_per_length, args.seed)
    write_jsonl(rows, args.out / "train.jsonl")
    longest = max(len(tokenizer.encode(r["prompt"])) + len(tokenizer.encode(r["target"])) for r in rows)
    print(f"wrote {model} ({tokenizer.vocab_size} pieces) and {len(rows)} rows to {args.out / 'train.jsonl'}; "
          f"the longest prompt + target is {longest} tokens")


if __name__ == "__main__":
    main()
