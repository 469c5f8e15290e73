"""Nothing untrusted can stall training or be silently scored.

Each case failed before: a sandboxed program that wrote a deep record on the result channel and then
defined a correct function earned 0.5; an environment whose reset hung held a run for minutes in
silence; a verifier's cold start or time-out scored correct answers 0 without a word.
"""

from __future__ import annotations

import functools
import threading
import time

import pytest

from grpokit.rewards.spec import RewardSpec
from helpers.hanging_env import Hang
from helpers.paths import TESTS
from helpers.train_processes import grpokit_train
from helpers.verifier_answers import SLOW_ANSWER

TAMPER = """
import os
os.write(3, b"[" * 200000 + b"]" * 200000 + b"\\n")
def f(x):
    return 2 * x
"""
HONEST = "def f(x):\n    return 2 * x\n"
CASES = [{"fn": "f", "args": [1], "expected": 2}, {"fn": "f", "args": [3], "expected": 6}]


def _need_sandbox():
    from grpokit.rewards.code import probe

    ok, why = probe()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable on this host: {why}")


def test_tampering_with_the_result_channel_forfeits_the_reward_in_process():
    # a record nested 200,000 deep, then a correct f; 2 cases. Were the deep line to taint case 0 only,
    # case 1 would pass: 0.5. The completion scores 0.0 as tampering (a plain float to a direct caller,
    # as TRL's convention asks: an exception would drop it from its group), reported by kind.
    from grpokit.rewards.calls import collecting_faults
    from grpokit.rewards.code import code_pass_fraction

    _need_sandbox()
    with collecting_faults() as faults:
        out = code_pass_fraction([f"```python\n{TAMPER}```", f"```python\n{HONEST}```"], [CASES, CASES], wall_s=10)
    assert out == [0.0, 1.0] and type(out[0]) is float
    assert list(faults) == [0] and faults[0][0] == "tampering" and "result channel" in faults[0][1]


@pytest.mark.parametrize("workers", [0, 1])
def test_tampering_is_a_counted_failure_through_the_runner(workers):
    from grpokit.rewards.code import code_pass_fraction
    from grpokit.rewards.runner import RewardRunner

    _need_sandbox()
    fn = functools.partial(code_pass_fraction, wall_s=10)
    with RewardRunner([RewardSpec(fn, "code")], num_workers=workers, timeout_s=60) as runner:
        # one group of 2: the group call fails, each completion is retried alone; only the tamperer fails
        res = runner.score(
            ["p", "p"],
            [f"```python\n{TAMPER}```", f"```python\n{HONEST}```"],
            [[1], [1]],
            2,
            {"test_cases": [CASES, CASES]},
        )
    assert res.total_N.tolist() == [0.0, 1.0]
    m = res.metrics
    assert m["rewards/code/tampering"] == 1.0 and m["rewards/code/zeroed"] == 1.0 and m["rewards/code/failures"] == 0.0
    assert m["rewards/code/mean"] == 0.5  # the tamperer's 0 is a score like any other


@pytest.mark.parametrize(
    "program",
    [
        # neighbours: the honest records written twice; a record for the other case first; a huge channel
        'import os\nos.write(3, b\'{"case": 0, "status": "ok", "value": 2}\\n\')\ndef f(x):\n    return 2 * x\n',
        'import os\nos.write(3, b\'{"case": 1, "status": "ok", "value": 6}\\n\')\ndef f(x):\n    return 2 * x\n',
        "import os\ndef f(x):\n    os.write(3, b' ' * (8 << 20))\n    return 2 * x\n",
        'import os\ndef f(x):\n    os.write(3, b\'{"case": 0, "status"\\n\')\n    return 2 * x\n',
    ],
)
def test_channel_tampering_neighbours_forfeit(program):
    from grpokit.rewards.calls import collecting_faults
    from grpokit.rewards.code import code_pass_fraction

    _need_sandbox()
    with collecting_faults() as faults:
        assert code_pass_fraction([f"```python\n{program}```"], [CASES], wall_s=10, memory_mb=512) == [0.0]
    assert faults[0][0] == "tampering"


# ------------------------------------------------------------------------------------------ verifier

CONTROLS = (
    [r"so \boxed{5}", "<answer>5</answer>", r"\boxed{\frac{1}{2}}", r"\boxed{2\sqrt{2}}"],
    ["5", "5", "0.5", r"\sqrt{8}"],
)


def test_the_verifier_is_warm_before_the_first_deadline_runs():
    # a fresh pool with a 1 s deadline per item: without the warm-up, the worker's imports and parser
    # set-up ran inside the first items' deadline and all four correct controls timed out (measured
    # on this machine, load 14: 4 time-outs); warmed at start (outside the deadline) they score 1
    from grpokit.rewards.math import MathVerifyPool

    with MathVerifyPool(timeout_s=1.0) as pool:
        assert pool.verify(CONTROLS[1], CONTROLS[0]) == [1.0, 1.0, 1.0, 1.0]
        assert pool.timeouts == 0


