"""Adaptive entropy control (Skywork-OR1; TRL's use_adaptive_entropy): the coefficient's update by
hand, the loss and gradients step by step against TRL's own ``_compute_loss`` (an oracle only), the
config's checks and a short run whose coefficient ends where the hand count says."""

import math
import sys

import pytest
import torch

from grpokit.algo.entropy_control import EntropyController, applied_coef, next_coef
from grpokit.algo.loss import policy_loss
from grpokit.config import Config, ConfigError, apply_overrides
from grpokit.validation import validate
from helpers.paths import ROOT


def test_next_coef_and_applied_coef_by_hand():
    # target 0.2, delta 0.05, bounds [0, 0.12]
    assert next_coef(0.01, 0.5, 0.2, 0.05, 0.0, 0.12) == 0.0  # 0.5 > 0.2: 0.01 - 0.05 = -0.04, floored at 0
    assert next_coef(0.0, 0.1, 0.2, 0.05, 0.0, 0.12) == 0.05  # 0.1 <= 0.2: 0 + 0.05
    assert next_coef(0.10, 0.1, 0.2, 0.05, 0.0, 0.12) == 0.12  # 0.15 capped at 0.12
    assert next_coef(0.05, 0.2, 0.2, 0.05, 0.0, 0.12) == pytest.approx(
        0.10
    )  # equal to the target counts as low (TRL's <=)
    assert applied_coef(0.07, math.inf, 0.2) == 0.0  # no measurement yet: no bonus
    assert applied_coef(0.07, 0.2, 0.2) == 0.07 and applied_coef(0.07, 0.21, 0.2) == 0.0


def test_controller_walks_the_hand_worked_sequence():
    c = EntropyController(coef=0.01, target=0.2, delta=0.05, lo=0.0, hi=0.12)
    # entropy per step -> (coefficient after it, coefficient the next step applies)
    # 0.5: 0.01 - 0.05 -> 0 (floor); 0.5 > 0.2 so the next step applies 0
    # 0.1: 0 + 0.05 = 0.05, applied 0.05;  0.1: 0.10, applied 0.10;  0.1: 0.15 -> 0.12 (cap)
    # 0.3: 0.12 - 0.05 = 0.07, but 0.3 > 0.2 so 0 is applied
    expected = [(0.0, 0.0), (0.05, 0.05), (0.10, 0.10), (0.12, 0.12), (0.07, 0.0)]
    assert c.applied() == 0.0
    for entropy, (coef, applied) in zip([0.5, 0.1, 0.1, 0.1, 0.3], expected):
        c.update(entropy)
        assert (c.coef, c.applied()) == (pytest.approx(coef), pytest.approx(applied))
    restored = EntropyController(coef=0.5, target=0.2, delta=0.05, lo=0.0, hi=0.12)
    restored.load_state_dict(c.state_dict())
    assert (restored.coef, restored.last_entropy) == (pytest.approx(0.07), 0.3)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algo.entropy_coef_delta=-0.1"],
        ["algo.entropy_coef_min=0.5", "algo.entropy_coef_max=0.1"],
        ["algo.entropy_coef_min=-0.1"],
    ],
)
def test_config_refuses_bounds_that_cannot_hold(overrides):
    cfg = apply_overrides(Config(), ["algo.entropy_adaptive=true"] + overrides)
    with pytest.raises(ConfigError, match="algo.entropy_coef"):
        validate(cfg)
    with pytest.raises(ConfigError, match=r"has no effect unless algo.entropy_adaptive=true"):
        validate(apply_overrides(Config(), overrides))  # without adaptive control nothing reads them: said


def _batch(scale: float, seed: int):
    """A fixed batch (bench/trl_oracle) with token entropies of mean about ``scale``."""
    from trl_oracle import fixed_batch

    logp, old, _, adv, mask = fixed_batch(seed=seed)
    ent = torch.rand(logp.shape, generator=torch.Generator().manual_seed(seed + 7)) * 2 * scale
    return logp, old, adv, mask, ent


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_adaptive_steps_equal_trl(loss_type):
    # target 0.8, entropies of mean ~0.5, ~1.5, ~0.5, start 0.05, delta 0.02:
    # step 1 applies 0 (no measurement), then 0.05 + 0.02 = 0.07 (0.5 <= 0.8); step 2 applies 0.07, then 0.05;
    # step 3 applies 0 (1.5 > 0.8), then 0.07. TRL's code does the same on the same tensors.
    sys.path.insert(0, str(ROOT / "bench"))
    pytest.importorskip("trl")
    from trl_oracle import trl_adaptive_entropy_stand_in, trl_adaptive_step

    fake = trl_adaptive_entropy_stand_in(0.05, 0.8, 0.02, 0.0, 1.0, loss_type)
    ours = EntropyController(coef=0.05, target=0.8, delta=0.02, lo=0.0, hi=1.0)
    aggregation = {"dapo": "token-mean", "grpo": "seq-mean-token-mean"}[loss_type]
    applied, coefs = [], []
    for k, scale in enumerate([0.5, 1.5, 0.5]):
        logp, old, adv, mask, ent = _batch(scale, k)
        grads = []
        for side in ("trl", "grpokit"):
            x, e = logp.clone().requires_grad_(True), ent.clone().requires_grad_(True)
            if side == "trl":
                loss = trl_adaptive_step(fake, x, old, adv, mask, e)
            else:
                applied.append(ours.applied())
                loss, _ = policy_loss(
                    x,
                    old,
                    adv,
                    mask,
                    aggregation=aggregation,
                    entropy_NT=e,
                    entropy_coef=ours.applied(),
                    entropy_aggregation="token-mean",
                )
                ours.update(float((ent * mask).sum() / mask.sum()))
            loss.backward()
            grads.append((loss, x.grad, e.grad))
        (l_trl, gx_trl, ge_trl), (l_ours, gx_ours, ge_ours) = grads
        assert torch.allclose(l_ours, l_trl, atol=1e-7, rtol=1e-6)
        assert torch.allclose(gx_ours, gx_trl, atol=1e-7, rtol=1e-6)
        zero = torch.zeros_like(ent)  # a step without bonus: TRL multiplies by 0.0, grpokit leaves the term out
        ge_ours, ge_trl = (zero if g is None else g for g in (ge_ours, ge_trl))
        assert torch.allclose(ge_ours, ge_trl, atol=1e-8) and (ge_ours.abs().sum() > 0) == (applied[-1] > 0)
        assert ours.coef == pytest.approx(fake.entropy_coef) and ours.last_entropy == pytest.approx(
            fake._last_world_entropy
        )
        coefs.append(ours.coef)
    assert applied == [0.0, pytest.approx(0.07), 0.0]
    assert coefs == [pytest.approx(0.07), pytest.approx(0.05), pytest.approx(0.07)]


