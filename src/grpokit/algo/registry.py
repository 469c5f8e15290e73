"""Registries of the algorithm's stages: advantage estimators, objectives and token masks by the
name the config gives them.

Every built-in stage is a small pure function registered here under its config name; a user adds
one the same way, from their own module::

    import grpokit.algo

    @grpokit.algo.register_advantage("my_adv")
    def my_adv(ctx):                     # ctx: contexts.AdvantageContext
        return ctx.rewards_N - ctx.rewards_N.mean(), {}

and selects it with ``algo.advantage=my_adv`` (once the module is imported), or without the
decorator with ``algo.advantage=my_module:my_adv`` (imported on first use). Likewise
``algo.objective`` (``fn(ratio_NT, adv_NT, logp_NT, clip: ClipSettings) -> objective_NT``, the
per-token value to maximise) and ``algo.token_masks`` (``fn(ctx: MaskContext) -> mask_NT``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from .settings import no_clipping

ADVANTAGES: dict[str, Callable] = {}
OBJECTIVE_FNS: dict[str, Callable] = {}
TOKEN_MASKS: dict[str, Callable] = {}
REWARD_STAGES: dict[str, Callable] = {}  # (ctx: StageContext, rewards_N) -> (rewards_N, metrics), before the estimator
ADVANTAGE_STAGES: dict[str, Callable] = {}  # (ctx: StageContext, advantages) -> (advantages, metrics), after it
POLICY_WEIGHTS: dict[str, Callable] = {}  # (ctx: StageContext) -> (weight_NT, metrics): a factor of the policy term
_KINDS = {
    "advantage": ADVANTAGES,
    "objective": OBJECTIVE_FNS,
    "token mask": TOKEN_MASKS,
    "reward stage": REWARD_STAGES,
    "advantage stage": ADVANTAGE_STAGES,
    "policy weight": POLICY_WEIGHTS,
}


@dataclass(frozen=True)
class StageSpec:
    """What an advantage estimator, token mask, reward stage, advantage stage or policy weight declares beside its
    function, so that the pipeline and validation read the declaration instead of branching on its
    name. A plugin registered without one is ``UNDECLARED_STAGE``: the step takes every
    log-probability for it."""

    declared: bool = True  # False: its needs are unknown, so the step takes pi_old and the entropies for it
    needs_old: bool = False  # it reads pi_old's log-probabilities (LogProbs.old)
    needs_entropy: bool = False  # it reads pi_old's token entropies (LogProbs.entropy); implies needs_old
    active: Callable[[Any], bool] | None = None  # StepSettings -> whether it runs (None: when the config names it)
    params: Callable[..., Any] | None = None  # its own parameters: a record whose field names are its config fields
    config_errors: Callable[[Any], list[str]] | None = None  # Config -> one sentence per wrong value of its own
    # a token mask only: it narrows the policy term alone (UpdateInputs.policy_mask: the surrogate and the entropy
    # bonus), its tokens keeping their KL and their place in the normalisers (the entropy top-fraction, as TRL);
    # False: it narrows the loss mask, as if its tokens had never been sampled (DAPO's overlong filter)
    policy_only: bool = False


UNDECLARED_STAGE = StageSpec(declared=False)
STAGE_SPECS: dict[str, dict[str, StageSpec]] = {kind: {} for kind in _KINDS if kind != "objective"}


def _register(table: dict[str, Callable], name: str, spec: StageSpec | None = None) -> Callable[[Callable], Callable]:
    kind = next(k for k, t in _KINDS.items() if t is table)
    if spec is not None:
        STAGE_SPECS[kind][name] = spec

    def add(fn: Callable) -> Callable:
        table[name] = fn
        return fn

    return add


def register_advantage(name: str, spec: StageSpec = UNDECLARED_STAGE) -> Callable[[Callable], Callable]:
    """Decorator: ``fn(ctx: AdvantageContext) -> (advantages (N,) or (N, T), metrics)`` under ``name``,
    chosen with ``algo.advantage=name``; ``spec`` declares its needs and its own config checks."""
    return _register(ADVANTAGES, name, spec)


def stage_spec(kind: str, name: str) -> StageSpec:
    """The declaration of the ``kind`` stage ``name`` (``UNDECLARED_STAGE`` for a plugin that gave none)."""
    return STAGE_SPECS[kind].get(name, UNDECLARED_STAGE)


def active_stages(kind: str, settings: Any) -> list[str]:
    """The ``kind`` stages whose own switch (``StageSpec.active``) is on for ``settings``, in
    registration order: the built-in stages turned on by their config fields."""
    return [n for n, spec in STAGE_SPECS[kind].items() if spec.active is not None and spec.active(settings)]


@dataclass(frozen=True)
class ObjectiveSpec:
    """What an objective declares beside its function, so that the pipeline, the loss and validation
    read the declaration instead of branching on its name. A plugin registered without one is
    ``UNDECLARED``: it gets every log-probability and PPO's clip metrics."""

    declared: bool = True  # False: its needs are unknown, so the step takes pi_old and the entropies for it
    params: Callable[[Any], Any] | None = None  # AlgoConfig -> its own parameters (ClipSettings.params); None: none
    config_errors: Callable[[Any], list[str]] | None = None  # AlgoConfig -> one sentence per wrong field of its own
    min_clip_high: float = 0.0  # the lowest algo.clip_high it accepts
    # which tokens it clips: (ratio, adv, mask, clip) -> (low, high, extra), boolean (N, T) each; extra maps a
    # metric name to such a flag (counted as the clip ratios are: loss.clip_metrics) or to a number; None: PPO's
    clipped: Callable | None = None
    metrics: Callable | None = None  # (ratio, adv, clip) -> extra metrics of its own
    sampler_weight: Callable | None = (
        None  # TIS weights (N, T) -> a log weight (N,) joining its ratio (None: TIS weighs the policy term)
    )
    # the shared clip fields it reads (CLIP_FIELDS: algo.clip_low, algo.clip_high); validation refuses the others
    # set away from their defaults. None: what ``clipped`` says, none for ``no_clipping`` (a smooth weight clips
    # nothing: SAPO, VESPO), both otherwise; an objective that reads one of them declares it (CISPO)
    clip_fields: tuple[str, ...] | None = None

    def reads_clip(self) -> tuple[str, ...]:
        """The shared clip fields this objective reads (an undeclared plugin: both, as nothing is known)."""
        if self.clip_fields is not None:
            return self.clip_fields
        return () if self.clipped is no_clipping else CLIP_FIELDS


