"""The small records that flow between pipeline stages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Prompt:
    """One training prompt: its text, its token ids, and the dataset's other columns (answer ...)."""

    text: str
    ids: list[int]
    columns: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rollout:
    """Stage 2's output: G completions for each of P prompts, grouped consecutively (N = P*G).

    ``completion_ids[i]`` has no padding; it ends with the EOS token when ``finish_reasons[i]`` is
    "eos". ``sampling_logprobs[i][t]`` is the log-probability the sampler gave token t (after
    temperature, top-k/p, min-p).
    """

    prompt_ids: list[list[int]]  # P
    completion_ids: list[list[int]]  # N
    sampling_logprobs: list[list[float]]  # N
    finish_reasons: list[str]  # N: "eos" | "length" | "stop"
    group_size: int

    @property
    def num_sequences(self) -> int:
        return len(self.completion_ids)


@dataclass
class TokenBatch:
    """Prompt + completion tokens of N sequences as tensors, ready for a forward pass.

    Prompts are left-padded to a common width, completions right-padded to width T, so completion
    token t of every row sits at column ``prompt_width + t``.
    """

    input_ids: torch.Tensor  # (N, Lp + T)
    attention_mask: torch.Tensor  # (N, Lp + T)
    position_ids: torch.Tensor  # (N, Lp + T)
    completion_ids: torch.Tensor  # (N, T)
    completion_mask: torch.Tensor  # (N, T) float, 1 on real completion tokens

    def rows(self, idx: slice) -> "TokenBatch":
        return TokenBatch(*(t[idx] for t in (self.input_ids, self.attention_mask, self.position_ids, self.completion_ids, self.completion_mask)))

    @property
    def width(self) -> int:
        return self.completion_ids.shape[1]
