"""Learned rewards: a sequence-classification reward model, and process reward models (PRMs).

SequenceClassifierReward: a Hugging Face `AutoModelForSequenceClassification` loaded from a local folder,
scoring `prompt + completion` in batches; the reward is the model's one logit (a reward model has one
output: loaded with num_labels=1, as TRL loads one, so a classifier with several labels is refused in one
sentence rather than scored on its first label), or the logit of `label_index` when one is given. A text
beyond the model's length keeps its end (the completion's), warned once. It scores where it is told
(`device`), else where a given model object already is (a folder loads on the CPU): a model the user placed
on a GPU is never moved off it. It is a plain callable with the reward contract; it holds a model, so run it
with num_workers=0 (in process) or let each worker load its own copy.

Process supervision: a `ProcessRewardFunction` returns, per completion, a list of
(step_end_token_index, step_reward): the index of the last token of each step in `completion_ids[i]`
and that step's reward. The trainer's process-supervision advantage consumes exactly this.
`NewlineStepReward` is the simple built-in: steps are the lines of the completion, each scored by a
`verify_step(prompt, previous_steps, step, **row) -> float` callback.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol

from grpokit.config.sections import ConfigError

from .math import completion_text

log = logging.getLogger(__name__)


class ProcessRewardFunction(Protocol):
    def __call__(
        self, prompts: list[str], completions: list[Any], completion_ids: list[list[int]], **columns: Any
    ) -> list[list[tuple[int, float]]]: ...


class SequenceClassifierReward:
    """Reward = classifier logit on `prompt + completion`; batched; from a local model folder.

    A text longer than `max_length` tokens loses its start, not its end: the completion's last tokens are
    what a reward model reads its score from, so cutting the end would give every long completion the
    score of the same prefix. That is said once (a warning) per reward model."""

    def __init__(
        self,
        path: str | None,
        batch_size: int = 8,
        max_length: int | None = None,
        label_index: int | None = None,
        device: Any = None,
        model: Any = None,
    ) -> None:
        """``model``: an instantiated sequence-classification model instead of ``path`` (its tokenizer is
        loaded from the folder or id it was loaded from). ``max_length``: the most tokens a text is scored
        on (None: the model's own limit, its config's max_position_embeddings or n_positions; no limit
        when it has none). ``label_index``: the logit scored (None: the reward model's one output).
        ``device``: where it scores (None: where ``model`` is, the CPU for a folder)."""
        import torch
        from transformers import AutoTokenizer

        self.__name__ = "reward_model"
        self.tokenizer = AutoTokenizer.from_pretrained(path or model.config._name_or_path)
        model = model if model is not None else load_classifier(path, label_index)
        self.label_index = scored_label(model.config, label_index)
        self.model, self.device = model.eval(), model_device(model)
        self.place(device)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size = batch_size
        self.max_length = max_length if max_length is not None else model_max_length(self.model.config)
        self._warned = False
        self._torch = torch

    def place(self, device: Any) -> None:
        """Score on ``device`` from now on (None: stay where the model is)."""
        import torch

        if device is not None and model_device(self.model) != torch.device(device):
            self.model = self.model.to(device)
        self.device = model_device(self.model)

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        return self.score_texts([completion_text(p) + completion_text(c) for p, c in zip(prompts, completions)])

    def score_texts(self, texts: list[str], add_special_tokens: bool = True, cut: bool = True) -> list[float]:
        """The logit of ``label_index`` for each text, in batches of ``batch_size`` padded on the right.
        ``cut``: a text over ``max_length`` tokens keeps its last ``max_length`` (warned once); without it
        every token is scored, as TRL scores them."""
        scores: list[float] = []
        with self._torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                ids = self.tokenizer(texts[start : start + self.batch_size], add_special_tokens=add_special_tokens)
                ids = ids["input_ids"]
                if cut and self.max_length:
                    ids = self._cut(ids)
                batch = self.tokenizer.pad({"input_ids": ids}, padding_side="right", return_tensors="pt")
                logits_BL = self.model(**batch.to(self.device)).logits  # (B, num_labels)
                scores.extend(logits_BL[:, self.label_index].float().tolist())
        return scores

    def _cut(self, ids: list[list[int]]) -> list[list[int]]:
        """Each token list's last ``max_length`` tokens; the first time one is longer, a warning."""
        long = [len(x) for x in ids if len(x) > self.max_length]
        if long and not self._warned:
            self._warned = True
            log.warning(
                "Reward model %s: a prompt + completion of %d tokens is longer than its max_length %d; its "
                "start is cut and the last %d tokens (the completion's end) are scored (said once)",
                self.model.config._name_or_path,
                max(long),
                self.max_length,
                self.max_length,
            )
        return [x[-self.max_length :] for x in ids]


def load_classifier(path: str, label_index: int | None) -> Any:
    """The sequence classifier in folder or hub id ``path``: as a reward model with one output (num_labels=1,
    as TRL loads a reward model) unless ``label_index`` picks a label of a classifier; a folder holding a
    classifier of several labels is then refused in one sentence naming them (TRL's load fails on it)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    if label_index is not None:
        return AutoModelForSequenceClassification.from_pretrained(path)
    try:
        return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    except RuntimeError as exc:
        if "mismatched" not in str(exc):
            raise
    raise ConfigError(_not_one_output(AutoConfig.from_pretrained(path), path)) from None


def scored_label(config: Any, label_index: int | None) -> int:
    """The logit a reward is read from: the one output of a reward model (``label_index`` None), or
    ``label_index`` of a classifier; anything else refused in one sentence."""
    n, name = config.num_labels, config._name_or_path
    if label_index is None and n != 1:
        raise ConfigError(_not_one_output(config, name))
    if label_index is not None and not 0 <= label_index < n:
        raise ConfigError(f"label_index={label_index} is no label of {name!r}, whose labels are {label_list(config)}")
    return label_index or 0


def label_list(config: Any) -> str:
    """A classifier's labels as a sentence names them: "0: negative, 1: positive" (an index without a name: itself)."""
    return ", ".join(f"{i}: {config.id2label.get(i, i)}" for i in range(config.num_labels))


def _not_one_output(config: Any, name: str) -> str:
    return (
        f"reward model {name!r} is a classifier with {config.num_labels} labels ({label_list(config)}), not a reward "
        "model with one output (num_labels=1, as TRL loads one); give a reward model, or score one of its labels "
        "with grpokit.rewards.models.SequenceClassifierReward(path, label_index=...) as a reward function"
    )


def model_device(model: Any) -> Any:
    """The device a model's weights are on (the CPU for a model without any)."""
    import torch

    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def model_max_length(config: Any) -> int | None:
    """The most positions a model's config allows (max_position_embeddings, or GPT-2's n_positions)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)


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
