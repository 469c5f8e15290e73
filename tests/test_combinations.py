"""The combination table (issue 25, item 5): every pair of options that config validation accepts
gives update inputs and a loss equal to a naive reference written here loop by loop from the papers'
formulas; every pair it refuses is refused in one sentence that names the field.

Axes (each value an override set; a pair sets two axes, the rest stay default): objective x
aggregation x KL placement x advantage estimator x token masks x num_iterations x multi-turn x
ratio level. The reference recomputes from scratch, per token with Python floats:
  rewards    r_i (minus beta * sum_t (old - ref) with KL in the reward, k1)
  advantage  A_i = (r_i - b_i) / s_g: b = group mean (GRPO) or mean of the others (RLOO);
             s = group std + eps (GRPO), batch std + eps ("batch") or 1 (Dr. GRPO / RLOO);
             a flat group gives 0
  mask       completion mask (environment tokens 0), minus truncated rows (DAPO), minus tokens below
             the entropy quantile (80/20), minus drifted negative rows (off-policy masking)
  ratio      exp(logp - old) per token, or exp of its masked mean over the sequence (GSPO) / turn
  token loss -min(rho A, clip(rho) A) (clip), -min(rho, 1 + eps_h) A logp (CISPO),
             -sigmoid(tau (rho - 1)) 4 / tau A (SAPO); + beta k3 with KL in the loss
  reduction  the aggregation's sums and counts
"""

import itertools
import math

import pytest
import torch

from grpokit.algo.loss import objective_loss
from grpokit.algo.pipeline import LogProbs, StepSettings, needed_logprobs, update_inputs
from grpokit.algo.settings import LossTensors
from grpokit.config import Config, ConfigError
from grpokit.config.io import apply_overrides
from grpokit.config.validation import validate
from grpokit.types import Episode

from pipeline_helpers import scored

