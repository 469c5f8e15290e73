"""reward.judge (also spelled algo.dynamic_sampling_on): the reward functions that say whether a completion is
right, the one judge dynamic sampling, the frontier curriculum and EDGE-GRPO's error correction read. The names
resolve against the run's own functions ("task": the task's verifier, or the passed functions on one's own data),
an unknown name or a domain judged by none of its functions is refused, and --preset dapo on one's own data with a
binary verifier drops every group whose answers are all right or all wrong, whatever its overlong penalties (DAPO:
0 < correct < G). With accuracy 1/0 and a format bonus of 0.5 every completion earns, a wrong answer no longer passes
the curriculum's threshold of 0.5, and a group of wrong answers is all wrong for error correction."""

import json

import pytest

from grpokit.config import Config, presets
from grpokit.config.io import apply_overrides
from grpokit.config.sections import ConfigError
from grpokit.train import Trainer, domain_setup, reward_setup
from helpers.runs import ROWS, has_a


def columns(over: list[str], passed=None):
    cfg = apply_overrides(Config(), ["algo.dynamic_sampling=true", *over])
    specs = reward_setup.reward_specs(cfg, passed)
    return [s.name for s in specs], domain_setup.judged_columns(cfg, specs)


def test_names_resolve_against_the_runs_own_functions():
    own = ["data.task=", "reward.functions=[overlong_penalty]"]
    # on one's own data "task" is the passed function (after the named ones), as it takes task's place
    assert columns([*own, "reward.judge=[task]"], [has_a]) == (["overlong_penalty", "has_a"], [1])
    assert columns([*own, "reward.judge=[has_a]"], [has_a]) == (["overlong_penalty", "has_a"], [1])
    assert columns(own, [has_a])[1] is None  # empty: the weighted total decides
    # with a task "task" is its verifier, wherever it stands; a passed function beside it is not
    names, judged = columns(["reward.functions=[overlong_penalty, task]", "reward.judge=[task]"], [has_a])
    assert names == ["overlong_penalty", "arithmetic_accuracy", "has_a"] and judged == [1]
    # an import path by its entry or its metrics name, and two names summed
    path = ["data.task=", "reward.functions=['helpers.runs:likes_a', overlong_penalty]"]
    assert columns([*path, "reward.judge=['helpers.runs:likes_a']"])[1] == [0]
    assert columns([*path, "reward.judge=[likes_a, overlong_penalty]"])[1] == [0, 1]


def test_an_unknown_name_is_refused_in_one_sentence():
    with pytest.raises(ConfigError) as e:
        columns(["data.task=", "reward.functions=[overlong_penalty]", "reward.judge=[acuracy]"], [has_a])
    assert str(e.value) == (
        "reward.judge names 'acuracy', which is none of the run's reward functions (overlong_penalty, has_a); name "
        "some of them, task for the run's own reward (the task's verifier, or the functions passed to the Trainer), "
        "or leave it empty to judge completions by the reward as trained"
    )
    with pytest.raises(ConfigError, match="names 'task', which is none of the run's reward functions"):
        columns(["reward.functions=[overlong_penalty]", "reward.judge=[task]"])  # a task, not named


def test_every_domain_needs_a_judged_function(tmp_path):
    data = tmp_path / "own.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    over = [
        "data.domains.add.task=arithmetic",
        f"data.domains.own.dataset={data}",
        "data.domains.own.reward_functions=['helpers.runs:likes_a']",
    ]
    cfg = apply_overrides(Config(), ["algo.dynamic_sampling=true", "reward.judge=[task]", *over])
    specs = domain_setup.domain_reward_specs(cfg, None)
    assert [s.name for s in specs] == ["add/arithmetic_accuracy", "own/likes_a"]
    with pytest.raises(ConfigError) as e:
        domain_setup.judged_columns(cfg, specs)
    assert str(e.value) == (
        "reward.judge=['task'] judges none of data.domains.own's reward functions, so each of its completions would "
        "be judged 0 alike (no group kept by dynamic sampling, no pass for the curriculum, every group corrected); "
        "add one of them (own/likes_a) or task for its task's verifier"
    )
    cfg.reward.judge = ["task", "own/likes_a"]
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
    assert cfg.reward.judge == ["task"] and cfg.reward.functions == ["overlong_penalty"]
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
            "reward.judge": "[likes_a]",
        },
    )
    assert [s.name for s in tr.runner.specs] == ["overlong_penalty", "likes_a"] and tr.judged == [1]


def test_passed_functions_stand_where_task_is_named():
    """--preset dapo on one's own data: reward.functions=[task, overlong_penalty] and a passed verifier. The
    verifier takes task's place, in its place, so it is the run's grader (the first function), not the penalty
    (before: [overlong_penalty, has_a], and held-out accuracy read the penalty)."""
    own = ["data.task=", "reward.functions=[task, overlong_penalty]", "reward.judge=[task]"]
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


