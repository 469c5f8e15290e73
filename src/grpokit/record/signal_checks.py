"""The doctor's checks of the learning signal itself (record/doctor.py): a reward that never varies,
a reward spread that died, steps whose gradient was exactly zero, a KL pinned at a ceiling, a reward
plateau, clipping on one side only. Each returns a ``Finding`` or None.

A run whose every reward is 0 (or every reward 1) looks calm on every other check: no KL, no
clipping, no length change; only these say that nothing was learned, because nothing could be.
"""

from __future__ import annotations

import statistics

from grpokit.config.health import HealthConfig

from .config_advice import dynamic_sampling, joined, masks_truncated
from .findings import DoctorConfig, Finding
from .health_checks import SAME_REWARD, early_floor, reward_level
from .report_data import Run
from .run_series import config_value, recent, reward_span, span_steps, trend, values, window
from .unscored_checks import unscored

EPS = 1e-9


def check_reward_constant(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """Every completion of the run scored the same (`_constant`), or nearly every group did at one value from
    the first steps on, a few outliers aside (`_pinned`): the advantages are (nearly) all zero, no step can
    learn. A run that started lower and rose to solve every group converged instead: not this finding."""
    return _constant(run, dc) or _pinned(run, hc, dc)


def _constant(run: Run, dc: DoctorConfig) -> Finding | None:
    """Read from the completions' lowest and highest rewards where logged, else from a zero `reward_std`
    at every step with a constant mean; a constant mean alone says nothing of the completions."""
    lows, highs = values(run, "completions/reward_min"), values(run, "completions/reward_max")
    stds, means = values(run, "reward_std"), values(run, "reward")
    if lows and highs:
        level, spread = min(v for _, v in lows), max(v for _, v in highs) - min(v for _, v in lows)
    elif stds and means:
        level = min(v for _, v in means)
        spread = max(max(v for _, v in stds), max(v for _, v in means) - level)
    else:
        return None
    if spread > EPS or any(v > EPS for _, v in stds):
        return None
    steps = means or lows
    none = unscored(run)
    if none.share is not None and none.share >= 1 - EPS:  # nothing was scored: say so, not "scored the same"
        title = f"The reward is always {level:.3g} because no completion was ever scored: nothing can be learned"
        said = f"every completion reward in steps {steps[0][0]}-{steps[-1][0]} is {level:.3g}, the sum of no score"
    else:
        title = f"The reward is always {level:.3g}: no completion ever scored differently, nothing can be learned"
        said = f"every completion reward in steps {steps[0][0]}-{steps[-1][0]} is {level:.3g}" + (
            f" ({none.share:.0%} of completions got no score, counted as 0)" if none.share else ""
        )
    return Finding(
        "reward_constant",
        title,
        said + (f" (reward_std 0 at all {len(stds)} steps)" if stds else ""),
        "score a few completions by hand with the reward functions: a broken verifier (wrong answer "
        "column, a parser that never matches, a format the model never writes) or prompts far too hard "
        f"(or too easy, all 1) for the model; check reward.functions ({config_value(run, 'reward.functions')})",
        0.98,
        panel="reward",
        steps=(steps[0][0], steps[-1][0]),
    )


def _pinned(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """At least `constant_step_share` of the steps have `constant_group_share` of their groups solved (every
    completion at the step's best) at one and the same best, and the run was there from its first `window`
    steps: the mean reward of every one of them, an outlier aside (health_checks.early_floor), lies within
    1 - `converged_reward_level` of that best (as a share of the range between the run's lowest and highest
    completion reward), the live monitor's rule for a run solved from the start
    (health_checks.solved_from_start). A run that started further off and rose to it, however fast, learned:
    convergence."""
    solved, tops, rewards = (
        dict(values(run, k)) for k in ("completions/frac_groups_solved", "completions/reward_max", "reward")
    )
    steps = sorted(s for s in solved if s in tops)
    pinned = [s for s in steps if solved[s] >= dc.constant_group_share]
    span = reward_span(run)
    if not pinned or len(pinned) < dc.constant_step_share * len(steps) or span is None:
        return None
    level = statistics.median_low(tops[s] for s in pinned)
    at = [s for s in pinned if abs(tops[s] - level) <= SAME_REWARD * max(1.0, abs(level))]
    pts = [(s, rewards[s]) for s in steps if s in rewards]
    if len(at) < dc.constant_step_share * len(steps) or not pts or span[1] - span[0] <= SAME_REWARD:
        return None
    w = window(len(pts), hc)
    early, late = statistics.fmean(v for _, v in pts[:w]), statistics.fmean(v for _, v in pts[-w:])
    near = [1 - abs(v - level) / (span[1] - span[0]) for _, v in pts[:w]]  # 1: at the pinned best, 0: a range off
    if early_floor(near) < hc.converged_reward_level:
        return None  # the reward started elsewhere and came to this: a run that learned (converged), not pinned
    others = [s for s in steps if s not in set(at)]
    top = level >= span[1] - SAME_REWARD * max(1.0, abs(span[1]))
    shown = ", ".join(map(str, others[:8])) + (f" (+{len(others) - 8} more)" if len(others) > 8 else "")
    return Finding(
        "reward_constant",
        f"The reward is pinned at {level:.3g} from the first steps: nearly every group scores alike, "
        "nothing can be learned",
        f"in {len(at)} of {len(steps)} steps ({len(at) / len(steps):.0%}) at least {dc.constant_group_share:.0%} of "
        f"groups had every completion at {level:.3g}, from the first steps (mean reward {early:.3g} in steps "
        f"{pts[0][0]}-{pts[w - 1][0]}, {late:.3g} in steps {pts[-w][0]}-{pts[-1][0]}); completion rewards ranged "
        f"{span[0]:.3g}-{span[1]:.3g} over the run" + (f", the other steps: {shown}" if others else ""),
        (
            "score a few completions by hand: a verifier that accepts every answer (a check that always passes, "
            "the wrong answer column) or prompts the model already solves (harder prompts, data.curriculum=frontier)"
            if top
            else "score a few completions by hand: a verifier that never matches (wrong answer column, a parser "
            "or format the model never writes) or prompts far too hard for the model"
        )
        + f"; check reward.functions ({config_value(run, 'reward.functions')})",
        0.9,
        panel="reward",
        steps=(steps[0], steps[-1]),
    )


def check_reward_std_death(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """The spread of rewards within groups died out while the reward is not at its best: every group
    scores alike, so the advantages and the gradient vanish (the policy collapsed, or a reward broke)."""
    pts = values(run, "reward_std")
    tr, span = trend(run, "reward_std", hc), reward_span(run)
    if tr is None or tr[0] <= EPS or tr[1] > dc.reward_std_dead * tr[0] or span is None:
        return None
    rw = recent(run, "reward", hc)
    level = reward_level(rw[0], *span) if rw else None
    if level is not None and level >= hc.converged_reward_level:  # solved: all groups earn the best reward
        return None
    w = window(len(pts), hc)
    return Finding(
        "reward_std_death",
        "The reward spread within groups died out before the task was learned",
        f"reward_std {tr[0]:.3g} -> {tr[1]:.3g} ({tr[2]})"
        + (f", reward at {level:.0%} of its range" if level is not None else ""),
        "read the latest samples: identical completions mean a collapsed policy (raise rollout.temperature, "
        "lower optim.lr); varied completions that score alike mean a reward that stopped distinguishing "
        "them (a broken or saturated reward function)",
        0.85,
        panel="reward-std",
        steps=(pts[-w][0], pts[-1][0]),
    )


def check_zero_grad(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """Steps whose gradient norm is exactly 0: the step cost a rollout and taught nothing. Each step's cause is
    read from its own evidence (`zero_grad_causes`): every group scored alike, or groups with signal whose
    completions were truncated and masked out of the loss (algo.mask_truncated), or something else."""
    pts = values(run, "grad_norm")
    zero = [s for s, v in pts if v == 0.0]
    if len(pts) < 3 or len(zero) < 2 or len(zero) / len(pts) < dc.zero_grad_share:
        return None
    causes = zero_grad_causes(run, zero)
    said = _zero_grad_said(run)
    masked = len(causes.get("masked", []))
    parts = [
        f"at {len(steps)} of them (step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps[:8]))}"
        f"{' ...' if len(steps) > 8 else ''}) {said[c][0]}"
        for c, steps in causes.items()
    ]
    return Finding(
        "zero_grad_steps",
        "Steps with exactly zero gradient (nothing learned at those steps)"
        + (": truncated completions masked out of the loss" if masked >= 2 else ""),
        f"grad_norm is exactly 0 at {len(zero)} of {len(pts)} steps ({len(zero) / len(pts):.0%}); " + "; ".join(parts),
        "; ".join(said[c][1] for c in causes),
        # truncation masking is a cause the run's own config makes: raised to an error where it zeroed 2+ steps
        max(0.8 if len(zero) / len(pts) > 0.5 else 0.5, 0.85 if masked >= 2 else 0.0),
        panel="grad-norm",
        steps=(zero[0], zero[-1]),
    )


def _zero_grad_said(run: Run) -> dict[str, tuple[str, str]]:
    """Per cause of a zero gradient (zero_grad_causes), its evidence and its advice."""
    alike = joined(dynamic_sampling(run), "a larger group (rollout.group_size) or prompts of the right difficulty")
    return {
        "masked": (
            "groups had signal but algo.mask_truncated=true left their truncated completions out of the loss "
            "(completions/clipped_ratio > 0)",
            "truncation masking is the cause there: raise rollout.max_new_tokens (now "
            f"{config_value(run, 'rollout.max_new_tokens')}) so completions finish, or set algo.mask_truncated=false "
            "(a soft overlong penalty, DAPO, curbs length without discarding them)",
        ),
        "alike": ("every group scored alike (frac_reward_zero_std 1)", alike),
        "other": (
            "groups had signal (frac_reward_zero_std < 1) and still no gradient",
            "look for what else leaves tokens out of the loss (rollout.mismatch_mask, algo.entropy_top_fraction, "
            "algo.token_masks) or parameters that get no gradient",
        ),
        "unknown": (
            "no frac_reward_zero_std was logged to tell why",
            "if every group scored alike: " + alike + "; if truncated completions are masked out of the loss, "
            "raise the completion length limit",
        ),
    }


def zero_grad_causes(run: Run, zero: list[int]) -> dict[str, list[int]]:
    """The zero-gradient steps by what their own metrics say: "alike" (every group scored alike:
    frac_reward_zero_std 1), "masked" (groups had signal, algo.mask_truncated is on and some completions were
    cut at the length limit: their tokens left the loss), "other" (signal, and no such mask), "unknown" (the step
    logged no frac_reward_zero_std)."""
    alike, clipped = dict(values(run, "frac_reward_zero_std")), dict(values(run, "completions/clipped_ratio"))
    masking = masks_truncated(run)
    out: dict[str, list[int]] = {c: [] for c in ("masked", "alike", "other", "unknown")}  # the order they are told in
    for s in zero:
        if s not in alike:
            cause = "unknown"
        elif alike[s] >= 1 - EPS:
            cause = "alike"
        else:
            cause = "masked" if masking and clipped.get(s, 0.0) > 0 else "other"
        out[cause].append(s)
    return {c: steps for c, steps in out.items() if steps}


def check_kl_pinned(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """KL sitting at its ceiling: at the run's own clamp (algo.kl_clamp), or at one value it rose to
    and never left (a clamp or a KL-capped controller elsewhere): the reported KL no longer measures the
    drift, and the penalty no longer grows with it."""
    pts = values(run, "kl")
    if len(pts) < 6:
        return None
    w = window(len(pts), hc)
    clamp = config_value(run, "algo.kl_clamp", 0.0)
    rec = statistics.fmean(v for _, v in pts[-w:])
    if isinstance(clamp, (int, float)) and clamp > 0 and rec >= (1 - dc.kl_pinned_clamp_share) * clamp:
        return _kl_pinned(
            run,
            f"recent kl {rec:.3g} at algo.kl_clamp={clamp:g} (steps {pts[-w][0]}-{pts[-1][0]})",
            pts[-w][0],
            pts[-1][0],
        )
    top = max(v for _, v in pts)
    if top <= EPS or top > hc.kl_max:  # above kl_max the runaway finding (stability_checks) names it
        return None
    at = [s for s, v in pts if v >= top * (1 - dc.kl_pinned_tol)]
    tail = [s for s, v in pts[-w:] if v >= top * (1 - dc.kl_pinned_tol)]
    first = statistics.fmean(v for _, v in pts[:w])
    if len(at) < max(3, len(pts) // 4) or len(tail) < w or first > 0.5 * top:
        return None  # a ceiling is reached from below: a KL flat from the start is no clamp
    ev = (
        f"kl stays at {top:.3g} (within {dc.kl_pinned_tol:.1%}) at {len(at)} of {len(pts)} steps, "
        f"from step {at[0]} to the end"
    )
    return _kl_pinned(run, ev, at[0], pts[-1][0])


def _kl_pinned(run: Run, evidence: str, first: int, last: int) -> Finding:
    return Finding(
        "kl_pinned",
        "KL is pinned at its clip",
        evidence,
        "the KL estimate is clamped or saturated: the policy moved as far as the cap allows and the penalty "
        f"stopped growing with it; lower optim.lr ({config_value(run, 'optim.lr')}), raise algo.beta, or "
        f"raise / drop the clamp (algo.kl_clamp={config_value(run, 'algo.kl_clamp')})",
        0.7,
        panel="kl",
        steps=(first, last),
    )


def check_plateau(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """The reward stopped moving for the second half of the run, well below its best level."""
    pts = values(run, "reward")
    w = window(len(pts), hc)
    if len(pts) < 4 * w or len(pts) < 12:
        return None
    half = pts[len(pts) // 2 :]
    means = [statistics.fmean(v for _, v in half[i : i + w]) for i in range(0, len(half) - w + 1, w)]
    span = reward_span(run)
    if len(means) < 2 or max(means) - min(means) > hc.reward_flat_tol or span is None or span[1] - span[0] <= EPS:
        return None
    level = (means[-1] - span[0]) / (span[1] - span[0])
    first = statistics.fmean(v for _, v in pts[:w])
    if level >= hc.converged_reward_level or means[-1] - first > hc.reward_flat_tol:
        return None  # converged, or learned in the first half and then held: neither is a plateau to fix
    return Finding(
        "plateau",
        "The reward has not moved for the second half of the run",
        f"reward stays within {max(means) - min(means):.3g} of {means[-1]:.3g} over steps {half[0][0]}-{half[-1][0]} "
        f"(first steps {first:.3g}), {level:.0%} of its range",
        "the run is not learning: raise optim.lr, or make the reward reachable (easier prompts, "
        "partial credit), or a larger group (rollout.group_size) to find rare successes",
        0.6,
        panel="reward",
        steps=(half[0][0], half[-1][0]),
    )


def check_clip_asymmetry(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """Clipping almost only on one side of the trust region: the upper side (probabilities of
    rewarded tokens capped, exploration choked: DAPO's clip-higher) or the lower one."""
    lo, hi = recent(run, "clip_ratio/low_mean", hc), recent(run, "clip_ratio/high_mean", hc)
    if lo is None or hi is None or lo[0] + hi[0] < dc.clip_asymmetry_min:
        return None
    big, small, side = (hi[0], lo[0], "upper") if hi[0] >= lo[0] else (lo[0], hi[0], "lower")
    if big < dc.clip_asymmetry_ratio * max(small, EPS):
        return None
    advice = (
        "the upper clip caps the tokens that earned reward: raise algo.clip_high (clip-higher, DAPO 0.28)"
        if side == "upper"
        else "the lower clip cuts what the policy unlearns: lower optim.lr or take fewer updates per batch "
        f"(algo.num_iterations={config_value(run, 'algo.num_iterations')})"
    )
    return Finding(
        "clip_asymmetry",
        f"Tokens are clipped almost only on the {side} side",
        f"clip_ratio/high_mean {hi[0]:.3g} vs clip_ratio/low_mean {lo[0]:.3g} ({hi[1]})",
        advice,
        0.45,
        panel="clip",
        steps=span_steps(hi[1]),
    )


def check_constant_component(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """One reward function of several scores every completion the same at every step: it adds the same
    to every member of a group, so it moves the reward curve and teaches nothing (a format term every
    completion earns, a checker that never fires)."""
    names = dict.fromkeys(
        k.split("/")[1] for r in run.metrics for k in r if k.startswith("rewards/") and k.endswith("/std")
    )
    if len(names) < 2:
        return None  # a single function always scoring alike is the constant reward (check_reward_constant)
    dead = []
    for n in names:
        std, mean = values(run, f"rewards/{n}/std"), values(run, f"rewards/{n}/mean")
        if (
            len(std) >= 3
            and mean
            and all(v <= EPS for _, v in std)
            and max(v for _, v in mean) - min(v for _, v in mean) <= EPS
        ):
            dead.append((n, mean[0][1], std))
    if not dead or len(dead) == len(names):
        return None  # every function constant: check_reward_constant names it
    n, level, std = dead[0]
    return Finding(
        "constant_component",
        f"The reward function {n} scores every completion {level:.3g} at every step: it teaches nothing",
        f"rewards/{n}/std is 0 and rewards/{n}/mean {level:.3g} at all {len(std)} steps"
        + (f" (also: {', '.join(d[0] for d in dead[1:])})" if len(dead) > 1 else ""),
        f"a term every completion earns only shifts the reward: drop {n} from reward.functions, or check that it "
        "can tell completions apart (a format the model always writes, a checker that never fires)",
        0.4,
        panel="reward",
        steps=(std[0][0], std[-1][0]),
    )


def check_small_group(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """Groups too small to carry signal: with G completions per prompt a group teaches only when they
    score differently; at G = 2 that needs exactly one right of two, and most groups are wasted."""
    g = config_value(run, "rollout.group_size", None)
    pts = values(run, "frac_reward_zero_std")
    if not isinstance(g, int) or g > dc.small_group_max or len(pts) < 3:
        return None
    z = statistics.fmean(v for _, v in pts)
    if z < dc.zero_std_share:
        return None
    return Finding(
        "small_group",
        f"Groups of {g} completions are too small: most carry no signal",
        f"rollout.group_size={g}; {z:.0%} of groups scored all alike over steps {pts[0][0]}-{pts[-1][0]} "
        f"({1 / max(1e-9, 1 - z):.2g} rollouts paid per useful one)",
        "sample more completions per prompt (rollout.group_size=8 or more) with fewer prompts per step, "
        "so each step costs the same and more groups carry a signal",
        0.45,
        panel="signal",
        steps=(pts[0][0], pts[-1][0]),
    )


def check_tight_clip(run: Run, hc: HealthConfig, dc: DoctorConfig) -> Finding | None:
    """A trust region far narrower than GRPO's usual 0.2 that clips many tokens: each update is cut
    short, so the run learns slower than its learning rate says (and its gradient norm jumps between
    clipped and unclipped steps)."""
    eps = [config_value(run, f"algo.{k}", None) for k in ("clip_low", "clip_high")]
    eps = [e for e in eps if isinstance(e, (int, float)) and not isinstance(e, bool) and e > 0]
    clip = recent(run, "clip_ratio/region_mean", hc)
    if not eps or min(eps) >= dc.clip_eps_min or clip is None or clip[0] <= dc.clip_asymmetry_min:
        return None
    return Finding(
        "tight_clip",
        f"The clip range is very narrow (epsilon {min(eps):g}) and clips many tokens",
        f"algo.clip_low={config_value(run, 'algo.clip_low')}, algo.clip_high={config_value(run, 'algo.clip_high')}; "
        f"{clip[0]:.0%} of tokens clipped ({clip[1]})",
        f"widen the clip range (algo.clip_low=0.2, algo.clip_high=0.2 or 0.28, DAPO) and keep the step small with "
        f"optim.lr instead (now {config_value(run, 'optim.lr')})",
        0.5,
        panel="clip",
        steps=span_steps(clip[1]),
    )
