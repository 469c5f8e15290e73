"""grpokit.trl's optimizer and schedule arguments against transformers itself (a dev-only oracle):
``lr_scheduler_type`` / ``lr_scheduler_kwargs`` / ``warmup_steps`` give transformers' rate at every TRL
step, ``optim`` / ``optim_args`` the optimizer class and hyperparameters of
``Trainer.get_optimizer_cls_and_kwargs``; a run with Adafactor trains and resumes."""

from __future__ import annotations

import importlib.machinery
import sys
import types
import warnings

import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments, get_scheduler
from transformers.training_args import OptimizerNames

from grpokit.config import ConfigError
from grpokit.optim.optimizers import build_optimizer
from grpokit.optim.schedule import make_scheduler
from grpokit.trl.config import GRPOConfig
from grpokit.trl.mapping import to_config
from helpers.trl_models import make_chat_model, small_args

# one generation batch of 4 prompts x G 2 per step: 10 rows are 2 whole batches per epoch (the last 2 rows are dropped)
BATCH = dict(per_device_train_batch_size=8, num_generations=2)


def trl_rates(kwargs: dict, steps: int) -> list[float]:
    """What transformers' Trainer does with these arguments: its warm-up and get_scheduler over max_steps."""
    targs = TrainingArguments("unused", use_cpu=True, report_to="none", max_steps=steps, learning_rate=1e-3, **kwargs)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sched = get_scheduler(
            targs.lr_scheduler_type,
            opt,
            num_warmup_steps=targs.get_warmup_steps(steps),
            num_training_steps=steps,
            scheduler_specific_kwargs=targs.lr_scheduler_kwargs,
        )
    return [_next(sched) for _ in range(steps)]


def _next(sched) -> float:
    lr = sched.get_last_lr()[0]  # transformers 5 logs the rate of the update it just made
    sched.optimizer.step()
    sched.step()
    return lr


def grpokit_rates(kwargs: dict, steps: int) -> list[float]:
    cfg = to_config(GRPOConfig("o", max_steps=steps, learning_rate=1e-3, **BATCH, **kwargs), num_rows=10, world_size=1)
    sched = make_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3), cfg.optim, run_updates=10**6)
    return [_next(sched) for _ in range(steps)]


SCHEDULES = [
    dict(lr_scheduler_type="linear"),
    dict(lr_scheduler_type="linear", warmup_steps=3),
    dict(lr_scheduler_type="linear", warmup_steps=0.25),  # a share of max_steps: ceil(0.25 * 10) = 3
    dict(lr_scheduler_type="constant", warmup_steps=3),  # transformers' constant ignores the warm-up
    dict(lr_scheduler_type="constant_with_warmup", warmup_steps=3),
    dict(lr_scheduler_type="cosine", warmup_steps=2, lr_scheduler_kwargs={"num_cycles": 1.5}),
    dict(lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.1}),  # open-r1's GRPO recipes
    dict(lr_scheduler_type="cosine_with_min_lr", warmup_steps=0.1, lr_scheduler_kwargs={"min_lr": 2e-4}),
    dict(
        lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs='{"min_lr_rate": "0.2", "num_cycles": "1"}'
    ),  # a CLI's JSON
    dict(
        lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": None, "min_lr_rate": 0.1}
    ),  # None: not given
    dict(lr_scheduler_type="cosine_warmup_with_min_lr", warmup_steps=3, lr_scheduler_kwargs={"min_lr_rate": 0.1}),
    dict(lr_scheduler_type="cosine_with_restarts", warmup_steps=1, lr_scheduler_kwargs={"num_cycles": 3}),
    dict(lr_scheduler_type="polynomial", warmup_steps=2, lr_scheduler_kwargs={"power": 2.0, "lr_end": 1e-5}),
    dict(lr_scheduler_type="inverse_sqrt", warmup_steps=2),
    dict(lr_scheduler_type="inverse_sqrt", lr_scheduler_kwargs={"timescale": 3}),
    dict(
        lr_scheduler_type="warmup_stable_decay",
        warmup_steps=2,
        lr_scheduler_kwargs={"num_decay_steps": 4, "min_lr_ratio": 0.1},
    ),
    dict(
        lr_scheduler_type="warmup_stable_decay",
        lr_scheduler_kwargs={
            "num_decay_steps": 3,
            "num_stable_steps": 4,
            "decay_type": "linear",
            "warmup_type": "cosine",
        },
    ),
]


