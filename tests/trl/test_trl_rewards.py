"""The reward calling convention TRL users rely on: trainer_state, log_metric and log_extra (also
from worker processes), and module:function paths found in the working directory."""

from __future__ import annotations

import pytest

from grpokit.rewards.spec import RewardSpec, resolve_reward
from grpokit.train.callbacks import RunState


def logs_things(completions, trainer_state, log_metric, log_extra, **kwargs):
    log_metric("my/len", sum(len(c) for c in completions) / len(completions))
    log_extra("doubled", [c * 2 for c in completions])
    return [float(trainer_state.global_step)] * len(completions)


@pytest.mark.parametrize("workers", [0, 1])
def test_log_metric_log_extra_and_trainer_state_reach_the_result(workers):
    from grpokit.rewards import RewardRunner

    with RewardRunner([RewardSpec(logs_things, "logs")], num_workers=workers) as runner:
        res = runner.score(
            ["p"] * 4,
            ["a", "bb", "ccc", "dddd"],
            [[1]] * 4,
            group_size=2,
            trainer_state=RunState(global_step=7, max_steps=9),
        )
    assert res.rewards_NF[:, 0].tolist() == [7.0] * 4
    # two group calls log (1 + 2) / 2 = 1.5 and (3 + 4) / 2 = 3.5: the step's metric is their mean, 2.5
    assert res.metrics["my/len"] == pytest.approx(2.5)
    assert res.extra == {"doubled": ["aa", "bbbb", "cccccc", "dddddddd"]}  # each value beside its completion


def test_module_function_paths_are_found_in_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "cwd_rewards_t18.py").write_text("def one(completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    assert resolve_reward("cwd_rewards_t18:one")(["x", "y"]) == [1.0, 1.0]
    from grpokit.rewards.spec import RewardError

    with pytest.raises(RewardError, match="working directory"):
        resolve_reward("no_such_module_t18:fn")


def test_a_failing_reward_function_is_one_sentence_with_its_name_and_row(tmp_path, monkeypatch):
    from datasets import Dataset

    from grpokit.rewards.spec import RewardError
    from grpokit.trl import GRPOConfig, GRPOTrainer
    from helpers.trl_models import make_chat_model

    def math_accuracy(completions, **kwargs):
        raise KeyError("solution")

    monkeypatch.delenv("GRPOKIT_DEBUG", raising=False)
    model = make_chat_model(tmp_path / "m")
    args = GRPOConfig(
        str(tmp_path / "run"),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=2,
        use_cpu=True,
        disable_tqdm=True,
    )
    tr = GRPOTrainer(
        str(model), reward_funcs=math_accuracy, args=args, train_dataset=Dataset.from_list([{"prompt": "ab"}] * 2)
    )
    with pytest.raises(
        RewardError,
        match=r"^Reward 'math_accuracy' failed on 2 of 2 completions.*first error, on completion 0: "
        r"KeyError: 'solution'",
    ) as info:
        tr.train()
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained 30-frame traceback


KWARGS: list = []  # each call's keywords beside prompts and completions: name -> (type, first value)


def strict(prompts, completions, **kwargs):
    """Records every keyword it got (its type: a callable is one, a lambda or a bound method), so the test
    compares the whole set."""
    kind = lambda v: "callable" if callable(v) else type(v).__name__  # noqa: E731
    KWARGS.append({k: (kind(v), v[0] if isinstance(v, list) else None) for k, v in kwargs.items()})
    return [0.0] * len(completions)


def keywords_under(lib: str, model: str, tmp_path) -> dict:
    import importlib

    from datasets import Dataset

    trl = importlib.import_module(lib)
    KWARGS.clear()
    row = {"prompt": [{"role": "user", "content": "ab"}], "level": 1, "meta": {"a": 1}, "opt": None, "completion": "c"}
    args = trl.GRPOConfig(
        str(tmp_path / lib), max_steps=1, per_device_train_batch_size=2, num_generations=2, max_completion_length=2,
        use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    trl.GRPOTrainer(model, reward_funcs=strict, args=args, train_dataset=Dataset.from_list([row] * 2)).train()
    (seen,) = KWARGS
    return {k: v if k != "completion_ids" else v[0] for k, v in seen.items()}  # ids differ: sampled


def test_a_reward_function_gets_the_same_keywords_under_trl_and_grpokit_trl(chat_model, tmp_path):
    """The whole keyword dict a function gets beside prompts and completions, on one dataset with extra columns
    (one named completion, which TRL passes no function). Before, grpokit.trl added group_size=2 and
    completion=["c", "c"]: a function that forwards **kwargs to something strict failed under grpokit only."""
    pytest.importorskip("trl")
    ours, theirs = keywords_under("grpokit.trl", chat_model, tmp_path), keywords_under("trl", chat_model, tmp_path)
    assert ours == theirs
    assert sorted(ours) == ["completion_ids", "level", "log_extra", "log_metric", "meta", "opt", "trainer_state"]
    assert ours["level"] == ("list", 1) and ours["meta"] == ("list", {"a": 1}) and ours["opt"] == ("list", None)
