"""Held-out evaluation: greedy completions scored by the run's first reward function.

The completions are sampled with the run's own settings at temperature 0 (``held_out_params``): its
length, stop strings and repetition penalty, built by the same function as training's and ``grpokit
eval``'s (rollout/sampling.py), so a stop string that ends a training completion ends a held-out one;
and by the run's own decode loop (``sample``: the trainer passes the hf engine training builds,
train/engines.py ``hf_engine``), so rollout.engine=generate's generation_kwargs (no_repeat_ngram_size,
suppress_tokens, beams ...) shape a held-out completion as they shape a training one, as TRL's
evaluation generates with its training GenerationConfig.

``accuracy`` is the fraction of prompts whose completion earns that function's full reward
(>= 1 - 1e-6); for a 0/1 verifier that is the usual accuracy. ``reward`` is its mean. A prompt the
function cannot grade (it answers None: math_accuracy for a gold that does not parse, which the run
reported when the data loaded) is left out of both, not counted wrong; ``ungraded`` says how many
(``n`` counts every prompt). With none graded, accuracy and reward are NaN. Several sets' summaries
(data.domains: a set a domain) pool by the same rule (record/domain_metrics.py ``pooled_evaluation``). With tools
or an environment, every prompt is a greedy episode (the same loop as training), scored on its
conversation (the model's last message is its answer: an episode that ends on a tool's message has none and
scores as none), and ``tool_use_rate`` / ``turns_mean`` / ``no_answer_rate`` (episodes that ended before the
model answered) say how the episodes went. Prompts with a
``kind`` column (the shapes task's ``box`` / ``count`` questions) also get ``reward_<kind>``, the mean
reward of each kind, so a run's summary and report show which question moved.

A real model's evaluation takes minutes on a CPU (SmolLM2-135M: 200 greedy completions of 64 tokens),
so ``progress`` receives one line before the first batch and one after each batch.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch

from grpokit.config.rollout import RolloutConfig
from grpokit.rewards.inputs import model_answer, reward_inputs, reward_prompts
from grpokit.rollout.hf import generate
from grpokit.rollout.sampling import SamplingParams, sampling_params
from grpokit.types import Prompt, repeat_columns


@torch.no_grad()
def evaluate(
    model,
    tokenizer,
    prompts: list[Prompt],
    runner,
    *,
    params: SamplingParams,
    eos_token_ids: set[int],
    batch_size: int = 256,
    episodes=None,
    convention: str = "grpokit",
    progress: Callable[[str], None] | None = None,
    sample: Callable | None = None,
) -> dict[str, float]:
    """``sample``: the episode loop's sampler (``contexts, group_size, params, vision=None -> Rollout``), the
    run's decode loop on ``model`` (rollout/engine.py ``HFEngine.turn_sampler``); None: rollout/hf.py's
    default loop, with no generation_kwargs."""
    if not prompts:
        return {}
    start, say = time.perf_counter(), progress or (lambda line: None)
    say(
        f"grpokit: held-out evaluation: {len(prompts)} prompts, greedy, up to {params.max_new_tokens} new tokens, "
        f"{min(batch_size, len(prompts))} at a time"
    )
    was_training = model.training
    model.eval()
    texts, lengths, correct, rewards, tool_use, turns, no_answer = [], [], [], [], [], [], []
    sample = sample or _hf_sampler(model, tokenizer, eos_token_ids)
    for s in range(0, len(prompts), batch_size):
        chunk = prompts[s : s + batch_size]
        batch = _score_chunk(chunk, sample, episodes, params, tokenizer, runner, convention)
        texts += batch.texts
        rewards += batch.rewards
        correct += batch.correct
        lengths += batch.lengths
        tool_use += batch.tool_use
        turns += batch.turns
        no_answer += batch.no_answer
        say(
            f"grpokit: held-out evaluation: {len(texts)}/{len(prompts)} prompts, accuracy so far "
            f"{_mean(correct):.3f} ({time.perf_counter() - start:.0f}s)"
        )
    if was_training:
        model.train()
    return _summary(prompts, rewards, correct, lengths, tool_use, turns, no_answer)


def held_out_params(rollout: RolloutConfig) -> SamplingParams:
    """The held-out evaluation's sampling: the rollout section's settings (rollout/sampling.py, as training
    and ``grpokit eval`` build them) at temperature 0, greedy."""
    return dataclasses.replace(sampling_params(rollout), temperature=0.0)


def _hf_sampler(model, tokenizer, eos_token_ids: set[int]) -> Callable:
    """The episode loop's sampler on ``model`` itself (rollout/hf.py), decoding with ``tokenizer``."""

    def sample(contexts, group_size, p, vision=None, images=None):  # images: vLLM's; this is the hf engine
        return generate(
            model,
            contexts,
            group_size,
            p,
            eos_token_ids=eos_token_ids,
            pad_token_id=tokenizer.pad_token_id,
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            vision=vision,
        )

    return sample


