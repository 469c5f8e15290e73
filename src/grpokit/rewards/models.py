"""Learned rewards: a sequence-classification reward model, and process reward models (PRMs).

SequenceClassifierReward: a Hugging Face `AutoModelForSequenceClassification` loaded from a local folder,
scoring `prompt + completion` in batches; the reward is the logit of `label_index` (num_labels == 1 for
a standard reward model). It is a plain callable with the reward contract; it holds a model, so run it
with num_workers=0 (in process) or let each worker load its own copy.

Process supervision: a `ProcessRewardFunction` returns, per completion, a list of
(step_end_token_index, step_reward): the index of the last token of each step in `completion_ids[i]`
and that step's reward. The trainer's process-supervision advantage consumes exactly this.
`NewlineStepReward` is the simple built-in: steps are the lines of the completion, each scored by a
`verify_step(prompt, previous_steps, step, **row) -> float` callback.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from .math import completion_text


class ProcessRewardFunction(Protocol):
    def __call__(
        self, prompts: list[str], completions: list[Any], completion_ids: list[list[int]], **columns: Any
    ) -> list[list[tuple[int, float]]]: ...


class SequenceClassifierReward:
    """Reward = classifier logit on `prompt + completion`; batched; from a local model folder."""

    def __init__(
        self,
        path: str | None,
        batch_size: int = 8,
        max_length: int = 1024,
        label_index: int = 0,
        device: str = "cpu",
        model: Any = None,
    ) -> None:
        """``model``: an instantiated sequence-classification model instead of ``path`` (its tokenizer is
        loaded from the folder or id it was loaded from)."""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.__name__ = "reward_model"
        self.tokenizer = AutoTokenizer.from_pretrained(path or model.config._name_or_path)
        model = model if model is not None else AutoModelForSequenceClassification.from_pretrained(path)
        self.model = model.to(device).eval()
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.max_length, self.label_index, self.device = batch_size, max_length, label_index, device
        self._torch = torch

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        texts = [completion_text(p) + completion_text(c) for p, c in zip(prompts, completions)]
        scores: list[float] = []
        with self._torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    texts[start : start + self.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                logits_BL = self.model(**batch).logits  # (B, num_labels)
                scores.extend(logits_BL[:, self.label_index].float().tolist())
        return scores


class NewlineStepReward:
    """Process rewards with steps = non-empty lines; each step scored by `verify_step`.

    Token positions: a step ends at the first token whose decoded prefix `decode(ids[:t+1])` reaches the
    step's last character (`decode` is a callable ids -> str, e.g. tokenizer.decode). O(T^2) decoding:
    fine for verifier-sized completions; pass a faster decode for long ones.
    """

    def __init__(self, verify_step: Callable[..., float], decode: Callable[[list[int]], str]) -> None:
        self.verify_step = verify_step
        self.decode = decode

    def __call__(
        self, prompts: list[str], completions: list[Any], completion_ids: list[list[int]], **columns: Any
    ) -> list[list[tuple[int, float]]]:
        out = []
        for i, (prompt, completion, ids) in enumerate(zip(prompts, completions, completion_ids)):
            row = {k: v[i] for k, v in columns.items()}
            text = completion_text(completion)
            # character offset where each prefix of tokens ends
            ends = [len(self.decode(ids[: t + 1])) for t in range(len(ids))]
            steps: list[tuple[int, float]] = []
            previous: list[str] = []
            pos = 0
            for line in text.split("\n"):
                line_end = pos + len(line)
                if line.strip():
                    token = next((t for t, e in enumerate(ends) if e >= line_end), len(ids) - 1)
                    steps.append((token, float(self.verify_step(prompt, list(previous), line, **row))))
                    previous.append(line)
                pos = line_end + 1
            out.append(steps)
        return out
