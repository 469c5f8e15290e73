"""make_optimizer: AdamW runs fused on CPU and takes the same step as torch's reference loop; the other
optimizers and schedules run from overrides; mistakes are one sentence."""

import pytest
import torch

from grpokit.config import Config, ConfigError, OptimConfig
from grpokit.train.update import make_optimizer


def test_fused_adamw_step_equals_the_reference_implementation():
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    cfg = OptimConfig(lr=0.1, weight_decay=0.01)
    opt, _ = make_optimizer(a, cfg, total_steps=10)
    assert opt.param_groups[0]["fused"] is True
    ref = torch.optim.AdamW(
        b.parameters(),
        lr=0.1,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_eps,
        weight_decay=0.01,
        foreach=False,
    )
    x = torch.randn(5, 4)
    for _ in range(3):
        for m, o in ((a, opt), (b, ref)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    # first step of Adam moves every weight by ~lr (m/sqrt(v) = sign(g)), so differences are rounding only
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_a_grpokit_run_takes_any_optimizer_and_schedule_from_overrides(tmp_path):
    """`grpokit train optim.optimizer=sgd optim.schedule=cosine_with_min_lr ...`: 2 steps of the demo task.
    The logged rate is the one each update ran at: 1e-3, then cosine half-way to the floor 0.1,
    0.5 * (1 + cos(pi / 2)) * 0.9 + 0.1 = 0.55 of it."""
    import json

    from grpokit.config import Config, apply_overrides
    from grpokit.train import Trainer

    cfg = apply_overrides(
        Config(),
        [
            "train.steps=2",
            "train.prompts_per_step=2",
            "rollout.group_size=4",
            "data.eval_size=4",
            "record.sinks=[jsonl]",
            "record.report=false",
            "optim.lr=1e-3",
            "train.threads=1",
            "optim.optimizer=sgd",
            "optim.momentum=0.9",
            "optim.schedule=cosine_with_min_lr",
            "optim.min_lr_rate=0.1",
            f"train.out={tmp_path}/run",
        ],
    )
    trainer = Trainer(cfg, quiet=True)
    trainer.train()
    assert type(trainer.optimizer) is torch.optim.SGD and trainer.optimizer.param_groups[0]["momentum"] == 0.9
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["learning_rate"] for x in lines if "learning_rate" in x] == pytest.approx([1e-3, 5.5e-4])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"optimizer": "lion"},
            "optim.optimizer='lion' is not valid; choose one of: adamw, adafactor, sgd, adagrad, rmsprop, adamw_8bit, "
            "paged_adamw_8bit, paged_adamw_32bit, ademamix, ademamix_8bit, paged_ademamix_32bit, paged_ademamix_8bit, "
            "lion_32bit, lion_8bit, paged_lion_32bit, paged_lion_8bit, rmsprop_bnb, rmsprop_bnb_8bit, "
            "rmsprop_bnb_32bit, adamw_torch_4bit, adamw_torch_8bit",
        ),
        (
            {"optimizer": "adamw", "momentum": 0.9},
            "optim.momentum=0.9 has no effect with optim.optimizer=adamw; it is read by optim.optimizer sgd, rmsprop",
        ),
        (
            {"optimizer": "sgd", "nesterov": True},
            "optim.nesterov=true needs optim.momentum > 0 and optim.dampening = 0 (got 0.0, 0.0)",
        ),
        # the Adam settings are refused like the others where nothing reads them (before: silently ignored)
        (
            {"optimizer": "sgd", "adam_beta1": 0.5},
            "optim.adam_beta1=0.5 has no effect with optim.optimizer=sgd; it is read by optim.optimizer adamw, "
            "adamw_8bit, paged_adamw_8bit, paged_adamw_32bit, ademamix, ademamix_8bit, paged_ademamix_32bit, "
            "paged_ademamix_8bit, lion_32bit, lion_8bit, paged_lion_32bit, paged_lion_8bit, adamw_torch_4bit, "
            "adamw_torch_8bit",
        ),
        (
            {"optimizer": "adafactor", "adam_eps": 1e-3},
            "optim.adam_eps=0.001 has no effect with optim.optimizer=adafactor; it is read by optim.optimizer adamw, "
            "adamw_8bit, paged_adamw_8bit, paged_adamw_32bit, ademamix, ademamix_8bit, paged_ademamix_32bit, "
            "paged_ademamix_8bit, adamw_torch_4bit, adamw_torch_8bit",
        ),
    ],
)
def test_optimizer_mistakes_are_one_sentence(overrides, message):
    from helpers.config_errors import optim_error

    assert optim_error(overrides) == message


def test_lambda_grpos_own_adam_reads_the_betas_whatever_the_optimizer():
    # algo.aggregation=lambda-grpo trains lambda with its own Adam on optim.adam_beta1 / adam_beta2 (not adam_eps)
    from grpokit.validation import validate

    cfg = Config()
    cfg.algo.aggregation, cfg.optim.optimizer, cfg.optim.adam_beta1, cfg.optim.adam_beta2 = (
        "lambda-grpo",
        "sgd",
        0.5,
        0.9,
    )
    validate(cfg)
    cfg.optim.adam_eps = 1e-3
    with pytest.raises(ConfigError, match="optim.adam_eps=0.001 has no effect with optim.optimizer=sgd"):
        validate(cfg)


def test_one_rule_says_which_optimizer_fields_go_unread():
    # config/optim.py unread_optimizer_fields, read by validation (refused when set) and presets (left unset): the
    # optimizers' fields are the betas, adam_eps, momentum, dampening, nesterov, lr_decay, eps, rms_alpha, centered;
    # sgd reads momentum, dampening, nesterov; lambda-GRPO's own Adam adds the two betas, never adam_eps
    from grpokit.config.optim import unread_optimizer_fields

    assert unread_optimizer_fields("sgd", "token-mean") == [
        "adam_beta1",
        "adam_beta2",
        "adam_eps",
        "centered",
        "eps",
        "lr_decay",
        "rms_alpha",
    ]
    assert unread_optimizer_fields("sgd", "lambda-grpo") == ["adam_eps", "centered", "eps", "lr_decay", "rms_alpha"]
    # adamw reads the three Adam fields: the rest, whatever the aggregation
    unread = ["centered", "dampening", "eps", "lr_decay", "momentum", "nesterov", "rms_alpha"]
    assert unread_optimizer_fields("adamw", "lambda-grpo") == unread_optimizer_fields("adamw", "") == unread


def test_a_preset_fills_no_adam_setting_an_optimizer_does_not_read():
    # trl-default and smollm2-math set optim.adam_beta2=0.999 (TRL's); a run on sgd or adafactor gets none of it
    # (the refusal is for values the user sets), a run on adamw gets it, and lambda-GRPO's own Adam reads it on sgd
    from grpokit.config import apply_overrides, presets
    from grpokit.validation import unread_rules, validate

    for preset in ("trl-default", "smollm2-math"):
        for optimizer, aggregation, beta2 in [
            ("sgd", "", 0.99),
            ("adafactor", "", 0.99),
            ("adamw", "", 0.999),
            ("sgd", "lambda-grpo", 0.999),
        ]:
            given = [f"optim.optimizer={optimizer}"] + ([f"algo.aggregation={aggregation}"] if aggregation else [])
            cfg = presets.apply(preset, apply_overrides(Config(), given), rules=unread_rules())
            assert cfg.optim.adam_beta2 == beta2, (preset, optimizer, aggregation)
            validate(cfg)
