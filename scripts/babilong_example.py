"""The tokenizer of the CPU-sized BABILong example (recipes/babilong-example.yaml, docs/results/babilong-cpu.md). The
code lives in the package (tapecli/data/babilong/example.py, also `python -m tapecli.data.babilong.example`); this
script runs it.

    python scripts/babilong_example.py OUT [--vocab-size 500] [--seed 999]
"""

from tapecli.data.babilong.example import main

if __name__ == "__main__":
    main()
