"""The longest prompt a run takes, enforced once, at start.

A prompt longer than the model can hold never ends well: 8 prompts of 40,000 characters on the demo
model (a 64-position model) ran over 4 minutes without a step. So every prompt (training and
evaluation) is measured when the run is built, against ``rollout.max_prompt_tokens``, or, when that
is 0, the model's context (``max_position_embeddings``, or vLLM's ``rollout.vllm_max_model_len``):

- by default a longer prompt is refused before any work, in one sentence naming how many, the
  longest (its row and length) and the limit, and the two ways out;
- with ``rollout.truncate_prompts=true`` it keeps its last ``limit`` tokens, as TRL's
  ``max_prompt_length`` truncated (from the left, so the question at the end stays), and the run says
  once how many prompts were cut. Reward functions still receive the whole prompt text.

Image prompts are never cut (their image tokens would be torn): they can only be refused.
"""

from __future__ import annotations

import dataclasses
import logging

from grpokit.config.sections import Config, ConfigError
from grpokit.types import Prompt

log = logging.getLogger("grpokit")


def model_context(model, cfg: Config) -> int:
    """The model's context in tokens (0 when it does not say)."""
    if cfg.rollout.backend == "vllm" and cfg.rollout.vllm_max_model_len:
        return cfg.rollout.vllm_max_model_len
    config = getattr(model, "config", None)
    config = getattr(config, "get_text_config", lambda: config)() if config is not None else None
    n = getattr(config, "max_position_embeddings", 0)
    return n if isinstance(n, int) and n > 0 else 0


def prompt_limit(cfg: Config, model) -> tuple[int, str]:
    """(limit, what set it); limit 0 = none known."""
    if cfg.rollout.max_prompt_tokens > 0:
        return cfg.rollout.max_prompt_tokens, f"rollout.max_prompt_tokens={cfg.rollout.max_prompt_tokens}"
    n = model_context(model, cfg)
    return n, f"the model's context of {n} tokens"


def limit_prompts(prompts: list[Prompt], limit: int, why: str, truncate: bool, which: str) -> tuple[list[Prompt], int]:
    """``prompts`` within ``limit`` tokens, and how many were cut; raises ConfigError (refusal)."""
    long = [k for k, p in enumerate(prompts) if limit and len(p.ids) > limit]
    if not long:
        return prompts, 0
    worst = max(long, key=lambda k: len(prompts[k].ids))
    if not truncate or any(prompts[k].vision is not None for k in long):
        raise ConfigError(
            f"{len(long)} of {len(prompts)} {which} prompts are longer than {why} (the longest, row {worst}, "
            f"has {len(prompts[worst].ids)} tokens); shorten them, raise rollout.max_prompt_tokens within "
            "the model's context, or set rollout.truncate_prompts=true to keep each one's last tokens"
            + (" (image prompts cannot be cut)" if prompts[worst].vision is not None else "")
        )
    out = list(prompts)
    for k in long:  # TRL's max_prompt_length: the last tokens stay
        out[k] = dataclasses.replace(prompts[k], ids=list(prompts[k].ids[-limit:]))
    log.warning(
        "grpokit: warning: %d of %d %s prompts are longer than %s and were cut to their last %d tokens "
        "(rollout.truncate_prompts=true; the longest, row %d, had %d)",
        len(long),
        len(prompts),
        which,
        why,
        limit,
        worst,
        len(prompts[worst].ids),
    )
    return out, len(long)


def check_prompt_lengths(cfg: Config, model, prompts: list[Prompt], eval_prompts: list[Prompt]):
    """The training and evaluation prompts within the run's limit: (prompts, eval_prompts, cut)."""
    limit, why = prompt_limit(cfg, model)
    prompts, cut = limit_prompts(prompts, limit, why, cfg.rollout.truncate_prompts, "training")
    eval_prompts, cut_eval = limit_prompts(eval_prompts, limit, why, cfg.rollout.truncate_prompts, "evaluation")
    return prompts, eval_prompts, cut + cut_eval
