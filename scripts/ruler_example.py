"""The data of the CPU-sized RULER example (scripts/ruler_example.sh, docs/results/ruler-cpu.md): a tokenizer and
prompt/answer rows. The code lives in the package (tapecli/data/ruler/example.py, also `python -m
tapecli.data.ruler.example`); this script runs it.

    python scripts/ruler_example.py OUT [--rows-per-length 9000] [--lengths 224,240,256] [--seed 1000]
"""

from tapecli.data.ruler.example import main

if __name__ == "__main__":
    main()
