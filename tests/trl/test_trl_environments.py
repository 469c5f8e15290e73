"""TRL's ``environment_factory`` as a dict: the same script under ``trl`` and ``grpokit.trl``,
only the import changed, routes each example to the environment its ``environment`` column names.

Two environments with different tools (``Calc`` owns a reward through ``get_reward``, ``Notes`` does
not) and one standalone tool (``shout``). Under both libraries: the prompt of a ``calc`` row lists
``shout`` and ``add`` (not ``note``), a ``notes`` row ``shout`` and ``note``; ``reset`` gets the row
without its ``environment`` column; the reward columns are the passed function and ``Calc`` (named
after the class); the ``Calc`` column scores only the ``calc`` rows (the ``notes`` rows get None,
NaN in TRL's ``_logs``). The model is a tiny random Qwen2 with TRL's own Qwen3 chat template (one
TRL knows how to parse tool calls from), so no tool is called here: routing is what is compared."""

from __future__ import annotations

import importlib
import math
import re

import pytest
from datasets import Dataset

from helpers.trl_models import make_qwen2_tool_model

RESETS: list = []  # (class name, sorted reset kwargs, prompt text)
SEEN: list = []  # the environment class of each completion, as the reward function sees it
RENDERED: list = []  # every prompt text the tokenizer's chat template rendered with tools


def shout(text: str) -> str:
    """Repeat a text loudly.

    Args:
        text: what to shout.
    """
    return text.upper()


class Calc:
    """Adds numbers; its reward is whether the last sum was the row's target."""

    def reset(self, prompt, target, **kwargs):
        RESETS.append(("Calc", sorted(["prompt", "target", *kwargs]), prompt[-1]["content"]))
        self.target, self.total = target, None

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first number.
            b: the second number.
        """
        self.total = a + b
        return self.total

    def get_reward(self) -> float:
        return 0.25  # a constant: the test checks where it lands, not what it learns


class Notes:
    """Keeps notes; no reward of its own."""

    def reset(self, **kwargs):
        RESETS.append(("Notes", sorted(kwargs), kwargs["prompt"][-1]["content"]))
        self.notes = []

    def note(self, text: str) -> str:
        """Write a note down.

        Args:
            text: the note.
        """
        self.notes.append(text)
        return "noted"


def seen(completions, environments, **kwargs):
    SEEN.extend(type(e).__name__ for e in environments)
    return [0.0] * len(completions)


def rows():
    return Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "sum"}], "environment": "calc", "target": 3},
            {"prompt": [{"role": "user", "content": "write"}], "environment": "notes", "target": 0},
        ]
    )


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory):
    """A tiny Qwen2 whose character tokenizer has TRL's Qwen3 template (tools, <tool_call>)."""
    from trl.chat_template_utils import qwen3_chat_template

    path = tmp_path_factory.mktemp("qwen-tools")
    return make_qwen2_tool_model(path, qwen3_chat_template, max_positions=2048)[0]


def recording_tokenizer(path):
    """The model's tokenizer, its chat template's rendered prompts (those with tools) recorded."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    render = tok.apply_chat_template

    def apply_chat_template(*args, **kwargs):
        if kwargs.get("tools"):  # TRL asks for token ids, grpokit for text: record the text either way
            text_kwargs = {k: v for k, v in kwargs.items() if k not in ("tokenize", "return_dict")}
            text = render(*args, tokenize=False, **text_kwargs)
            RENDERED.extend(text if isinstance(text, list) else [text])  # TRL renders a batch of one
        return render(*args, **kwargs)

    tok.apply_chat_template = apply_chat_template
    return tok


def run(lib: str, model, tmp_path, **data):
    """The TRL user's script; ``lib`` is the only thing that changes."""
    trl = importlib.import_module(lib)
    for log in (RESETS, SEEN, RENDERED):
        log.clear()
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / lib),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        max_steps=1,
        learning_rate=1e-3,
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        max_tool_calling_iterations=1,
    )
    trainer = trl.GRPOTrainer(
        str(model),
        reward_funcs=[seen],
        args=args,
        processing_class=recording_tokenizer(model),
        tools=[shout],
        environment_factory={"calc": Calc, "notes": Notes},
        **data,
    )
    trainer.train()
    return trainer