def test_run_raises_the_coefficient_once_per_optimizer_step(tmp_path):
    # entropy_target 15 nats is above any entropy of the demo model, so every optimizer step adds
    # delta: 2 steps x num_iterations 2 = 4 updates -> 0.01 + 4 * 0.005 = 0.03. The checkpoint keeps it.
    from grpokit.train.checkpoint import load_extra
    from grpokit.train.loop import Trainer

    cfg = apply_overrides(
        Config(),
        [
            "train.steps=2",
            "train.prompts_per_step=2",
            "rollout.group_size=2",
            "data.eval_size=0",
            "record.sinks=[jsonl]",
            "record.report=false",
            "train.threads=1",
            "rollout.max_new_tokens=4",
            "algo.num_iterations=2",
            "algo.entropy_coef=0.01",
            "algo.entropy_adaptive=true",
            "algo.entropy_target=15",
            "algo.entropy_aggregation=token-mean",
            f"train.out={tmp_path}/run",
        ],
    )
    updates = []

    class EachUpdate:  # the step's line is the mean over its updates: each update's own metrics, here
        def on_optimizer_step(self, args, state, control, metrics=None, **kw):
            updates.append(dict(metrics))

    trainer = Trainer(cfg, callbacks=[EachUpdate()], quiet=True)
    trainer.train()
    assert trainer.stage_state("entropy_control").coef == pytest.approx(0.03)
    ckpt = sorted((tmp_path / "run" / "checkpoints").glob("step-*"))[-1]
    assert load_extra(ckpt)["entropy_control"]["coef"] == pytest.approx(0.03)
    import json

    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["entropy_coef"] == pytest.approx(0.03)
    # the updates applied 0 (no measured entropy yet: TRL's first step has no bonus), 0.015, 0.02 then 0.025, the
    # coefficient after the update before: each update's loss is its policy loss minus that coef * the entropy of
    # its loss tokens
    assert len(updates) == 4
    for coef, m in zip((0.0, 0.015, 0.02, 0.025), updates):
        assert m["policy_loss"] - m["loss"] == pytest.approx(coef * m["entropy/loss_tokens_mean"], rel=1e-4, abs=1e-7)


def test_trl_evaluate_subtracts_the_bonus_the_next_step_would_apply(tmp_path):
    # TRL's eval loss is policy_loss - coef * H (H the mean token entropy); with a target above any
    # entropy, after 2 optimizer steps the coefficient is 0.1 + 2 * 0.05 = 0.2 and it applies
    from datasets import Dataset

    from grpokit.trl import GRPOConfig, GRPOTrainer
    from helpers.trl_models import make_chat_model

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd")])
    a = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=2,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        use_cpu=True,
        disable_tqdm=True,
        report_to="none",
        entropy_coef=0.1,
        logging_steps=1,
        use_adaptive_entropy=True,
        entropy_target=50.0,
        entropy_coef_delta=0.05,
    )
    tr = GRPOTrainer(
        str(make_chat_model(tmp_path / "m")),
        reward_funcs=[lambda completions, **kw: [float(len(c[0]["content"])) for c in completions]],
        args=a,
        train_dataset=data,
        eval_dataset=data,
    )
    tr.train()
    assert tr.entropy_coef == pytest.approx(0.2) and tr._last_world_entropy < 50.0
    ev = tr.evaluate()
    assert ev["eval_policy_loss"] - ev["eval_loss"] == pytest.approx(0.2 * ev["eval_entropy"], rel=1e-4, abs=1e-7)
    assert [h["entropy_coef"] for h in tr.state.log_history if "entropy_coef" in h and "train_loss" not in h][
        -1
    ] == pytest.approx(0.2)
