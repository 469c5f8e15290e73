"""grpokit.trl is a superset of trl (issue 46, deliverable 4): grpokit's names stay grpokit's everywhere,
every other public name and module of trl is trl's own, and without trl such a name stops in one sentence."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import types

import pytest

import grpokit.trl as gtrl
from grpokit.trl import upstream


def test_without_trl_grpokit_names_work_and_trl_names_stop_in_one_sentence():
    """trl blocked in a fresh process (``sys.modules['trl'] = None``, as when it is not installed)."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["trl"] = None
        import grpokit.trl as trl
        from grpokit.trl.trainer.grpo_trainer import GRPOTrainer
        from grpokit.trl.trainer.grpo_config import GRPOConfig
        from grpokit.trl.scripts.utils import TrlParser
        from grpokit.trl.rewards.accuracy_rewards import accuracy_reward
        assert GRPOTrainer is trl.GRPOTrainer and GRPOConfig is trl.GRPOConfig and TrlParser is trl.TrlParser
        assert accuracy_reward.__module__ == "grpokit.trl.rewards"
        assert trl.trainer.ModelConfig is trl.ModelConfig
        assert "SFTConfig" in dir(trl) and "GRPOTrainer" in dir(trl)
        for stmt in ["trl.SFTConfig", "from grpokit.trl import DPOTrainer", "import grpokit.trl.data_utils",
                     "from grpokit.trl.trainer.grpo_trainer import RepeatSampler"]:
            try:
                exec(stmt)
            except ModuleNotFoundError as e:
                print(e)
            else:
                print("no error:", stmt)
        assert not hasattr(trl, "NotATrlName")
        assert sys.modules["trl"] is None  # nothing imported trl behind the block
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines == [
        f"grpokit.trl.{n} is TRL's, which grpokit does not implement; install TRL to use it (pip install trl)"
        for n in ("SFTConfig", "DPOTrainer", "data_utils", "trainer.grpo_trainer.RepeatSampler")
    ]


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError, match="grpokit.trl' has no attribute 'NotATrlName'"):
        gtrl.NotATrlName  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("grpokit.trl.not_a_trl_module")


trl = pytest.importorskip("trl")


def test_every_public_name_of_trl_resolves():
    """grpokit's own where it implements the name, trl's very object otherwise; dir() lists them all."""
    names = [n for n in dir(trl) if not n.startswith("_") and n != "import_utils"]
    assert set(upstream.TRL_NAMES) <= set(names)  # the list used without trl is TRL's
    ours = set(gtrl.__all__)
    for name in names:
        got = getattr(gtrl, name)
        if name in ours:
            assert got is gtrl.__dict__[name], name
        elif isinstance(got, types.ModuleType):
            assert got.__name__ == "grpokit.trl." + name, name  # trl's module as its grpokit.trl view
        else:
            assert got is getattr(trl, name), name
    assert set(names) <= set(dir(gtrl))


def test_implemented_table_says_where_trl_defines_each_name():
    """Every name of IMPLEMENTED is defined by TRL in that module, and every name grpokit.trl exports that
    TRL also exports is in the table (otherwise a submodule would hand out TRL's object for it)."""
    for module, (ours, names) in upstream.IMPLEMENTED.items():
        for name in names:
            assert getattr(importlib.import_module(module), name).__module__ == module, (module, name)
            assert getattr(importlib.import_module(ours), name) is not None
    listed = {n for _, names in upstream.IMPLEMENTED.values() for n in names}
    shared = {n for n in gtrl.__all__ if n in dir(trl)}
    assert shared <= listed


def test_submodules_give_grpokits_objects_where_it_implements_them():
    import trl.trainer.sft_trainer
    import trl.trainer.utils

    import grpokit.trl.trainer.grpo_config as grpo_config
    import grpokit.trl.trainer.grpo_trainer as grpo_trainer
    import grpokit.trl.trainer.sft_trainer as sft_trainer
    import grpokit.trl.trainer.utils as utils
    from grpokit.trl.extras.profiling import profiling_decorator
    from grpokit.trl.rewards.format_rewards import think_format_reward
    from grpokit.trl.scripts.utils import ScriptArguments
    from grpokit.trl.scripts.vllm_serve import ScriptArguments as ServeArguments

    assert grpo_trainer.GRPOTrainer is gtrl.GRPOTrainer
    assert grpo_trainer.GRPOConfig is gtrl.GRPOConfig  # TRL's module imports it: grpokit's here too
    assert grpo_config.GRPOConfig is gtrl.GRPOConfig
    assert grpo_trainer.RepeatSampler is trl.trainer.grpo_trainer.RepeatSampler
    assert sft_trainer.SFTTrainer is trl.trainer.sft_trainer.SFTTrainer
    assert utils.get_peft_config is gtrl.get_peft_config
    assert utils.selective_log_softmax is trl.trainer.utils.selective_log_softmax
    assert gtrl.trainer.ModelConfig is gtrl.ModelConfig and gtrl.trainer.SFTConfig is trl.SFTConfig
    assert ScriptArguments is gtrl.ScriptArguments
    assert ServeArguments is not gtrl.ScriptArguments  # vllm-serve's own class, another one in TRL too
    assert think_format_reward is gtrl.rewards.think_format_reward
    assert profiling_decorator is importlib.import_module("trl.extras.profiling").profiling_decorator
    assert gtrl.trainer.grpo_trainer is grpo_trainer and "sft_trainer" in dir(gtrl.trainer)
