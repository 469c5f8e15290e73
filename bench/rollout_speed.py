"""Rollout alone: grpokit's static engine, its dynamic-cache engine and HF ``generate`` on the same
batch (P prompts x G samples, T new tokens, sampling at temperature 1), alternated in one process.

    python bench/rollout_speed.py --model DIR --G 8 --P 8 --T 32 --rounds 3

Tokens/s counts generated tokens (up to and including EOS) for every engine. HF ``generate`` is
given the prompts already repeated G times (as TRL does) and its KV cache.

grpokit's engines run on the linear kernels its trainer picks (``model.cpu_matmul="auto"``: oneDNN
on AMD CPUs). ``hf_generate`` is the stock model as a TRL user runs it; ``hf_generate_same_kernels``
is ``generate`` on grpokit's model object, so the decode loops are compared on equal kernels too.

Image prompts (``--vision``, no ``--model``): the shipped tiny Qwen2-VL (``data.task=shapes``) on
the shapes task's prompts (one 64x64 image = 16 image tokens each). Each engine prefills a prompt
with its image once; ``hf_generate`` gets every row's prompt and pixels repeated G times (the
placeholder tokens suppressed, as grpokit hides them).

    python bench/rollout_speed.py --vision --G 8 --P 8 --T 16 --rounds 5
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternate import turns  # noqa: E402
from timing import seconds, spread  # noqa: E402
from workload import micro_bench_setup  # noqa: E402


def main(argv=None):
    a, plain, tok, ids = micro_bench_setup(argv)
    import copy

    from grpokit.nn import kernels
    from grpokit.rollout.hf import SamplingParams

    model = copy.deepcopy(plain)
    onednn = kernels.wants_onednn("auto", torch.device("cpu"))
    if onednn:
        kernels.use_onednn_linears(model)

    params = SamplingParams(max_new_tokens=a.T)

    def ours(engine, model=model):
        return _grpokit_engine(model, ids, a.G, params, tok, engine)

    def hf(seed, model=plain):
        torch.manual_seed(seed)
        tok.padding_side = "left"
        enc = tok([tok.decode(x) for x in ids for _ in range(a.G)], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, **_hf_sampling(a.T, tok))
        return _generated(out[:, enc["input_ids"].shape[1] :], tok.eos_token_id)

    engines = {
        "static": ours("static"),
        "static_torch_kernels": ours("static", plain),
        "dynamic": ours("dynamic"),
        "hf_generate": hf,
        "hf_generate_same_kernels": lambda seed: hf(seed, model),
    }
    summary = _alternate(engines, a.rounds)
    summary["static_vs_hf"] = summary["static"]["median_tok_s"] / summary["hf_generate"]["median_tok_s"]
    summary["dynamic_vs_hf"] = summary["dynamic"]["median_tok_s"] / summary["hf_generate"]["median_tok_s"]
    summary["static_vs_hf_same_kernels"] = (
        summary["static"]["median_tok_s"] / summary["hf_generate_same_kernels"]["median_tok_s"]
    )
    print(
        "BENCH_JSON "
        + json.dumps(
            {
                "G": a.G,
                "P": a.P,
                "T": a.T,
                "threads": torch.get_num_threads(),
                "grpokit_kernels": "onednn" if onednn else "torch",
                **summary,
            }
        )
    )


def vision_main(argv):
    import argparse

    from grpokit.config.sections import DataConfig
    from grpokit.data.prompts import to_prompts
    from grpokit.data.tasks import shapes
    from grpokit.data.vision import placeholder_ids
    from grpokit.rollout.hf import SamplingParams

    p = argparse.ArgumentParser()
    p.add_argument("--vision", action="store_true")
    for name, default in (("G", 8), ("P", 8), ("T", 16), ("rounds", 3), ("threads", 0)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    model, proc = shapes.load_shapes_model()
    model.eval()
    tok = proc.tokenizer
    prompts = to_prompts(shapes.train_rows(a.P, seed=1), tok, DataConfig(), processor=proc)
    params = SamplingParams(max_new_tokens=a.T)

    def ours(engine):
        return _grpokit_engine(model, [q.ids for q in prompts], a.G, params, tok, engine, [q.vision for q in prompts])

    width = max(len(q.ids) for q in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(q.ids)) + q.ids for q in prompts for _ in range(a.G)])
    extra = {k: torch.cat([q.vision[k] for q in prompts for _ in range(a.G)]) for k in prompts[0].vision}

    def hf(seed):
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=(ids != tok.pad_token_id).long(),
                **extra,
                **_hf_sampling(a.T, tok),
                suppress_tokens=placeholder_ids(model),
            )
        return _generated(out[:, width:], tok.eos_token_id)

    engines = {"static": ours("static"), "dynamic": ours("dynamic"), "hf_generate": hf}
    summary = _alternate(engines, a.rounds)
    summary["static_vs_dynamic"] = summary["static"]["median_tok_s"] / summary["dynamic"]["median_tok_s"]
    summary["static_vs_hf"] = summary["static"]["median_tok_s"] / summary["hf_generate"]["median_tok_s"]
    print(
        "BENCH_JSON "
        + json.dumps({"vision": True, "G": a.G, "P": a.P, "T": a.T, "threads": torch.get_num_threads(), **summary})
    )


def _grpokit_engine(model, ids, group_size, params, tok, engine, vision=None):
    """``run(seed) -> generated tokens``: grpokit's ``engine`` sampling ``group_size`` completions of each prompt."""
    from grpokit.rollout.hf import generate

    def run(seed):
        ro = generate(
            model,
            ids,
            group_size,
            params,
            eos_token_ids={tok.eos_token_id},
            pad_token_id=tok.pad_token_id,
            generator=torch.Generator().manual_seed(seed),
            engine=engine,
            **({"vision": vision} if vision is not None else {}),
        )
        return sum(len(c) for c in ro.completion_ids)

    return run


def _hf_sampling(max_new_tokens: int, tok) -> dict:
    """HF ``generate``'s arguments for plain sampling at temperature 1 (no top-k / top-p cut)."""
    return dict(
        do_sample=True,
        max_new_tokens=max_new_tokens,
        top_k=0,
        top_p=1.0,
        temperature=1.0,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )


def _generated(completions: torch.Tensor, eos: int) -> int:
    """Tokens generated in each row of ``completions`` up to and including its first ``eos``, summed."""
    return sum(next((k + 1 for k, x in enumerate(row) if x == eos), len(row)) for row in completions.tolist())


def _alternate(engines: dict, rounds: int) -> dict:
    """Tokens/s of each engine: one warm-up, then ``rounds`` rounds with the engines alternated."""
    for f in engines.values():
        f(0)
    res = {k: [] for k in engines}
    for r, name in turns(list(engines), rounds):
        dt, n = seconds(lambda: engines[name](100 + r))
        res[name].append(n / dt)
    spreads = {k: spread(v) for k, v in res.items()}
    return {k: {"median_tok_s": s["median"], "min": s["min"], "max": s["max"]} for k, s in spreads.items()}


if __name__ == "__main__":
    vision_main(sys.argv[1:]) if "--vision" in sys.argv else main()
