"""Issue 25 item 5: the combinations of algorithm options, owned and tested.

Every pair of values of two option dimensions (the other dimensions at their defaults) is either
refused by config validation with one sentence naming the fields, or run through the real pipeline
(algo/pipeline.update_inputs, then algo/loss.objective_loss exactly as train/update.policy_update
calls it) and compared with an expectation computed here, from the papers' formulas, by code that
shares nothing with grpokit's:

    dimension      values
    objective      clip (PPO/GRPO), cispo (MiniMax-M1), sapo (soft gate)
    ratio          token (GRPO), sequence (GSPO), turn (GAGPO), trajectory (TIC-GRPO)
    aggregation    seq-mean-token-mean, token-mean, seq-mean-token-sum-norm (Dr. GRPO), seq-mean-token-sum
    kl             none (beta 0), loss (GRPO's k3 in the loss), reward (REINFORCE++'s KL in the reward)
    advantage      group (GRPO), rloo, dr (no std), gtpo, grpo_s, gigpo, gagpo
    mask           none, overlong (DAPO), entropy_top (80/20), tis, icepop (token), mis (sequence), offpolicy
    iterations     2 (pi_old a fixed earlier policy: the default of the table), 1 (pi_old = pi_theta)
    turns          single (plain completions), multi (episodes with an environment token and two turns)

The group family's advantages, the reward-side KL, the masks, the ratios, the objectives, the KL term
and the aggregations are all recomputed below. GTPO / GRPO-S / GiGPO / GAGPO have hand-worked tests of
their own (tests/test_variants_*.py, tests/test_credit.py); here their advantages are taken from the
registered estimator alone, on the rewards the reference computed, so that what is tested is that the
other stages compose with them (rewards in, masks and objective after). A newly registered stage
name that this table does not know fails ``test_every_registered_stage_has_a_row``.

lambda-GRPO's aggregation needs the learnable lambda (tests/test_variants_lambda.py) and the plugin
path is tested in tests/test_plugins.py.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from grpokit.algo import registry
from grpokit.algo.pipeline import AdvantageContext, LogProbs, StepSettings, needed_logprobs, update_inputs
from grpokit.algo.loss import objective_loss
from grpokit.algo.settings import LossTensors
from grpokit.config.io import apply_overrides
from grpokit.config.sections import Config, ConfigError
from grpokit.config.validation import validate
from grpokit.rollout.collect import ScoredBatch
from grpokit.train.scaling import uses_tis
from grpokit.types import Episode, Prompt, Rollout, TokenBatch

torch.set_default_dtype(torch.float32)

# ---------------------------------------------------------------- the option table

DIMENSIONS: dict[str, dict[str, list[str]]] = {
    "objective": {"clip": [], "cispo": ["algo.objective=cispo"], "sapo": ["algo.objective=sapo"]},
    "ratio": {"token": [], "sequence": ["algo.ratio_level=sequence"], "turn": ["algo.ratio_level=turn"],
              "trajectory": ["algo.ratio_level=trajectory"]},
    "aggregation": {"seq-mean-token-mean": [], "token-mean": ["algo.aggregation=token-mean"],
                    "seq-mean-token-sum-norm": ["algo.aggregation=seq-mean-token-sum-norm", "algo.norm_constant=5"],
                    "seq-mean-token-sum": ["algo.aggregation=seq-mean-token-sum"]},
    "kl": {"none": [], "loss": ["algo.beta=0.1"], "reward": ["algo.beta=0.1", "algo.kl_placement=reward"]},
    "advantage": {"group": [], "rloo": ["algo.baseline=leave_one_out", "algo.scale=none"], "dr": ["algo.scale=none"],
                  "gtpo": ["algo.entropy_shaping=gtpo"], "grpo_s": ["algo.entropy_shaping=grpo_s"],
                  "gigpo": ["algo.credit=gigpo"], "gagpo": ["algo.credit=gagpo"]},
    "mask": {"none": [], "overlong": ["algo.mask_truncated=true"], "entropy_top": ["algo.entropy_top_fraction=0.5"],
             "tis": ["rollout.tis_cap=2", "rollout.async_staleness=1"], "icepop": ["rollout.mismatch_mask=token"],
             "mis": ["rollout.mismatch_mask=sequence"], "offpolicy": ["algo.offpolicy_delta=0.05"]},
    "iterations": {"2": ["algo.num_iterations=2"], "1": []},  # 2 first: the ratios are not 1 in the other cells
    "turns": {"single": [], "multi": ["env.tools=[calculator]"]},
}
DEFAULT = {dim: next(iter(values)) for dim, values in DIMENSIONS.items()}

# every registered name of a stage kind -> the table row that selects it (a new name must be added here)
REGISTERED_ROWS = {
    "advantage": {"group": ("advantage", "group"), "gtpo": ("advantage", "gtpo"), "grpo_s": ("advantage", "grpo_s"),
                  "gigpo": ("advantage", "gigpo"), "gagpo": ("advantage", "gagpo"),
                  "process": None},  # process supervision needs a process reward function: tests/test_variants_family.py
    "objective": {name: ("objective", name) for name in ("clip", "cispo", "sapo")},
    "token mask": {"overlong": ("mask", "overlong"), "entropy_top": ("mask", "entropy_top")},
    "reward stage": {"kl_in_reward": ("kl", "reward"),
                     "normalize_components": None},  # MO-GRPO needs several reward functions: tests/test_pipeline.py
    "advantage stage": {"tis": ("mask", "tis"), "mismatch_mask": ("mask", "icepop"), "entropy_advantage": None},
}  # entropy_advantage (EDGE-GRPO): tests/test_pipeline.py::test_mo_grpo_then_edge_stages


def cells() -> list[dict[str, str]]:
    """Every pair of values of two dimensions, the others at their defaults (no duplicates)."""
    out, seen = [], set()
    for d1, d2 in itertools.combinations(DIMENSIONS, 2):
        for v1, v2 in itertools.product(DIMENSIONS[d1], DIMENSIONS[d2]):
            cell = {**DEFAULT, d1: v1, d2: v2}
            key = tuple(cell.values())
            if key not in seen:
                seen.add(key)
                out.append(cell)
    return out


def cell_id(cell: dict[str, str]) -> str:
    return "-".join(f"{d}={v}" for d, v in cell.items() if v != DEFAULT[d]) or "defaults"


def config_of(cell: dict[str, str]) -> Config:
    overrides = [o for dim, value in cell.items() for o in DIMENSIONS[dim][value]]
    return apply_overrides(Config(), overrides)


# ---------------------------------------------------------------- one fixed batch: P = 2 prompts, G = 2, T = 4

G, T, BETA, TIS_CAP, LOW, HIGH, DELTA, C = 2, 4, 0.1, 2.0, 0.5, 2.0, 0.05, 5.0
REWARDS = [1.0, 0.0, 0.3, 0.8]
LOGP = torch.tensor([[-0.5, -1.0, -0.7, -0.2], [-0.9, -0.4, 0.0, 0.0], [-0.3, -1.2, -0.6, 0.0], [-0.8, 0.0, 0.0, 0.0]])
OLD2 = LOGP + torch.tensor([[0.3, -0.2, 0.1, 0.4], [-0.5, 0.2, 0, 0], [0.1, 0.3, -0.2, 0], [0.6, 0, 0, 0]])
REF = LOGP - torch.tensor([[0.2, 0.1, -0.3, 0.5], [0.4, -0.1, 0, 0], [0.0, 0.2, 0.3, 0], [-0.2, 0, 0, 0]])
ENT = torch.tensor([[0.9, 0.1, 0.5, 0.7], [0.3, 0.8, 0, 0], [0.2, 0.6, 0.4, 0], [1.1, 0, 0, 0]])
# the sampler's log-probabilities relative to pi_old: ratio pi_old / pi_sampler = exp(OFFSET)
SAMPLER_OFFSET = torch.tensor([[0.1, math.log(3.0), -0.2, 0.0], [-0.05, 0.3, 0, 0], [0.2, -math.log(2.5), 0.1, 0],
                               [0.0, 0, 0, 0]])
SINGLE = {"lengths": [4, 2, 3, 1], "model_mask": None, "turns": None}
MULTI = {"lengths": [4, 2, 3, 1], "model_mask": [[1, 1, 0, 1], [1, 1], [1, 0, 1], [1]],
         "turns": [[0, 0, 0, 1], [0, 0], [0, 0, 1], [0]], "states": [["a", "b"], ["a"], ["a", "c"], ["a"]]}
FINISH = ["eos", "eos", "length", "eos"]  # row 2 was cut by the length limit


def completion_mask(shape: dict) -> torch.Tensor:
    rows = shape["model_mask"] or [[1] * n for n in shape["lengths"]]
    return torch.tensor([r + [0] * (T - len(r)) for r in rows], dtype=torch.float32)


def batch_of(cell: dict[str, str]):
    """(scored batch, token batch, pi_old used) for the cell; pi_old is pi_theta itself at 1 iteration."""
    shape = MULTI if cell["turns"] == "multi" else SINGLE
    mask = completion_mask(shape)
    old = LOGP.clone() if cell["iterations"] == "1" else OLD2.clone()
    sampler = [(old[i] - SAMPLER_OFFSET[i])[:n].tolist() for i, n in enumerate(shape["lengths"])]
    episodes = None
    if shape["turns"] is not None:
        episodes = [Episode(m, t, s) for m, t, s in zip(shape["model_mask"], shape["turns"], shape["states"])]
        sampler = [[v if m else 0.0 for v, m in zip(row, mm)] for row, mm in zip(sampler, shape["model_mask"])]
    prompts = [Prompt(text=f"p{p}", ids=[1], columns={"answer": "1"}) for p in range(2)]
    ro = Rollout([[1], [1]], [[5] * n for n in shape["lengths"]], sampler, FINISH, G, episodes)
    total = torch.tensor(REWARDS)
    sb = ScoredBatch(prompts, ro, [f"t{i}" for i in range(4)], total[:, None], total, ["r"])
    ids = torch.full((4, 1 + T), 5)
    attn = torch.cat([torch.ones(4, 1), (torch.arange(T)[None] < torch.tensor(shape["lengths"])[:, None]).float()], dim=1)
    batch = TokenBatch(ids, attn, torch.arange(1 + T).expand(4, -1), ids[:, 1:], mask)
    return sb, batch, old


def run_pipeline(cell: dict[str, str], cfg: Config):
    """What Trainer.train_step and policy_update do with this batch: returns (inputs, loss)."""
    sb, batch, old = batch_of(cell)
    r = cfg.rollout
    settings = StepSettings(cfg.algo, None, None, r.tis_cap if uses_tis(cfg) else 0.0, cfg.algo.norm_constant or r.max_new_tokens,
                            mismatch=(r.mismatch_mask, r.mismatch_low, r.mismatch_high))
    need_old, need_ref, want_entropy = needed_logprobs(settings)
    lp = LogProbs(old if need_old else None, REF if need_ref else None, ENT if want_entropy else None)
    inputs = update_inputs(settings, sb, batch, lp)
    logp = LOGP.clone().requires_grad_(True)
    old_used = inputs.old_logp if inputs.old_logp is not None else logp.detach()
    norms = inputs.norms.__class__(inputs.norms.aggregation, 4.0, float(inputs.loss_mask.sum()), inputs.norms.norm_constant)
    tensors = LossTensors(logp, old_used, inputs.advantages, inputs.loss_mask, inputs.ref_logp, ENT, inputs.turn_ids,
                          ratio_mask=batch.completion_mask)  # as policy_update passes it
    loss, _ = objective_loss(tensors, inputs.loss, norms)
    return inputs, loss, sb, batch, old


# ---------------------------------------------------------------- the reference, from the papers' formulas


def k3(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    d = ref - logp  # DeepSeekMath eq. 4: pi_ref/pi - log(pi_ref/pi) - 1
    return torch.exp(d) - d - 1


def ref_rewards(cell, old, mask) -> torch.Tensor:
    r = torch.tensor(REWARDS)
    if cell["kl"] == "reward":  # REINFORCE++: r_i - beta * sum_t KL_t(pi_old || pi_ref), k3
        r = r - BETA * (k3(old, REF) * mask).sum(dim=1)
    return r


def ref_group_advantages(kind: str, r: torch.Tensor) -> torch.Tensor:
    out = []
    for g in range(0, len(r), G):
        grp = r[g:g + G].tolist()
        mean = sum(grp) / G
        for x in grp:
            if kind == "rloo":  # leave-one-out baseline, no scale
                out.append(x - (sum(grp) - x) / (G - 1))
            elif kind == "dr":  # Dr. GRPO: no std
                out.append(x - mean)
            else:  # GRPO: unbiased std plus adv_eps; a flat group gets 0
                std = math.sqrt(sum((y - mean) ** 2 for y in grp) / (G - 1))
                out.append(0.0 if max(grp) - min(grp) <= 1e-6 * max(abs(y) for y in grp) else (x - mean) / (std + 1e-4))
    return torch.tensor(out)


def ref_advantages(cell, cfg, r, sb, batch) -> torch.Tensor:
    if cell["advantage"] in ("group", "rloo", "dr"):
        return ref_group_advantages(cell["advantage"], r)
    # GTPO / GRPO-S / GiGPO / GAGPO: the estimator alone (hand-worked in its own tests), on these rewards
    ctx = AdvantageContext(cfg.algo, sb, r, batch.completion_mask, ENT, G, _One())
    return registry.lookup("advantage", cell["advantage"])(ctx)[0]


class _One:
    active = False

    @staticmethod
    def gather_rows(x):
        return x

    local_rows = gather_varlen = gather_rows


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default)."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = math.floor(pos)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (pos - lo)


def ref_masks(cell, mask, old):
    """(loss mask, per-token advantage weights) after the masks and the advantage stages."""
    loss_mask, weight = mask.clone(), torch.ones_like(mask)
    ratio = torch.exp(SAMPLER_OFFSET)  # pi_old / pi_sampler on each token
    real = mask > 0
    if cell["mask"] == "overlong":  # DAPO: truncated rows leave the loss
        loss_mask[2] = 0
    elif cell["mask"] == "entropy_top":  # keep tokens at or above the median entropy of the real tokens
        loss_mask = mask * (ENT >= quantile(ENT[real].tolist(), 0.5)).float()
    elif cell["mask"] == "tis":  # TIS: A times min(pi_old / pi_sampler, cap)
        weight = torch.where(real, ratio.clamp(max=TIS_CAP), torch.ones_like(ratio))
    elif cell["mask"] == "icepop":  # IcePop: tokens with ratio outside [low, high] leave the gradient
        weight = torch.where(real & ((ratio < LOW) | (ratio > HIGH)), 0.0, 1.0)
    elif cell["mask"] == "mis":  # MIS: rows whose geometric-mean ratio is outside [low, high]
        geo = torch.exp((SAMPLER_OFFSET * mask).sum(dim=1) / mask.sum(dim=1))
        weight = torch.where(real & ((geo < LOW) | (geo > HIGH))[:, None], 0.0, 1.0)
    return loss_mask, weight


def ref_log_ratio(cell, logp, old, mask, turns) -> torch.Tensor:
    d = (logp - old) * mask
    if cell["ratio"] == "token":
        return d
    if cell["ratio"] == "sequence":  # GSPO: mean log-ratio of the sequence
        return (d.sum(dim=1) / mask.sum(dim=1))[:, None].expand_as(d)
    if cell["ratio"] == "trajectory":  # TIC-GRPO: the product of the token ratios
        return d.sum(dim=1)[:, None].expand_as(d)
    out = torch.zeros_like(d)  # GAGPO: mean log-ratio of each turn's model tokens
    for i in range(d.shape[0]):
        for t in range(T):
            same = [u for u in range(T) if turns[i][u] == turns[i][t] and mask[i, u] > 0]
            out[i, t] = sum(d[i, u] for u in same) / max(len(same), 1)
    return out


def ref_objective(cell, rho, adv, logp) -> torch.Tensor:
    """The per-token loss of the objective (the negative of what it maximises)."""
    if cell["objective"] == "cispo":  # sg(min(rho, 1 + eps_high)) * A * log pi
        return -torch.clamp(rho, max=1.2) * adv * logp
    if cell["objective"] == "sapo":  # sigmoid(tau (rho - 1)) * 4 / tau * A, tau by the sign of A
        tau = torch.where(adv > 0, 1.0, 1.05)
        return -torch.sigmoid(tau * (rho - 1)) * 4 / tau * adv
    return -torch.minimum(rho * adv, torch.clamp(rho, 0.8, 1.2) * adv)  # PPO's clipped surrogate


def ref_aggregate(cell, loss, mask) -> torch.Tensor:
    n_tok = mask.sum()
    if cell["aggregation"] == "token-mean":
        return (loss * mask).sum() / n_tok
    if cell["aggregation"] == "seq-mean-token-sum-norm":
        return (loss * mask).sum() / (4 * C)
    if cell["aggregation"] == "seq-mean-token-sum":
        return (loss * mask).sum() / 4
    return ((loss * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum() / 4


def reference(cell, cfg, sb, batch, old):
    """(advantages (N, T) on real tokens, loss mask, loss) from the formulas above."""
    mask = batch.completion_mask
    r = ref_rewards(cell, old, mask)
    adv = ref_advantages(cell, cfg, r, sb, batch)
    adv_NT = (adv[:, None] if adv.dim() == 1 else adv).expand(4, T).clone()
    loss_mask, weight = ref_masks(cell, mask, old)
    adv_NT = adv_NT * weight
    turns = [row + [0] * (T - len(row)) for row in (MULTI["turns"] if cell["turns"] == "multi" else [[0] * T] * 4)]
    rho = torch.exp(ref_log_ratio(cell, LOGP, old, mask, turns))
    loss = ref_objective(cell, rho, adv_NT, LOGP)
    if cell["kl"] == "loss":  # GRPO: beta * k3(pi_theta || pi_ref) per token
        loss = loss + BETA * k3(LOGP, REF)
    if cell["mask"] == "offpolicy":  # DeepSeek-V3.2: negative rows drifted by more than delta leave the loss
        n = loss_mask.sum(dim=1)
        drift = ((old - LOGP) * loss_mask).sum(dim=1) / n
        mean_adv = (adv_NT * loss_mask).sum(dim=1) / n
        dropped = (mean_adv < 0) & (drift > DELTA)
        return adv_NT, loss_mask, ref_aggregate_with(cell, loss, loss_mask * (~dropped)[:, None], loss_mask)
    return adv_NT, loss_mask, ref_aggregate(cell, loss, loss_mask)


def ref_aggregate_with(cell, loss, loss_mask, count_mask) -> torch.Tensor:
    """Dropped sequences still count in the normalisers (the token count is the loss mask's)."""
    n_tok = count_mask.sum()
    masked = loss * loss_mask
    if cell["aggregation"] == "token-mean":
        return masked.sum() / n_tok
    if cell["aggregation"] == "seq-mean-token-sum-norm":
        return masked.sum() / (4 * C)
    if cell["aggregation"] == "seq-mean-token-sum":
        return masked.sum() / 4
    return (masked.sum(dim=1) / loss_mask.sum(dim=1).clamp(min=1)).sum() / 4


# ---------------------------------------------------------------- the tests

CELLS = cells()


def test_the_table_covers_every_pair():
    # 8 dimensions of sizes 3, 4, 4, 3, 7, 7, 2, 2: the distinct cells of all pairs
    sizes = [len(v) for v in DIMENSIONS.values()]
    pairs = sum((a - 1) * (b - 1) for a, b in itertools.combinations(sizes, 2))  # both off default
    singles = sum(a - 1 for a in sizes)  # one off default (each appears in several pairs, counted once)
    assert len(CELLS) == 1 + singles + pairs


def test_every_registered_stage_has_a_row():
    import grpokit.algo.loss  # noqa: F401  (registers the objectives)
    import grpokit.algo.pipeline  # noqa: F401  (registers the reward, advantage and mask stages)

    for kind, table in registry._KINDS.items():
        built_in = {name for name, fn in table.items() if fn.__module__.startswith("grpokit.")}  # not tests' plugins
        unknown = sorted(built_in - set(REGISTERED_ROWS[kind]))
        assert not unknown, (f"registered {kind} {unknown} has no row in tests/test_combinations.py: add its "
                             "dimension value and reference formula (or say which test owns it)")


REFUSED: dict[str, str] = {}  # cell id -> the refusal sentence (filled by test_cell, checked below)


@pytest.mark.parametrize("cell", CELLS, ids=[cell_id(c) for c in CELLS])
def test_cell(cell):
    cfg = config_of(cell)
    try:
        validate(cfg)
    except ConfigError as e:  # refused: one sentence that names the fields
        text = str(e)
        assert "\n" not in text and "algo." in text or "rollout." in text or "env." in text, text
        REFUSED[cell_id(cell)] = text
        return
    inputs, loss, sb, batch, old = run_pipeline(cell, cfg)
    adv_NT, loss_mask, expected = reference(cell, cfg, sb, batch, old)
    real = batch.completion_mask > 0
    got_adv = (inputs.advantages[:, None] if inputs.advantages.dim() == 1 else inputs.advantages).expand(4, T)
    assert torch.allclose(got_adv[real], adv_NT[real], atol=1e-5), (got_adv, adv_NT)
    assert torch.equal(inputs.loss_mask, loss_mask)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)


def test_refusals_are_the_pairs_that_cannot_run():
    # GAGPO normalises its GAE by the group's std (validation.py), so the two unscaled baselines are
    # refused; every other pair of the table runs.
    for cell in CELLS:
        try:
            validate(config_of(cell))
        except ConfigError as e:
            assert cell["advantage"] == "gagpo" and cell_id(cell).count("advantage=") == 1, (cell_id(cell), str(e))
            assert "algo.credit=gagpo" in str(e)
