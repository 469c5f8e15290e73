"""A reward model given to GRPOTrainer by folder, hub id or model object, scored as TRL scores one: through the
reward tokenizer's chat template for conversational rows (refused before step 1 where it has none), prompt +
completion otherwise, its first logit the reward. The scoring itself is grpokit.rewards.models'
SequenceClassifierReward (batches, padding, the device); this module is TRL's way of feeding it."""

from __future__ import annotations

import logging
from typing import Any, Callable

from grpokit.config.sections import ConfigError
from grpokit.rewards.models import label_list


class RewardModel:
    """A sequence-classification reward model given by folder or hub id, scoring as TRL does: the
    reward tokenizer's chat template (with ``chat_template_kwargs``) over prompt + completion messages for
    conversational data (a tokenizer without one is refused, as TRL fails), ``prompt + completion``
    otherwise, tokenized without special tokens and without truncation; the reward is the first logit (a
    folder loads with num_labels=1, as TRL's; a model object of several labels is scored on its first, as
    TRL scores it, with a warning). It scores on ``device_of()``, the run's device, as TRL's accelerator
    places a reward model (a model object is moved there at the first call, a folder's too)."""

    def __init__(
        self,
        path: Any,
        tokenizer: Any = None,
        chat_template_kwargs: dict | None = None,
        device_of: Callable[[], Any] | None = None,
    ):
        from grpokit.rewards.models import SequenceClassifierReward
        from grpokit.train.hub import check_reachable

        given = not isinstance(path, str)  # an instantiated model (TRL takes one too)
        self.scorer = (  # a hub id: cached and the Hub unreachable, its cached folder (as the policy's)
            SequenceClassifierReward(None, model=path, label_index=_first_logit(path))
            if given
            else SequenceClassifierReward(check_reachable(path, "reward_funcs entry"))
        )
        self.device_of = device_of
        if tokenizer is not None:  # TRL's reward_processing_classes entry replaces the model's own tokenizer
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            self.scorer.tokenizer = tokenizer
            self.scorer.model.config.pad_token_id = tokenizer.pad_token_id  # the score is read before the first pad
        name = path.config._name_or_path if given else path
        self.__name__ = name.rstrip("/").split("/")[-1]
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def templated(self) -> bool:
        """Whether its tokenizer has a chat template (conversational data is scored through it)."""
        return bool(getattr(self.scorer.tokenizer, "chat_template", None))

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        from grpokit.rewards.errors import RewardInfrastructureError
        from grpokit.rewards.math import completion_text

        if self.device_of is not None:
            self.scorer.place(self.device_of())
        tok = self.scorer.tokenizer
        if prompts and isinstance(prompts[0], list):  # TRL's is_conversational
            if not self.templated():  # no score of this batch could be right: the run stops
                raise RewardInfrastructureError(no_template(self.__name__))
            kw = self.chat_template_kwargs
            texts = [tok.apply_chat_template(p + c, tokenize=False, **kw) for p, c in zip(prompts, completions)]
        else:
            texts = [p + completion_text(c) for p, c in zip(prompts, completions)]
        # TRL: the texts as they are, no special tokens added (the template wrote them) and no truncation
        return self.scorer.score_texts(texts, add_special_tokens=False, cut=False)


def no_template(name: str) -> str:
    return (
        f"reward model {name!r} scores conversational prompts through its tokenizer's chat template, and its "
        "tokenizer has none; give a tokenizer with a chat_template as its reward_processing_classes entry (or set "
        "its chat_template), as TRL requires"
    )


def check_reward_templates(funcs: list, rows: list) -> None:
    """Before step 1: a reward model without a chat template cannot score conversational rows (TRL raises at
    its first batch); refused in one sentence naming it."""
    if rows and isinstance(rows[0].get("prompt"), list):
        for f in funcs:
            if isinstance(f, RewardModel) and not f.templated():
                raise ConfigError(no_template(f.__name__))


def _first_logit(model: Any) -> int | None:
    """A reward model object's logit: its one output (None), or the first of several, as TRL's
    ``logits[:, 0]`` reads it, said once (a classifier's first label is seldom a reward)."""
    config = model.config
    if config.num_labels == 1:
        return None
    logging.getLogger("grpokit.trl").warning(
        "reward model %r is a classifier with %d labels (%s); it is scored on its first logit, as TRL scores a "
        "reward model object; give a reward model with one output (num_labels=1), or a reward function that reads "
        "the label you mean",
        config._name_or_path,
        config.num_labels,
        label_list(config),
    )
    return 0
