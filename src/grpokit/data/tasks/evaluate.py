"""Greedy held-out accuracy with plain ``model.generate``: the independent reference.

The trainer evaluates with its own decode loop (grpokit.train.evaluate); this module stays on transformers'
generic ``generate`` so that tests/train/test_learns.py can check the two agree (fast equals naive), and so
the demo-model script does not depend on the engine it is used to test.

For each row the model greedily continues ``row["prompt"]``; the completion is the generated text
up to (not including) the first EOS, and it scores 1 when ``arithmetic_accuracy`` would give it
1.0. Greedy decoding makes the number a property of the model, not of a sampling seed.

Decoding uses ``model.generate`` with the KV cache and left padding (prompts of different lengths
end at the same column, so every row's first new token is produced by the same forward pass).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .arithmetic import arithmetic_accuracy

RewardFn = Callable[..., list[float]]


@torch.inference_mode()
def greedy_completions(
    model: Any, tokenizer: Any, prompts: Sequence[str], *, batch_size: int = 256, max_new_tokens: int = 8
) -> tuple[list[str], list[int], list[bool]]:
    """Greedy completion texts, their lengths in tokens (EOS counted) and whether EOS was emitted.

    Returns ``(texts, lengths, finished)``, one entry per prompt, in order. ``texts`` omit the EOS
    and any padding; a completion that never emits EOS has length ``max_new_tokens``.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    texts: list[str] = []
    lengths: list[int] = []
    finished: list[bool] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = list(prompts[start : start + batch_size])
            enc = tokenizer(chunk, return_tensors="pt", padding=True, padding_side="left")
            enc = {k: v.to(device) for k, v in enc.items()}
            out = model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos_id,
                pad_token_id=pad_id,
            )
            new_tokens = out[:, enc["input_ids"].shape[1] :].tolist()  # (B, <= max_new_tokens)
            for ids in new_tokens:
                done = eos_id in ids
                text_ids = ids[: ids.index(eos_id)] if done else ids
                texts.append(tokenizer.decode(text_ids))
                lengths.append(len(text_ids) + int(done))
                finished.append(done)
    finally:
        model.train(was_training)
    return texts, lengths, finished


def evaluate_accuracy(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, str]],
    *,
    batch_size: int = 256,
    max_new_tokens: int = 8,
    reward_fn: RewardFn = arithmetic_accuracy,
    num_samples: int = 0,
) -> dict[str, Any]:
    """Greedy accuracy of ``model`` on ``rows`` (``{"prompt", "answer"}`` dicts).

    Returns a dict with
      ``accuracy``      mean reward over rows, in [0, 1]
      ``n``             number of rows
      ``mean_length``   mean completion length in tokens (EOS included when emitted)
      ``truncated``     fraction of completions that hit ``max_new_tokens`` without EOS
      ``samples``       the first ``num_samples`` (prompt, completion, answer, reward) dicts
    """
    if not rows:
        raise ValueError("evaluate_accuracy: rows is empty; pass at least one {'prompt', 'answer'} row")
    prompts = [r["prompt"] for r in rows]
    answers = [r["answer"] for r in rows]
    texts, lengths, finished = greedy_completions(
        model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens
    )
    rewards = reward_fn(prompts, texts, answer=answers)
    n = len(rows)
    return {
        "accuracy": sum(rewards) / n,
        "n": n,
        "mean_length": sum(lengths) / n,
        "truncated": finished.count(False) / n,
        "samples": [
            {"prompt": p, "completion": c, "answer": a, "reward": r}
            for p, c, a, r in list(zip(prompts, texts, answers, rewards))[:num_samples]
        ],
    }
