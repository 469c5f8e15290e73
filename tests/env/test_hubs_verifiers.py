"""A verifiers (0.4, verifiers.v1) environment under grpokit (grpokit.env.hubs.verifiers_env), against
the real library: a Taskset's tasks as prompts, its Task's @vf.reward methods as the reward (each
its own logged component, with its @vf.reward weight), scored on a real verifiers Trace of the
episode; single-turn, and multi-turn with a Toolset's @vf.tool methods as the episode's tools. Each
trains two GRPO steps end to end. A missing library is one sentence naming the extra to install."""

import json
import sys

import pytest
import torch

vf = pytest.importorskip("verifiers.v1")

from grpokit.config import ConfigError  # noqa: E402
from grpokit.env.hubs import require  # noqa: E402
from grpokit.env.hubs.verifiers_env import (  # noqa: E402
    build_trace,
    rubric_rewards,
    rubric_weights,
    taskset_rows,
    toolset_environment,
)
from helpers.hubs import hub_trainer, save_tag_model, scripted  # noqa: E402

PAIRS = ((12, 30), (45, 21))


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    def exact(self, task: SumData, trace: vf.Trace) -> float:
        return float(trace.last_reply == f"<answer>{task.answer}</answer>")

    @vf.reward(weight=0.5)
    async def used_tool(self, trace) -> float:  # verifiers' rewards may be coroutines
        return float(len(trace.tool_messages) > 0)


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for a, b in PAIRS:
            yield SumTask(SumData(prompt=f"{a}+{b}=", answer=str(a + b)), self.config.task)


class Adder(vf.Toolset):
    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("vf-model")
    save_tag_model(path)
    return path


def taskset():
    return SumTaskset(vf.TasksetConfig())


def test_rows_rewards_and_weights_come_from_the_taskset():
    rows = taskset_rows(taskset())
    assert [r["prompt"] for r in rows] == ["12+30=", "45+21="]
    assert rows[0]["vf_task"]["type"] == "SumTask" and rows[0]["vf_task"]["data"]["answer"] == "42"
    fns = rubric_rewards(taskset())
    assert [f.__name__ for f in fns] == ["exact", "used_tool"] and rubric_weights(taskset()) == [1.0, 0.5]
    tool_turns = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 12, "b": 30}}}],
        },
        {"role": "tool", "name": "add", "content": "42"},
        {"role": "assistant", "content": "<answer>42</answer>"},
    ]
    comps = [tool_turns, "<answer>41</answer>"]
    cols = [rows[0]["vf_task"]] * 2
    assert fns[0](["12+30="] * 2, comps, vf_task=cols) == [1.0, 0.0]
    assert fns[1](["12+30="] * 2, comps, vf_task=cols) == [1.0, 0.0]
    trace = build_trace(SumTask(SumData(prompt="12+30=", answer="42")), "12+30=", tool_turns)
    assert trace.num_turns == 2 and trace.tool_messages[0].tool_call_id == trace.assistant_messages[0].tool_calls[0].id


def correct(context):
    a, b = context.split("=")[0].split("+")
    return int(a) + int(b)


def test_a_single_turn_rubric_trains_two_steps_with_one_component_per_reward(model_dir, tmp_path):
    weights = ",".join(map(str, rubric_weights(taskset())))
    tr = hub_trainer(
        model_dir,
        tmp_path / "run",
        taskset_rows(taskset()),
        reward_funcs=rubric_rewards(taskset()),
        over=[f"reward.weights=[{weights}]"],
    )
    scripted(tr, lambda ctx, g: f"<answer>{correct(ctx) + g}</answer><eos>")  # g = 0 right, g = 1 off by one
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:
        assert m["rewards/exact/mean"] == pytest.approx(0.5) and m["rewards/used_tool/mean"] == 0.0
        assert m["reward"] == pytest.approx(0.5)
    assert any(not torch.equal(before[n], p) for n, p in tr.model.named_parameters())


def test_a_toolset_is_the_episodes_environment_and_trains_two_steps(model_dir, tmp_path):
    env = toolset_environment(Adder)
    tr = hub_trainer(
        model_dir,
        tmp_path / "run",
        taskset_rows(taskset()),
        reward_funcs=rubric_rewards(taskset()),
        environment_factory=env,
        over=["reward.weights=[1.0,0.5]"],
    )

    def reply(ctx, g):  # g = 0 calls the toolset's add and answers with its result; g = 1 guesses wrong
        if g == 1:
            return "<answer>7</answer><eos>"
        if "<tool_result>" in ctx:
            return "<answer>" + ctx.split("<tool_result>")[1].split("</tool_result>")[0] + "</answer><eos>"
        a, b = ctx.split("=")[0].split("+")
        return '<tool_call>{"name": "add", "arguments": {"a": %s, "b": %s}}</tool_call>' % (a, b)

    sampler = scripted(tr, reply)
    tr.train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:  # the tool user is right (exact 1, used_tool 1), the guesser wrong: 1.5 / 2 per step
        assert m["rewards/exact/mean"] == pytest.approx(0.5) and m["rewards/used_tool/mean"] == pytest.approx(0.5)
        assert m["reward"] == pytest.approx((1.0 + 0.5) / 2) and m["tools/failure_frequency"] == 0.0
    assert any("<tool_result>42</tool_result>" in c for c in sampler.contexts)  # the toolset really added


@pytest.mark.parametrize(
    "module,extra", [("verifiers.v1", "verifiers"), ("textarena", "textarena"), ("openenv.core", "openenv")]
)
def test_a_missing_library_is_one_sentence(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: importing it raises ImportError
    with pytest.raises(
        ConfigError,
        match=rf"^this environment needs the {extra} library .*"
        rf"install it with: pip install 'grpokit\[{extra}\]'$",
    ):
        require(module, extra)
