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

A prompt within the context can still leave no room for its completion: the longest prompt and what
may follow it (``rollout.max_new_tokens``; an episode of several turns: ``env.max_episode_tokens``
when larger, unbounded when it is 0) are measured against the context too. What then happens depends on
what samples and on the loaded model, so that is what decides:

- a model with a learned table of positions (an ``nn.Embedding`` of positions with a row per position of
  the context: GPT-2's ``wpe``, OPT's and BioGPT's ``embed_positions`` with their offset of 2) has no
  position past it and would fail mid-run (IndexError): refused at start;
- ``backend=vllm_server``: the server rejects a request whose prompt and ``max_tokens`` pass its
  ``max_model_len`` (HTTP 400), which would end the run mid-step: refused at start;
- ``backend=vllm`` (colocated): vLLM stops a completion at ``max_model_len``, so the longest are cut
  there: warned once;
- any other model (rotary, ALiBi, sinusoidal, or no positions at all: Mamba, RWKV, Jamba ...) runs past
  the context, untrained there: warned once.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from grpokit.config.sections import Config, ConfigError
from grpokit.types import Prompt

log = logging.getLogger("grpokit")


@dataclass(frozen=True)
class Room:
    """The most tokens a sequence holds after its prompt, and the setting that says so."""

    tokens: int  # 0 with ``unbounded``
    setting: str  # the field, e.g. "rollout.max_new_tokens"
    unbounded: bool = False  # env.max_episode_tokens=0 on episodes of several turns: no cap at all

    def __str__(self) -> str:
        return f"{self.setting} {self.tokens}" if self.setting.startswith("--") else f"{self.setting}={self.tokens}"


def _text_config(model):
    config = getattr(model, "config", None)
    return getattr(config, "get_text_config", lambda: config)() if config is not None else None


def model_context(model, cfg: Config, engine: str | None = None) -> int:
    """The model's context in tokens (0 when it does not say); ``engine`` overrides rollout.backend."""
    if (engine or cfg.rollout.backend) == "vllm" and cfg.rollout.vllm_max_model_len:
        return cfg.rollout.vllm_max_model_len
    n = getattr(_text_config(model), "max_position_embeddings", 0)
    return n if isinstance(n, int) and n > 0 else 0


def learned_positions(model) -> bool:
    """Whether the loaded model looks its positions up in a table: an ``nn.Embedding`` named for positions
    (a name holding "pos", or ending "wpe" / "embed_positions") with a row per position of the context
    (``max_position_embeddings``, or 2 more for OPT's offset). A sequence longer than the table fails
    (IndexError) instead of running past it; no such table (rotary, ALiBi, sinusoidal, no positions): False."""
    import torch

    n = getattr(_text_config(model), "max_position_embeddings", None)
    if not isinstance(n, int) or n <= 0 or not isinstance(model, torch.nn.Module):
        return False
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        named = "pos" in leaf or leaf.endswith(("wpe", "embed_positions"))
        if named and isinstance(module, torch.nn.Embedding) and module.num_embeddings in (n, n + 2):
            return True
    return False


def overrun(cfg: Config, model, engine: str | None = None) -> str:
    """What a sequence past the context does (see the module docstring): "learned" (IndexError), "vllm_server"
    (HTTP 400), "vllm" (cut at max_model_len) or "runs_past"; ``engine`` overrides rollout.backend."""
    if learned_positions(model):
        return "learned"
    backend = engine or cfg.rollout.backend
    return backend if backend in ("vllm", "vllm_server") else "runs_past"


def completion_room(cfg: Config, max_new_tokens: int, multi_turn: bool, eval_flag: bool = False) -> Room:
    """What may follow a prompt: ``max_new_tokens`` (the largest a run's stages use; ``eval_flag``: grpokit
    eval's --max-new-tokens), or for episodes of several turns with tools or an environment
    ``env.max_episode_tokens`` when larger (their cap on the model's and the environment's tokens together;
    0: unbounded)."""
    e = cfg.env
    if multi_turn and e.max_turns != 1 and e.max_episode_tokens == 0:  # episodes capped by nothing
        return Room(0, "env.max_episode_tokens", unbounded=True)
    if multi_turn and e.max_turns != 1 and e.max_episode_tokens > max_new_tokens:
        return Room(e.max_episode_tokens, "env.max_episode_tokens")
    return Room(max_new_tokens, "--max-new-tokens" if eval_flag else "rollout.max_new_tokens")


def prompt_limit(cfg: Config, model) -> tuple[int, str]:
    """(limit, what set it); limit 0 = none known."""
    if cfg.rollout.max_prompt_tokens > 0:
        return cfg.rollout.max_prompt_tokens, f"rollout.max_prompt_tokens={cfg.rollout.max_prompt_tokens}"
    n = model_context(model, cfg)
    return n, f"the model's context of {n} tokens"


TRAIN_FIX = (
    "shorten them, raise rollout.max_prompt_tokens within the model's context, or set rollout.truncate_prompts=true "
    "to keep each one's last tokens"
)


def limit_prompts(
    prompts: list[Prompt], limit: int, why: str, truncate: bool, which: str, fix: str = TRAIN_FIX
) -> tuple[list[Prompt], int]:
    """``prompts`` within ``limit`` tokens, and how many were cut; raises ConfigError (refusal, ending in ``fix``)."""
    long = [k for k, p in enumerate(prompts) if limit and len(p.ids) > limit]
    if not long:
        return prompts, 0
    worst = max(long, key=lambda k: len(prompts[k].ids))
    if not truncate or any(prompts[k].vision is not None for k in long):
        raise ConfigError(
            f"{len(long)} of {len(prompts)} {which} prompts are longer than {why} (the longest, row {worst}, "
            f"has {len(prompts[worst].ids)} tokens); {fix}"
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


OVERRUN = {  # what a sequence past the context does, as check_room says it
    "learned": "whose positions are a learned table with no row past it",
    "vllm_server": "which the vLLM server refuses (HTTP 400, which would end the run mid-step)",
}
WARNED = {
    "vllm": "vLLM stops a completion at its max_model_len, so the completions that long will be cut there",
    "runs_past": "this model's positions run past it, but it was not trained there, so the completions that long "
    "may degrade",
}


def check_room(sets: dict[str, list[Prompt]], context: int, room: Room, kind: str, cuts: bool = True) -> None:
    """Refuse (``kind`` "learned" or "vllm_server", see ``overrun``) or warn once when the longest prompt of
    ``sets`` ({"training": prompts, ...}) and ``room`` pass the ``context`` (0: unknown, nothing checked);
    ``cuts``: the advice names rollout.truncate_prompts (grpokit eval cuts no prompt)."""
    rows = [(len(p.ids), k, which) for which, ps in sets.items() for k, p in enumerate(ps)]
    if not context or not rows or (not room.unbounded and max(rows)[0] + room.tokens <= context):
        return
    n, row, which = max(rows, key=lambda r: r[0])
    if room.unbounded:  # an episode of several turns capped by nothing: it may pass any context
        if kind == "learned":
            raise ConfigError(
                f"env.max_episode_tokens=0 puts no cap on an episode of several turns, so one can run past the "
                f"model's context of {context}, {OVERRUN[kind]}; set env.max_episode_tokens to at most "
                f"{max(1, context - n)} (the context less the longest {which} prompt, row {row}, {n} tokens)"
            )
        return
    said = (
        f"the longest {which} prompt (row {row}, {n} tokens) and {room} make {n + room.tokens} tokens, more than "
        f"the model's context of {context}"
    )
    fix = f"shorten the prompts or lower {room.setting}" + (
        f", or cut them with rollout.truncate_prompts=true and rollout.max_prompt_tokens={context - room.tokens}"
        if cuts and context > room.tokens
        else ""
    )
    if kind in OVERRUN:
        raise ConfigError(f"{said}, {OVERRUN[kind]}; {fix}")
    log.warning("grpokit: warning: %s; %s; %s", said, WARNED[kind], fix)


def check_prompt_lengths(
    cfg: Config, model, prompts: list[Prompt], eval_prompts: list[Prompt], room: Room | None = None
):
    """The training and evaluation prompts within the run's limit: (prompts, eval_prompts, cut); with
    ``room`` (what may follow a prompt), each with its completion within the model's context too."""
    limit, why = prompt_limit(cfg, model)
    prompts, cut = limit_prompts(prompts, limit, why, cfg.rollout.truncate_prompts, "training")
    eval_prompts, cut_eval = limit_prompts(eval_prompts, limit, why, cfg.rollout.truncate_prompts, "evaluation")
    if room is not None:
        sets = {"training": prompts, "evaluation": eval_prompts}
        check_room(sets, model_context(model, cfg), room, overrun(cfg, model))
    return prompts, eval_prompts, cut + cut_eval


def check_eval_prompts(cfg: Config, model, prompts: list[Prompt], room: Room) -> None:
    """``grpokit eval``'s prompts (it cuts none), each with what may follow it (``room``), within the model's
    context: refused in one sentence, or warned about once, as a training run's."""
    context = model_context(model, cfg, engine="hf")  # grpokit eval samples with transformers
    limit_prompts(prompts, context, f"the model's context of {context} tokens", False, "evaluation", "shorten them")
    check_room({"evaluation": prompts}, context, room, overrun(cfg, model, engine="hf"), cuts=False)