@pytest.mark.parametrize("kwargs", SCHEDULES, ids=lambda k: k["lr_scheduler_type"])
def test_every_step_has_the_rate_transformers_gives_it(kwargs):
    assert grpokit_rates(kwargs, 10) == pytest.approx(trl_rates(kwargs, 10), rel=1e-12, abs=0)


def test_schedule_spans_trls_steps_not_grpokits_rounds():
    # num_iterations 2: 5 TRL steps are 3 grpokit rounds (6 updates), but the schedule is 5 long, as TRL's
    cfg = to_config(
        GRPOConfig("o", max_steps=5, num_iterations=2, lr_scheduler_type="linear", **BATCH), num_rows=10, world_size=1
    )
    assert (cfg.train.steps, cfg.optim.schedule_steps) == (3, 5)


def test_epochs_set_the_schedule_length_as_transformers():
    # 10 rows, 4 prompts a step: 2 whole generation batches an epoch; 1.5 epochs = ceil(1.5 * 2) = 3 TRL steps
    cfg = to_config(GRPOConfig("o", num_train_epochs=1.5, **BATCH), num_rows=10, world_size=1)
    assert (cfg.train.steps, cfg.optim.schedule_steps) == (3, 3)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (
            dict(lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="steps"),
            "lr_scheduler_type='reduce_lr_on_plateau' is not supported by grpokit: "
            "it lowers the rate from an evaluation metric",
        ),
        (
            dict(lr_scheduler_type="greedy", eval_strategy="steps"),
            "lr_scheduler_type='greedy' is not supported by grpokit: it moves the rate",
        ),
        (dict(lr_scheduler_type="cosine_with_min_lr"), "with cosine_with_min_lr exactly one of min_lr and min_lr_rate"),
        (
            dict(lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": 1e-7, "min_lr_rate": 0.1}),
            "exactly one of",
        ),
        (
            dict(lr_scheduler_type="cosine", lr_scheduler_kwargs={"min_lr_rate": 0.1}),
            "valid: with cosine the keys num_cycles",
        ),
        (dict(lr_scheduler_kwargs={"num_cycles": 1.0}), "valid: with linear None or {}"),
        (dict(lr_scheduler_type="warmup_stable_decay"), "with warmup_stable_decay a dict with num_decay_steps"),
        (dict(lr_scheduler_type="step"), "lr_scheduler_type='step' is not valid; use one of linear, cosine, "),
        (
            dict(lr_scheduler_type="cosine", lr_scheduler_kwargs="{num_cycles: 1}"),
            "valid: None, a dict or a JSON object string",
        ),
    ],
)
def test_schedules_grpokit_cannot_run_are_one_sentence(kwargs, words):
    with pytest.raises(ConfigError) as e:
        to_config(GRPOConfig("o", **kwargs), num_rows=10)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_constant_schedules_ignore_kwargs_as_transformers():
    cfg = to_config(
        GRPOConfig("o", lr_scheduler_type="constant_with_warmup", lr_scheduler_kwargs={"anything": 1}), num_rows=10
    )
    assert cfg.optim.schedule == "constant"


# ------------------------------------------------------------------ optimizers
OPTIMIZERS = [
    dict(optim="adamw_torch"),
    dict(optim="adamw_torch_fused", weight_decay=0.01, adam_beta1=0.8, adam_epsilon=1e-6),
    dict(optim="adamw_torch", optim_args="momentum=0.9"),  # AdamW reads no optim_args, in both libraries
    dict(optim="adafactor"),
    dict(optim="adafactor", weight_decay=0.1),
    dict(optim="sgd"),
    # transformers gives the Adam settings to the Adam family only: the mapping leaves them out (grpokit refuses an
    # optim.adam_* set where its optimizer does not read it), so TRL's values are accepted and change nothing
    dict(optim="sgd", adam_beta1=0.5, adam_beta2=0.9, adam_epsilon=1e-3),
    dict(optim="adafactor", adam_beta2=0.5),
    dict(optim="sgd", optim_args="momentum=0.9, nesterov=True", weight_decay=0.01),
    dict(
        optim="sgd", optim_args="momentum=0.5,dampening=0.1,weight_decay=0.3"
    ),  # the group's weight_decay wins in both
    dict(optim="adagrad"),
    dict(optim="adagrad", optim_args="lr_decay=0.01,eps=1e-6"),
    dict(optim="rmsprop"),
    dict(optim="rmsprop", optim_args="momentum=0.9,alpha=0.9,eps=1e-6,centered=true", weight_decay=0.01),
]
IMPLEMENTATION = {
    "params",
    "fused",
    "foreach",
    "differentiable",
    "capturable",
}  # how a step is computed, not what it computes