def test_the_old_spelling_sets_the_judge_without_a_word_and_python_is_told_the_new_name(tmp_path):
    """Config files, overrides and the config.yaml of earlier runs keep algo.dynamic_sampling_on: it sets
    reward.judge (assigned, so a preset leaves it alone) and the saved config holds reward.judge alone. In Python
    the old attribute would be set and read by nothing, so it is refused naming the new one."""
    from grpokit.config.io import assigned, from_dict, load_yaml, save_yaml, to_dict

    cfg = apply_overrides(Config(), ["algo.dynamic_sampling_on=[task]"])
    assert cfg.reward.judge == ["task"] and "reward.judge" in assigned(cfg)
    earlier = from_dict({"algo": {"dynamic_sampling": True, "dynamic_sampling_on": ["task"]}})
    assert earlier.reward.judge == ["task"]
    save_yaml(earlier, tmp_path / "config.yaml")
    assert "dynamic_sampling_on" not in (tmp_path / "config.yaml").read_text()
    assert load_yaml(tmp_path / "config.yaml").reward.judge == ["task"]
    assert "dynamic_sampling_on" not in to_dict(earlier)["algo"]
    with pytest.raises(AttributeError, match=r"algo.dynamic_sampling_on is reward.judge in Python .*cfg.reward.judge"):
        Config().algo.dynamic_sampling_on = ["task"]


def test_a_judged_value_is_the_sum_of_the_judges_own_columns():
    """rewards_NF rows (accuracy, format) = (1, 0.5), (0, 0.5), (NaN, 0.5), (NaN, NaN), weights (1, 1): totals
    1.5, 0.5, 0.5, 0. Judged by accuracy (column 0): 1, 0, 0 (nothing: NaN adds nothing), 0, scored where the
    accuracy gave a value: True, True, False, False. Judged by none: the totals and scored_N."""
    import torch

    from grpokit.types import Rollout, ScoredBatch

    nan = float("nan")
    rewards = torch.tensor([[1.0, 0.5], [0.0, 0.5], [nan, 0.5], [nan, nan]])
    total = torch.tensor([1.5, 0.5, 0.5, 0.0])
    ro = Rollout([[1]], [[2]] * 4, [[0.0]] * 4, ["eos"] * 4, 4)
    sb = ScoredBatch([None], ro, ["x"] * 4, rewards, total, ["accuracy", "format"])
    values, valid = sb.judged([0])
    assert values.tolist() == [1.0, 0.0, 0.0, 0.0] and valid.tolist() == [True, True, False, False]
    values, valid = sb.judged(None)
    assert values.tolist() == [1.5, 0.5, 0.5, 0.0] and valid.tolist() == [True, True, True, False]


def test_the_curriculum_counts_a_pass_by_the_judge():
    """One group of G=4: accuracy 1, 0, 0, 0 with a format bonus of 0.5 each (totals 1.5, 0.5, 0.5, 0.5), threshold
    0.5. Judged by the accuracy: 1 pass of 4, pass rate (1 + 1) / (4 + 2) = 1/3. By the totals (before: the only
    way) all 4 passed, (4 + 1) / (4 + 2) = 5/6. The zero-std share reads the totals either way (not flat: 0)."""
    from grpokit.data.curriculum import FrontierSampler
    from grpokit.types import Prompt

    s = FrontierSampler([Prompt(text="a", ids=[1])], seed=0, threshold=0.5, group_size=4)
    s.observe(s.prompts, [1.5, 0.5, 0.5, 0.5], 4, judged_N=[1.0, 0.0, 0.0, 0.0])
    assert s.stats[0] == [1.0, 4.0] and s.pass_rate(0) == pytest.approx(1 / 3)
    assert s.metrics()["curriculum/zero_std_share"] == 0.0
    s = FrontierSampler([Prompt(text="a", ids=[1])], seed=0, threshold=0.5, group_size=4)
    s.observe(s.prompts, [1.5, 0.5, 0.5, 0.5], 4)  # no judge: the reward as trained
    assert s.stats[0] == [4.0, 4.0] and s.pass_rate(0) == pytest.approx(5 / 6)


def test_error_correction_finds_a_group_all_wrong_by_the_judge():
    """Group 0: accuracy 0, 0 with a format bonus of 0.5 (totals 0.5, 0.5); group 1: accuracy 1, 0 (totals 1.5,
    0.5); max_reward 0. By the totals no group is all wrong (0.5 > 0: before, never corrected); by the accuracy
    (column 0) group 0 is, and its last completion becomes the gold answer, re-scored 1 + 0.5."""
    import torch

    from grpokit.rewards.runner import RewardRunner
    from grpokit.rewards.spec import RewardSpec
    from grpokit.rollout import gec
    from grpokit.types import Prompt, Rollout, ScoredBatch
    from helpers.models import char_tokenizer
    from helpers.runs import gold_answer, half

    tok = char_tokenizer()
    prompts = [
        Prompt("ab", tok("ab")["input_ids"], {"answer": "a"}),
        Prompt("cd", tok("cd")["input_ids"], {"answer": "a"}),
    ]
    texts = ["x", "y", "a", "z"]
    ids = [tok(t)["input_ids"] + [1] for t in texts]
    ro = Rollout([p.ids for p in prompts], ids, [[-0.5] * len(i) for i in ids], ["eos"] * 4, 2)
    rewards = torch.tensor([[0.0, 0.5], [0.0, 0.5], [1.0, 0.5], [0.0, 0.5]])

    def batch():
        return ScoredBatch(prompts, ro, list(texts), rewards.clone(), rewards.sum(1), ["has_a", "half"], {})

    specs = [RewardSpec(fn=has_a, name="has_a", weight=1.0), RewardSpec(fn=half, name="half", weight=1.0)]
    runner = RewardRunner(specs, num_workers=0)
    kw = dict(mode="gold", render=gold_answer, reflection="", max_reward=0.0, eos_id=1)
    assert gec.correct(batch(), tok, runner, **kw).metrics["gec/corrected_groups"] == 0.0
    sb = gec.correct(batch(), tok, runner, judged=[0], **kw)
    assert sb.metrics["gec/corrected_groups"] == 1.0 and sb.texts == ["x", "a", "a", "z"]
    assert sb.total_N.tolist() == [0.5, 1.5, 1.5, 0.5]


