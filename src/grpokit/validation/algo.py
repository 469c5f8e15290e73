"""algo.*: the registered stages the config names and their own checks, the objective, the
KL, the aggregation and the numeric ranges of clipping.
"""

from __future__ import annotations

import dataclasses

from grpokit.algo import estimators  # noqa: F401  (registers the built-in stages)
from grpokit.algo.advantages import BASELINES, SCALES, STD_KINDS
from grpokit.algo.loss import AGGREGATIONS, ENTROPY_AGGREGATIONS, KL_ESTIMATORS
from grpokit.algo.masks import TRUNCATION_RULES
from grpokit.algo.pipeline import KL_PLACEMENTS
from grpokit.algo.ratio import RATIO_LEVELS
from grpokit.algo.registry import CLIP_FIELDS, STAGE_SPECS, is_import_path, lookup, objective_spec, registered
from grpokit.config.algo import UNREAD_UNLESS, Unread
from grpokit.config.sections import AlgoConfig, Config, ConfigError, RolloutConfig
from grpokit.rollout.gec import MODES as GEC_MODES

from .checks import check, one_of, unread


def registered_stage(field: str, kind: str, name: str) -> None:
    """A stage the registry knows (or can import as module:function): one sentence otherwise."""
    if is_import_path(name):
        try:
            lookup(kind, name)
        except ValueError as e:
            raise ConfigError(f"{field}: {e}") from None
    else:
        check(
            name in registered(kind),
            f"{field}={name!r} is not valid; choose one of: {', '.join(registered(kind))} (or a module:function)",
        )


def check_stages(cfg: Config) -> None:
    """The registered stages the config names, then every registered stage's own checks
    (``StageSpec.config_errors``, ``ObjectiveSpec.config_errors``): the values it reads, and the pairs
    it would silently ignore (tests/algo/test_combinations.py's table found them)."""
    a = cfg.algo
    registered_stage("algo.advantage", "advantage", a.advantage)
    registered_stage("algo.objective", "objective", a.objective)
    for name in a.token_masks:
        registered_stage("algo.token_masks", "token mask", name)
    for specs in STAGE_SPECS.values():
        for spec in specs.values():
            for message in spec.config_errors(cfg) if spec.config_errors is not None else []:
                check(False, message)
    for name in registered("objective"):
        errors = objective_spec(name).config_errors
        for message in errors(a) if errors is not None else []:
            check(False, message)


def check_algo_objective(cfg: Config) -> None:
    """algo.*: advantage estimator, objective, aggregation and KL."""
    a, t = cfg.algo, cfg.train
    one_of("algo.baseline", a.baseline, BASELINES)
    one_of("algo.scale", a.scale, SCALES)
    one_of("algo.std", a.std, STD_KINDS)
    one_of("algo.ratio_level", a.ratio_level, RATIO_LEVELS)
    one_of("algo.truncated_by", a.truncated_by, TRUNCATION_RULES)
    check_stages(cfg)
    one_of("algo.kl_estimator", a.kl_estimator, KL_ESTIMATORS)
    one_of("algo.aggregation", a.aggregation, AGGREGATIONS)
    check(
        a.lambda_lr > 0 and a.lambda_r > 0,
        f"algo.lambda_lr={a.lambda_lr} and algo.lambda_r={a.lambda_r} must be > 0 (defaults 0.01 and 0.1111)",
    )
    check(
        a.aggregation != "lambda-grpo" or not t.fsdp,
        "algo.aggregation=lambda-grpo keeps lambda outside the sharded model; set train.fsdp=false",
    )
    one_of("algo.kl_placement", a.kl_placement, tuple(KL_PLACEMENTS))
    one_of("algo.entropy_aggregation", a.entropy_aggregation, ENTROPY_AGGREGATIONS)
    check(
        not a.entropy_adaptive or (a.entropy_coef_delta >= 0 and 0 <= a.entropy_coef_min <= a.entropy_coef_max),
        f"algo.entropy_coef_delta={a.entropy_coef_delta}, algo.entropy_coef_min={a.entropy_coef_min} and "
        f"algo.entropy_coef_max={a.entropy_coef_max} must satisfy delta >= 0 and 0 <= min <= max (defaults 0.005, 0, "
        "1)",
    )
    check(a.kl_clamp >= 0, f"algo.kl_clamp={a.kl_clamp} must be >= 0 (0 = off; verl uses 10)")
    check(
        0 <= a.loss_temperature < float("inf"),
        f"algo.loss_temperature={a.loss_temperature} must be a finite number > 0, or 0 (rollout.temperature's)",
    )
    check(
        not (a.kl_bias_correction and a.kl_placement == "reward" and a.beta > 0),
        "algo.kl_bias_correction weights the KL term of the loss, and algo.kl_placement=reward puts the KL in the "
        "reward instead; set algo.kl_bias_correction=false or algo.kl_placement=loss",
    )