def test_a_verifier_time_out_scores_zero_and_is_counted(fresh_math_pool):
    # an answer that keeps sympy busy past its CPU budget (a deep sum of powers: under every text
    # limit, answer_limits.py) scores 0.0 like a wrong answer (a NaN would drop it from its group, so a
    # policy unsure of its answer would be paid for stalling the checker) and is counted as a timeout
    from grpokit.rewards.calls import collecting_faults
    from grpokit.rewards.math import MathVerifyPool, math_accuracy
    from grpokit.rewards.runner import RewardRunner

    slow = SLOW_ANSWER  # 28 CPU seconds of sympy
    with MathVerifyPool(timeout_s=0.5) as pool, collecting_faults() as faults:
        out = pool.verify(["6", "5"], [slow, r"\boxed{5}"])
    assert out == [0.0, 1.0] and pool.timeouts == 1 and faults[0][0] == "timeouts"
    with RewardRunner([RewardSpec(math_accuracy, "math_accuracy")], num_workers=0, timeout_s=60) as runner:
        res = runner.score(["p"] * 2, [slow, r"\boxed{5}"], [[1], [1]], 2, {"answer": ["6", "5"]})
    m = res.metrics
    assert res.total_N.tolist() == [0.0, 1.0]
    assert m["rewards/math_accuracy/failures"] == 0.0 and m["rewards/math_accuracy/zeroed"] == 1.0


def test_length_rewards_pass_a_verifier_failure_on():
    # cosine_length and length_penalty read correctness: a NaN is truthy, so it would count as a
    # correct answer; the failure passes through to the runner instead
    from grpokit.rewards import length
    from grpokit.rewards.errors import ItemFailure

    fail = ItemFailure("math verification ran past its deadline", True)
    orig = length.correctness
    try:
        length.correctness = lambda completions, kwargs: [fail, 1.0]
        assert length.cosine_length(["a", "b"], [[1], [1]], max_length=4)[0] is fail
        assert length.length_penalty(["a", "b"], [[1], [1, 2]])[0] is fail
    finally:
        length.correctness = orig


# ------------------------------------------------------------------------------------ environments


def _threads(prefix: str) -> int:
    return sum(t.name.startswith(prefix) for t in threading.enumerate())


def test_call_many_holds_its_deadline_when_every_call_hangs_and_bounds_the_threads():
    from grpokit.env.calls import MAX_ABANDONED, call_many

    key = "test-hang-" + str(time.monotonic())
    for _ in range(3):  # step after step: the abandoned threads stay at the bound, never grow
        start = time.monotonic()
        outs = call_many(key, [lambda: time.sleep(3600)] * 20, timeout_s=0.3, threads=8)
        assert time.monotonic() - start < 3  # one deadline, not 20 x 0.3 s
        assert all(o.timed_out and not o.ok for o in outs)
        assert _threads(f"grpokit-{key}") == MAX_ABANDONED
    # on a loaded machine every call may look starved (its thread waited for a CPU) and be retried once:
    # the retries are held to the same bound (they started threads past it before)
    from grpokit.env import workers

    key = "test-starved-" + str(time.monotonic())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(workers.Task, "starved", lambda self: True)
        for _ in range(2):
            outs = call_many(key, [lambda: time.sleep(3600)] * 20, timeout_s=0.3, threads=8)
            assert all(o.timed_out and not o.ok for o in outs)
            assert _threads(f"grpokit-{key}") == MAX_ABANDONED
    # calls that finish are plain results, side by side (4 x 0.2 s in about 0.2 s)
    start = time.monotonic()
    outs = call_many("test-fine", [lambda i=i: (time.sleep(0.2), i)[1] for i in range(4)], timeout_s=5, threads=4)
    assert [o.value for o in outs] == [0, 1, 2, 3] and time.monotonic() - start < 1.5


def _Tok():
    from grpokit.data.tasks.calculator import TAGS
    from grpokit.data.tasks.chartok import ALPHABET, build_char_tokenizer

    return build_char_tokenizer(ALPHABET, TAGS)


def _prompt(k: int):
    from grpokit.types import Prompt

    text = f"{k}="
    return Prompt(text, list(_Tok()(text, add_special_tokens=False)["input_ids"]), {}, text)


def _never_called(contexts, group_size, params):
    raise AssertionError("no turn is sampled when the resets fail the batch")


