"""grpokit.trl's DistillationConfig / DistillationTrainer (trl/distillation.py): TRL 1.16's fields, each
mapped field's grpokit setting, the refusals, and a one-step run per divergence on tiny local models."""

import dataclasses

import pytest

from grpokit.config.base import ConfigError
from grpokit.trl import DistillationConfig, DistillationTrainer
from helpers.trl_models import SMALL_RUN, make_chat_model

ROWS = [{"prompt": [{"role": "user", "content": "add two"}]}] * 8


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return str(make_chat_model(tmp_path_factory.mktemp("teacher"), seed=1))


def trainer(chat_model, out, teacher_model=None, **kw):
    args = DistillationConfig(output_dir=str(out), **{**SMALL_RUN, **kw})
    return DistillationTrainer(chat_model, teacher_model=teacher_model, args=args, train_dataset=ROWS)


def test_the_fields_are_trls_plus_grpokits_two():
    import trl

    theirs = {f.name for f in dataclasses.fields(trl.DistillationConfig)}
    ours = {f.name for f in dataclasses.fields(DistillationConfig)}
    assert ours - theirs == {"distill_top_k", "num_generations"} and theirs <= ours


@pytest.mark.parametrize(
    "kw, want",
    [
        ({}, {"algo.distill_coef": 1.0, "algo.distill_estimator": "k1", "algo.distill_top_k": 0, "algo.beta": 0.0}),
        ({"beta": 0.0, "distill_top_k": 5}, {"algo.distill_top_k": 5, "algo.distill_coef": 1.0}),
        ({"temperature": 0.7}, {"rollout.temperature": 0.7}),
        ({"top_k": 5, "top_p": 0.9}, {"rollout.top_k": 5, "rollout.top_p": 0.9}),
        ({"max_completion_length": 7}, {"rollout.max_new_tokens": 7}),
        ({"learning_rate": 3e-6}, {"optim.lr": 3e-6}),
        ({"num_generations": 2}, {"rollout.group_size": 2}),
    ],
)
def test_each_mapped_field_sets_its_grpokit_field(chat_model, teacher, tmp_path, kw, want):
    cfg = trainer(chat_model, tmp_path, teacher_model_name_or_path=teacher, **kw).cfg
    assert cfg.algo.distill_teacher == teacher
    for dotted, value in want.items():
        section, name = dotted.split(".")
        assert getattr(getattr(cfg, section), name) == pytest.approx(value), dotted


def test_teacher_model_replaces_the_configs_teacher(chat_model, teacher, tmp_path):
    cfg = trainer(chat_model, tmp_path, teacher_model=teacher, teacher_model_name_or_path="elsewhere").cfg
    assert cfg.algo.distill_teacher == teacher


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"beta": 0.5}, r"beta=0.5 \(distill_top_k=0\) is not supported by grpokit"),
        ({"beta": 0.0}, r"beta=0.0 \(distill_top_k=0\) is not supported by grpokit: use beta=1.0"),
        ({"teacher_model_revision": "main"}, "teacher_model_revision='main' is not supported by grpokit"),
        ({"teacher_model_init_kwargs": {"dtype": "bfloat16"}}, "teacher_model_init_kwargs=.* is not supported"),
        ({"teacher_model_name_or_path": None}, "DistillationTrainer needs a teacher"),
        ({"vllm_structured_outputs_regex": "a+"}, "vllm_structured_outputs_regex"),
    ],
)
def test_what_grpokit_does_not_carry_out_is_one_sentence(chat_model, teacher, tmp_path, kw, message):
    with pytest.raises(ConfigError, match=message):
        trainer(chat_model, tmp_path, **{"teacher_model_name_or_path": teacher, **kw})


def test_a_teacher_object_is_refused(chat_model, tmp_path):
    with pytest.raises(ConfigError, match="teacher_model must be a folder or a model name"):
        trainer(chat_model, tmp_path, teacher_model=object())


@pytest.mark.parametrize(
    "kw, metric", [({}, "distill/reverse_kl"), ({"beta": 0.0, "distill_top_k": 4}, "distill/forward_kl")]
)
def test_one_step_trains(chat_model, teacher, tmp_path, kw, metric):
    tr = trainer(chat_model, tmp_path, teacher_model=teacher, max_steps=1, **kw)
    out = tr.train()
    logs = tr.state.log_history[-1]
    assert out.global_step == 1 and logs[metric] != 0.0 and logs["reward"] == 0.0