def check_sampling_and_shaping(cfg: Config) -> None:
    """GFPO, dynamic sampling, error correction, EDGE's entropy advantage and the reference refresh."""
    r, a = cfg.rollout, cfg.algo
    one_of("rollout.gfpo_criterion", r.gfpo_criterion, ("length", "token_efficiency"))
    check(
        r.sample_group_size == 0 or r.sample_group_size > r.group_size,
        f"rollout.sample_group_size={r.sample_group_size} must be 0 (off) or larger than "
        f"rollout.group_size={r.group_size}",
    )
    check(
        not r.gfpo_adaptive or r.sample_group_size > 0,
        "rollout.gfpo_adaptive needs rollout.sample_group_size > group_size",
    )
    default = RolloutConfig()  # GFPO's other settings, read only with it: refused rather than ignored
    if not r.sample_group_size:
        why = "with rollout.sample_group_size=0 (GFPO off)"
        unread("rollout", r, default, ("gfpo_criterion",), why, "set rollout.sample_group_size > group_size")
    if not r.gfpo_adaptive:
        why = "with rollout.gfpo_adaptive=false"
        unread("rollout", r, default, ("gfpo_adaptive_threshold",), why, "set rollout.gfpo_adaptive=true")
    check(a.max_sampling_rounds >= 1, f"algo.max_sampling_rounds={a.max_sampling_rounds} must be at least 1")
    check(
        a.entropy_advantage_max_scale >= 0,
        f"algo.entropy_advantage_max_scale={a.entropy_advantage_max_scale} must be >= 0 (0 = no cap)",
    )
    one_of("algo.error_correction", a.error_correction, GEC_MODES)
    check(
        a.error_correction == "off" or ":" in a.error_correction_fn,
        f"algo.error_correction={a.error_correction} needs algo.error_correction_fn=module:function rendering the "
        "gold answer (e.g. grpokit.data.tasks.arithmetic:format_completion)",
    )
    check(
        a.error_correction == "off" or not a.dynamic_sampling,
        "algo.error_correction needs the all-wrong groups that algo.dynamic_sampling drops; turn one of them off",
    )
    check(
        a.error_correction == "off" or (r.backend == "hf" and r.async_staleness == 0),
        "algo.error_correction injects tokens no sampler drew, which truncated importance sampling cannot weigh; "
        "use rollout.backend=hf with rollout.async_staleness=0",
    )
    check(a.offpolicy_delta >= 0, f"algo.offpolicy_delta={a.offpolicy_delta} must be >= 0 (0 = off)")
    check(a.ref_refresh_every >= 0, f"algo.ref_refresh_every={a.ref_refresh_every} must be >= 0")
    check(
        0 < a.ref_mixup_alpha <= 1, f"algo.ref_mixup_alpha={a.ref_mixup_alpha} must be in (0, 1] (1 = copy the policy)"
    )
    check(
        a.ref_refresh_every == 0 or a.beta > 0,
        "algo.ref_refresh_every needs algo.beta > 0 (without a KL term there is no reference model)",
    )