def _run_with_a_format_bonus(tiny_model_dir, out, *over):
    """The tiny model on ROWS (gold "a"), rewarded by has_a (1/0) plus half (0.5 for every completion), G=4, two
    prompts a step, every group logged to samples.jsonl."""
    from helpers.runs import ROWS, half, tiny_cfg

    cfg = tiny_cfg(
        tiny_model_dir, out, **{"record.samples_every": 1, "record.samples_prompts": 100, "data.eval_size": 0}
    )
    apply_overrides(cfg, list(over))
    cfg.data.dataset = ""  # rows are passed directly
    tr = Trainer(cfg, reward_funcs=[has_a, half], train_rows=ROWS, quiet=True)
    tr.train()
    groups = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return tr, groups


def test_a_wrong_answer_with_a_format_bonus_does_not_pass_the_curriculum(tiny_model_dir, tmp_path):
    """The hunter's case: data.curriculum_threshold=0.5 and a format bonus of 0.5, one step. Before, every
    completion passed (a wrong one totals 0.5 >= 0.5): a group with 1 right answer of 4 counted 4 passes. Judged by
    has_a, each prompt's passes are its right answers (seen 4, no decay after one step)."""
    over = ["train.steps=1", "data.curriculum=frontier", "data.curriculum_threshold=0.5", "reward.judge=[has_a]"]
    tr, groups = _run_with_a_format_bonus(tiny_model_dir, tmp_path / "run", *over)
    right = {g["prompt"]: sum(c["rewards"]["has_a"] for c in g["completions"]) for g in groups}
    passes = {tr.sampler.prompts[b].text: stats for b, stats in tr.sampler.stats.items()}
    assert {p: right[p] for p in passes} == {p: stats[0] for p, stats in passes.items()}
    assert all(stats[1] == 4.0 for stats in passes.values())
    assert min(right.values()) < 4  # some wrong answer was drawn: the total would have passed it


def test_a_group_of_wrong_answers_with_a_format_bonus_is_corrected(tiny_model_dir, tmp_path):
    """The same rewards under EDGE-GRPO's error correction (max_reward 0). Before, no group was ever all wrong (a
    wrong answer totals 0.5 > 0), so a group of four wrong answers trained as drawn (0 corrected). Judged by has_a,
    every group with no right answer gets the gold one: each trained group holds a right answer."""
    over = [
        "train.steps=2",
        "algo.error_correction=gold",
        "algo.error_correction_fn=helpers.runs:gold_answer",
        "reward.judge=[has_a]",
    ]
    tr, groups = _run_with_a_format_bonus(tiny_model_dir, tmp_path / "run", *over)
    assert all(sum(c["rewards"]["has_a"] for c in g["completions"]) >= 1 for g in groups), groups
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("gec/corrected_groups", 0) for r in rows) >= 1


def test_a_curriculum_or_error_correction_judged_by_a_summed_reward_is_warned_about(tiny_model_dir, tmp_path, capsys):
    """reward.judge empty while the reward sums has_a and half: the curriculum's pass would read the format bonus,
    said once at start; not with a judge, nor for dynamic sampling alone (its default, groups flat in the trained
    reward, are those without a gradient)."""
    from grpokit.train.build import build_rewards
    from helpers.runs import half, tiny_cfg

    class NoEpisodes:
        factory = None

    def warned(*over):
        cfg = apply_overrides(tiny_cfg(tiny_model_dir, tmp_path / "run"), list(over))
        build_rewards(cfg, [has_a, half], NoEpisodes())
        return capsys.readouterr().out

    assert warned("data.curriculum=frontier") == (
        "grpokit: warning: data.curriculum=frontier judges a completion by the reward as trained (reward.judge is "
        "empty), the weighted sum of has_a, half: a shaping term there counts towards a pass and keeps a group from "
        "being all wrong; set reward.judge to the functions that say whether an answer is right (e.g. [task])\n"
    )
    assert warned("data.curriculum=frontier", "reward.judge=[has_a]") == ""
    assert warned("algo.dynamic_sampling=true") == ""
