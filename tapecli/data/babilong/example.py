"""The tokenizer of the CPU-sized BABILong example (recipes/babilong-example.yaml, docs/results/babilong-cpu.md).

    python -m tapecli.data.babilong.example OUT [--vocab-size 500] [--seed 999]

writes OUT/tokenizer.model: a small SentencePiece BPE model (tape's lossless options, no dummy prefix) trained on
BABILong prompts of all five tasks (`samples.Generator` with a byte-level stand-in for the lengths, stories seeded
"tokenizer-SEED", never an evaluation's or a training run's), whose user-defined symbols are RULER's five noise
sentences, with and without the space that joins them: a distractor sentence is one token, so a 2,048-token prompt
holds about 2,000 sentences while the bAbI words, names and places are learned pieces. The training data itself is
generated on the fly by the `babilong` data kind (`tapecli.data.babilong.training`); pass this file as
`data.tokenizer`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tapecli.data.ruler.constants import NOISE

NOISE_SENTENCES = [s if s.endswith(".") else s + "." for s in NOISE.split(". ")]
SYMBOLS = [*NOISE_SENTENCES, *(" " + s for s in NOISE_SENTENCES)]


def train_tokenizer(out: Path, vocab_size: int = 500, seed: int = 999, stories: int = 400) -> Path:
    """OUT (a .model file): see the module docstring."""
    from tapecli.data.babilong.samples import Generator
    from tapecli.data.babilong.world import TASKS
    from tapecli.data.tokenizer import load_tokenizer, train_symbol_tokenizer

    generator = Generator(load_tokenizer("byte"), seed=f"tokenizer-{seed}")
    lines = []
    for index in range(stories):
        for task in TASKS:
            sample = generator.sample(task, 0 if index % 2 else 1024, None, index)
            lines += [*sample.prompt.splitlines(), " " + sample.target]
    return train_symbol_tokenizer(out, lines, SYMBOLS, vocab_size)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--vocab-size", type=int, default=500)
    parser.add_argument("--seed", type=int, default=999)
    args = parser.parse_args(argv)

    from tapecli.data.tokenizer import load_tokenizer

    model = train_tokenizer(args.out / "tokenizer.model", args.vocab_size, args.seed)
    print(f"wrote {model} ({load_tokenizer(str(model)).vocab_size} pieces)")


if __name__ == "__main__":
    main()
