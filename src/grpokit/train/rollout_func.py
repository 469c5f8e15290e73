"""TRL's ``rollout_func`` convention: a user function that samples in place of the engine, its dict
turned into a Rollout, and the extra columns it returns logged beside each completion.
"""

from __future__ import annotations

from typing import Callable

from grpokit.config.sections import ConfigError
from grpokit.rollout.finish import FINISH_REASONS, finish_by_last_token
from grpokit.types import Episode, Rollout, grouped_prompts


def call_rollout_func(fn: Callable, trainer, prompts, group_size: int, ends: frozenset[int]):
    """TRL's ``rollout_func(prompts, trainer) -> dict``: ``prompt_ids`` (one per completion, TRL's, or one
    per prompt), ``completion_ids`` and ``logprobs`` (G per prompt, grouped), optional ``env_mask``
    (1 on the model's tokens, 0 on the environment's) and ``finish_reasons`` (grpokit's, one per
    completion; without it, TRL's rule: cut unless the last token is one of ``ends``, rollout/finish.py);
    other keys go to the reward functions (``extra_columns``). A completion trains on its own prompt,
    as TRL's: where the rows of a group were given different prompts, each row keeps its own."""
    out = fn([p.raw if p.raw is not None else p.text for p in prompts], trainer)
    missing = sorted({"prompt_ids", "completion_ids", "logprobs"} - set(out))
    if missing:
        raise ConfigError(f"rollout_func must return the keys {missing} in its dict (TRL's convention)")
    comps, N = out["completion_ids"], len(prompts) * group_size
    if len(comps) != N:
        raise ConfigError(
            f"rollout_func returned {len(comps)} completions for {len(prompts)} prompts; "
            f"it must return group_size={group_size} per prompt, grouped"
        )
    group_pids, row_pids = _prompt_ids(out["prompt_ids"], len(prompts), group_size)
    mask = out.get("env_mask")
    episodes = [Episode(list(m), [0] * len(m)) for m in mask] if mask is not None else None
    ro = Rollout(
        group_pids,
        [list(c) for c in comps],
        [list(lp) for lp in out["logprobs"]],
        _finish_reasons(out, comps, ends),
        group_size,
        episodes,
        row_prompt_ids=row_pids,
    )
    return ro, extra_columns(out, N)


def _prompt_ids(pids, P: int, G: int) -> tuple[list[list[int]], list[list[int]] | None]:
    """Each group's prompt ids and, where the rows of some group were given different prompts (TRL trains each
    completion on its own row of ``prompt_ids``), every row's; None when each group's rows share theirs."""
    pids = [list(p) for p in pids]
    if len(pids) not in (P, P * G):
        raise ConfigError(
            f"rollout_func returned {len(pids)} prompt_ids for {P} prompts x group_size={G}; give one per "
            f"completion ({P * G}, TRL's convention) or one per prompt ({P})"
        )
    return (pids, None) if len(pids) == P else grouped_prompts(pids, G)


ROLLOUT_KEYS = ("prompt_ids", "completion_ids", "logprobs", "env_mask", "finish_reasons")


def extra_columns(out: dict, n: int) -> dict[str, list]:
    """The dict's other keys as reward columns of ``n`` rows, by TRL's rule: a list gives one value per
    completion, any other value (a string, a number, a tuple ...) is every completion's."""
    extra = {}
    for key, value in out.items():
        if key in ROLLOUT_KEYS:
            continue
        if not isinstance(value, list):
            extra[key] = [value] * n
        elif len(value) == n:
            extra[key] = list(value)
        else:
            raise ConfigError(
                f"rollout_func returned {key!r} as a list of {len(value)} values for {n} completions; a list "
                "gives one value per completion (TRL's rule), any other value (a string, a number) goes to every one"
            )
    return extra


def _finish_reasons(out: dict, comps: list, ends: frozenset[int]) -> list[str]:
    """The dict's ``finish_reasons`` (checked: one known reason per completion), else each completion's
    by its last token, as TRL decides which completions were truncated."""
    reasons = out.get("finish_reasons")
    if reasons is None:
        return finish_by_last_token(comps, ends)
    reasons = list(reasons)
    if len(reasons) != len(comps):
        raise ConfigError(
            f"rollout_func returned {len(reasons)} finish_reasons for {len(comps)} completions; give one per "
            "completion, or leave the key out (a completion then ended when its last token is EOS or pad)"
        )
    unknown = sorted({str(r) for r in reasons} - set(FINISH_REASONS))
    if unknown:
        raise ConfigError(
            f"rollout_func returned finish_reasons {unknown[:3]}; each must be one of {', '.join(FINISH_REASONS)} "
            '("length": cut by the length limit)'
        )
    return reasons


def add_logged_columns(rows: list[dict], extra: dict[str, list], group_size: int) -> list[dict]:
    """Put reward functions' ``log_extra`` values beside each completion of sample rows (row p holds
    completions p*G .. p*G+G-1), as TRL adds them to its completions table."""
    for p, row in enumerate(rows):
        for g, comp in enumerate(row["completions"]):
            logged = {k: v[p * group_size + g] for k, v in extra.items() if v[p * group_size + g] is not None}
            if logged:
                comp["extra"] = logged
    return rows
