"""Stage 4 -> 5: a rollout's token lists as the padded tensors the update reads (``TokenBatch``)."""

from __future__ import annotations

import torch

from grpokit.types import Rollout, TokenBatch


def make_token_batch(rollout: Rollout, pad_token_id: int, device: torch.device | str = "cpu") -> TokenBatch:
    """Left-pad the prompts (each row's: its group's, repeated G times, or its own) and right-pad the completions
    into tensors. Environment tokens of multi-turn episodes are attended to but get completion_mask 0."""
    N = rollout.num_sequences
    prompts = [rollout.prompt_of(i) for i in range(N)]
    lp = max(len(p) for p in prompts)
    T = max(1, max(len(c) for c in rollout.completion_ids))
    input_ids = torch.full((N, lp + T), pad_token_id, dtype=torch.long)
    attn = torch.zeros((N, lp + T), dtype=torch.long)
    comp_mask = torch.zeros((N, T), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompts, rollout.completion_ids)):
        input_ids[i, lp - len(p) : lp] = torch.tensor(p, dtype=torch.long)
        attn[i, lp - len(p) : lp] = 1
        if c:
            input_ids[i, lp : lp + len(c)] = torch.tensor(c, dtype=torch.long)
            attn[i, lp : lp + len(c)] = 1
            comp_mask[i, : len(c)] = (
                1.0 if rollout.episodes is None else torch.tensor(rollout.model_mask(i), dtype=torch.float32)
            )
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    batch = TokenBatch(input_ids, attn, pos, input_ids[:, lp:].clone(), comp_mask)
    return TokenBatch(
        *(
            t.to(device)
            for t in (
                batch.input_ids,
                batch.attention_mask,
                batch.position_ids,
                batch.completion_ids,
                batch.completion_mask,
            )
        ),
        vision=rollout.vision,
    )