def listed_tools(text: str) -> list[str]:
    """The names of the functions the template listed (one JSON schema a line between <tools> and </tools>)."""
    listing = re.search(r"<tools>\n(.*?)\n</tools>", text, re.S).group(1)
    return sorted(re.findall(r'"function": \{"name": "(\w+)"', listing))


@pytest.mark.parametrize("lib", ["trl", "grpokit.trl"])
def test_a_dict_of_environments_routes_each_example_as_trl_does(lib, qwen_model, tmp_path):
    trainer = run(lib, qwen_model, tmp_path, train_dataset=rows())
    # each example's prompt lists the standalone tool and its own environment's methods only
    by_prompt: dict = {}  # every rendering of a prompt (a library may render it more than once) lists the same tools
    for text in RENDERED:
        if '"name": "probe_tool"' in text:  # grpokit's check that the template shows tools (env/parse.py)
            continue
        by_prompt.setdefault("sum" if "<|im_start|>user\nsum" in text else "write", set()).add(
            tuple(listed_tools(text))
        )
    assert by_prompt == {"sum": {("add", "shout")}, "write": {("note", "shout")}}
    # reset(**row) without the routing column; G=2 episodes of each of the 2 prompts: 2 resets per environment
    assert (
        sorted(RESETS) == [("Calc", ["prompt", "target"], "sum")] * 2 + [("Notes", ["prompt", "target"], "write")] * 2
    )
    assert sorted(SEEN) == ["Calc", "Calc", "Notes", "Notes"]
    # the reward columns: the passed function, then one named after the class with get_reward (Notes has none)
    assert list(trainer._logs["rewards"]) == ["seen", "Calc"]
    calc = trainer._logs["rewards"]["Calc"]
    is_calc = ["sum" in str(p) for p in trainer._logs["prompt"]]
    assert len(calc) == 4 and sum(is_calc) == 2
    for value, mine in zip(calc, is_calc):  # Calc scores its own rollouts (0.25); the Notes rollouts get None -> NaN
        assert value == 0.25 if mine else math.isnan(value)
    last = next(h for h in trainer.state.log_history if "rewards/Calc/mean" in h)
    assert last["rewards/Calc/mean"] == pytest.approx(0.25)  # NaN rows are left out of the mean, as TRL does


@pytest.mark.parametrize("lib", ["trl", "grpokit.trl"])
def test_an_unknown_environment_name_is_refused_with_the_valid_names(lib, qwen_model, tmp_path):
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "sum"}], "environment": "chess", "target": 3}] * 2
    )
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Example has `environment='chess'`, which is not among the environments "
            "passed to `environment_factory`. Expected one of: ['calc', 'notes']."
        ),
    ):
        run(lib, qwen_model, tmp_path, train_dataset=data)


@pytest.mark.parametrize("lib", ["trl", "grpokit.trl"])
def test_a_dict_of_environments_needs_a_dataset_with_the_routing_column(lib, qwen_model, tmp_path):
    with pytest.raises(
        ValueError,
        match=re.escape(
            "A `dict` `environment_factory` (multiple environments) requires a "
            "`train_dataset` with an `environment` column"
        ),
    ):
        run(lib, qwen_model, tmp_path)
    # a dataset without the column: every example names no environment (None), which is not one of them
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "sum"}], "target": 3}] * 2)
    with pytest.raises(
        ValueError, match=re.escape("Example has `environment=None`, which is not among the environments")
    ):
        run(lib, qwen_model, tmp_path, train_dataset=data)
