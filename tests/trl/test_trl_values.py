"""Every value TRL accepts, with TRL's meaning (issue 46, deliverable 5).

values_table.json holds, for each boundary value of each field of TRL's GRPOConfig (trl_values.py), TRL's
verdict (its GRPOConfig, and a 1-step run of its GRPOTrainer where grpokit once refused the value:
bench/trl_values_oracle.py), grpokit.trl's verdict and the reason. The first test walks every pair through
grpokit's GRPOConfig and mapping (no model, no trl needed) and checks the table; the last checks that the
TRL side of the table still is what the installed TRL says.
"""

from __future__ import annotations

import collections
import json

import pytest
from trl_values import base_args, boundary_values, grpokit_verdict, load_table, other_versions, trl_verdict

ROWS = load_table()


def test_grpokit_verdicts_are_the_tables():
    if why := other_versions():
        pytest.skip(why)
    changed = []
    for r in ROWS:
        verdict, why = grpokit_verdict(r["field"], r["value"])
        if verdict != r["grpokit"]:
            changed.append((r["field"], r["value"], r["grpokit"], verdict, why))
    assert not changed, (
        f"{len(changed)} verdicts differ from values_table.json (rerun bench/trl_values_oracle.py): "
        + (json.dumps(changed[:10]))
    )


def test_every_value_trl_runs_with_is_accepted_or_has_a_reason():
    """TRL is the oracle: a value its 1-step run trains with is accepted, or refused because TRL misbehaves on it
    or grpokit does not carry it out (the refusal says what TRL does); a value TRL fails on may be refused."""
    kinds = collections.Counter()
    for r in ROWS:
        if r["trl_config"] == "refuse":
            assert not r["trl_run"]  # never run: TRL's own GRPOConfig refuses it
            continue
        assert not r["reason"].startswith("open"), r  # every pair is decided, by TRL as the oracle
        if r["trl_run"] == "runs" and r["grpokit"] == "refuse":
            assert r["reason"].startswith("refused"), r
            assert "TRL runs" in r["grpokit_why"], r  # the sentence says TRL runs it and what it does
        if r["trl_run"] == "fails" and r["grpokit"] == "refuse":
            assert r["reason"] == "TRL fails too", r
        if r["grpokit"] == "refuse":
            assert r["trl_run"], r  # every value grpokit refuses and TRL's config takes was tried on TRL
        kinds[(r["trl_run"] or "config only", r["grpokit"])] += 1
    # the measured state (see docs/TRL.md); an "open" row that gets carried out changes these numbers
    assert kinds[("runs", "accept")] >= 72
    assert kinds[("runs", "refuse")] <= 15


def _mapped(**kw) -> dict:
    import dataclasses

    from grpokit.trl.config import GRPOConfig
    from grpokit.trl.mapping import to_config

    args = GRPOConfig(**{**base_args("o", "report_to", "none"), **kw})  # nothing is written to "o"
    return dataclasses.asdict(to_config(args, num_rows=64))


def test_a_gated_value_is_inert_while_its_gate_is_off():
    """Every boundary value of a field TRL reads only behind another argument (checks.GATES), with that gate
    off (trl_values.BASE), maps onto the same grpokit Config as the field's default: it reaches no field."""
    from grpokit.trl.args.checks import GATES

    base = _mapped()
    tried = 0
    for r in ROWS:
        if r["field"] in GATES and r["grpokit"] == "accept":
            assert _mapped(**{r["field"]: r["value"]}) == base, (r["field"], r["value"])
            tried += 1
    assert tried >= 40