def _mean(values: list[float]) -> float:
    """The mean of the graded values (NaN: ungraded, left out); NaN when none is graded."""
    graded = [v for v in values if v == v]
    return sum(graded) / len(graded) if graded else float("nan")


def _summary(prompts, rewards, correct, lengths, tool_use, turns, no_answer=()) -> dict[str, float]:
    """Accuracy and mean reward over the graded prompts, how many are ungraded, count and mean length;
    the mean reward of each ``kind``; tool use and turns of episodes."""
    n = len(prompts)
    out = {
        "accuracy": _mean(correct),
        "reward": _mean(rewards),
        "n": float(n),
        "ungraded": float(sum(r != r for r in rewards)),
        "mean_length": sum(lengths) / n,
    }
    out.update(_by_kind(prompts, rewards))
    if tool_use:
        out.update(tool_use_rate=sum(tool_use) / n, turns_mean=sum(turns) / n, no_answer_rate=sum(no_answer) / n)
    return out


@dataclass
class _Scored:
    """One chunk of held-out prompts, sampled greedily and scored by the first reward function."""

    texts: list[str]
    rewards: list[float]  # NaN where the function could not grade (answered None)
    correct: list[float]  # 1.0 where the reward is full (>= 1 - 1e-6), NaN where ungraded
    lengths: list[int]
    tool_use: list[float]
    turns: list[float]
    no_answer: list[float]  # 1.0 for an episode that ended before the model answered (on a tool's message)


def _score_chunk(chunk: list[Prompt], sample, episodes, params, tokenizer, runner, convention: str) -> _Scored:
    """Sample one completion (or episode) per prompt of ``chunk`` and score it: the completions, the
    first function's rewards (NaN where it answered None: ungraded), the model's lengths, and per episode
    its tool use and turns."""
    vision = [p.vision for p in chunk] if chunk[0].vision is not None else None
    ro = (
        episodes.run(sample, chunk, 1, params)
        if episodes is not None
        else sample([p.ids for p in chunk], 1, params, vision=vision)
    )
    comp = [tokenizer.decode(c, skip_special_tokens=True) for c in ro.completion_ids]
    columns = repeat_columns(chunk)  # no "prompt" column: only TRL's _calculate_rewards reads it (training's)
    parse = episodes.parse_message if episodes is not None else None
    scored_comp = reward_inputs(ro, comp, chunk, convention, parse)[0] if ro.episodes is None else comp
    tool_use: list[float] = []
    turns: list[float] = []
    no_answer: list[float] = []
    if ro.episodes is not None:  # episodes are scored on their conversation, as in training
        scored_comp = [e.messages for e in ro.episodes]
        tool_use = [float(e.tool_calls > 0) for e in ro.episodes]
        turns = [float(e.turns) for e in ro.episodes]
        no_answer = [float(bool(e.messages) and model_answer(e.messages) is None) for e in ro.episodes]
        if any(e.environment is not None for e in ro.episodes):
            columns["environments"] = [e.environment for e in ro.episodes]
    result = runner.score(reward_prompts(chunk, 1, convention, ro.episodes), scored_comp, ro.completion_ids, 1, columns)
    first = result.rewards_NF[:, 0]
    correct = (first >= 1 - 1e-6).float().masked_fill(first.isnan(), float("nan")).tolist()
    return _Scored(comp, first.tolist(), correct, ro.model_lengths(), tool_use, turns, no_answer)


def _by_kind(prompts: list[Prompt], rewards: list[float]) -> dict[str, float]:
    """``{"reward_<kind>": mean reward}`` per value of a string ``kind`` column (none without one); ungraded
    prompts are left out."""
    groups: dict[str, list[float]] = {}
    for p, r in zip(prompts, rewards):
        kind = p.columns.get("kind")
        if isinstance(kind, str) and kind.isidentifier():
            groups.setdefault(kind, []).append(r)
    return {f"reward_{k}": _mean(v) for k, v in sorted(groups.items())}