@pytest.mark.parametrize("kwargs", OPTIMIZERS, ids=lambda k: f"{k['optim']}-{k.get('optim_args', '')}")
def test_optimizer_and_hyperparameters_are_transformers(kwargs):
    targs = TrainingArguments("unused", use_cpu=True, report_to="none", learning_rate=3e-4, **kwargs)
    cls, options = Trainer.get_optimizer_cls_and_kwargs(targs)
    # Trainer.create_optimizer: the decaying parameters' group carries args.weight_decay
    theirs = cls([{"params": [torch.nn.Parameter(torch.zeros(2))], "weight_decay": targs.weight_decay}], **options)
    cfg = to_config(GRPOConfig("o", learning_rate=3e-4, **kwargs), num_rows=10)
    ours = build_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg.optim)
    assert type(ours) is cls
    mine, want = ({k: v for k, v in o.param_groups[0].items() if k not in IMPLEMENTATION} for o in (ours, theirs))
    assert mine == want


def test_the_adam_settings_reach_only_an_optimizer_that_reads_them():
    # TRL's defaults (adam_beta2 0.999) and values given with sgd or adafactor: transformers passes them to the
    # Adam family alone, so the mapping leaves grpokit's fields unset there (0.9, 0.99, 1e-8) and the run's checks,
    # which refuse an optim.adam_* set where its optimizer does not read it, pass; adamw_torch copies them
    from grpokit.validation import validate

    for optim in ("sgd", "adafactor", "adamw_torch"):
        cfg = to_config(GRPOConfig("o", optim=optim, adam_beta1=0.5, adam_epsilon=1e-3), num_rows=10)
        validate(cfg)
        adam = (cfg.optim.adam_beta1, cfg.optim.adam_beta2, cfg.optim.adam_eps)
        assert adam == ((0.5, 0.999, 1e-3) if optim == "adamw_torch" else (0.9, 0.99, 1e-8)), optim


@pytest.mark.parametrize(
    "optim, package",
    [
        ("adamw_8bit", "bitsandbytes"),
        ("paged_adamw_8bit", "bitsandbytes"),
        ("adamw_bnb_8bit", "bitsandbytes"),
        ("adamw_torch_4bit", "torchao"),
    ],
)
def test_a_missing_cuda_library_is_one_sentence_naming_it(optim, package, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # absent even where it is installed
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError) as e:
        to_config(GRPOConfig("o", optim=optim), num_rows=10)
    assert str(e.value) == (
        f"GRPOConfig argument optim={optim!r} needs the {package} package, which is not installed; "
        "install it (a CUDA library) or use adamw_torch"
    )


def test_bitsandbytes_adamw_gets_transformers_arguments(monkeypatch):
    seen = {}

    class AdamW(torch.optim.SGD):  # a stand-in for bitsandbytes' class: records what it is built with
        def __init__(self, params, **kw):
            seen.update(kw)
            super().__init__(params, lr=kw["lr"])

    fake, optim = types.ModuleType("bitsandbytes"), types.ModuleType("bitsandbytes.optim")
    fake.__spec__ = importlib.machinery.ModuleSpec("bitsandbytes", None)
    optim.AdamW, fake.optim = AdamW, optim
    monkeypatch.setitem(sys.modules, "bitsandbytes", fake)
    monkeypatch.setitem(sys.modules, "bitsandbytes.optim", optim)
    cfg = to_config(GRPOConfig("o", optim="paged_adamw_8bit", learning_rate=2e-4, weight_decay=0.01), num_rows=10)
    build_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg.optim)
    # transformers: lr, betas, eps (adam_kwargs), optim_bits 8, is_paged; weight decay from the parameter group
    assert seen == {
        "lr": 2e-4,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 0.01,
        "optim_bits": 8,
        "is_paged": True,
    }


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (
            dict(optim="galore_adamw"),
            "optim='galore_adamw' is not supported by grpokit; valid: adamw_torch, adamw_torch_fused, adafactor",
        ),
        (
            dict(optim="sgd", optim_args="momentum=0.9,foo=1"),
            "valid: with optim='sgd' the keys momentum, dampening, nesterov",
        ),
        (dict(optim="sgd", optim_args="momentum"), "comma-separated key=value pairs"),
        (dict(optim="rmsprop", optim_args="alpha=high"), "a number for alpha"),
    ],
)
def test_optimizer_mistakes_are_one_sentence(kwargs, words):
    with pytest.raises(ConfigError) as e:
        to_config(GRPOConfig("o", **kwargs), num_rows=10)
    assert words in str(e.value)


