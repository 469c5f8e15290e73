"""The one GRPO workload both trainers run: a local random-init Qwen2-shaped model with a
character-level tokenizer, a fixed prompt set, a cheap deterministic reward, and an analytic
FLOP count.

Everything here is built offline and saved to a folder, so grpokit and TRL load the *same* files.
The tokenizer is saved with ``tokenizer_class: PreTrainedTokenizerFast`` because transformers 5
otherwise loads ``Qwen2Tokenizer`` for a Qwen2 model and maps our small vocabulary to ``<unk>``;
``build_model_dir`` checks that text round-trips after loading.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 +-*/=?!.,:;()<>[]'\"#%&_|~^@$"  # 64 - 3 specials = 61 used


def char_tokenizer(vocab_size: int = 64):
    """pad/eos/unk plus one id per character of CHARS, ``vocab_size`` ids in all (at most 64)."""
    from grpokit.data.tasks.chartok import build_char_tokenizer

    chars = CHARS[: max(0, min(len(CHARS), vocab_size - 3))]
    return build_char_tokenizer(chars, (), padding_side="right", model_max_length=None)


# Published shapes (config.json of the Qwen2.5 base models), built here with random weights.
SHAPES = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=1e6,
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
        rope_theta=1e6,
    ),
    # --tiny runs of bench/gpu_bench.py and bench/gpu_big.py on CPU: the scripts' plumbing, not a measurement
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
        tie_word_embeddings=True,
        rope_theta=1e4,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=1e6,
    ),
}


def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct's converted folder: the named model ``smollm2-135m-instruct`` (docs/MODELS.md)."""
    from grpokit.train.named_models import resolve

    return resolve("smollm2-135m-instruct")


def build_model_dir(
    path: str | Path,
    hidden: int = 256,
    layers: int = 4,
    vocab_size: int = 64,
    seed: int = 0,
    shape: str = "",
    device: str = "cpu",
) -> Path:
    """Save a random-init Qwen2-shaped model + char tokenizer to ``path`` (reused if already there).

    ``shape`` names one of SHAPES (then hidden/layers/vocab_size are the shape's, the weights are
    saved in bfloat16, and ids beyond the tokenizer's 64 decode to nothing); ``device`` is where the
    random weights are drawn (a GPU draws a 1.5B model in seconds)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    if (path / "config.json").exists():
        return path
    tok = char_tokenizer(vocab_size)
    torch.manual_seed(seed)
    dims = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        tie_word_embeddings=False,
    )
    dims.update(SHAPES[shape] if shape else {})
    rope = {"rope_theta": dims.pop("rope_theta")} if "rope_theta" in dims else {}
    cfg = Qwen2Config(
        **dims,
        **rope,
        max_position_embeddings=4096 if shape else 1024,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
    )
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    (model.to(torch.bfloat16) if shape else model).save_pretrained(path)
    del model
    tok.save_pretrained(path)
    tc = path / "tokenizer_config.json"
    data = json.loads(tc.read_text())
    data["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc.write_text(json.dumps(data, indent=2))
    loaded = AutoTokenizer.from_pretrained(path)
    text = "12+34=?"
    if loaded.decode(loaded(text)["input_ids"]) != text or loaded.unk_token_id in loaded(text)["input_ids"]:
        raise RuntimeError(f"tokenizer in {path} does not round-trip ({type(loaded).__name__})")
    return path


def prompts(n: int = 256, seed: int = 0) -> list[dict]:
    """``n`` short arithmetic prompts, 6-9 characters, as dataset rows with a ``prompt`` column."""
    rng = random.Random(seed)
    return [{"prompt": f"{rng.randint(1, 99)}+{rng.randint(1, 99)}="} for _ in range(n)]


def chat_prompts(n: int = 256, seed: int = 0) -> list[dict]:
    """``n`` chat prompts for a real instruct model (the real-model workload): one user message asking
    an arithmetic question in words, as rows with a ``prompt`` column of messages and an ``answer``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append(
            {
                "prompt": [
                    {
                        "role": "user",
                        "content": f"What is {a} + {b}? Think briefly, then give the final answer as a number.",
                    }
                ],
                "answer": str(a + b),
            }
        )
    return rows


