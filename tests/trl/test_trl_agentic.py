"""TRL's ``tools=`` and ``environment_factory=`` through ``grpokit.trl.GRPOTrainer``: the episodes call
the standalone tool and the environment's methods, ``reset`` gets the dataset row as TRL passes it,
the environment's ``get_reward`` joins the reward functions with weight 1 after ``reward_weights``,
and a reward function receives what TRL passes for environments (``environments``, one instance per
completion, and the conversation after the prompt as ``completions``).

The model is scripted (the trainer's turn sampler is replaced) so that the episodes are known in
advance; everything else (prompt rendering, tool parsing and calling, rewards, advantages, the
update) is grpokit's own code path."""

from __future__ import annotations

import json
import types

import pytest
from datasets import Dataset

from grpokit.trl import GRPOConfig, GRPOTrainer
from helpers.episodes import chat_tokenizer
from helpers.models import save_tiny_model
from helpers.trl_models import small_args

CALLS: list = []


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    CALLS.append(("multiply", a, b))
    return a * b


class Counter:
    """A TRL environment: reset(**row) per episode, public methods are tools, get_reward."""

    def reset(self, prompt, target, **kwargs):
        self.row = {"prompt": prompt, "target": target, **kwargs}
        self.count, self.done = 0, False
        return " to " + str(target)

    def add(self, n: int) -> str:
        """Add n to the counter.

        Args:
            n: the amount.
        """
        CALLS.append(("add", n))
        self.count += int(n)
        self.done = self.count >= self.row["target"]
        return str(self.count)

    def get_reward(self) -> float:
        return float(self.count == self.row["target"])


SEEN: dict = {}


def closes_counter(prompts, completions, environments, target, **kwargs):
    """0.5 when the episode's environment reached the row's target, read from the environment as TRL allows."""
    SEEN.update(prompts=prompts, completions=completions, environments=environments, target=target, keys=sorted(kwargs))
    return [0.5 * (env.count == t) for env, t in zip(environments, target)]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """A tiny Llama whose tokenizer has a Hermes-style tool-calling chat template."""
    tok = chat_tokenizer()
    return save_tiny_model(tmp_path_factory.mktemp("tool-model"), tok, max_positions=512, eos_token_id=tok.eos_token_id)


