"""EDGE-GRPO's guided error correction (Zhang et al., arXiv 2507.21848, GEC), between stages 3 and 4.

A group whose completions are all wrong has equal rewards, so GRPO gives it no gradient. GEC puts a
corrected response into such a group: the group's last completion is replaced, and the new one is
scored by the same reward functions as every other completion, so the group usually gains a
correct member and a gradient that points at the correction. Two modes (``algo.error_correction``):

* ``"gold"``: the response is the gold answer rendered by ``algo.error_correction_fn``
  (``module:function``, called with the prompt text and the dataset's columns, ``answer`` among
  them, keeping only the arguments it names), followed by the end-of-sequence token;
* ``"reflection"``: the wrong completion is kept, then ``algo.error_correction_prompt`` (the
  paper's "Wait! Something is wrong here.") and the rendered gold answer are appended.

The injected tokens were not sampled by pi_old. The loss treats them like sampled ones: their old
logprobs are pi_old's own (computed on the batch, as for every row), so the ratio starts at 1 and
the update is ``A * grad log pi`` on the correction, an advantage-weighted supervised step with no
importance correction for the renderer that wrote it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Callable

import torch

from grpokit.config.sections import ConfigError
from grpokit.types import ScoredBatch, repeat_columns

MODES: tuple[str, ...] = ("off", "gold", "reflection")


def resolve_renderer(path: str) -> Callable[..., str]:
    """``module:function`` -> the function (one clear sentence when it cannot be imported)."""
    mod, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(mod), name) if mod and name else None
    except ImportError as e:
        raise ConfigError(f"algo.error_correction_fn={path!r} cannot be imported ({e}); give module:function") from None
    if not callable(fn):
        raise ConfigError(
            f"algo.error_correction_fn={path!r} is not a function; give module:function "
            f"(e.g. grpokit.data.tasks.arithmetic:format_completion)"
        )
    return fn


def _call(fn: Callable[..., str], prompt: str, columns: dict) -> str:
    params = inspect.signature(fn).parameters
    kwargs = {"prompt": prompt, **columns}
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return str(fn(**kwargs))


def all_wrong_groups(values_N: torch.Tensor, group_size: int, max_reward: float) -> list[int]:
    """Groups whose every completion's judged value (``ScoredBatch.judged``: reward.judge's functions summed, or
    the reward as trained) is at most ``max_reward``."""
    return [p for p, row in enumerate(values_N.view(-1, group_size)) if bool((row <= max_reward).all())]


def correct(
    sb: ScoredBatch,
    tokenizer,
    runner,
    *,
    mode: str,
    render: Callable[..., str],
    reflection: str,
    max_reward: float,
    eos_id: int | None,
    judged: list[int] | None = None,
) -> ScoredBatch:
    """Replace the last completion of every all-wrong group by a corrected, re-scored one: a group whose judged
    values (``judged``: reward.judge's rewards_NF columns, None the reward as trained) are all <= ``max_reward``."""
    ro, G = sb.rollout, sb.group_size
    if ro.episodes is not None:
        raise ConfigError(
            "algo.error_correction works on single-turn completions; turn it off for tool or environment episodes"
        )
    groups = all_wrong_groups(sb.judged(judged)[0], G, max_reward)
    metrics = {"gec/corrected_groups": float(len(groups)), "gec/injected_reward_mean": 0.0}
    if not groups:
        sb.metrics.update(metrics)
        return sb
    ids, logps, reasons, texts = (
        list(ro.completion_ids),
        list(ro.sampling_logprobs),
        list(ro.finish_reasons),
        list(sb.texts),
    )
    rows, new_texts = [], []
    for p in groups:
        i = p * G + G - 1  # the group's last completion makes way for the correction
        prompt = sb.prompts[p]
        gold = _call(render, prompt.text, dict(prompt.columns))
        tail = [eos_id] if eos_id is not None else []
        if mode == "reflection":  # EDGE-GRPO GEC: the wrong attempt, a reflection cue, then the gold answer
            head = [t for t in ids[i] if t != eos_id]
            new = head + tokenizer(f" {reflection} {gold}", add_special_tokens=False)["input_ids"] + tail
            text = f"{texts[i]} {reflection} {gold}"
        else:  # EDGE-GRPO GEC: the gold answer in place of the wrong completion
            new = tokenizer(gold, add_special_tokens=False)["input_ids"] + tail
            text = gold
        ids[i], logps[i], reasons[i], texts[i] = new, [0.0] * len(new), "eos", text  # no sampler logprobs: not sampled
        rows.append(i)
        new_texts.append(text)
    columns = {k: [v[i] for i in rows] for k, v in repeat_columns(sb.prompts, G).items()}
    scored = runner.score([sb.prompts[i // G].text for i in rows], new_texts, [ids[i] for i in rows], 1, columns)
    rewards_NF, total_N = sb.rewards_NF.clone(), sb.total_N.clone()
    idx = torch.tensor(rows)
    rewards_NF[idx], total_N[idx] = scored.rewards_NF.to(rewards_NF.dtype), scored.total_N.to(total_N.dtype)
    metrics["gec/injected_reward_mean"] = scored.total_N.float().mean().item()
    versions = None  # the sampled rows keep their versions (rollout/staleness.py); a corrected one is no one's: age 0
    if ro.sampling_versions is not None:
        versions = [None if i in rows else v for i, v in enumerate(ro.sampling_versions)]
    new_ro = dataclasses.replace(
        ro, completion_ids=ids, sampling_logprobs=logps, finish_reasons=reasons, sampling_versions=versions
    )
    failed_NF = None  # the corrected rows' failures replace the sampled ones' (the step's reward metrics read them)
    if sb.failed_NF is not None or scored.failed_NF is not None:
        failed_NF = torch.zeros_like(rewards_NF, dtype=torch.bool) if sb.failed_NF is None else sb.failed_NF.clone()
        failed_NF[idx] = False if scored.failed_NF is None else scored.failed_NF
    return ScoredBatch(
        sb.prompts, new_ro, texts, rewards_NF, total_N, sb.names, {**sb.metrics, **metrics}, failed_NF=failed_NF
    )
