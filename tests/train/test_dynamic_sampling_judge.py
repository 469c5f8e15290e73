"""algo.dynamic_sampling_on: which reward functions dynamic sampling judges a group by. The names resolve
against the run's own functions ("task": the task's verifier, or the passed functions on one's own data),
an unknown name or a domain judged by none of its functions is refused, and --preset dapo on one's own data
with a binary verifier drops every group whose answers are all right or all wrong, whatever its overlong
penalties (DAPO: 0 < correct < G)."""

import json

import pytest

from grpokit.config import Config, presets
from grpokit.config.io import apply_overrides
from grpokit.config.sections import ConfigError
from grpokit.train import Trainer, domain_setup, reward_setup
from helpers.runs import ROWS


def has_a(prompts, completions, **kw):
    """A binary verifier: 1 when the completion holds an 'a'."""
    return [1.0 if "a" in c else 0.0 for c in completions]


def columns(over: list[str], passed=None):
    cfg = apply_overrides(Config(), ["algo.dynamic_sampling=true", *over])
    specs = reward_setup.reward_specs(cfg, passed)
    return [s.name for s in specs], domain_setup.judged_columns(cfg, specs)


def test_names_resolve_against_the_runs_own_functions():
    own = ["data.task=", "reward.functions=[overlong_penalty]"]
    # on one's own data "task" is the passed function (after the named ones), as it takes task's place
    assert columns([*own, "algo.dynamic_sampling_on=[task]"], [has_a]) == (["overlong_penalty", "has_a"], [1])
    assert columns([*own, "algo.dynamic_sampling_on=[has_a]"], [has_a]) == (["overlong_penalty", "has_a"], [1])
    assert columns(own, [has_a])[1] is None  # empty: the weighted total decides
    # with a task "task" is its verifier, wherever it stands; a passed function beside it is not
    names, judged = columns(["reward.functions=[overlong_penalty, task]", "algo.dynamic_sampling_on=[task]"], [has_a])
    assert names == ["overlong_penalty", "arithmetic_accuracy", "has_a"] and judged == [1]
    # an import path by its entry or its metrics name, and two names summed
    path = ["data.task=", "reward.functions=['helpers.runs:likes_a', overlong_penalty]"]
    assert columns([*path, "algo.dynamic_sampling_on=['helpers.runs:likes_a']"])[1] == [0]
    assert columns([*path, "algo.dynamic_sampling_on=[likes_a, overlong_penalty]"])[1] == [0, 1]


def test_an_unknown_name_is_refused_in_one_sentence():
    with pytest.raises(ConfigError) as e:
        columns(["data.task=", "reward.functions=[overlong_penalty]", "algo.dynamic_sampling_on=[acuracy]"], [has_a])
    assert str(e.value) == (
        "algo.dynamic_sampling_on names 'acuracy', which is none of the run's reward functions (overlong_penalty, "
        "has_a); name some of them, task for the run's own reward (the task's verifier, or the functions passed to "
        "the Trainer), or leave it empty to judge groups by the reward as trained"
    )
    with pytest.raises(ConfigError, match="names 'task', which is none of the run's reward functions"):
        columns(["reward.functions=[overlong_penalty]", "algo.dynamic_sampling_on=[task]"])  # a task, not named


def test_every_domain_needs_a_judged_function(tmp_path):
    data = tmp_path / "own.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    over = [
        "data.domains.add.task=arithmetic",
        f"data.domains.own.dataset={data}",
        "data.domains.own.reward_functions=['helpers.runs:likes_a']",
    ]
    cfg = apply_overrides(Config(), ["algo.dynamic_sampling=true", "algo.dynamic_sampling_on=[task]", *over])
    specs = domain_setup.domain_reward_specs(cfg, None)
    assert [s.name for s in specs] == ["add/arithmetic_accuracy", "own/likes_a"]
    with pytest.raises(ConfigError) as e:
        domain_setup.judged_columns(cfg, specs)
    assert str(e.value) == (
        "algo.dynamic_sampling_on=['task'] judges none of data.domains.own's reward functions, so its groups would "
        "all look flat and be dropped; add one of them (own/likes_a) or task for its task's verifier"
    )
    cfg.algo.dynamic_sampling_on = ["task", "own/likes_a"]
    assert domain_setup.judged_columns(cfg, specs) == [0, 1]