def _calls(tool: str):
    """A sampler whose every turn calls ``tool``."""
    from grpokit.types import Rollout

    tok = _Tok()
    text = '<tool_call>{"name": "%s", "arguments": {"n": "1"}}</tool_call>' % tool

    def sample(contexts, group_size, params):
        n = len(contexts) * group_size
        t = list(tok(text, add_special_tokens=False)["input_ids"])
        return Rollout(
            [list(c) for c in contexts],
            [list(t) for _ in range(n)],
            [[-0.5] * len(t) for _ in range(n)],
            ["stop"] * n,
            group_size,
        )

    return sample


def test_a_hanging_reset_stops_the_rollout_with_one_sentence_and_no_thread_growth():
    # every reset hangs. 8 prompts x 2 episodes with reset_timeout_s=0.5: not 16 resets of 0.5 s one
    # after another (30 s each by default: 8 minutes) with the batch going on from bare prompts, but one
    # deadline, then EnvironmentFailure past env.max_failure_fraction
    from grpokit.env.calls import MAX_ABANDONED, EnvironmentFailure
    from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
    from grpokit.rollout.hf import SamplingParams

    # a class of its own: the abandoned resets of another test's Hang in this process (a test run earlier by
    # the same xdist worker) still sleep, and count against the same key's bound
    alone = type(f"Hang{time.monotonic_ns()}", (Hang,), {})
    runner = EpisodeRunner(
        EpisodeSpec(max_turns=2, tool_format="tags", reset_timeout_s=0.5), _Tok(), environment_factory=alone
    )
    # the second batch: the 8 abandoned resets still sleep, so no thread is started and all fail at once
    for first in ("timed out after 0.5 s", "not run: 8 earlier calls that timed out are still running"):
        start = time.monotonic()
        with pytest.raises(EnvironmentFailure) as err:
            runner.run(_never_called, [_prompt(k) for k in range(8)], 2, SamplingParams())
        assert str(err.value) == (
            "environment reset() failed on 16 of 16 episodes, more than "
            f"env.max_failure_fraction=0.5; first error: {first}"
        )
        assert time.monotonic() - start < 5
        assert _threads(f"grpokit-environment-reset-{alone.__name__}") <= MAX_ABANDONED


class HangingConstructor(Hang):
    def __init__(self):
        time.sleep(3600)


class BrokenConstructor(Hang):
    def __init__(self):
        raise OSError("no such game server")


def test_an_environment_whose_constructor_hangs_or_raises_is_one_sentence_when_the_runner_is_made():
    # the runner builds one environment to list its tools; that probe sat forever on a constructor that
    # hangs (and raised a traceback on one that fails): now it is bounded by reset_timeout_s
    from grpokit.env.calls import EnvironmentFailure
    from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec

    spec = EpisodeSpec(max_turns=2, tool_format="tags", reset_timeout_s=0.5)
    cases = [
        (HangingConstructor, "the environment could not be built to list its tools: timed out after 0.5 s"),
        ({"game": BrokenConstructor}, "environment 'game' could not be built to list its tools: OSError: no such"),
    ]
    for factory, message in cases:
        start = time.monotonic()
        with pytest.raises(EnvironmentFailure) as err:
            EpisodeRunner(spec, _Tok(), environment_factory=factory)
        assert str(err.value).startswith(message), str(err.value)
        assert "env.reset_timeout_s=0.5" in str(err.value)
        assert time.monotonic() - start < 5


class HangingTool:
    def reset(self, **row):
        return None

    def wait(self, n: str) -> str:
        """Wait forever.

        Args:
            n: ignored.
        """
        time.sleep(3600)


def test_a_tool_that_hangs_on_every_call_stops_the_rollout_and_bounds_its_threads():
    from grpokit.env import workers
    from grpokit.env.calls import EnvironmentFailure
    from grpokit.env.tools import MAX_ABANDONED
    from grpokit.rollout.episodes import TOOL_THREADS, EpisodeRunner, EpisodeSpec
    from grpokit.rollout.hf import SamplingParams

    spec = EpisodeSpec(max_turns=3, tool_format="tags", tool_timeout_s=0.3)
    runner = EpisodeRunner(spec, _Tok(), environment_factory=HangingTool)
    for starved in (True, False):  # first as on a loaded machine: every call starved, each retried once
        start = time.monotonic()
        with pytest.MonkeyPatch.context() as mp:
            if starved:
                mp.setattr(workers.Task, "starved", lambda self: True)
            with pytest.raises(EnvironmentFailure, match="tool calls ran past env.tool_timeout_s on 16 of 16 episodes"):
                runner.run(_calls("wait"), [_prompt(k) for k in range(8)], 2, SamplingParams())
        assert time.monotonic() - start < 5
        assert _threads("grpokit-tool-wait") <= TOOL_THREADS + MAX_ABANDONED


