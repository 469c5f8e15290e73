"""mask_truncated_completions in a tool episode, against TRL itself: TRL's rule is the completion's last token
(no EOS or pad id: truncated), so an episode stopped by max_tool_calling_iterations on a turn that ended with EOS
stays in the loss (algo.truncated_by=last_token; before, grpokit.trl left every such episode out, finish "turns")."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from datasets import Dataset

from grpokit.config.sections import ConfigError
from grpokit.trl.config import GRPOConfig
from grpokit.trl.mapping import to_config
from grpokit.validation import validate

CALL = '{"name": "lookup", "arguments": {"word": "ab"}}'  # one token of the model's vocabulary


def lookup(word: str) -> str:
    """Look a word up.

    Args:
        word: the word
    """
    return word.upper()


def test_the_mapping_takes_trls_rule():
    on = to_config(GRPOConfig("o", mask_truncated_completions=True), num_rows=8).algo
    assert (on.mask_truncated, on.truncated_by) == (True, "last_token")
    off = to_config(GRPOConfig("o"), num_rows=8).algo
    assert (off.mask_truncated, off.truncated_by) == (False, "finish")  # the rule is read only with the mask
    cfg = to_config(GRPOConfig("o"), num_rows=8)
    cfg.algo.truncated_by = "last_token"
    with pytest.raises(ConfigError, match=r"^algo.truncated_by='last_token' has no effect unless algo.mask_truncated"):
        validate(cfg)


@pytest.fixture(scope="module")
def calling_model(tmp_path_factory):
    """A model that answers every turn with "<tool_call>CALL</tool_call><|im_end|>" under TRL's Qwen3 template."""
    trl = pytest.importorskip("trl")
    from helpers.trl_models import make_chain_model

    template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    chain = ["<tool_call>", CALL, "</tool_call>", "<|im_end|>"]
    return str(make_chain_model(tmp_path_factory.mktemp("caller"), chain, template, extra_tokens=(CALL,)))


@pytest.mark.parametrize("backend", ["grpokit.trl", pytest.param("trl", marks=pytest.mark.slow)])
def test_an_episode_stopped_by_the_turn_limit_on_eos_is_trained(backend, calling_model, tmp_path):
    from helpers.trl_models import small_args

    mod, masks = importlib.import_module(backend), []

    class Recording(mod.GRPOTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            tool = inputs.get("tool_mask")
            masks.append((inputs["completion_mask"] * (1 if tool is None else tool)).sum(dim=1).tolist())
            return super().compute_loss(model, inputs, *args, **kwargs)

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("xy", "zw")])
    args = small_args(
        mod.GRPOConfig, tmp_path, max_steps=1, per_device_train_batch_size=4, num_generations=2, report_to="none",
        max_completion_length=64, mask_truncated_completions=True, max_tool_calling_iterations=1,
    )  # fmt: skip
    rewards = lambda completions, **kw: [float(i % 3) for i in range(len(completions))]  # noqa: E731
    Recording(calling_model, reward_funcs=rewards, train_dataset=data, tools=[lookup], args=args).train()
    # each episode: the call turn (4 model tokens), the tool's result (context), the call again (4 model tokens),
    # whose calls the iteration limit leaves unrun; it ended with <|im_end|>, so all 8 model tokens train
    assert masks == [[8, 8, 8, 8]]  # before, under grpokit.trl: [[0, 0, 0, 0]]