AXES = {
    "objective": {"clip": [], "cispo": ["algo.objective=cispo", "algo.clip_high=0.1"], "sapo": ["algo.objective=sapo"]},
    "aggregation": {a: [f"algo.aggregation={a}"] for a in
                    ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum")},
    "kl": {"none": [], "loss": ["algo.beta=0.1"], "reward": ["algo.beta=0.1", "algo.kl_placement=reward", "algo.kl_estimator=k1"]},
    "estimator": {"grpo": [], "rloo": ["algo.baseline=leave_one_out", "algo.scale=none"], "dr": ["algo.scale=none"],
                  "batch": ["algo.scale=batch"], "process": ["algo.supervision=process", "reward.process_function=task"],
                  "gagpo": ["algo.credit=gagpo"]},
    "mask": {"none": [], "overlong": ["algo.mask_truncated=true"], "entropy": ["algo.entropy_top_fraction=0.5"],
             "offpolicy": ["algo.offpolicy_delta=0.05"]},
    "mu": {"1": [], "2": ["algo.num_iterations=2"]},
    "turns": {"single": [], "multi": ["env.tools=[calculator]"]},
    "ratio": {"token": [], "sequence": ["algo.ratio_level=sequence"], "turn": ["algo.ratio_level=turn"]},
}
# the estimators the naive reference covers; the others are checked for validation only
REFERENCE_ESTIMATORS = ("grpo", "rloo", "dr", "batch")

G, EPS, BETA, NORM_C = 3, 1e-4, 0.1, 4.0
REWARDS = [1.0, 0.0, 0.5, 0.2, 0.2, 0.9]
LENGTHS = [3, 2, 3, 1, 3, 2]
FINISH = ["eos", "length", "eos", "eos", "eos", "eos"]
gen = torch.Generator().manual_seed(0)
LOGP = -torch.rand(6, 3, generator=gen) - 0.1  # (N, T) log pi_theta now
SHIFT = 0.3 * (torch.rand(6, 3, generator=gen) - 0.5)  # pi_old = pi_theta + shift after a first update (mu = 2)
REF = LOGP - 0.2 * torch.rand(6, 3, generator=gen)
ENTROPY = torch.rand(6, 3, generator=gen)


def pairs():
    for (a, va), (b, vb) in itertools.combinations(AXES.items(), 2):
        for (ka, oa), (kb, ob) in itertools.product(va.items(), vb.items()):
            yield f"{a}={ka},{b}={kb}", {a: ka, b: kb}, oa + ob


CASES = list(pairs())


def _config(overrides):
    return validate(apply_overrides(Config(), ["rollout.group_size=3", "data.task=calculator"] + overrides))


@pytest.mark.parametrize("name, choice, overrides", CASES, ids=[c[0] for c in CASES])
def test_pair_is_refused_in_one_sentence_or_matches_the_reference(name, choice, overrides):
    try:
        cfg = _config(overrides)
    except ConfigError as e:
        msg = str(e)
        assert "\n" not in msg and msg.count(". ") == 0, msg  # one sentence
        assert any(o.split("=")[0] in msg for o in overrides), msg  # names a field of the pair
        return
    if choice.get("estimator", "grpo") not in REFERENCE_ESTIMATORS:
        return
    loss, inputs, want_loss, want_adv, want_mask = _both(cfg.algo, choice.get("turns") == "multi")
    assert inputs.loss_mask.tolist() == want_mask
    adv = inputs.advantages if inputs.advantages.dim() == 1 else inputs.advantages[:, 0]
    assert adv.tolist() == pytest.approx(want_adv, rel=1e-5, abs=1e-6)
    assert loss.item() == pytest.approx(want_loss, rel=1e-5, abs=1e-6)


def _batch(multi: bool):
    eps = None
    if multi:  # row 0: model token, environment token, model token of the second turn
        eps = [Episode([1, 0, 1], [0, 0, 1])] + [Episode.single(n) for n in LENGTHS[1:]]
    sb, batch = scored(REWARDS, G, LENGTHS, FINISH, eps)
    if multi:
        batch.completion_mask[0, 1] = 0.0
    return sb, batch


def _both(a, multi):
    sb, batch = _batch(multi)
    need_old, need_ref, need_ent = needed_logprobs(StepSettings(a))
    mu2 = a.num_iterations > 1
    old_now = LOGP + SHIFT if mu2 else LOGP.clone()  # pi_old as the update sees it
    lp = LogProbs(LOGP.clone() if need_old else None, REF if need_ref else None, ENTROPY if need_ent else None)
    inputs = update_inputs(StepSettings(a, norm_constant=NORM_C), sb, batch, lp)
    old = old_now if (inputs.old_logp is not None or mu2) else LOGP.detach()
    n_tok = float(inputs.loss_mask.sum())
    norms = inputs.norms.__class__(inputs.norms.aggregation, 6.0, n_tok, inputs.norms.norm_constant)
    tensors = LossTensors(LOGP, old, inputs.advantages, inputs.loss_mask, inputs.ref_logp,
                          turn_ids=inputs.turn_ids)
    loss, _ = objective_loss(tensors, inputs.loss, norms)
    want_loss, want_adv, want_mask = reference(a, batch.completion_mask.tolist(), old.tolist(), multi)
    return loss, inputs, want_loss, want_adv, want_mask


def reference(a, mask, old, multi):
    logp, ref, ent = LOGP.tolist(), REF.tolist(), ENTROPY.tolist()
    N, T = len(mask), len(mask[0])
    r = list(REWARDS)
    if a.beta and a.kl_placement == "reward":  # k1 of pi_old (= pi_theta before the first update) to pi_ref
        r = [r[i] - a.beta * sum(mask[i][t] * (logp[i][t] - ref[i][t]) for t in range(T)) for i in range(N)]
    adv = _advantages(a, r)
    m = [row[:] for row in mask]
    if a.mask_truncated:
        m = [[0.0] * T if FINISH[i] == "length" else m[i] for i in range(N)]
    if a.entropy_top_fraction < 1:
        pool = torch.tensor([ent[i][t] for i in range(N) for t in range(T) if m[i][t]])
        q = torch.quantile(pool, 1 - a.entropy_top_fraction).item()
        m = [[m[i][t] if ent[i][t] >= q else 0.0 for t in range(T)] for i in range(N)]
    loss_m = [row[:] for row in m]
    if a.offpolicy_delta:
        for i in range(N):
            n = sum(m[i]) or 1
            drift = sum(m[i][t] * (old[i][t] - logp[i][t]) for t in range(T)) / n
            if adv[i] < 0 and drift > a.offpolicy_delta:
                loss_m[i] = [0.0] * T
    turn = [[0, 0, 1]] + [[0] * T] * (N - 1) if multi else [[0] * T] * N
    losses = [[_token_loss(a, _ratio(a, logp, old, m, turn, i, t), adv[i], logp[i][t], ref[i][t]) for t in range(T)]
              for i in range(N)]
    return _reduce(a, losses, loss_m, sum(map(sum, m))), adv, m


def _advantages(a, r):
    out = []
    for p in range(len(r) // G):
        g = r[p * G:(p + 1) * G]
        if max(g) - min(g) <= max(1e-6 * max(map(abs, g)), 1e-8):
            out += [0.0] * G
            continue
        mean = sum(g) / G
        if a.scale == "group":
            s = math.sqrt(sum((x - mean) ** 2 for x in g) / (G - 1)) + EPS
        elif a.scale == "batch":
            mb = sum(r) / len(r)
            s = math.sqrt(sum((x - mb) ** 2 for x in r) / (len(r) - 1)) + EPS
        else:
            s = 1.0
        base = [(sum(g) - x) / (G - 1) for x in g] if a.baseline == "leave_one_out" else [mean] * G
        out += [(x - b) / s for x, b in zip(g, base)]
    return out


def _ratio(a, logp, old, m, turn, i, t):
    if a.ratio_level == "token":
        return math.exp(logp[i][t] - old[i][t])
    span = [u for u in range(len(m[i])) if a.ratio_level == "sequence" or turn[i][u] == turn[i][t]]
    n = sum(m[i][u] for u in span) or 1
    return math.exp(sum(m[i][u] * (logp[i][u] - old[i][u]) for u in span) / n)


def _token_loss(a, rho, A, logp, ref):
    if a.objective == "clip":
        obj = min(rho * A, min(max(rho, 1 - a.clip_low), 1 + a.clip_high) * A)
    elif a.objective == "cispo":
        obj = min(rho, 1 + a.clip_high) * A * logp
    else:
        tau = a.sapo_tau_pos if A > 0 else a.sapo_tau_neg
        obj = 1 / (1 + math.exp(-tau * (rho - 1))) * 4 / tau * A
    kl = math.exp(ref - logp) - (ref - logp) - 1 if a.beta and a.kl_placement == "loss" else 0.0
    return -obj + a.beta * kl


def _reduce(a, losses, m, n_tok):
    N = len(losses)
    sums = [sum(l * w for l, w in zip(losses[i], m[i])) for i in range(N)]
    if a.aggregation == "seq-mean-token-mean":
        return sum(s / (sum(m[i]) or 1) for i, s in enumerate(sums)) / N
    if a.aggregation == "token-mean":
        return sum(sums) / max(n_tok, 1)
    if a.aggregation == "seq-mean-token-sum-norm":
        return sum(sums) / (N * NORM_C)
    return sum(sums) / N


# ---------------------------------------------------------------- what the table found (each fails on the old code)


@pytest.mark.parametrize("overrides, field", [
    (["algo.supervision=process", "reward.process_function=task", "algo.scale=none"], "algo.scale=group"),
    (["algo.supervision=process", "reward.process_function=task", "algo.beta=0.1", "algo.kl_placement=reward"],
     "algo.kl_placement=loss"),
    (["algo.supervision=process", "reward.process_function=task", "reward.normalize_components=true"],
     "reward.normalize_components"),
    (["algo.credit=gagpo", "algo.scale=none"], "algo.scale=group"),
    (["algo.entropy_shaping=gtpo", "algo.baseline=leave_one_out"], "algo.baseline=group_mean"),
])
def test_estimator_that_would_ignore_an_option_refuses_it(overrides, field):
    with pytest.raises(ConfigError, match=field):
        _config(overrides)