def test_grpokit_train_with_a_hanging_environment_stops_with_one_sentence(tmp_path):
    # the run: 2 steps with env.environment=module:Hang sat 10 minutes without a word
    import json

    rows = [{"question": f"{a}+{a}=", "solution": str(2 * a)} for a in range(10, 16)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "hangenv.py").write_text((TESTS / "helpers" / "hanging_env.py").read_text())
    args = [
        "data.dataset=train.jsonl",
        "data.prompt_column=question",
        "data.answer_column=solution",
        "rollout.group_size=2",
        "train.prompts_per_step=2",
        "rollout.max_new_tokens=4",
        "train.steps=2",
        "record.sinks=[]",
        "train.threads=1",
        "record.report=false",
        "env.environment=hangenv:Hang",
        "env.reset_timeout_s=1",
        "reward.functions=[math_accuracy]",
        "--out",
        "run",
    ]
    start = time.monotonic()
    out = grpokit_train(args, tmp_path)
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "grpokit: error: environment reset() failed on 4 of 4 episodes, more than "
        "env.max_failure_fraction=0.5; first error: timed out after 1 s;"
    ), out.stderr
    assert "Traceback" not in out.stderr
    assert time.monotonic() - start < 240


# ------------------------------------------------------------------ a server that stops answering


class SilentServer:
    """A real HTTP server on 127.0.0.1 that accepts every connection and never replies."""

    def __init__(self):
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/score"
        self.conns: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])  # held open, never read, never answered
            except OSError:
                return

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def asks_a_reward_server(completions, url, **kwargs):
    """A reward model behind HTTP, called as users write it: no timeout of its own."""
    import urllib.request

    return [float(urllib.request.urlopen(u).read()) for u in url]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_reward_server_that_never_answers_is_timed_out_counted_and_stops_the_run(workers):
    from grpokit.rewards.runner import RewardRunner
    from grpokit.rewards.spec import RewardError

    server = SilentServer()
    try:
        with RewardRunner(
            [RewardSpec(asks_a_reward_server, "rm")], num_workers=workers, timeout_s=0.5, max_failure_fraction=1.0
        ) as runner:
            start = time.monotonic()
            res = runner.score(["p"] * 4, ["a", "b", "c", "d"], [[1]] * 4, 2, {"url": [server.url] * 4})
            # 2 group calls of 0.5 s (timed-out groups are not retried), plus, with a worker, two worker
            # start-ups (each imports this module, torch with it: start-up, outside every deadline)
            assert time.monotonic() - start < 60
            assert res.metrics["rewards/rm/timeouts"] == 4.0 and res.total_N.tolist() == [0.0] * 4
            runner.max_failure_fraction = 0.5
            with pytest.raises(RewardError, match=r"Reward 'rm' failed on 4 of 4 completions.*timed out after 0.5 s"):
                runner.score(["p"] * 4, ["a", "b", "c", "d"], [[1]] * 4, 2, {"url": [server.url] * 4})
    finally:
        server.close()


def test_a_tool_whose_server_never_answers_stops_the_rollout():
    from grpokit.env.calls import EnvironmentFailure
    from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
    from grpokit.rollout.hf import SamplingParams

    server = SilentServer()

    def lookup(n: str) -> str:
        """Ask the service.

        Args:
            n: the question.
        """
        import urllib.request

        return urllib.request.urlopen(server.url).read().decode()

    try:
        runner = EpisodeRunner(EpisodeSpec(max_turns=2, tool_format="tags", tool_timeout_s=0.3), _Tok(), tools=[lookup])
        start = time.monotonic()
        with pytest.raises(EnvironmentFailure, match="tool calls ran past env.tool_timeout_s on 4 of 4 episodes"):
            runner.run(_calls("lookup"), [_prompt(k) for k in range(2)], 2, SamplingParams())
        assert time.monotonic() - start < 5
    finally:
        server.close()


class HangingDone:
    def reset(self, **row):
        return None

    @property
    def done(self):
        time.sleep(3600)

    def add(self, n: str) -> str:
        """Add.

        Args:
            n: amount.
        """
        return n


def test_a_done_property_that_hangs_ends_its_episode_within_the_tool_deadline():
    # a neighbour of reset: `done` is read after every turn, and was read in the trainer's thread
    from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
    from grpokit.rollout.hf import SamplingParams

    runner = EpisodeRunner(
        EpisodeSpec(max_turns=3, tool_format="tags", tool_timeout_s=0.3), _Tok(), environment_factory=HangingDone
    )
    start = time.monotonic()
    ro = runner.run(_calls("add"), [_prompt(0)], 2, SamplingParams())
    assert time.monotonic() - start < 5
    assert ro.finish_reasons == ["done", "done"]
