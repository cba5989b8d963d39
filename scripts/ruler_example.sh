#!/usr/bin/env bash
# The CPU-sized RULER example (docs/results/ruler-cpu.md): tiny RoPE and ALiBi models trained briefly on RULER's
# niah_single_1 (noise haystack) at RULER lengths 224-256, then `tape eval ruler` at 256, 512, 1024 and 2048 tokens.
#
#   bash scripts/ruler_example.sh [OUT]      (default OUT: runs/ruler-example; STEPS=3000 PES="rope alibi")
#
# 1. scripts/ruler_example.py (tapecli/data/ruler/example.py): a 600-piece SentencePiece tokenizer whose pieces
#    include RULER's fixed phrases, and 27,000 prompt/answer rows from the official generator (seeds 1000-1002; the
#    evaluation uses 42).
# 2. `tape pretrain --recipe ruler-example` (recipes/ruler-example.yaml; data kind `pairs`: the loss on the answer
#    only) per PE.
# 3. `tape eval ruler` on both models; results.json, samples.jsonl, ruler.png and the heat-maps in OUT/ruler.
# About 15 minutes on an idle 2-core CPU. Everything runs under `nice`, one thread per training; a killed run
# resumes where it stopped when the script is run again.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/ruler-example}
STEPS=${STEPS:-3000}
PES=${PES:-rope alibi}
BIN=${BIN:-.venv/bin}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

if [ ! -f "$OUT/data/train.jsonl" ]; then
  nice "$BIN/python" scripts/ruler_example.py "$OUT/data" --rows-per-length 9000 --lengths 224,240,256 --seed 1000
fi
models=()
for pe in $PES; do  # one after the other (run them side by side on a free machine)
  OMP_NUM_THREADS=1 nice "$BIN/tape" pretrain --recipe ruler-example --out "$OUT/$pe" \
    data.source="$OUT/data/train.jsonl" data.tokenizer="$OUT/data/tokenizer.model" model.pe="$pe" \
    train.max_steps="$STEPS"
  models+=(--model "$OUT/$pe")
done
nice "$BIN/tape" eval ruler "${models[@]}" --tasks niah_single_1 --lengths 256,512,1024,2048 --samples 50 \
  --batch-size 10 --device cpu --out "$OUT/ruler"
