"""The combinations of algorithm options, owned and tested.

Every pair of values of two option dimensions (the other dimensions at their defaults), and the
larger combinations in ``LARGER``, is either refused by config validation with one sentence naming a
field of each option set, or run through the real pipeline (algo/pipeline.update_inputs, then
algo/loss.objective_loss exactly as train/update.accumulate calls it) and compared with an
expectation computed from the papers' formulas by code that shares nothing with grpokit's
(tests/helpers/combination_reference.py):

    dimension      values
    objective      clip (PPO/GRPO), cispo (MiniMax-M1), sapo (soft gate)
    ratio          token (GRPO), sequence (GSPO-token), sequence_whole (GSPO's sequence objective, TRL's),
                   turn (GAGPO), trajectory (TIC-GRPO)
    aggregation    seq-mean-token-mean, token-mean, seq-mean-token-sum-norm (Dr. GRPO), seq-mean-token-sum
    kl             none (beta 0), loss (GRPO's k3 in the loss), reward (REINFORCE++'s KL in the reward),
                   loss_k1, loss_k2, reward_k1 (Schulman's other estimators)
    advantage      group (GRPO's family), gtpo, grpo_s, gigpo, gagpo (every registered estimator)
    normalisation  group (GRPO), rloo, dr (no std), population (std over G), batch (TRL's batch std),
                   batch_whiten, token_whiten (REINFORCE++-baseline as verl)
    mask           none, overlong (DAPO), entropy_top (80/20), tis, icepop (token), mis (sequence), offpolicy
    iterations     2 (pi_old a fixed earlier policy: the default of the table), 1 (pi_old = pi_theta)
    turns          single (plain completions), multi (episodes with an environment token and two turns)

The group family's advantages, the reward-side KL, the masks, the ratios, the objectives, the KL term
and the aggregations are all recomputed below. GTPO / GRPO-S / GiGPO / GAGPO have hand-worked tests of
their own (tests/test_variants_*.py, tests/algo/test_credit.py); here their advantages are taken from the
registered estimator alone, on the rewards the reference computed, so that what is tested is that the
other stages compose with them (rewards in, masks and objective after). A newly registered stage
name that this table does not know fails ``test_every_registered_stage_has_a_row``, and a new value
of an option's config field fails ``test_every_config_name_has_a_row``. The refused cells are exactly
the estimators that fix their own normalisation paired with another one (``ACCEPTED_NORMALISATIONS``).

lambda-GRPO's aggregation needs the learnable lambda (tests/algo/test_variants_lambda.py) and the plugin
path is tested in tests/algo/test_plugins.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from grpokit.algo import registry
from grpokit.algo.advantages import BASELINES, SCALES, STD_KINDS
from grpokit.algo.loss import AGGREGATIONS, KL_ESTIMATORS, OBJECTIVES, objective_loss
from grpokit.algo.pipeline import (
    KL_PLACEMENTS,
    LogProbs,
    MismatchSettings,
    StepSettings,
    TISSettings,
    needed_logprobs,
    update_inputs,
)
from grpokit.algo.ratio import RATIO_FNS
from grpokit.algo.settings import LossTensors
from grpokit.config.io import apply_overrides
from grpokit.config.sections import Config, ConfigError
from grpokit.train.engines import uses_tis
from grpokit.types import Episode, Prompt, Rollout, ScoredBatch, TokenBatch
from grpokit.validation import validate
from helpers.combination_reference import (
    ENT,
    FINISH,
    LOGP,
    MULTI,
    OLD2,
    REF,
    REWARDS,
    SAMPLER_OFFSET,
    SINGLE,
    G,
    T,
    reference,
)

torch.set_default_dtype(torch.float32)

# ---------------------------------------------------------------- the option table

DIMENSIONS: dict[str, dict[str, list[str]]] = {
    "objective": {"clip": [], "cispo": ["algo.objective=cispo"], "sapo": ["algo.objective=sapo"]},
    "ratio": {
        "token": [],
        "sequence": ["algo.ratio_level=sequence"],
        "sequence_whole": ["algo.ratio_level=sequence_whole"],
        "turn": ["algo.ratio_level=turn"],
        "trajectory": ["algo.ratio_level=trajectory"],
    },
    "aggregation": {
        "seq-mean-token-mean": [],
        "token-mean": ["algo.aggregation=token-mean"],
        "seq-mean-token-sum-norm": ["algo.aggregation=seq-mean-token-sum-norm", "algo.norm_constant=5"],
        "seq-mean-token-sum": ["algo.aggregation=seq-mean-token-sum"],
    },
    "kl": {
        "none": [],
        "loss": ["algo.beta=0.1"],
        "reward": ["algo.beta=0.1", "algo.kl_placement=reward"],
        "loss_k1": ["algo.beta=0.1", "algo.kl_estimator=k1"],
        "loss_k2": ["algo.beta=0.1", "algo.kl_estimator=k2"],
        "reward_k1": ["algo.beta=0.1", "algo.kl_placement=reward", "algo.kl_estimator=k1"],
    },
    "advantage": {
        "group": [],
        "gtpo": ["algo.advantage=gtpo"],
        "grpo_s": ["algo.advantage=grpo_s"],
        "gigpo": ["algo.advantage=gigpo"],
        "gagpo": ["algo.advantage=gagpo"],
    },
    "normalisation": {
        "group": [],
        "rloo": ["algo.baseline=leave_one_out", "algo.scale=none"],
        "dr": ["algo.scale=none"],
        "population": ["algo.std=population"],
        "batch": ["algo.scale=batch"],
        "batch_whiten": ["algo.scale=batch_whiten"],
        "token_whiten": ["algo.scale=token_whiten"],
    },
    "mask": {
        "none": [],
        "overlong": ["algo.mask_truncated=true"],
        "entropy_top": ["algo.entropy_top_fraction=0.5"],
        "tis": ["rollout.tis_cap=2", "rollout.async_staleness=1"],
        "icepop": ["rollout.mismatch_mask=token"],
        "mis": ["rollout.mismatch_mask=sequence"],
        "offpolicy": ["algo.offpolicy_delta=0.05"],
    },
    "iterations": {"2": ["algo.num_iterations=2"], "1": []},  # 2 first: the ratios are not 1 in the other cells
    "turns": {"single": [], "multi": ["env.tools=[calculator]"]},
}
DEFAULT = {dim: next(iter(values)) for dim, values in DIMENSIONS.items()}

# every registered name of a stage kind -> the table row that selects it (a new name must be added here)
REGISTERED_ROWS = {
    "advantage": {
        "group": ("advantage", "group"),
        "gtpo": ("advantage", "gtpo"),
        "grpo_s": ("advantage", "grpo_s"),
        "gigpo": ("advantage", "gigpo"),
        "gagpo": ("advantage", "gagpo"),
        "process": None,
    },  # process supervision needs a process reward function: tests/algo/test_variants_family.py
    "objective": {
        **{name: ("objective", name) for name in ("clip", "cispo", "sapo")},
        "vespo": None,
    },  # VESPO (trajectory ratio only): tests/project/test_bench_loss_equality.py against TRL's code
    "token mask": {"overlong": ("mask", "overlong"), "entropy_top": ("mask", "entropy_top")},
    "reward stage": {
        "kl_in_reward": ("kl", "reward"),
        "normalize_components": None,
    },  # MO-GRPO needs several reward functions: tests/algo/test_pipeline.py
    "advantage stage": {"entropy_advantage": None, "distill": None},
    "policy weight": {"tis": ("mask", "tis"), "mismatch_mask": ("mask", "icepop")},
}  # entropy_advantage (EDGE-GRPO): tests/algo/test_pipeline.py::test_mo_grpo_then_edge_stages; distill: test_distill.py


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


# larger combinations that matter: several non-default options that meet in one code path
LARGER = [
    {"ratio": "sequence", "mask": "entropy_top", "turns": "multi"},  # the ratio spans all model tokens
    {"ratio": "turn", "advantage": "gigpo", "turns": "multi", "mask": "icepop"},
    {"ratio": "turn", "advantage": "gagpo", "turns": "multi", "mask": "mis", "objective": "cispo"},
    {"objective": "cispo", "aggregation": "token-mean", "kl": "loss", "mask": "tis", "iterations": "1"},
    {"objective": "sapo", "ratio": "trajectory", "mask": "offpolicy", "aggregation": "seq-mean-token-sum"},
    {"normalisation": "rloo", "kl": "reward", "mask": "overlong", "ratio": "sequence", "aggregation": "token-mean"},
    {"normalisation": "token_whiten", "mask": "overlong", "turns": "multi", "kl": "reward"},
    {
        "normalisation": "dr",
        "aggregation": "seq-mean-token-sum-norm",
        "kl": "loss",
        "ratio": "sequence",
        "mask": "icepop",
        "iterations": "1",
    },
    {"advantage": "gtpo", "mask": "entropy_top", "objective": "sapo", "kl": "loss"},
    {"advantage": "grpo_s", "mask": "tis", "kl": "reward", "ratio": "trajectory"},
    {"mask": "offpolicy", "turns": "multi", "ratio": "turn", "kl": "loss", "aggregation": "token-mean"},
    {"normalisation": "batch_whiten", "mask": "mis", "ratio": "sequence", "kl": "reward", "objective": "cispo"},
]


def cell_id(cell: dict[str, str]) -> str:
    return "-".join(f"{d}={v}" for d, v in cell.items() if v != DEFAULT[d]) or "defaults"


def config_of(cell: dict[str, str]) -> Config:
    overrides = [o for dim, value in cell.items() for o in DIMENSIONS[dim][value]]
    return apply_overrides(Config(), overrides)


# ---------------------------------------------------------------- the real pipeline on the fixed batch


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
    attn = torch.cat(
        [torch.ones(4, 1), (torch.arange(T)[None] < torch.tensor(shape["lengths"])[:, None]).float()], dim=1
    )
    batch = TokenBatch(ids, attn, torch.arange(1 + T).expand(4, -1), ids[:, 1:], mask)
    return sb, batch, old


def run_pipeline(cell: dict[str, str], cfg: Config):
    """What Trainer.train_step and accumulate do with this batch: returns (inputs, loss)."""
    sb, batch, old = batch_of(cell)
    r = cfg.rollout
    settings = StepSettings(
        algo=cfg.algo,
        norm_constant=cfg.algo.norm_constant or r.max_new_tokens,
        tis=TISSettings(cap=r.tis_cap if uses_tis(cfg) else 0.0, mode=r.tis_mode, floor=r.tis_min),
        mismatch=MismatchSettings(mode=r.mismatch_mask, low=r.mismatch_low, high=r.mismatch_high),
    )
    need_old, need_ref, want_entropy = needed_logprobs(settings)
    lp = LogProbs(old if need_old else None, REF if need_ref else None, ENT if want_entropy else None)
    inputs = update_inputs(settings, sb, batch, lp)
    logp = LOGP.clone().requires_grad_(True)
    old_used = inputs.old_logp if inputs.old_logp is not None else logp.detach()
    norms = inputs.norms.__class__(
        inputs.norms.aggregation, 4.0, float(inputs.loss_mask.sum()), inputs.norms.norm_constant
    )
    tensors = LossTensors(
        logp,
        old_used,
        inputs.advantages,
        inputs.loss_mask,
        inputs.ref_logp,
        ENT,
        inputs.turn_ids,
        ratio_mask=batch.completion_mask,
        policy_mask=inputs.policy_mask,
        policy_weight=inputs.policy_weight,
    )  # as accumulate passes it
    loss, _ = objective_loss(tensors, inputs.loss, norms)
    loss.backward()
    return inputs, loss, logp.grad, sb, batch, old


# ---------------------------------------------------------------- the tests

CELLS = cells() + [{**DEFAULT, **c} for c in LARGER]


def test_the_table_covers_every_pair():
    # 9 dimensions of sizes 3, 5, 4, 6, 5, 7, 7, 2, 2: the distinct cells of all pairs, plus the larger ones
    sizes = [len(v) for v in DIMENSIONS.values()]
    pairs = sum((a - 1) * (b - 1) for a, b in itertools.combinations(sizes, 2))  # both off default
    singles = sum(a - 1 for a in sizes)  # one off default (each appears in several pairs, counted once)
    assert len(CELLS) == 1 + singles + pairs + len(LARGER)


def test_every_registered_stage_has_a_row():
    import grpokit.algo.loss  # noqa: F401  (registers the objectives)
    import grpokit.algo.pipeline  # noqa: F401  (registers the reward, advantage and mask stages)

    for kind, table in registry._KINDS.items():
        built_in = {name for name, fn in table.items() if fn.__module__.startswith("grpokit.")}  # not tests' plugins
        unknown = sorted(built_in - set(REGISTERED_ROWS[kind]))
        assert not unknown, (
            f"registered {kind} {unknown} has no row in tests/algo/test_combinations.py: add its "
            "dimension value and reference formula (or say which test owns it)"
        )


def refusal(cell: dict[str, str]) -> str | None:
    """Validation's sentence refusing the cell's config, or None when it is accepted (cached by cell)."""
    key = cell_id(cell)
    if key not in _REFUSALS:
        try:
            validate(config_of(cell))
            _REFUSALS[key] = None
        except ConfigError as e:
            _REFUSALS[key] = str(e)
    return _REFUSALS[key]


_REFUSALS: dict[str, str | None] = {}


@pytest.mark.parametrize("cell", CELLS, ids=[cell_id(c) for c in CELLS])
def test_cell(cell):
    text = refusal(cell)
    if text is not None:  # refused: one sentence that names a field of every option set off its default
        assert "\n" not in text and text.count(". ") == 0, text
        for dim, value in cell.items():
            if value == DEFAULT[dim]:
                continue
            fields = {o.split("=")[0] for o in DIMENSIONS[dim][value]}
            assert not fields or any(f in text for f in fields), (dim, value, text)
        return
    cfg = config_of(cell)
    inputs, loss, grad, sb, batch, old = run_pipeline(cell, cfg)
    logp = LOGP.clone().requires_grad_(True)
    adv_NT, loss_mask, expected = reference(cell, cfg, sb, batch, old, logp)
    expected.backward()
    real = batch.completion_mask > 0
    got_adv = (inputs.advantages[:, None] if inputs.advantages.dim() == 1 else inputs.advantages).expand(4, T)
    assert torch.allclose(got_adv[real], adv_NT[real], atol=1e-5), (got_adv, adv_NT)
    assert torch.equal(inputs.loss_mask, loss_mask)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    # the gradient too: the ratio levels' forms (GSPO-token or the whole sequence's) differ there only
    assert torch.allclose(grad[real], logp.grad[real], rtol=1e-4, atol=1e-6), (grad, logp.grad)


# the estimators that fix their own normalisation (their StageSpec.config_errors; docs/ALGORITHMS.md "Differences"):
# GTPO normalises its token rewards itself (group mean, group std); GiGPO normalises within groups
# (group mean, group std or none); GAGPO's GAE always by the group's std. GRPO-S takes any.
ACCEPTED_NORMALISATIONS = {
    "gtpo": {"group", "population"},
    "gigpo": {"group", "dr", "population"},
    "gagpo": {"group", "population"},
}


def test_refusals_are_the_pairs_that_cannot_run():
    refused, expected = [], []
    for cell in CELLS:
        if cell["normalisation"] not in ACCEPTED_NORMALISATIONS.get(cell["advantage"], DIMENSIONS["normalisation"]):
            expected.append(cell_id(cell))
        if refusal(cell) is not None:
            refused.append(cell_id(cell))
    # of the 7 normalisations, gtpo refuses 7 - 2 = 5, gigpo 7 - 3 = 4, gagpo 7 - 2 = 5: 14 cells
    assert refused == expected and len(refused) == 14, refused


CONFIG_NAMES = {  # every name a config field accepts for these options -> it must have a row
    "algo.objective": OBJECTIVES,
    "algo.ratio_level": tuple(RATIO_FNS),
    "algo.aggregation": AGGREGATIONS,
    "algo.kl_placement": tuple(KL_PLACEMENTS),
    "algo.baseline": BASELINES,
    "algo.scale": SCALES,
    "algo.std": STD_KINDS,
    "algo.kl_estimator": KL_ESTIMATORS,
    "algo.advantage": ("group", "process", "gigpo", "gagpo", "gtpo", "grpo_s"),
    "rollout.mismatch_mask": ("none", "token", "sequence"),
}
OWNED_ELSEWHERE = {
    ("algo.aggregation", "lambda-grpo"): "tests/algo/test_variants_lambda.py (the learnable lambda)",
    ("algo.objective", "vespo"): "tests/project/test_bench_loss_equality.py (equal to TRL's loss_type='vespo')",
    ("algo.advantage", "process"): "tests/algo/test_variants_family.py (it needs a process reward function)",
}


@pytest.mark.parametrize("field", sorted(CONFIG_NAMES))
def test_every_config_name_has_a_row(field):
    section, name = field.split(".")
    default = getattr(getattr(Config(), section), name)
    rows = {
        o.split("=")[1]
        for values in DIMENSIONS.values()
        for overrides in values.values()
        for o in overrides
        if o.split("=")[0] == field
    }
    missing = [v for v in CONFIG_NAMES[field] if v != default and v not in rows and (field, v) not in OWNED_ELSEWHERE]
    assert not missing, (
        f"{field} values {missing} have no row in tests/algo/test_combinations.py: add one with its reference"
    )


# combinations of options outside the table's dimensions that validation refuses: (overrides, the
# fields the sentence must name); algo.beta and reward.process_function only make the others active
REFUSED_ELSEWHERE = [
    (["algo.objective=cispo", "algo.dual_clip=3"], ["algo.objective", "algo.dual_clip"]),  # dual clip bounds PPO's clip
    (["algo.objective=sapo", "algo.dual_clip=3"], ["algo.objective", "algo.dual_clip"]),
    (
        [
            "algo.beta=0.1",
            "algo.kl_placement=reward",
            "algo.kl_bias_correction=true",
        ],  # no KL term in the loss to weigh
        ["algo.kl_placement", "algo.kl_bias_correction"],
    ),
    (
        ["algo.advantage=process", "reward.process_function=task", "algo.beta=0.1", "algo.kl_placement=reward"],
        ["algo.advantage=process", "algo.kl_placement"],
    ),  # the outcome reward (and its KL) is not used
    (
        ["algo.advantage=process", "reward.process_function=task", "reward.normalize_components=true"],
        ["algo.advantage=process", "reward.normalize_components"],
    ),
    # process supervision trains on the step rewards alone: a second outcome function, its weights and a
    # filter on the outcome total would be unread, or judge groups by a reward that does not train
    (
        ["algo.advantage=process", "reward.process_function=task", "reward.functions=[task,strict_format]"],
        ["algo.advantage=process", "reward.functions"],
    ),
    (
        ["algo.advantage=process", "reward.process_function=task", "reward.weights=[2.0]"],
        ["algo.advantage=process", "reward.weights"],
    ),
    (
        ["algo.advantage=process", "reward.process_function=task", "algo.dynamic_sampling=true"],
        ["algo.advantage=process", "algo.dynamic_sampling"],
    ),
    # the fields that chose an estimator beside algo.advantage are refused, naming the one spelling
    (["algo.credit=gigpo"], ["algo.credit", "algo.advantage=gigpo"]),
    (["algo.supervision=process"], ["algo.supervision", "algo.advantage=process"]),
    (["algo.entropy_shaping=gtpo"], ["algo.entropy_shaping", "algo.advantage=gtpo"]),
    # a process reward that no estimator but process would read
    (["reward.process_function=task", "algo.advantage=gigpo"], ["reward.process_function", "algo.advantage"]),
]


@pytest.mark.parametrize("overrides, fields", REFUSED_ELSEWHERE, ids=[" ".join(o) for o, _ in REFUSED_ELSEWHERE])
def test_options_outside_the_table_are_refused_in_one_sentence(overrides, fields):
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), overrides))
    text = str(e.value)
    assert "\n" not in text and ". " not in text, text
    assert all(f in text for f in fields), (fields, text)
