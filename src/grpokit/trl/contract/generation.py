"""A subclass's ``_generate_and_score_completions`` as grpokit's stages 1-4 (hooks.py says when).

TRL calls it once per generation batch with the batch's rows (each prompt repeated G times) and
trains on the dict it returns. ``TrlGenerate`` sits in the Trainer's ``sample_and_score`` slot: it
draws the step's prompts, passes them as TRL's rows to the trainer's method and keeps the dict the
subclass returned as the generation batch the loss stage (stages.TrlLoss) trains on.
grpokit.trl's own method (``super()``) samples and scores through grpokit's stages and returns TRL's
dict; its scored batch is what the step records.
"""

from __future__ import annotations

from typing import Any

import torch

from grpokit.config.sections import ConfigError
from grpokit.rollout.finish import end_ids, finish_by_last_token

from .stages import batch_rows, row_values, trl_batch

TRL_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")


def trl_rows(prompts: list, G: int) -> list[dict[str, Any]]:
    """TRL's ``inputs``: one row per completion, the prompt as the dataset holds it and its other columns."""
    return [{"prompt": p.raw if p.raw is not None else p.text, **p.columns} for p in prompts for _ in range(G)]


class TrlGenerate:
    """The Trainer's ``sample_and_score`` through the trainer's ``_generate_and_score_completions``."""

    def __init__(self, facade: Any, trainer: Any):
        self.facade, self.trainer, self.sample_and_score = facade, trainer, trainer.sample_and_score

    def __call__(self, prompts: Any, group_size: int):
        from grpokit.train import engines

        f, t = self.facade, self.trainer
        if isinstance(prompts, int):  # this rank's slice of the step's prompts
            prompts, _ = engines.next_prompts(t.engine, t.sampler, t.dist, prompts, group_size)
        if not prompts:
            return self.sample_and_score(prompts, group_size)
        f._gen_call, f._gen_scored = (self.sample_and_score, prompts, group_size), None
        try:
            out = f._generate_and_score_completions(trl_rows(prompts, group_size))
        finally:
            f._gen_call = None
        sb = f._gen_scored
        if sb is None:
            raise ConfigError(
                "_generate_and_score_completions must call super()._generate_and_score_completions under "
                "grpokit.trl (grpokit samples and scores there); change its result instead"
            )
        _check(out, len(sb.texts))
        if not f._evaluating:
            f._generation_batch = out  # the loss stage trains on the subclass's dict
            k = f.args.steps_per_generation or f.args.gradient_accumulation_steps
            f._buffered_inputs = split_rows(out, k)
        return sb


def _check(out: Any, n: int) -> None:
    if not isinstance(out, dict) or any(k not in out for k in TRL_KEYS):
        raise ConfigError(
            f"_generate_and_score_completions returned {type(out).__name__} without TRL's keys; TRL's contract is "
            f"a dict with {', '.join(TRL_KEYS)}"
        )
    for key, value in out.items():  # TRL cuts every tensor and list with the rows (stages.row_values)
        rows = (value.shape[0] if isinstance(value, torch.Tensor) else len(value)) if row_values(value) else n
        if rows != n:
            raise ConfigError(
                f"_generate_and_score_completions returned {key!r} with {rows} rows for {n} completions; TRL cuts "
                "every tensor, list and tuple of the batch with its rows, so each needs one row per completion (a "
                "value for the whole batch: a 0-dim tensor or a number)"
            )


