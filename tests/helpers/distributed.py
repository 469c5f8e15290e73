"""A scripted rollout for the multi-process tests: completions that depend only on (prompt, sample index),
so one process and several give the same global batch."""

import random

from grpokit.types import Rollout

# adam_eps 1e-4: with the default 1e-8, Adam turns float noise in near-zero gradients (summation order:
# ranks, kernels, prompt sharing) into lr-sized steps, and the comparisons below would test luck.
OVER = {
    "train.prompts_per_step": 4,
    "train.steps": 2,
    "algo.scale": "batch",
    "algo.aggregation": "token-mean",
    "algo.beta": 0.04,
    "optim.max_grad_norm": 0.5,
    "data.eval_size": 0,
    "train.deterministic": True,
    "train.micro_batch_size": 4,
    "optim.adam_eps": 1e-4,
}


def scripted_generate(
    model,
    prompt_ids,
    group_size,
    params,
    *,
    eos_token_ids,
    pad_token_id,
    generator=None,
    decode=None,
    cuda_graphs=True,
    engine="auto",
    generation_kwargs=None,
):
    """Completions that depend only on (prompt, sample index): the same on any rank layout."""
    comps, logps, reasons = [], [], []
    for p in prompt_ids:
        for g in range(group_size):
            rng = random.Random(1000 * sum((i + 1) * t for i, t in enumerate(p)) + g)
            n = rng.randint(1, params.max_new_tokens)
            toks = [rng.randint(3, 28) for _ in range(n)]
            comps.append(toks)
            logps.append([-1.0] * n)
            reasons.append("length" if n == params.max_new_tokens else "eos")
    return Rollout([list(p) for p in prompt_ids], comps, logps, reasons, group_size)


def run(model_dir, out, over):
    import grpokit.rollout.engine as train_mod  # the hf engine samples with its module's generate
    from helpers.runs import make

    real, train_mod.generate = train_mod.generate, scripted_generate
    try:
        tr = make(model_dir, out, **over)
        tr.train()
    finally:
        train_mod.generate = real  # other tests in this process sample for real
    return tr, {n: p.detach().clone() for n, p in tr.model.named_parameters()}
