"""Held-out evaluation: greedy completions scored by the run's first reward function.

``accuracy`` is the fraction of prompts whose completion earns that function's full reward
(>= 1 - 1e-6); for a 0/1 verifier that is the usual accuracy. ``reward`` is its mean.
"""

from __future__ import annotations

import torch

from .data import repeat_columns
from .rollout.hf import SamplingParams, generate
from .types import Prompt


@torch.no_grad()
def evaluate(model, tokenizer, prompts: list[Prompt], runner, *, max_new_tokens: int, eos_token_ids: set[int],
             batch_size: int = 256) -> dict[str, float]:
    if not prompts:
        return {}
    was_training = model.training
    model.eval()
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    texts, lengths, correct, rewards = [], [], [], []
    for s in range(0, len(prompts), batch_size):
        chunk = prompts[s:s + batch_size]
        ro = generate(model, [p.ids for p in chunk], 1, params, eos_token_ids=eos_token_ids,
                      pad_token_id=tokenizer.pad_token_id)
        comp = [tokenizer.decode(c, skip_special_tokens=True) for c in ro.completion_ids]
        columns = repeat_columns(chunk)
        result = runner.score([p.text for p in chunk], comp, ro.completion_ids, 1, columns)
        first = torch.nan_to_num(result.rewards_NF[:, 0], nan=0.0)
        rewards += first.tolist()
        correct += (first >= 1 - 1e-6).float().tolist()
        texts += comp
        lengths += [len(c) for c in ro.completion_ids]
    if was_training:
        model.train()
    n = len(prompts)
    return {"accuracy": sum(correct) / n, "reward": sum(rewards) / n, "n": float(n), "mean_length": sum(lengths) / n}