@pytest.mark.parametrize(
    "bad, gate",
    [
        (dict(vespo_k_pos=-1.0), dict(loss_type="vespo", beta=0.0)),
        (dict(ref_model_sync_steps=0), dict(sync_ref_model=True)),
        (dict(ref_model_mixup_alpha=2.0), dict(sync_ref_model=True)),
        (dict(entropy_target=-1.0), dict(use_adaptive_entropy=True)),
        (dict(per_device_eval_batch_size=0), dict(eval_strategy="steps", eval_steps=1)),
        (dict(num_generations_eval=-1), dict(eval_on_start=True)),
        (dict(vllm_tensor_parallel_size=0), dict(use_vllm=True)),
        (dict(vllm_importance_sampling_cap=-1.0), dict(use_vllm=True)),
    ],
)
def test_a_gated_value_is_checked_once_its_gate_is_on(bad, gate):
    """The same value is refused, in one sentence naming the gate, when the config turns the gate on: at
    construction, when the value is set afterwards, and at the mapping when the gate is set afterwards."""
    from grpokit.config.sections import ConfigError
    from grpokit.trl.config import GRPOConfig
    from grpokit.trl.mapping import to_config

    (name, value), gate_arg = next(iter(bad.items())), next(iter(gate))
    words = rf"GRPOConfig argument {name}={value!r} is not valid; use .*\(read because {gate_arg}="
    with pytest.raises(ConfigError, match=words):
        GRPOConfig("o", report_to="none", **bad, **gate)
    on = GRPOConfig("o", report_to="none", **gate)
    with pytest.raises(ConfigError, match=words):
        setattr(on, name, value)
    off = GRPOConfig("o", report_to="none", **bad)  # inert: accepted
    for k, v in gate.items():
        setattr(off, k, v)
    with pytest.raises(ConfigError, match=words):
        to_config(off, num_rows=64)


def test_hub_strategy_is_read_with_push_to_hub_only():
    from grpokit.config.sections import ConfigError
    from grpokit.trl.config import GRPOConfig
    from grpokit.trl.mapping import to_config

    args = GRPOConfig("o", report_to="none", hub_strategy="checkpoint")
    to_config(args, num_rows=64)
    args.__dict__["push_to_hub"] = True  # as if set; construction with it would reach for the Hub
    with pytest.raises(ConfigError, match=r"hub_strategy='checkpoint' .*\(read because push_to_hub=True\)"):
        to_config(args, num_rows=64)


def test_values_named_by_the_issue_are_accepted():
    accepted = {(r["field"], json.dumps(r["value"])) for r in ROWS if r["grpokit"] == "accept"}
    for field, value in [
        ("num_completions_to_print", 0),
        ("save_total_limit", 0),
        ("shuffle_dataset", None),
        ("top_k", -1),
        ("max_grad_norm", -1),
    ]:
        assert (field, json.dumps(value)) in accepted, (field, value)


def test_trl_side_of_the_table_is_trls():
    trl = pytest.importorskip("trl")
    if why := other_versions():
        pytest.skip(why)
    pairs = boundary_values(trl.GRPOConfig)
    assert [(r["field"], r["value"]) for r in ROWS] == [(f, v) for f, v in pairs], "TRL's fields changed: rerun"
    wrong = [(r["field"], r["value"]) for r in ROWS if trl_verdict(r["field"], r["value"])[0] != r["trl_config"]]
    assert not wrong, wrong


def test_a_negative_logging_steps_logs_at_trls_steps(chat_model, tmp_path):
    """transformers: logging_steps below 1 is ceil(max_steps * value); -1 on a 3-step run is the period -3,
    so ``step % -3 == 0`` logs step 3 only. grpokit's run logs the same steps (TRL's run, when installed)."""
    from datasets import Dataset

    from grpokit.trl import GRPOConfig, GRPOTrainer
    from helpers.trl_models import small_args

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd")])

    def reward(completions, **kwargs):
        return [float(len(c[0]["content"])) for c in completions]

    def logged(config_cls, trainer_cls, out):
        args = small_args(config_cls, out, max_steps=3, logging_steps=-1, report_to="none", save_strategy="no")
        tr = trainer_cls(chat_model, reward_funcs=[reward], train_dataset=data, args=args)
        tr.train()
        return [e["step"] for e in tr.state.log_history if "loss" in e]

    assert logged(GRPOConfig, GRPOTrainer, tmp_path / "g") == [3]
    trl = pytest.importorskip("trl")
    assert logged(trl.GRPOConfig, trl.GRPOTrainer, tmp_path / "t") == [3]