# ------------------------------------------------------------------ a run
ROWS = [{"prompt": [{"role": "user", "content": f"add {a} {b}"}]} for a in range(4) for b in range(2)]


def short(completions, **kwargs):
    return [-float(len(c[0]["content"])) for c in completions]


class StopAt:
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


def run(out, model, stop_at=None, **kw):
    from grpokit.trl import GRPOTrainer

    args = small_args(
        GRPOConfig,
        out,
        max_steps=3,
        save_steps=1,
        optim="adafactor",
        learning_rate=1e-2,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.1},
        full_determinism=True,
        logging_steps=1,
    )
    trainer = GRPOTrainer(
        str(model),
        reward_funcs=[short],
        args=args,
        train_dataset=Dataset.from_list(ROWS),
        callbacks=[StopAt(stop_at)] if stop_at else None,
    )
    trainer.train(**kw)
    return trainer


def test_an_adafactor_run_trains_and_resumes_where_it_left_off(tmp_path):
    model = make_chat_model(tmp_path / "model")
    full = run(tmp_path / "a", model)
    opt = full._get().optimizer
    assert type(opt).__name__ == "Adafactor" and opt.state  # Adafactor's factored moments exist
    before = dict(make_chat_model_weights(model))
    after = {n: p.detach() for n, p in full._get().model.named_parameters()}
    assert any(not torch.equal(before[n], w) for n, w in after.items())  # it trained
    # cosine to 0.1 of 1e-2 over 3 steps: 1e-2, then 0.5 * (1 + cos(pi / 3)) * 0.9 + 0.1 = 0.775, then 0.325 (x 1e-2)
    assert [h["learning_rate"] for h in full.state.log_history if "learning_rate" in h] == pytest.approx(
        [1e-2, 7.75e-3, 3.25e-3]
    )
    run(
        tmp_path / "b", model, stop_at=2
    )  # the same run, stopped after step 2 (its checkpoint-2 holds Adafactor's state)
    resumed = run(tmp_path / "b", model, resume_from_checkpoint=True)
    for n, p in resumed._get().model.named_parameters():
        assert torch.equal(p.detach(), after[n]), n


def make_chat_model_weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors")).items()


# every optimizer transformers builds from bitsandbytes, read from transformers' own list of names (not a copy of
# grpokit's table): GaLore and torchao's 8-bit AdamW are other libraries
BNB_MORE = [
    o.value
    for o in OptimizerNames
    if any(k in o.value for k in ("bnb", "8bit", "32bit", "paged", "ademamix", "lion"))
    and not o.value.startswith(("galore", "adamw_torch"))
]


@pytest.mark.parametrize("optim", BNB_MORE)
def test_bitsandbytes_optimizers_are_the_ones_transformers_builds(optim):
    """The class, the hyperparameters of the group and bitsandbytes' own options (8- or 32-bit state, paged)
    of each bitsandbytes optimizer, against transformers' Trainer.get_optimizer_cls_and_kwargs itself."""
    pytest.importorskip("bitsandbytes")
    kwargs = dict(
        optim=optim, learning_rate=3e-4, weight_decay=0.01, adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-6
    )
    targs = TrainingArguments("unused", use_cpu=True, report_to="none", **kwargs)
    cls, options = Trainer.get_optimizer_cls_and_kwargs(targs)
    theirs = cls([{"params": [torch.nn.Parameter(torch.zeros(2))], "weight_decay": targs.weight_decay}], **options)
    ours = build_optimizer(
        [torch.nn.Parameter(torch.zeros(2))], to_config(GRPOConfig("o", **kwargs), num_rows=10).optim
    )
    assert type(ours) is cls
    mine, want = ({k: v for k, v in o.param_groups[0].items() if k not in IMPLEMENTATION} for o in (ours, theirs))
    assert mine == want
    assert (ours.args.optim_bits, ours.is_paged) == (theirs.args.optim_bits, theirs.is_paged)


def test_weight_decay_leaves_biases_and_norms_out_as_transformers():
    # transformers' Trainer builds two parameter groups (optim/decay.py; tests/optim/test_decay.py checks them)
    cfg = to_config(GRPOConfig("o", weight_decay=0.1), num_rows=10)
    assert (cfg.optim.weight_decay, cfg.optim.decay_norms_and_biases) == (0.1, False)