CLIP_FIELDS = ("clip_low", "clip_high")
"""The algo fields of the shared clip range, ``1 - clip_low <= ratio <= 1 + clip_high`` (PPO's, DAPO's clip-higher)."""


UNDECLARED = ObjectiveSpec(declared=False)
OBJECTIVE_SPECS: dict[str, ObjectiveSpec] = {}


def register_objective(name: str, spec: ObjectiveSpec = UNDECLARED) -> Callable[[Callable], Callable]:
    """Decorator: ``fn(ratio_NT, adv_NT, logp_NT, clip: ClipSettings) -> (N, T)`` to maximise, under
    ``name``; ``spec`` declares its parameters, checks and needs (``clip.params`` holds its parameters)."""
    OBJECTIVE_SPECS[name] = spec
    return _register(OBJECTIVE_FNS, name)


def objective_spec(name: str) -> ObjectiveSpec:
    """The declaration of objective ``name`` (``UNDECLARED`` for a plugin that gave none, or an import path)."""
    return OBJECTIVE_SPECS.get(name, UNDECLARED)


def register_token_mask(name: str, spec: StageSpec = UNDECLARED_STAGE) -> Callable[[Callable], Callable]:
    """Decorator: ``fn(ctx: MaskContext) -> mask_NT`` (a narrower mask) under ``name``, applied when listed
    in ``algo.token_masks`` or when ``spec.active`` says so (the built-in ones); it narrows the loss mask,
    or only the policy term with ``StageSpec(policy_only=True)``."""
    return _register(TOKEN_MASKS, name, spec)


def register_reward_stage(name: str, spec: StageSpec = UNDECLARED_STAGE) -> Callable[[Callable], Callable]:
    """Decorator: ``fn(ctx: StageContext, rewards_N) -> (rewards_N, metrics)``, run before the estimator
    while ``spec.active(settings)``."""
    return _register(REWARD_STAGES, name, spec)


def register_advantage_stage(name: str, spec: StageSpec = UNDECLARED_STAGE) -> Callable[[Callable], Callable]:
    """Decorator: ``fn(ctx: StageContext, advantages) -> (advantages, metrics)``, run after the estimator
    while ``spec.active(settings)``."""
    return _register(ADVANTAGE_STAGES, name, spec)


def register_policy_weight(name: str, spec: StageSpec = UNDECLARED_STAGE) -> Callable[[Callable], Callable]:
    """Decorator: ``fn(ctx: StageContext) -> (weight_NT, metrics)``, a per-token factor (>= 0) of the policy
    term, run while ``spec.active(settings)``: the sampler corrections (TIS, IcePop / MIS) weigh each token's
    objective as TRL multiplies its per-token loss by the importance sampling ratio, leaving the advantages
    (whose sign the clip metrics and the off-policy mask read) as the estimator gave them."""
    return _register(POLICY_WEIGHTS, name, spec)


def is_import_path(name: str) -> bool:
    return ":" in name and all(name.split(":", 1))


def lookup(kind: str, name: str) -> Callable:
    """The ``kind`` stage registered as ``name``, or ``module:function`` imported. An unknown name
    raises ValueError with one sentence that lists the registered names."""
    table = _KINDS[kind]
    if name in table:
        return table[name]
    if is_import_path(name):
        module, attr = name.split(":", 1)
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(
                f"{kind} {name!r} could not be imported ({e}); give a module:function on sys.path "
                f"or one of: {', '.join(registered(kind))}"
            ) from None
        table[name] = fn
        return fn
    raise ValueError(f"unknown {kind} {name!r}; choose one of: {', '.join(registered(kind))} (or a module:function)")


def registered(kind: str) -> list[str]:
    """The names registered for ``kind``, built-ins first, in registration order (no import paths)."""
    return [n for n in _KINDS[kind] if not is_import_path(n)]
