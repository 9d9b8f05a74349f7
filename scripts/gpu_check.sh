#!/usr/bin/env bash
# GPU / TensorRT check for anyone with an NVIDIA GPU and `pip install 'specrt[gpu]'`:
#   0. the PyTorch backend on CUDA (any NVIDIA GPU, no TensorRT needed),
#   1. the GPU tests (engine build, TensorRT vs ONNX Runtime logits, greedy speculative == plain,
#      corrupted engine, shapes outside the profiles),
#   2. a short benchmark: compile a small bundle with --engines trt and generate with --backend trt.
# Usage: scripts/gpu_check.sh [TARGET_CHECKPOINT [DRAFT_CHECKPOINT]]   (default: the built-in demo pair)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

echo "== PyTorch backend on CUDA (needs only a GPU visible to PyTorch)"
# -P: the repository's specrt/ folder must not shadow the installed package (specrt.compiler lives in compiler/)
"$PY" -P -m pytest -m gpu tests/runtime/test_torch_cuda.py -q -rs

"$PY" - <<'PYEOF'
from specrt.compiler.trt import cuda_device_error, trt_import_error
import sys
reason = trt_import_error() or cuda_device_error("cuda:0")
if reason:
    sys.exit(f"gpu_check: {reason}")
import tensorrt, torch
print(f"TensorRT {tensorrt.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
PYEOF

echo "== pytest -m gpu tests/trt"
"$PY" -m pytest -m gpu tests/trt -q -rs

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
TARGET=${1:-}
DRAFT=${2:-}
if [[ -z "$TARGET" ]]; then
  echo "== making a tiny demo pair (tests/helpers.py)"
  "$PY" - "$WORK" <<'PYEOF'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from helpers import make_checkpoint, train_tokenizer
w = Path(sys.argv[1])
tok = train_tokenizer(w / "tok" / "tokenizer.json")
make_checkpoint(w / "target", "llama", tok, layers=4, hidden=256, seed=0)
make_checkpoint(w / "draft", "llama", tok, layers=1, hidden=256, seed=1)
PYEOF
  TARGET=$WORK/target
  DRAFT=$WORK/draft
fi

echo "== specrt compile --engines trt --precision fp16"
specrt compile --target "$TARGET" ${DRAFT:+--draft "$DRAFT"} -o "$WORK/bundle" --max-seq-len 1024 \
  --max-draft-tokens 8 --engines trt --precision fp16 --gpu-memory-budget 20GiB --force
specrt inspect "$WORK/bundle" --memory

echo "== specrt generate --backend trt (speculative, then target only)"
PROMPT='def fibonacci(n):'
specrt generate "$WORK/bundle" --prompt "$PROMPT" --max-new-tokens 128 --backend trt --num-speculative-tokens 4
specrt generate "$WORK/bundle" --prompt "$PROMPT" --max-new-tokens 128 --backend trt --method none
echo "gpu_check: OK"
