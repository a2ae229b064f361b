#!/usr/bin/env bash
# On the GPU machine: build the random-weight Qwen3-VL-2B (= Cosmos-Reason2-2B architecture)
# checkpoint (bf16, 4.26 GB, ~21 s on the GPU) unless a complete one is there already.
#   bash scripts/gpu/make_model.sh [OUT=/root/m2b]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT=${1:-/root/m2b}
# shellcheck disable=SC1091
source "$HERE/env.sh"
if [ -f "$OUT/config.json" ] && [ -f "$OUT/tokenizer.json" ] && ls "$OUT"/*.safetensors >/dev/null 2>&1; then
  echo "make_model: $OUT exists ($(du -sh "$OUT" | cut -f1)); not rebuilt"
  exit 0
fi
rm -rf "$OUT"
python3 "$HERE/make_qwen3vl_2b.py" --out "$OUT" ${MODEL_ARGS:-}
echo "make_model: OK $OUT ($(du -sh "$OUT" | cut -f1))"