def split_rows(batch: dict[str, Any], k: int) -> list[dict[str, Any]]:
    """TRL's ``_buffered_inputs``: the generation batch cut into ``k`` equal dicts of rows (lists too)."""
    n = batch["completion_ids"].shape[0]
    each = max(1, n // max(1, k))
    return [batch_rows(batch, slice(s, s + each)) for s in range(0, n, each)]


def generate_and_score(facade: Any, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """grpokit.trl's own ``_generate_and_score_completions``: the rows' prompts sampled G times and
    scored by grpokit's stages, the step's log-probabilities and advantages; TRL's batch dict back."""
    from grpokit.algo.pipeline import update_inputs

    t = facade._get()
    if facade._gen_call is None:  # called directly: TRL's rows, each prompt repeated num_generations times
        G = facade.args.num_generations
        rows = [{k: v for k, v in r.items()} for r in group_rows(inputs, G)]
        prompts = t.make_prompts(rows, "the inputs")
        call = (getattr(t.sample_and_score, "sample_and_score", t.sample_and_score), prompts, G)
    else:
        call = facade._gen_call
    sample, prompts, G = call
    sb = sample(prompts, G)
    settings = t._step_settings()
    # the loop's own passes (pi_old as it takes it, the reference or the teacher's top-k), kept for the loop's
    # step_logprobs of the same batch, which then repeats neither
    batch, logprobs = t.step_logprobs(sb, settings, keep=facade._gen_call is not None)
    upd = update_inputs(settings, sb, batch, logprobs)
    facade._gen_scored = sb
    return trl_batch(upd, slice(None), float(upd.loss_mask.sum().item()))


def group_rows(inputs: list[dict[str, Any]], G: int) -> list[dict[str, Any]]:
    """The first row of each group of ``G`` consecutive rows (TRL's rows repeat each prompt num_generations
    times); rows that do not fall in such groups are refused, since grpokit samples G completions of each
    group's one prompt."""
    odd = next((i for i in range(len(inputs)) if inputs[i].get("prompt") != inputs[i - i % G].get("prompt")), None)
    if len(inputs) % G or odd is not None:
        where = f"row {odd}'s prompt differs from row {odd - odd % G}'s" if odd is not None else f"{len(inputs)} rows"
        raise ConfigError(
            f"_generate_and_score_completions was called with {where}; grpokit samples num_generations={G} "
            "completions of each prompt, so pass each prompt num_generations times in a row (TRL's inputs)"
        )
    return inputs[::G]


class TrlSingleTurn:
    """Stage 2 through the trainer's ``_generate_single_turn`` (a ``rollout_func`` in grpokit's slot for
    TRL's): the rows' prompts tokenized by ``_tokenize_prompts``, one row per completion as TRL passes
    them, the subclass's ``(completion_ids, logprobs)`` the rollout."""

    def __init__(self, facade: Any):
        self.facade = facade

    def __call__(self, prompts: list, trainer: Any) -> dict[str, Any]:
        f = self.facade
        G = (f.args.num_generations_eval or f.args.num_generations) if f._evaluating else f.args.num_generations
        rows = [p for p in prompts for _ in range(G)]
        prompt_ids, images, fields = f._tokenize_prompts(rows)
        f._turn_finish = None
        completion_ids, logprobs = f._generate_single_turn(prompt_ids, images, fields, G)
        reasons = turn_finish_reasons(
            completion_ids, f._turn_finish, end_ids(trainer.eos, trainer.tokenizer.pad_token_id)
        )
        if logprobs is None:  # TRL's transformers path: no sampling log-probabilities (grpokit's placeholder zeros)
            logprobs = [[0.0] * len(c) for c in completion_ids]
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [list(c) for c in completion_ids],
            "logprobs": [list(lp) for lp in logprobs],
            "finish_reasons": reasons,
        }


def turn_finish_reasons(
    completion_ids: list, sampled: tuple[list, list[str]] | None, ends: frozenset[int]
) -> list[str]:
    """The finish reason of each completion a ``_generate_single_turn`` returned: the engine's where the
    completion is the one ``super()`` sampled (``sampled``: its completions and reasons), else TRL's
    last-token rule (rollout/finish.py), for completions the subclass made or changed."""
    by_rule = finish_by_last_token(completion_ids, ends)
    if sampled is None or len(sampled[0]) != len(completion_ids):
        return by_rule
    return [r if list(c) == list(s) else rule for c, s, r, rule in zip(completion_ids, *sampled, by_rule)]


def generate_single_turn(facade: Any, prompt_ids: list, num_generations: int):
    """grpokit.trl's own ``_generate_single_turn``: one completion per row of ``prompt_ids`` (TRL repeats
    each prompt num_generations times before), sampled by grpokit's engine on the policy;
    ``(completion_ids, logprobs)`` as TRL returns them."""
    t = facade._get()
    with torch.no_grad():
        ro = t.turn_sampler(t.model)([list(p) for p in prompt_ids], 1, t.params)
    facade._turn_finish = ([list(c) for c in ro.completion_ids], list(ro.finish_reasons))
    return ro.completion_ids, ro.sampling_logprobs
