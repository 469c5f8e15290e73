"""transformers' Trainer's attributes and the class itself (grpokit/trl/contract/trainer_attributes.py, hooks.py):
every public attribute transformers' and TRL's ``__init__`` set is honoured or refused in one sentence, never a
plain attribute nothing reads; a method patched on the GRPOTrainer class is an override, as a subclass's."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch
from datasets import Dataset

from grpokit.config import ConfigError
from grpokit.trl import GRPOConfig, GRPOTrainer
from grpokit.trl.contract import attributes, trainer_attributes
from helpers.trl_models import small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}], "solution": "A"} for w in "abc"])
OTHER = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}], "solution": "B"} for w in "abc"])


def zero(completions, **kwargs):
    return [0.0] * len(completions)


def init_attributes(cls) -> set[str]:
    """Every public ``self.<name> = ...`` of ``cls.__init__`` (read from its source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) else []:
            for e in ast.walk(target):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    names.add(e.attr)
    return {n for n in names if not n.startswith("_")}


def test_every_public_attribute_transformers_and_trl_set_is_honoured_or_refused():
    """By construction: a property (honoured with TRL's meaning, or refusing in one sentence), TRL's machinery
    grpokit does not run (refused unless None), or a plain attribute grpokit reads where transformers does."""
    import transformers

    names = init_attributes(transformers.Trainer)
    assert {"train_dataset", "optimizer", "lr_scheduler", "data_collator", "eval_dataset"} <= names
    try:
        import trl

        names |= init_attributes(trl.GRPOTrainer)
    except ImportError:
        pass
    kinds = {n: type(inspect.getattr_static(GRPOTrainer, n, None)).__name__ for n in sorted(names)}
    loose = [n for n, k in kinds.items() if k != "property" and n not in attributes.INERT + [*trainer_attributes.PLAIN]]
    assert loose == []
    assert all(inspect.getattr_static(GRPOTrainer, n).fset is not None for n, k in kinds.items() if k == "property")


def test_refused_attributes_read_as_trls_and_refuse_an_assignment_in_one_sentence(chat_model, tmp_path):
    trl = pytest.importorskip("trl")
    ours = GRPOTrainer(chat_model, reward_funcs=[zero], train_dataset=DATA, args=small_args(GRPOConfig, tmp_path))
    theirs = trl.GRPOTrainer(
        chat_model, reward_funcs=[zero], train_dataset=DATA, args=small_args(trl.GRPOConfig, tmp_path / "t")
    )
    plain = (bool, int, float, str, type(None), list)
    for name in trainer_attributes.REFUSED:
        if isinstance(getattr(theirs, name), plain):
            assert getattr(ours, name) == getattr(theirs, name), name
        with pytest.raises(ConfigError, match=rf"^GRPOTrainer.{name} cannot be assigned: "):
            setattr(ours, name, object())
    assert ours.data_collator([{"a": 1}]) == theirs.data_collator([{"a": 1}]) == [{"a": 1}]  # rows as they are
    assert ours.train_dataset is DATA and ours.eval_dataset is None


@pytest.mark.parametrize("built", [False, True], ids=["before_build", "after_build"])
def test_a_train_dataset_assigned_before_train_is_the_one_trained_on_as_trl(chat_model, tmp_path, built):
    """transformers reads train_dataset when train() starts: the prompts' solution column the reward function
    sees is the assigned dataset's ("B"), with trl and grpokit alike; once training started, one sentence."""
    trl = pytest.importorskip("trl") if not built else None
    libraries = [(GRPOConfig, GRPOTrainer)] + ([(trl.GRPOConfig, trl.GRPOTrainer)] if trl else [])
    ours = None
    for Config, Trainer in libraries:
        seen = []

        def record(completions, solution, **kwargs):
            seen.extend(solution)
            return [0.0] * len(completions)

        args = small_args(Config, tmp_path / Config.__module__, max_steps=1, report_to="none", save_strategy="no")
        tr = Trainer(chat_model, reward_funcs=[record], train_dataset=DATA, args=args)
        if built:
            assert tr.model is not None and tr._trainer is not None  # reading builds the run
        tr.train_dataset = OTHER
        tr.train()
        assert set(seen) == {"B"} and tr.train_dataset is OTHER, Config.__module__
        ours = ours if Trainer is not GRPOTrainer else tr
    with pytest.raises(ConfigError, match=r"^GRPOTrainer.train_dataset can be replaced until train\(\) starts"):
        ours.train_dataset = DATA


def test_the_optimizer_and_schedule_are_the_runs_once_training_started(chat_model, tmp_path):
    tr = GRPOTrainer(chat_model, reward_funcs=[zero], train_dataset=DATA, args=small_args(GRPOConfig, tmp_path))
    assert tr.optimizer is None and tr.lr_scheduler is None and not tr.is_in_train  # transformers': before train()
    with pytest.raises(ConfigError, match=r"^GRPOTrainer.optimizer cannot be assigned: grpokit builds the optimizer"):
        tr.optimizer = torch.optim.SGD(tr.model.parameters(), lr=0.0)
    tr.train()
    assert tr.optimizer is tr._trainer.optimizer and tr.lr_scheduler is tr._trainer.scheduler


# ---------------------------------------------------------------- methods patched on the class itself


def constant_rewards(self, inputs, prompts, completions, completion_ids_list):
    """5 on even rows, 6 on odd ones: 4 completions of a step log reward (5 + 6 + 5 + 6) / 4 = 5.5."""
    return torch.tensor([[5.0 + i % 2] for i in range(len(prompts))])


@pytest.mark.parametrize("when", ["before_construction", "after_build"])
def test_a_method_patched_on_the_class_is_honoured_as_trl_calls_it(chat_model, tmp_path, monkeypatch, when):
    libraries = [GRPOTrainer]
    try:
        import trl

        libraries.append(trl.GRPOTrainer)
    except ImportError:
        pass
    for Trainer in libraries:
        if when == "before_construction":
            monkeypatch.setattr(Trainer, "_calculate_rewards", constant_rewards)
        Config = GRPOConfig if Trainer is GRPOTrainer else trl.GRPOConfig
        args = small_args(Config, tmp_path / Trainer.__module__, max_steps=1, logging_steps=1, report_to="none")
        tr = Trainer(chat_model, reward_funcs=[zero], train_dataset=DATA, args=args)
        if when == "after_build":
            assert tr.model is not None  # built (grpokit), then patched: the run is built anew at train()
            monkeypatch.setattr(Trainer, "_calculate_rewards", constant_rewards)
        tr.train()
        assert tr.state.log_history[0]["reward"] == pytest.approx(5.5), Trainer.__module__


def test_a_refused_method_patched_on_the_class_is_refused_in_one_sentence(chat_model, tmp_path, monkeypatch):
    monkeypatch.setattr(GRPOTrainer, "training_step", lambda self, *a, **k: None)
    with pytest.raises(ConfigError, match=r"^GRPOTrainer has training_step patched on the class, which grpokit"):
        GRPOTrainer(chat_model, reward_funcs=[zero], train_dataset=DATA, args=small_args(GRPOConfig, tmp_path))

    class Sub(GRPOTrainer):  # a subclass inherits the patch: refused the same way
        pass

    with pytest.raises(ConfigError, match=r"^GRPOTrainer has training_step patched on the class"):
        Sub(chat_model, reward_funcs=[zero], train_dataset=DATA, args=small_args(GRPOConfig, tmp_path))