def scripted(tok, reply, contexts=None):
    """A turn sampler playing the model: ``reply(context_text, g, G) -> text`` (eos appended)."""

    def model(ctxs, G, params):
        outs = []
        for c in ctxs:
            text = tok.decode(c)
            if contexts is not None:
                contexts.append(text)
            outs += [
                tok(reply(text, g, G), add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for g in range(G)
            ]
        return types.SimpleNamespace(
            completion_ids=outs, sampling_logprobs=[[-0.5] * len(o) for o in outs], finish_reasons=["eos"] * len(outs)
        )

    return lambda m, generator=None: model


def test_tools_and_environment_factory_run_through_the_trl_trainer(tool_model, tmp_path):
    tok = chat_tokenizer()
    data = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "count"}], "target": 4, "tag": "x"},
            {"prompt": [{"role": "user", "content": "count"}], "target": 6, "tag": "y"},
        ]
    )
    args = small_args(
        GRPOConfig,
        tmp_path / "run",
        max_steps=1,
        num_generations=2,
        max_completion_length=256,
        max_tool_calling_iterations=3,
        reward_weights=[2.0],
        log_completions=True,
        logging_steps=1,
        shuffle_dataset=False,
    )
    tr = GRPOTrainer(
        str(tool_model),
        reward_funcs=[closes_counter],
        args=args,
        train_dataset=data,
        tools=[multiply],
        environment_factory=Counter,
    )

    # The scripted model. Turn 0 (G=2 rows per prompt): row 0 asks multiply for 2*3 and then answers;
    # row 1 adds 3 until the environment reports done (target 6: two calls; target 4: it overshoots to
    # 6 on the second call and is done without reaching the target).
    def reply(text, g, G):
        if G == 2 and g == 0:
            return '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'
        return "six" if "<tool_response>6<" in text else '<tool_call>{"name": "add", "arguments": {"n": 3}}</tool_call>'

    contexts = []
    inner = tr._get()  # grpokit's Trainer behind the TRL one: replace its sampler by the script
    assert inner.episodes.spec.max_turns == 4  # max_tool_calling_iterations=3: three tool rounds, then an answer
    assert "Tools: multiply add" in inner.prompts[0].text  # the standalone tool and the environment's method
    inner.turn_sampler = scripted(tok, reply, contexts)
    CALLS.clear()
    tr.train()

    # reset's observation joined the user message, as TRL appends it
    assert "<|im_start|>user\ncount to 4<|im_end|>" in contexts[0]
    assert "<|im_start|>user\ncount to 6<|im_end|>" in contexts[1]
    # the tools were really called: one multiply per prompt, and the adders' calls (4: 3, 6 -> done; 6: 3, 6 -> done)
    assert sorted(CALLS) == sorted([("multiply", 2, 3)] * 2 + [("add", 3)] * 4)
    # what the reward function got: the whole batch in one call, as TRL passes it for environments
    assert SEEN["target"] == [4, 4, 6, 6] and {"trainer_state", "log_metric", "log_extra", "completion_ids"} <= set(
        SEEN["keys"]
    )
    assert len(SEEN["environments"]) == 4
    envs = SEEN["environments"][2:]  # the target-6 group
    assert len(envs) == 2 and all(isinstance(e, Counter) for e in envs) and envs[0] is not envs[1]
    assert envs[0].row == {"prompt": [{"role": "user", "content": "count"}], "target": 6, "tag": "y"}  # the whole row
    assert [e.count for e in envs] == [0, 6]
    conv0, conv1 = SEEN["completions"][2:]
    assert conv0[0]["tool_calls"][0]["function"]["name"] == "multiply"
    assert conv0[1] == {"role": "tool", "name": "multiply", "content": "6"}
    assert conv0[2] == {"role": "assistant", "content": "six"}
    assert [m["role"] for m in conv1] == ["assistant", "tool", "assistant", "tool"]  # ended by done after the 2nd add
    assert conv1[3] == {"role": "tool", "name": "add", "content": "6"}
    # the prompt with reset()'s observation in its user turn, as TRL passes it (before: the dataset's "count")
    assert SEEN["prompts"][0] == [{"role": "user", "content": "count to 4"}]

    # rewards: closes_counter weighted 2.0 (reward_weights), Counter.get_reward appended with weight 1 (TRL's rule).
    # target 4: the multiplier 0, the adder overshoots to 6 -> 0 and 0; target 6: multiplier 0, adder 2*0.5 + 1 = 2.
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["rewards/closes_counter/mean"] == pytest.approx(0.5 / 4)
    assert line["rewards/Counter/mean"] == pytest.approx(1 / 4)
    assert line["reward"] == pytest.approx((2.0 * 0.5 + 1.0) / 4)
    assert line["episodes/tool_use_rate"] == 1.0 and line["episodes/finished_done"] == pytest.approx(2 / 4)


def test_a_tool_episode_is_cut_at_max_completion_length_as_in_trl(tool_model, tmp_path):
    """TRL caps the whole completion of a tool episode (model turns and tool results) at
    max_completion_length; a model turn that would run past it is cut there and its call is not run."""
    lengths, convs = [], []

    def record(completions, completion_ids, **kwargs):
        lengths.extend(len(c) for c in completion_ids)
        convs.extend(completions)
        return [0.0] * len(completions)

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "count"}], "target": 100}])
    args = small_args(
        GRPOConfig,
        tmp_path / "run",
        max_steps=1,
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=100,
    )
    tr = GRPOTrainer(str(tool_model), reward_funcs=[record], args=args, train_dataset=data, environment_factory=Counter)
    # every turn is the same 41-token call (40 characters and tags, then eos); the tool's reply is about 50
    # tokens: turn 0 (41) + reply fits in 100, turn 1 (41 more) does not and is cut at the cap
    call = '<tool_call>{"name": "add", "arguments": {"n": 3}}</tool_call>'
    tr._get().turn_sampler = scripted(chat_tokenizer(), lambda text, g, G: call)
    CALLS.clear()
    tr.train()
    assert lengths == [100, 100]  # exactly the cap: the cut turn keeps what fits
    assert CALLS == [("add", 3), ("add", 3)]  # one call per episode ran; the cut one did not
    for conv in convs:
        assert [m["role"] for m in conv] == ["assistant", "tool", "assistant"] and "tool_calls" not in conv[2]
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["completions/clipped_ratio"] == 1.0  # cut episodes count as truncated (mask_truncated_completions)