def test_the_dapo_preset_on_own_data_drops_groups_of_one_accuracy(tiny_model_dir, tmp_path):
    """The hunter's case: a binary verifier passed to the Trainer beside --preset dapo's overlong penalty
    (10 new tokens: max_length 10, cache 2, so a completion cut at 10 tokens gets -1). Before, groups whose
    answers were all wrong stayed when their penalties differed (totals -1, -1, -1, 0; advantages -0.5 x 3,
    1.5). Now every trained group has some right and some wrong answers."""
    cfg = apply_overrides(
        Config(),
        [
            f"model.name_or_path={tiny_model_dir}",
            "data.task=",
            "reward.functions=[]",
            "rollout.group_size=4",
            "rollout.max_new_tokens=10",
            "train.prompts_per_step=4",
            "train.steps=3",
            "optim.lr=1e-2",
            f"train.out={tmp_path / 'run'}",
            "record.sinks=[]",
            "record.report=false",
            "train.threads=1",
            "record.samples_every=1",
            "record.samples_prompts=100",
            "data.eval_size=0",
            "train.updates_per_batch=4",
        ],
    )
    presets.apply("dapo", cfg)
    assert cfg.algo.dynamic_sampling_on == ["task"] and cfg.reward.functions == ["overlong_penalty"]
    Trainer(cfg, reward_funcs=[has_a], train_rows=ROWS, quiet=True).train()
    groups = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert groups
    for g in groups:
        accuracy = [c["rewards"]["has_a"] for c in g["completions"]]
        assert 0 < sum(accuracy) < len(accuracy), (g["step"], g["prompt"], accuracy)


def test_a_passed_function_is_judged_beside_named_ones(tiny_model_dir, tmp_path):
    """Without a preset: reward.functions=[overlong_penalty] and likes_a passed, judged by likes_a alone."""
    from helpers.runs import make

    tr = make(
        tiny_model_dir,
        tmp_path / "run",
        **{
            "reward.functions": "[overlong_penalty]",
            "algo.dynamic_sampling": "true",
            "algo.dynamic_sampling_on": "[likes_a]",
        },
    )
    assert [s.name for s in tr.runner.specs] == ["overlong_penalty", "likes_a"] and tr.judged == [1]


def test_passed_functions_stand_where_task_is_named():
    """--preset dapo on one's own data: reward.functions=[task, overlong_penalty] and a passed verifier. The
    verifier takes task's place, in its place, so it is the run's grader (the first function), not the penalty
    (before: [overlong_penalty, has_a], and held-out accuracy read the penalty)."""
    own = ["data.task=", "reward.functions=[task, overlong_penalty]", "algo.dynamic_sampling_on=[task]"]
    assert columns(own, [has_a]) == (["has_a", "overlong_penalty"], [0])
    cfg = apply_overrides(Config(), own)
    specs = reward_setup.reward_specs(cfg, [has_a])
    assert reward_setup.grader(cfg, specs) == (specs[0], 0) and specs[0].fn is has_a
    assert reward_setup.spec_sources(cfg, 2) == ["task", "overlong_penalty"]
    # two passed functions in task's place, a named one on each side: the order the user wrote
    cfg = apply_overrides(Config(), ["data.task=", "reward.functions=[strict_format, task, overlong_penalty]"])
    specs = reward_setup.reward_specs(cfg, [has_a, has_a])
    assert [s.name for s in specs] == ["strict_format", "has_a", "has_a", "overlong_penalty"]
    assert reward_setup.spec_sources(cfg, 4) == ["strict_format", "task", "task", "overlong_penalty"]