def check_algo_limits(cfg: Config) -> None:
    """algo.*: numeric ranges of clipping, KL and iterations."""
    a = cfg.algo
    check(0 <= a.clip_low < 1, f"algo.clip_low={a.clip_low} must be in [0, 1)")
    lowest = objective_spec(a.objective).min_clip_high  # CISPO's cap 1 + clip_high may sit below 1 (TRL's 0.2)
    check(
        a.clip_high >= lowest,
        f"algo.clip_high={a.clip_high} must be >= {lowest:g} with algo.objective={a.objective}",
    )
    check(a.dual_clip == 0 or a.dual_clip > 1, f"algo.dual_clip={a.dual_clip} must be 0 (off) or > 1")
    check(a.beta >= 0, f"algo.beta={a.beta} must be >= 0")
    check(a.adv_eps >= 0, f"algo.adv_eps={a.adv_eps} must be >= 0")
    check(a.num_iterations >= 1, f"algo.num_iterations={a.num_iterations} must be at least 1")
    check(a.norm_constant >= 0, f"algo.norm_constant={a.norm_constant} must be >= 0 (0 = max_new_tokens)")


def stage_owners() -> dict[str, list[str]]:
    """Each config field some registered advantage estimator or objective declares as its own parameter
    (``params``), mapped to the choices that read it: ``{"step_gamma": ["algo.advantage=gigpo", ...]}``. A
    plugin registered with a params record joins the table the same way."""
    owners: dict[str, list[str]] = {}
    declared = [("advantage", name, spec.params) for name, spec in STAGE_SPECS["advantage"].items()]
    declared += [("objective", name, objective_spec(name).params) for name in registered("objective")]
    for kind, name, params in declared:
        for f in dataclasses.fields(params) if params is not None else ():
            owners.setdefault(f.name, []).append(f"algo.{kind}={name}")
    return owners


CLIP_RANGE = "use algo.objective=clip for a clip range"


def objective_rules() -> tuple[Unread, ...]:
    """The clip fields each registered objective does not read, as ``Unread`` rules: from its declaration
    (``ObjectiveSpec.reads_clip``), so SAPO and VESPO (``clipped=no_clipping``: none read), CISPO (clip_high
    only) and any objective registered later are covered alike. An import path's objective declares nothing
    and reads both."""
    rules = []
    for name in registered("objective"):
        reads = objective_spec(name).reads_clip()
        unread_fields = tuple(f for f in CLIP_FIELDS if f not in reads)
        if unread_fields:
            what = " and ".join(f"algo.{f}" for f in reads) + " only" if reads else "no clip range"
            why = f"with algo.objective={name} (it reads {what})"
            rules.append(Unread(unread_fields, why, lambda a, n=name: a.objective != n, CLIP_RANGE))
    return tuple(rules)


def unread_rules() -> tuple[Unread, ...]:
    """Every ``Unread`` rule of the algo section: config/algo.py's ``UNREAD_UNLESS`` and the objectives' clip
    fields (``objective_rules``). The command line hands them to ``presets.apply`` (a preset fills none of
    the fields they would refuse)."""
    return UNREAD_UNLESS + objective_rules()


def check_unread_algo(cfg: Config) -> None:
    """A setting of a feature that is off, changed from its default, is refused, not ignored: the run would
    train without what the setting asks for and exit 0."""
    for rule in unread_rules():  # a feature's settings, and the clip range the objective does not read
        if not rule.on(cfg.algo):
            unread("algo", cfg.algo, AlgoConfig(), rule.fields, rule.why, rule.fix)
    a, defaults = cfg.algo, AlgoConfig()
    chosen = {f"algo.advantage={a.advantage}", f"algo.objective={a.objective}"}
    for name, readers in stage_owners().items():
        if hasattr(defaults, name) and not chosen.intersection(readers):
            unread("algo", a, defaults, [name], f"unless {' or '.join(readers)}", "set that")
