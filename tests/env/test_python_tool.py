"""The built-in python tool in real sandboxes: the model's own program failing is an error message the
model reads (the traceback's last lines, a time limit that killed it), never a hung tool; long output is
cut and marked."""

import pytest

from grpokit.env import call_tool, resolve_tools
from grpokit.env.builtin import MAX_ERROR_LINES, program_failure, sandbox_wall_s, shown_stdout
from grpokit.rewards.code import probe
from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
from grpokit.rollout.hf import SamplingParams
from grpokit.types import Prompt, Rollout


class CodePoints:
    """A tokenizer of code points: any program's text survives the round trip (the calculator's does not)."""

    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def always(text):
    def sample(contexts, group_size, params):
        n, t = len(contexts) * group_size, [ord(c) for c in text]
        return Rollout([list(c) for c in contexts], [t] * n, [[-0.1] * len(t)] * n, ["stop"] * n, group_size)

    return sample


@pytest.fixture(scope="module")
def sandbox():
    ok, why = probe()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable on this host: {why}")


def test_the_sandbox_wall_is_three_quarters_of_the_tool_deadline():
    assert sandbox_wall_s(10.0) == 7.5 and sandbox_wall_s(2.0) == 1.5


def test_failure_messages_by_hand():
    rec = {"status": "error", "returncode": 1, "stdout": "1\n", "stderr": "".join(f"l{k}\n" for k in range(12))}
    # 12 stderr lines: the last MAX_ERROR_LINES = 8 are l4 .. l11
    assert MAX_ERROR_LINES == 8
    assert program_failure(rec, "1\n") == (
        "the program failed (exit status 1); it printed: 1; its error output ended with:\n"
        + "\n".join(f"l{k}" for k in range(4, 12))
    )
    assert program_failure({"status": "error"}, "") == "the program failed"
    assert (
        shown_stdout({"stdout": "xxxx", "stdout_bytes": 10}, 4) == "xxxx...[output cut: the first 4 of 10 bytes shown]"
    )
    assert shown_stdout({"stdout": "xxxx", "stdout_bytes": 4}, 4) == "xxxx"


def test_a_programs_traceback_and_cut_output_reach_the_model(sandbox):
    tools = {"python": resolve_tools(["python"], tool_timeout_s=10.0)[0]}
    r = call_tool(tools, "python", "print(1)\ndef f():\n    return 1 / 0\nf()", timeout_s=10, max_chars=2000)
    assert r.error and not r.timed_out
    assert "exit status 1" in r.content and "ZeroDivisionError: division by zero" in r.content
    assert "line 3, in f" in r.content  # the traceback's last lines, not "the program failed" alone
    r = call_tool(tools, "python", "print('x' * 5000)", timeout_s=10, max_chars=0)
    # 5000 x and a newline = 5001 bytes; the sandbox keeps 4096 and says so
    assert r.content == "x" * 4096 + "...[output cut: the first 4096 of 5001 bytes shown]"


def test_the_models_endless_loop_is_its_error_not_a_hung_tool(sandbox):
    """Both episodes of the prompt loop forever. The sandbox's wall (1.5 s of a 2 s deadline) stops them:
    an error message each, no tool time-out; before, the deadline fired first, both calls counted as hung
    tools (2 of 2 > env.max_failure_fraction 0.5) and the run stopped with "fix the tool that hangs"."""
    spec = EpisodeSpec(max_turns=2, tool_format="tags", tool_timeout_s=2.0)
    runner = EpisodeRunner(spec, CodePoints(), tools=resolve_tools(["python"], tool_timeout_s=2.0))
    loop = always("<tool_call>while True: pass</tool_call>")
    ro = runner.run(loop, [Prompt("go", [103, 111], {}, "go")], 2, SamplingParams())
    for e in ro.episodes:
        assert e.tool_timeouts == 0 and e.tool_errors == 1
        assert e.messages[1]["content"] == "{'error': 'the program ran past its 1.5 s limit and was killed'}"


def test_a_slow_sandbox_start_is_not_the_tool_calls_time(sandbox, monkeypatch):
    """The launcher's and bwrap's start-up have their own budget (START_BUDGET_S), as a program's wall_s
    does not count it: here it takes 1.2 s (a loaded machine, simulated), longer than the whole 1 s
    deadline of the tool call. Before, the call timed out (a hung tool); its start-up is start-up now
    (calls.startup, the deadline stops), so the program's own 0.5 s wall and its output are what count."""
    import time as clock

    from grpokit.env import make_python_tool
    from grpokit.rewards.sandbox import isolation

    real = isolation._wait_begun

    def slow_start(*args):
        clock.sleep(1.2)
        return real(*args)

    monkeypatch.setattr(isolation, "_wait_begun", slow_start)
    tools = {"python": make_python_tool(wall_s=0.5)}
    r = call_tool(tools, "python", "print(6 * 7)", timeout_s=1.0, max_chars=200)
    assert not r.timed_out and not r.error and r.content == "42\n"
    r = call_tool(tools, "python", "while True: pass", timeout_s=1.0, max_chars=200)  # its own wall still holds
    assert not r.timed_out and r.error and "ran past its 0.5 s limit" in r.content