def test_values_carried_out_with_trls_meaning_train_a_step(chat_model, tmp_path):
    """One grpokit step with values TRL's run trains with and grpokit now carries out: bitsandbytes' Lion
    (8-bit state, as transformers builds lion_8bit), save_steps=0 (transformers: no step checkpoint),
    entropy_coef=-1 (an entropy penalty), top_entropy_quantile=2 (every token); then
    evaluate() reads per_device_eval_batch_size=0, which TRL's DataLoader fails on, and refuses it."""
    pytest.importorskip("bitsandbytes")
    from datasets import Dataset

    from grpokit.config.sections import ConfigError
    from grpokit.trl import GRPOConfig, GRPOTrainer
    from helpers.trl_models import small_args

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd")])

    def reward(completions, **kwargs):
        return [float(len(c[0]["content"])) for c in completions]

    values = dict(optim="lion_8bit", save_steps=0, entropy_coef=-1.0, top_entropy_quantile=2.0)
    args = small_args(GRPOConfig, tmp_path, max_steps=1, logging_steps=1, report_to="none", **values)
    args.per_device_eval_batch_size = 0  # inert while nothing evaluates (eval_strategy "no")
    tr = GRPOTrainer(chat_model, reward_funcs=[reward], train_dataset=data, args=args)
    cfg = tr._get().cfg
    assert (cfg.optim.optimizer, cfg.algo.entropy_coef, cfg.algo.entropy_top_fraction) == ("lion_8bit", -1.0, 1.0)
    assert (cfg.train.save_every, cfg.train.save_last) == (0, False)
    tr.train()
    assert [e["step"] for e in tr.state.log_history if "loss" in e] == [1]
    opt = tr._get().callbacks.objects["optimizer"]  # the one grpokit's run built from optim.optimizer
    assert type(opt).__module__.startswith("bitsandbytes") and type(opt).__name__ == "Lion", opt
    assert not list(tmp_path.glob("checkpoint-*"))
    with pytest.raises(ConfigError, match=r"per_device_eval_batch_size=0 .*\(read by this call\)"):
        tr.evaluate(data)


def test_enable_jit_checkpoint_checkpoints_the_last_step_on_sigterm(chat_model, tmp_path):
    """transformers' enable_jit_checkpoint: on SIGTERM, a checkpoint at the step reached, then stop; grpokit's
    loop does that on SIGTERM (train/stopping.py), named as TRL names it. With save_strategy "no" transformers
    still writes it and grpokit would not: refused."""
    import os
    import signal

    from datasets import Dataset
    from transformers import TrainerCallback

    from grpokit.config.sections import ConfigError
    from grpokit.trl import GRPOConfig, GRPOTrainer
    from grpokit.trl.mapping import to_config
    from helpers.trl_models import small_args

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd")])

    class Preempt(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    def reward(completions, **kwargs):
        return [float(len(c[0]["content"])) for c in completions]

    args = small_args(GRPOConfig, tmp_path, max_steps=40, save_steps=100, report_to="none", enable_jit_checkpoint=True)
    tr = GRPOTrainer(chat_model, reward_funcs=[reward], train_dataset=data, args=args, callbacks=[Preempt()])
    tr.train()
    assert tr.state.global_step == 2
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-2"]
    with pytest.raises(ConfigError, match="enable_jit_checkpoint=True is not supported by grpokit; valid: False with"):
        to_config(GRPOConfig("o", save_strategy="no", enable_jit_checkpoint=True), num_rows=4)
