"""A script may change ``trainer.args`` between ``GRPOTrainer(...)`` and ``train()``, as transformers reads its
arguments when train() starts: the change is read then, not dropped. A change once the run is built, or of a
field that acted at construction, is refused in one sentence."""

from __future__ import annotations

import pytest
from datasets import Dataset

from grpokit.config import ConfigError
from grpokit.trl import GRPOConfig, GRPOTrainer
from helpers.trl_models import small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh")])


def short(completions, **kwargs):
    return [-len(c[0]["content"]) / 10 for c in completions]


def trainer(model, out, **kw):
    return GRPOTrainer(model, reward_funcs=[short], train_dataset=DATA, args=small_args(GRPOConfig, out, **kw))


def test_fields_changed_before_train_are_read_at_train(chat_model, tmp_path):
    tr = trainer(chat_model, tmp_path / "o", max_steps=1, logging_steps=1, report_to="none")
    tr.args.max_steps, tr.args.learning_rate, tr.args.lr_scheduler_type = 3, 1e-3, "constant"
    out = tr.train()
    # transformers' (and TRL's) run: 3 steps at the constant 1e-3, not the constructed 1 step at 1e-6
    assert out.global_step == 3 == tr.cfg.optim.schedule_steps
    assert [h["learning_rate"] for h in tr.state.log_history if "loss" in h] == [1e-3, 1e-3, 1e-3]


def test_a_field_that_acted_at_construction_is_refused(chat_model, tmp_path):
    tr = trainer(chat_model, tmp_path / "o", max_steps=1, report_to="none")
    tr.args.skip_memory_metrics = not tr.args.skip_memory_metrics
    with pytest.raises(ConfigError) as e:
        tr.train()
    assert str(e.value) == (
        "GRPOConfig fields changed after GRPOTrainer(...) was constructed (skip_memory_metrics): they take effect at "
        "construction; pass them in the GRPOConfig given to GRPOTrainer"
    )
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_a_change_after_the_run_is_built_is_refused(chat_model, tmp_path):
    tr = trainer(chat_model, tmp_path / "o", max_steps=1, report_to="none")
    assert tr.state.global_step == 0  # the first use builds the run
    tr.args.max_steps, tr.args.beta = 4, 0.1
    with pytest.raises(ConfigError) as e:
        tr.train()
    assert str(e.value) == (
        "GRPOConfig fields changed after the run was built (max_steps, beta): grpokit reads trainer.args once, when "
        "train() (or the first use of trainer.state, evaluate() ...) builds the run; set them before that, or build "
        "a new GRPOTrainer"
    )


def test_an_invalid_change_is_checked_as_at_construction(chat_model, tmp_path):
    tr = trainer(chat_model, tmp_path / "o", max_steps=1, report_to="none")
    tr.args.num_generations = 3  # 4 completions per step: not a multiple of 3, as GRPOConfig itself would refuse
    with pytest.raises(ConfigError, match="num_generations"):
        tr.train()