def _text(completion) -> str:
    """A completion's text: plain text, or TRL's conversational form (a list with one assistant message)."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def reward_vowels(prompts, completions, **kwargs) -> list[float]:
    """Fraction of vowels in each completion (TRL's reward-function convention); cheap and deterministic."""
    return [sum(c in "aeiou" for c in text) / max(1, len(text)) for text in map(_text, completions)]


def reward_even_ids(prompts, completions, completion_ids, **kwargs) -> list[float]:
    """Fraction of even token ids in each completion: varied rewards whatever the tokenizer can decode
    (a random 151936-token model mostly samples ids the 64-character tokenizer has no text for)."""
    return [sum(i % 2 == 0 for i in ids) / max(1, len(ids)) for ids in completion_ids]


def model_flops(cfg, prompt_len: float, comp_len: float) -> dict[str, float]:
    """Forward FLOPs of one sequence: 2 per weight per token (embedding lookup excluded) plus
    attention scores and mixing (2 * 2 * layers * hidden per (query, key) pair, causal).

    Returns ``{"prefill", "decode"}``: the prompt's forward and the forward of ``comp_len`` tokens after
    it (together, one forward over prompt + completion; a group's G completions share the prefill).
    """
    h, L, V, I = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * I  # q, k, v, o, gate/up/down
    dense = 2 * (L * per_layer + h * V)
    attn = 4 * L * h  # per (query, key) pair

    def fwd(n_tokens, ctx_start):  # tokens at positions ctx_start .. ctx_start+n-1 attend to all before
        pairs = n_tokens * ctx_start + n_tokens * (n_tokens + 1) / 2
        return dense * n_tokens + attn * pairs

    return {"prefill": fwd(prompt_len, 0), "decode": fwd(comp_len, prompt_len)}


def matmul_peak_gflops(n: int = 1024, reps: int = 10, dtype=None, device: str = "cpu", kernel: str = "torch") -> float:
    """Best of ``reps`` timed (n x n) @ (n x n) products, in GFLOP/s: this machine's practical peak.

    ``kernel="torch"`` times ``a @ b`` (MKL on x86 CPU wheels); ``"onednn"`` times the oneDNN linear
    op that grpokit's ``model.cpu_matmul`` uses (CPU only). The harness takes the better of the two:
    a fraction of "peak" is then a fraction of the fastest float32 matmul this machine offers."""
    import time

    import torch

    a = torch.randn(n, n, dtype=dtype or torch.float32, device=device)
    b = torch.randn(n, n, dtype=dtype or torch.float32, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if kernel == "onednn":
        mm = lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")  # a @ b.T: same FLOPs
    else:
        mm = lambda: a @ b
    mm()
    sync()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        mm()
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def micro_bench_setup(argv=None):
    """Shared start of the micro-benchmarks: parse --model/--G/--P/--T/--rounds/--threads/--lora, set the
    thread count, load the model folder; returns (args, model, tokenizer, prompt token ids)."""
    import argparse

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    for name, default in (("G", 8), ("P", 8), ("T", 32), ("rounds", 3), ("threads", 0)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--lora", type=int, default=0, help="LoRA rank: the model in PEFT with adapters on every linear")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    if a.lora:
        from grpokit.config.sections import ModelConfig
        from grpokit.train.lora import add_adapters

        model = add_adapters(model, ModelConfig(lora_rank=a.lora)).eval()
    tok = AutoTokenizer.from_pretrained(a.model)
    ids = [tok(r["prompt"])["input_ids"] for r in prompts(a.P, seed=1)]
    return a, model, tok, ids
