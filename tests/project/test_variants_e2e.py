"""Every variant and every preset trains a few steps on the built-in task with the demo model."""

import json

import pytest

from grpokit.algo.variants import VARIANTS
from grpokit.config import Config, presets
from grpokit.config.io import apply_overrides
from grpokit.train import Trainer

SMALL = [
    "train.steps=2",
    "train.prompts_per_step=4",
    "rollout.group_size=8",
    "data.eval_size=16",
    "record.sinks=[]",
    "record.report=false",
    "optim.lr=1e-3",
]


def run(overrides, tmp_path, base: Config | None = None):
    cfg = apply_overrides(base or Config(), overrides + [f"train.out={tmp_path / 'run'}"])
    tr = Trainer(cfg, quiet=True)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    summary = tr.train()
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    moved = any(not (before[n] == p.detach()).all() for n, p in tr.model.named_parameters())
    return tr, summary, lines, moved


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_trains_on_builtin_task(name, tmp_path):
    _, overrides = VARIANTS[name]
    keep = {"rollout.group_size"} & {o.split("=")[0] for o in overrides}  # 2-grpo keeps its pairs
    tr, summary, lines, moved = run(overrides + [s for s in SMALL if s.split("=")[0] not in keep], tmp_path)
    assert summary["steps"] == 2 and len(lines) == 2
    assert all(l["reward"] == l["reward"] for l in lines)  # no NaN
    assert moved or all(l.get("frac_reward_zero_std", 0) == 1 for l in lines), "the policy never moved"
    if name == "dapo":
        assert "dynamic_sampling/rounds" in lines[0] and "rewards/overlong_penalty/mean" in lines[0]
    if name == "gfpo-adaptive":
        assert "gfpo/hard_prompts" in lines[0]
    if name in ("ref-refresh",):
        assert "kl" in lines[0]
    if name == "2-grpo":
        assert tr.cfg.rollout.group_size == 2
    if name == "edge-grpo-eda":
        assert lines[0]["eda/scale/min"] > 0
    if name == "cispo":
        assert "clip_ratio/high_mean" in lines[0]
    if name in ("gtpo", "gtpo-joint", "grpo-s"):  # entropy-shaped rewards (arXiv 2508.04349)
        assert ("gtpo/shaped_reward/mean" if name != "grpo-s" else "grpo_s/shaped_reward/mean") in lines[0]
    if name == "edge-grpo":  # guided error correction ran on every step (counted even when no group was all wrong)
        assert all("gec/corrected_groups" in l for l in lines)
    if name == "lambda-grpo":  # lambda is trained and logged every step
        assert all("lambda_grpo/lambda" in l for l in lines)
    if name == "offpolicy-mask":
        assert "offpolicy/masked_sequences" in lines[0]


@pytest.mark.parametrize("name", presets.names())
def test_preset_loads_and_runs_a_few_steps(name, tmp_path):
    base = presets.apply(name, Config())
    # keep the published algorithm, shrink the scale so it runs on a CPU in seconds
    shrink = [
        "rollout.max_new_tokens=12",
        "train.prompts_per_step=2",
        "rollout.group_size=4",
        "train.steps=2",
        "data.eval_size=8",
        "record.sinks=[]",
        "record.report=false",
    ]
    if "overlong_penalty" in base.reward.params:
        shrink.append("reward.params={overlong_penalty: {max_length: 12, cache_length: 4}}")
    if base.train.updates_per_batch > 1:  # dapo's 16, gspo's 4 updates a batch: still several on 2 x 4 completions
        shrink.append("train.updates_per_batch=2")
    tr, summary, lines, _ = run(shrink, tmp_path, base)
    assert summary["steps"] == 2 and len(lines) == 2
    assert tr.cfg.algo == base.algo  # the preset's algorithm survived the shrinking


def test_preset_values_and_override_on_top():
    cfg = presets.apply("dapo", Config(), paper_scale=True)
    assert (cfg.rollout.group_size, cfg.algo.clip_low, cfg.algo.clip_high, cfg.algo.beta) == (16, 0.2, 0.28, 0.0)
    assert cfg.algo.dynamic_sampling and cfg.algo.aggregation == "token-mean" and cfg.train.prompts_per_step == 512
    assert presets.apply("dapo", Config()).train.prompts_per_step == 16  # the run's own batch unless --paper-scale
    cfg = apply_overrides(presets.apply("deepseekmath", Config()), ["rollout.group_size=4"])
    assert cfg.rollout.group_size == 4 and cfg.algo.beta == 0.04 and cfg.optim.lr == 1e-6
    with pytest.raises(Exception, match="unknown preset 'nope'; valid presets: dapo"):
        presets.load("nope")
