"""Fault suite for untrusted code: rewards, tools, environments, servers, verifiers.

Every test here encodes one fault that ended a run (a hang, a crash, a leak) before containment was
a property of the system: the fault must end in a value, a counted failure or one sentence. Limits and
timeouts are short so the whole file stays fast; docs/FAULTS.md lists the guarantees.
"""

import contextlib
import math
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from grpokit.rewards.spec import RewardError, RewardSpec
from helpers.hanging_env import Hang

# ---------------------------------------------------------------------------------------------- rewards


def huge(completions, **kwargs):
    return [1e300] * len(completions)


def infinite_or_nan(completions, **kwargs):
    return [math.inf if c == "a" else math.nan for c in completions]


def exits(completions, **kwargs):
    if "x" in completions:
        sys.exit(3)
    return [1.0] * len(completions)


def interrupts(completions, **kwargs):
    if "x" in completions:
        raise KeyboardInterrupt
    return [1.0] * len(completions)


def raises_system_exit(completions, **kwargs):
    if "x" in completions:
        raise SystemExit("bye")
    return [1.0] * len(completions)


def hangs_on_x(completions, **kwargs):
    if "x" in completions:
        time.sleep(3600)
    return [1.0] * len(completions)


def _batch(completions, group_size=1):
    n = len(completions)
    return dict(prompts=["p"] * n, completions=completions, completion_ids=[[1]] * n, group_size=group_size)


def _runner(fn, name, **kw):
    from grpokit.rewards.runner import RewardRunner

    return RewardRunner([RewardSpec(fn, name)], **{"num_workers": 0, "timeout_s": 1.0, **kw})


def test_reward_of_1e300_inf_or_nan_is_a_counted_failure_not_a_crash():
    # 1e300 is a finite float64 but overflows the float32 rewards tensor (RuntimeError before)
    with _runner(huge, "huge", failure_value=-1.0, max_failure_fraction=1.0) as r:
        res = r.score(**_batch(["a", "b"]))
    assert res.rewards_NF[:, 0].tolist() == [-1.0, -1.0]
    assert res.metrics["rewards/huge/failures"] == 2.0 and res.metrics["rewards/huge/nonfinite"] == 2.0
    with _runner(infinite_or_nan, "inf", max_failure_fraction=1.0) as r:
        res = r.score(**_batch(["a", "b"]))
    assert res.metrics["rewards/inf/nonfinite"] == 2.0 and res.total_N.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("fn", [exits, interrupts, raises_system_exit])
def test_sys_exit_keyboard_interrupt_and_system_exit_in_a_reward_are_contained(fn):
    # uncontained, sys.exit(3) would end the run with exit code 3 and KeyboardInterrupt kill it; completion
    # "x" fails (failure_value 0.0) and "y", "z" score 1.0: 1 failure of 3 < max_failure_fraction 0.5
    with _runner(fn, "r") as r:
        res = r.score(**_batch(["x", "y", "z"]))
    assert res.rewards_NF[:, 0].tolist() == [0.0, 1.0, 1.0]
    assert res.metrics["rewards/r/failures"] == 1.0


def test_sys_exit_in_a_worker_process_is_contained():
    with _runner(exits, "r", num_workers=1, timeout_s=30.0) as r:
        res = r.score(**_batch(["x", "y", "z"]))
    assert res.rewards_NF[:, 0].tolist() == [0.0, 1.0, 1.0]


def test_hanging_reward_in_process_times_out_and_the_process_exits():
    # the default mode (num_workers=0): a call abandoned in a thread would be joined by the interpreter
    # at exit, so the process would never end; the main-thread deadline stops the call.
    script = textwrap.dedent("""
        import time
        from grpokit.rewards.runner import RewardRunner
        from grpokit.rewards.spec import RewardSpec
        def hang(completions, **kw):
            if "x" in completions:
                time.sleep(3600)
            return [1.0] * len(completions)
        r = RewardRunner([RewardSpec(hang, "hang")], num_workers=0, timeout_s=0.5)
        res = r.score(prompts=["p"] * 3, completions=["x", "y", "z"], completion_ids=[[1]] * 3, group_size=1)
        print(res.metrics["rewards/hang/timeouts"], res.rewards_NF[:, 0].tolist())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "1.0 [0.0, 1.0, 1.0]"


def test_hanging_reward_from_a_helper_thread_leaks_no_threads():
    # off the main thread the deadline is soft, but abandoned calls are capped (MAX_ABANDONED = 4)
    from grpokit.rewards.inproc import MAX_ABANDONED

    box = {}
    with _runner(hangs_on_x, "hang", timeout_s=0.2, max_failure_fraction=1.0) as r:

        def work():
            box["res"] = [r.score(**_batch(["x"] * 5)) for _ in range(4)]  # 20 hanging calls

        before = threading.active_count()
        t = threading.Thread(target=work)
        t.start()
        t.join(60)
    assert not t.is_alive()
    assert box["res"][-1].metrics["rewards/hang/timeouts"] == 5.0
    assert threading.active_count() - before <= MAX_ABANDONED
    assert all(th.daemon for th in threading.enumerate() if th.name.startswith("grpokit-reward"))


def test_too_many_failures_name_the_function_and_the_row():
    with _runner(huge, "huge") as r:
        with pytest.raises(
            RewardError, match=r"Reward 'huge' failed on 2 of 2 completions.*on completion 0: reward 1e\+300"
        ):
            r.score(**_batch(["a", "b"]))


# ------------------------------------------------------------------------------ tools and environments


def _tok():
    from grpokit.data.tasks.calculator import TAGS
    from grpokit.data.tasks.chartok import ALPHABET, build_char_tokenizer

    return build_char_tokenizer(ALPHABET, TAGS)


def _always(text):
    """A sampler that answers every context with ``text`` (stop reason "stop")."""
    from grpokit.types import Rollout

    tok = _tok()

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


def _prompt(text="1="):
    from grpokit.types import Prompt

    return Prompt(text, list(_tok()(text, add_special_tokens=False)["input_ids"]), {}, text)


def test_tool_arguments_nested_1000_deep_are_an_unreadable_call_not_a_recursion_error():
    from grpokit.env.parse import parse_tool_calls

    deep = "[" * 1000 + "]" * 1000
    for body in [
        '{"name": "f", "arguments": {"a": %s}}' % deep,  # json.loads raised RecursionError here
        '{"name": "f", "arguments": "{\\"a\\": %s}"}' % deep,
    ]:  # arguments as a JSON string
        (call,) = parse_tool_calls(f"<tool_call>{body}</tool_call>", ["f"])
        assert call.name == "" or isinstance(call.arguments, str)
    (call,) = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"a": %s}}</tool_call>' % deep, ["f"])
    assert call.name == "" and "env.max_tool_nesting=20" in call.error
    # the body {"name", "arguments": {"a": 18 lists}} is 1 + 1 + 18 = 20 deep: read; one more list is refused
    call = lambda k: parse_tool_calls(
        '<tool_call>{"name": "f", "arguments": {"a": %s}}</tool_call>' % ("[" * k + "]" * k), ["f"]
    )[0]
    assert call(18).name == "f" and call(18).arguments == {"a": [[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]}
    assert call(19).name == "" and "nests 21 levels deep" in call(19).error


def test_deep_tool_result_and_unprintable_result_become_error_messages():
    from grpokit.env.tools import call_tool

    deep: list = []
    for _ in range(490):
        deep = [deep]

    class Unprintable:
        def __str__(self):
            raise RuntimeError("no")

    tools = {"deep": lambda x: deep, "bad": lambda x: Unprintable()}
    r = call_tool(tools, "deep", "1", timeout_s=5, max_chars=200)
    assert r.error and "env.max_tool_nesting=20" in r.content
    r = call_tool(tools, "bad", "1", timeout_s=5, max_chars=200)  # str() raised in the trainer before
    assert r.error and "could not be turned into text (RuntimeError)" in r.content


def test_a_490_deep_value_is_written_to_jsonl():
    import json

    from grpokit.record.jsonl import MAX_JSON_DEPTH, dumps_line

    deep: list = []
    for _ in range(490):
        deep = [deep]
    line = json.loads(dumps_line({"messages": deep}))  # RecursionError in to_json_value before
    depth, v = 0, line["messages"]
    while isinstance(v, list):
        depth, v = depth + 1, v[0]
    # the record is level 1, so 63 of the 490 lists are kept and the 64th level becomes the note
    assert depth == MAX_JSON_DEPTH - 1 and v == f"[nested deeper than {MAX_JSON_DEPTH} levels]"


def test_a_hanging_tool_leaks_no_threads_and_a_looping_one_is_stopped():
    from grpokit.env.tools import MAX_ABANDONED, call_tool

    release = threading.Event()

    def hang(x: str) -> str:
        release.wait(30)
        return "late"

    def spin(x: str) -> str:
        while True:
            pass

    before = threading.active_count()
    results = [call_tool({"hang": hang}, "hang", "1", timeout_s=0.05, max_chars=200) for _ in range(20)]
    assert all(r.error for r in results)
    assert threading.active_count() - before <= MAX_ABANDONED  # 20 threads before
    assert "still running" in results[-1].content
    release.set()
    r = call_tool({"spin": spin}, "spin", "1", timeout_s=0.05, max_chars=200)
    assert r.error and "timed out" in r.content
    deadline = time.monotonic() + 10
    while any(t.name == "grpokit-tool-spin" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name == "grpokit-tool-spin" for t in threading.enumerate())  # stopped, not abandoned


def test_default_limits_cap_episodes():
    from grpokit.config.sections import EnvConfig
    from grpokit.rollout.episodes import EpisodeSpec

    e, s = EnvConfig(), EpisodeSpec()
    assert (e.max_episode_tokens, s.max_episode_tokens) == (8192, 8192)  # 0 = no cap before
    assert (e.max_tool_nesting, e.max_observation_chars, e.reset_timeout_s) == (20, 8000, 30.0)
    assert (e.max_turns, e.max_tool_output_chars) == (4, 1000)


class HugeReset(Hang):
    def reset(self, **row):
        return "1" * 10_000_000


class BrokenReset(Hang):
    def reset(self, **row):
        raise SystemExit(4)


@pytest.mark.timeout(120)
def test_environment_reset_hangs_raises_or_floods_and_training_goes_on():
    from grpokit.rollout.episode_metrics import episode_metrics
    from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
    from grpokit.rollout.hf import SamplingParams

    # max_failure_fraction=1: contained and counted; the stop past the fraction is tests/project/test_faults_stalls.py
    tok, spec = (
        _tok(),
        EpisodeSpec(
            max_turns=2, tool_format="tags", reset_timeout_s=0.5, max_observation_chars=100, max_failure_fraction=1.0
        ),
    )
    for env, failed in [(Hang, True), (BrokenReset, True), (HugeReset, False)]:
        start = time.monotonic()
        ro = EpisodeRunner(spec, tok, environment_factory=env).run(
            _always("<answer>1</answer>"), [_prompt()], 2, SamplingParams()
        )
        assert time.monotonic() - start < 30
        assert [e.reset_failed for e in ro.episodes] == [failed, failed]
        assert episode_metrics(ro)["episodes/reset_failures"] == 2.0 * failed
        # the prompt "1=" (2 tokens) + at most 100 characters + the cut mark, not 10 million tokens
        assert len(ro.prompt_ids[0]) <= 2 + 100 + len("...[truncated]")


# ------------------------------------------------------------------------------------------ verifiers


@pytest.mark.parametrize("hedge", [r"\boxed{5 = 6}", r"\boxed{5 \to 6}", r"\boxed{5 \\ 6}"])
def test_boxed_hedges_score_zero(hedge):
    # gold 6: each box names two answers (5 and 6), so the one-answer rule scores 0 (1.0 before)
    from grpokit.rewards.answers import count_values
    from grpokit.rewards.math import math_accuracy

    assert count_values(hedge[len(r"\boxed{") : -1]) == 2
    assert math_accuracy([f"The answer: {hedge}", r"so \boxed{6}"], answer=["6", "6"]) == [0.0, 1.0]


def test_forged_records_on_the_verdict_channel_taint_the_whole_channel():
    import json

    from grpokit.rewards.code import _trusted_records

    honest = ['{"case": 0, "status": "ok", "value": 3}', '{"case": 1, "status": "ok", "value": 4}']
    assert _trusted_records("\n".join(honest), 2) == ({0: json.loads(honest[0]), 1: json.loads(honest[1])}, False)
    deep = "[" * 100_000 + "]" * 100_000
    forged = '{"case": 1, "status": "ok", "value": 4}'
    for lines in (
        [deep, *honest],  # a deeply nested line written while case 0 ran (case 1 stood before)
        [honest[0], forged, honest[1]],  # a second record of case 1, before the honest one
        [honest[0], honest[0], honest[1]],  # case 0 named twice
        [*honest, '{"case": 2, "status": "ok", "value": 5}'],  # a record past the last case
        ['{"case": 0, "status": "ok", "value": 3'],
    ):  # malformed JSON
        assert _trusted_records("\n".join(lines), 2) == ({}, True), lines


FORGER = """
import os
def f(x):
    # a line nested 100,000 deep, then a record claiming the case passed, then a wrong answer
    os.write(3, b"[" * 100000 + b"]" * 100000 + b"\\n" + b'{"case": 0, "status": "ok", "value": 2}\\n')
    return 0
"""


def test_a_program_forging_its_verdict_in_the_sandbox_earns_nothing():
    # end to end, as a model's program would do it: skipping the deep line and reading the forged record
    # as the verdict would give it 1.0; the forger scores 0 (counted as tampering), the honest program passes
    import functools

    from grpokit.rewards.code import code_pass_fraction, probe
    from grpokit.rewards.runner import RewardRunner

    ok, why = probe()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable on this host: {why}")
    cases = [[{"fn": "f", "args": [1], "expected": 2}]] * 2
    honest = "def f(x):\n    return 2 * x\n"
    runner = RewardRunner(
        [RewardSpec(functools.partial(code_pass_fraction, wall_s=10), "code")], num_workers=0, timeout_s=60
    )
    res = runner.score(
        ["p", "p"], [f"```python\n{FORGER}```", f"```python\n{honest}```"], [[1], [1]], 1, {"test_cases": cases}
    )
    assert res.total_N.tolist() == [0.0, 1.0] and res.metrics["rewards/code/tampering"] == 1.0


# -------------------------------------------------------------------------------------------- servers


class RawServer:
    """A server on 127.0.0.1 that answers every connection with ``serve(conn)`` (a socket)."""

    def __init__(self, serve):
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.serve, self.stop = serve, threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            conn.recv(65536)
            self.serve(conn, self.stop)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.sock.close()


def drip(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
    while not stop.wait(0.2):  # one byte every 0.2 s: every read finishes well within any socket timeout
        conn.sendall(b" ")


def flood(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % 2**30)
    block = b"x" * 2**20
    for _ in range(1024):  # 1 GiB, unless the client hangs up first
        if stop.is_set():
            return
        conn.sendall(block)


def test_a_dripping_server_cannot_hold_a_call_past_its_deadline():
    from grpokit.rollout.vllm_http import http_call

    srv = RawServer(drip)
    try:
        start = time.monotonic()
        a = http_call("GET", srv.url + "/health", None, timeout=1.0)
        assert time.monotonic() - start < 5  # before: as long as the server kept dripping
        assert a.status == 0 and a.text == "timed out: no complete reply within 1 s"
    finally:
        srv.close()


def test_a_huge_reply_is_refused_not_read_into_memory():
    from grpokit.rollout.vllm_http import http_call

    srv = RawServer(flood)
    try:
        a = http_call("GET", srv.url + "/v1/models", None, timeout=30.0, max_bytes=2**20)
        assert a.status == 0 and a.text == f"the reply was larger than {2**20} bytes"
    finally:
        srv.close()


WRONG_SHAPES = [
    [],
    "x",
    None,
    {},
    {"choices": None},
    {"choices": [1]},
    {"choices": [{"index": "0"}]},
    {"choices": [{"index": 0}]},
    {"choices": [{"index": 0, "logprobs": {"tokens": ["7"], "token_logprobs": [0.0]}}]},
    {"choices": [{"index": 0, "logprobs": {"tokens": ["token_id:x"], "token_logprobs": [0.0]}}]},
    {"choices": [{"index": 0, "logprobs": {"tokens": ["token_id:1"], "token_logprobs": ["a"]}}]},
    {"choices": [{"index": 3, "logprobs": {"tokens": [], "token_logprobs": []}}]},
    {"choices": [{"index": 0, "logprobs": {"tokens": [], "token_logprobs": []}, "finish_reason": 5}]},
]


@pytest.mark.parametrize("body", WRONG_SHAPES, ids=range(len(WRONG_SHAPES)))
def test_wrong_shape_completions_reply_is_one_sentence(body):
    # a KeyError / TypeError / AttributeError in VLLMServer._complete before
    from grpokit.rollout.vllm_http import ServerReplyError, parse_choices

    with pytest.raises(ServerReplyError, match=r"^the vLLM server[^\n]*$"):
        parse_choices(body, 1)
    good = {
        "choices": [
            {"index": 0, "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.5]}, "finish_reason": "length"}
        ]
    }
    assert parse_choices(good, 1) == [(0, [7], [-0.5], "length", None)]


# ----------------------------------------------------------- fuzzing: model text and server replies
# Every generated input must end in a value or in the one-sentence error, never in another exception.

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=20,
)
PIECES = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        "[",
        "]",
        '"',
        ":",
        ",",
        "\\",
        "name",
        "arguments",
        '"name": "f"',
        '"arguments": ',
        "f:",
        "1e999",
        "NaN",
        "9" * 5000,
        "[" * 1500,
        "\x00",
        "\udcff",
    ]
)


@st.composite
def tool_call_text(draw):
    """Model text: free text, fragments of the call syntax, well-formed calls with odd arguments."""
    parts = draw(
        st.lists(
            st.one_of(
                st.text(max_size=20),
                PIECES,
                JSON.map(lambda v: '<tool_call>{"name": "f", "arguments": %s}</tool_call>' % json_dumps(v)),
                JSON.map(lambda v: "<tool_call>%s</tool_call>" % json_dumps(v)),
            ),
            max_size=8,
        )
    )
    return "".join(parts)


def json_dumps(v):
    import json

    return json.dumps(v)


@FUZZ
@given(text=tool_call_text(), names=st.lists(st.sampled_from(["f", "g", "calculator"]), max_size=3, unique=True))
def test_fuzz_tool_call_text_parses_to_calls_and_records(text, names):
    from grpokit.env.parse import ToolCall, assistant_message, parse_tool_calls
    from grpokit.record.jsonl import dumps_line

    calls = parse_tool_calls(text, names)
    assert all(isinstance(c, ToolCall) and isinstance(c.arguments, (dict, str)) for c in calls)
    assert all(c.error for c in calls if c.name == "")  # an unreadable call says why
    dumps_line({"messages": [assistant_message(text, calls)]})  # the sample record must be writable


@FUZZ
@given(body=JSON, n=st.integers(0, 3))
def test_fuzz_any_json_completions_reply_is_choices_or_one_sentence(body, n):
    from grpokit.rollout.vllm_http import ServerReplyError, parse_choices

    try:
        out = parse_choices(body, n)
    except ServerReplyError as e:
        assert str(e).startswith("the vLLM server") and "\n" not in str(e)
    else:
        assert len(out) == n


TOKENS = st.one_of(
    st.from_regex(r"token_id:[0-9]{1,6}", fullmatch=True), st.text(max_size=12), st.integers(), st.none()
)
VALUES = st.one_of(st.floats(), st.integers(-10, 10), st.text(max_size=3), st.none(), st.booleans())


@st.composite
def near_valid_reply(draw):
    """Replies that look like vLLM's, with any field replaced by something else."""
    n = draw(st.integers(1, 3))
    choices = []
    for k in range(n):
        m = draw(st.integers(0, 3))
        lp = {
            "tokens": draw(st.lists(TOKENS, min_size=m, max_size=m)),
            "token_logprobs": draw(st.lists(VALUES, min_size=m, max_size=m + draw(st.integers(0, 1)))),
        }
        c = {
            "index": draw(st.one_of(st.just(k), st.integers(-1, 4), st.text(max_size=2))),
            "logprobs": draw(st.one_of(st.just(lp), JSON)),
            "finish_reason": draw(st.one_of(st.sampled_from(["stop", "length", None]), JSON)),
            "stop_reason": draw(JSON),
        }
        choices.append(c)
    return {"choices": choices}, n


@FUZZ
@given(reply=near_valid_reply())
def test_fuzz_near_valid_completions_replies(reply):
    from grpokit.rollout.vllm import finish_reason
    from grpokit.rollout.vllm_http import ServerReplyError, parse_choices

    body, n = reply
    try:
        out = parse_choices(body, n)
    except ServerReplyError as e:
        assert "\n" not in str(e)
        return
    for index, ids, lps, fin, stop in out:
        assert all(type(i) is int for i in ids) and all(math.isfinite(v) for v in lps) and len(ids) == len(lps)
        assert finish_reason(fin, stop) in ("eos", "stop", "length")


@FUZZ
@given(body=JSON, text=st.text(max_size=50), status=st.integers(0, 599))
def test_fuzz_server_error_message_is_text(body, text, status):
    from grpokit.rollout.vllm_http import HTTPAnswer

    assert isinstance(HTTPAnswer(status, body, text).message, str)


def silent(conn, stop):
    stop.wait(60)  # accepts, reads the request, never answers


def test_push_to_hub_to_a_silent_endpoint_ends_in_one_sentence(tmp_path, monkeypatch):
    from grpokit.trl.trainer import HubPushError, push_folder

    srv = RawServer(silent)
    monkeypatch.setenv("HF_ENDPOINT", srv.url)
    (tmp_path / "config.json").write_text("{}")
    try:
        start = time.monotonic()
        with pytest.raises(
            HubPushError,
            match=r"^push_to_hub of .* to me/m at http://127.0.0.1:\d+ did not finish "
            r"within 1 s; .*GRPOKIT_HUB_TIMEOUT_S",
        ):
            push_folder(tmp_path, "me/m", "msg", token="x", private=None, timeout_s=1.0)
        assert time.monotonic() - start < 10  # before: no timeout at all
    finally:
        srv.close()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")  # nothing listens: a raw ConnectionError before
    with pytest.raises(HubPushError, match=r"failed \(\w+: .*\); the model is saved locally$"):
        push_folder(tmp_path, "me/m", "msg", token="x", private=None, timeout_s=60.0)


def test_vllm_serve_start_up_faults_are_one_sentence(monkeypatch, capsys, tmp_path):
    import socket

    from grpokit import cli
    from grpokit.rollout import vllm_serve

    monkeypatch.setattr(vllm_serve, "installed_vllm", lambda: "0.33.0")
    monkeypatch.setattr(vllm_serve.os, "execve", lambda *a: pytest.fail("vLLM must not start"))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    cases = [
        ([str(tmp_path / "missing")], f"the model folder {tmp_path / 'missing'} does not exist"),
        (
            ["M", "--host", "127.0.0.1", "--port", str(port)],
            f"cannot listen on 127.0.0.1:{port} (Address already in use)",
        ),
        (["M", "--port=http"], "--port http is not a port number"),
    ]
    try:
        for argv, message in cases:
            assert cli.main(["vllm-serve", *argv]) == 2
            err = capsys.readouterr().err
            assert message in err and err.count("\n") == 1 and "Traceback" not in err
    finally:
        taken.close()


# ---------------------------------------------------------------------------------------- no orphans

TRAINER = r"""
import sys
from grpokit.rewards.code import code_pass_fraction
code = "import os, time\nfor _ in range(3):\n    os.fork()\ntime.sleep(120)\n"
print("calling", flush=True)
code_pass_fraction(["```python\n" + code + "```"], [[{"input": "1\n", "output": "1\n"}]], wall_s=120)
"""


def _descendants(pid):
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _orphan_cgroups_swept(monkeypatch, owner_prefixes: tuple[str, ...]) -> list[str]:
    """The next sweep (grace 0) removes the sandbox cgroups the test's dead owners left; returns them.

    The sweep sees only those owners' folders: the cgroup tree is shared with every other process of the
    host (other tests running at once under xdist), and a grace of 0 would take a neighbour's folder
    between its mkdir and its flock."""
    from grpokit.rewards.sandbox import cleanup

    everyone = cleanup.sandbox_cgroups
    mine = lambda: [(c, f) for c, f in everyone() if os.path.basename(f).startswith(owner_prefixes)]  # noqa: E731
    monkeypatch.setattr(cleanup, "CGROUP_GRACE_S", 0.0)
    monkeypatch.setattr(cleanup, "sandbox_cgroups", mine)
    left = [f for _, f in mine() if cleanup._unlocked(f)]
    assert set(left) <= set(cleanup.sweep_stale_cgroups())
    assert [f for _, f in mine() if cleanup._unlocked(f)] == []
    return left


def test_sigkill_of_the_trainer_mid_call_leaves_no_process_and_no_job_folder(tmp_path, monkeypatch):
    import os
    import signal

    import psutil

    from grpokit.rewards.code import probe
    from grpokit.rewards.sandbox import budget
    from grpokit.rewards.sandbox.cleanup import sweep_stale_jobs

    ok, why = probe()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable on this host: {why}")
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the trainer's job folder lands here
    proc = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "calling"
        deadline = time.monotonic() + 60
        while len(_descendants(proc.pid)) < 6 and time.monotonic() < deadline:  # launcher, bwrap, harness, forks ...
            time.sleep(0.1)
        kids = _descendants(proc.pid)
        assert len(kids) >= 6, [k.name() for k in kids]
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(f"grpokit-job-{proc.pid}-")]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        gone, alive = psutil.wait_procs(kids, timeout=15)
        assert alive == [], [p.pid for p in alive]  # 6 sandbox processes outlived the trainer before
    finally:
        if proc.poll() is None:
            proc.kill()
    # the job folder of the dead trainer: removed by the next start's sweep
    removed = sweep_stale_jobs(str(tmp_path))
    assert [os.path.basename(p).startswith(f"grpokit-job-{proc.pid}-") for p in removed] == [True]
    assert not any(p.name.startswith("grpokit-job-") for p in tmp_path.iterdir())
    left = _orphan_cgroups_swept(monkeypatch, (f"grpokit-sandbox-{proc.pid}-",))  # and its cgroups
    assert bool(left) == (budget.mechanism() is not None)  # a cgroup budget leaves folders to sweep


def test_a_reward_deadline_during_a_sandboxed_call_leaves_no_sandbox_running():
    # in-process (num_workers=0) the reward's SIGALRM deadline interrupts the sandbox's wait; the
    # sandbox must be killed then, not left to run for its own (longer) wall-clock limit. (A user's reward
    # that waits inside its deadline: the built-in code rewards' wait is timed elsewhere.)
    import os

    import psutil

    from grpokit.rewards.code import probe
    from helpers.sandbox_probes import sandbox_inside_the_call as fn

    ok, why = probe()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable on this host: {why}")
    start = time.monotonic()
    with _runner(fn, "code", timeout_s=1.5, max_failure_fraction=1.0) as r:
        res = r.score(
            prompts=["p"],
            completions=["```python\nimport time\ntime.sleep(60)\n```"],
            completion_ids=[[1]],
            group_size=1,
            columns={"test_cases": [[{"input": "1\n", "output": "1\n"}]]},
        )
    assert res.metrics["rewards/code/timeouts"] == 1.0
    assert time.monotonic() - start < 20  # not the sandbox's own 60 s
    sandboxes = [
        p
        for p in psutil.Process(os.getpid()).children(recursive=True)
        if any("launcher.py" in a or "bwrap" in a for a in p.cmdline())
    ]
    assert sandboxes == []


def test_a_reward_worker_killed_at_its_timeout_leaves_no_sandbox_and_no_job_folder(tmp_path, monkeypatch):
    # num_workers=1: the deadline is a SIGKILL of the worker mid sandboxed call (its job folder and
    # 6 sandbox processes stayed before); the replacement worker's first sandboxed call sweeps the folder.
    # (A user's reward that waits inside its deadline: the built-in code rewards' wait is timed elsewhere.)
    import os

    import psutil

    from grpokit.rewards.code import probe
    from helpers.sandbox_probes import sandbox_inside_the_call as fn

    ok, why = probe()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable on this host: {why}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the spawned workers' job folders land here
    cases = {"test_cases": [[{"input": "1\n", "output": "1\n"}]]}
    sleeper = "```python\nimport os, time\nfor _ in range(2):\n    os.fork()\ntime.sleep(60)\n```"
    echo = "```python\nprint(input())\n```"
    # 8 s: time for the sandbox to start on a loaded machine, so that the kill lands in its sleep, not in its
    # start-up; the test checks that it did (the sandbox's launcher was seen)
    with _runner(fn, "code", num_workers=1, timeout_s=8.0, max_failure_fraction=1.0) as r:
        me = psutil.Process(os.getpid())
        before = {p.pid for p in me.children(recursive=True)}
        with _launcher_seen(me) as seen:
            res = r.score(prompts=["p"], completions=[sleeper], completion_ids=[[1]], group_size=1, columns=cases)
        assert res.rewards_NF[:, 0].tolist() == [0.0]  # timed out: failure_value
        assert seen, "the worker was killed before its sandbox's launcher started: the kill did not land in a sandbox"
        _, alive = psutil.wait_procs(
            [p for p in me.children(recursive=True) if any("launcher.py" in a or "bwrap" in a for a in p.cmdline())],
            timeout=15,
        )
        assert alive == []  # the sandbox died with the killed worker
        stale = [p.name for p in tmp_path.iterdir() if p.name.startswith("grpokit-job-")]
        assert len(stale) <= 1  # the killed worker's own folder, until the next sandboxed call
        res = r.score(prompts=["p"], completions=[echo], completion_ids=[[1]], group_size=1, columns=cases)
        assert res.rewards_NF[:, 0].tolist() == [1.0]  # the replacement worker scores, and sweeps first
        # the killed worker (spawned while the first call waited, on a loaded machine) and its replacement
        workers = before | set(seen) | {p.pid for p in me.children(recursive=True)}
    assert not any(p.name.startswith("grpokit-job-") for p in tmp_path.iterdir())
    # the killed worker's, if it left one (younger than the grace before). It may not: at a deadline the pool
    # kills the worker's sandbox tree before the worker, and the worker's own clean-up can remove its folder in
    # between (seen with strace on a loaded machine); the trainer's SIGKILL above surely leaves one
    _orphan_cgroups_swept(monkeypatch, tuple(f"grpokit-sandbox-{pid}-" for pid in workers))


@contextlib.contextmanager
def _launcher_seen(me):
    """A list that gets the pid of the process that started a sandbox launcher under ``me`` while the block
    ran (polled; the launcher starts once its cgroup is made)."""
    import psutil

    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set() and not seen:
            for p in me.children(recursive=True):
                try:
                    if any("launcher.py" in a for a in p.cmdline()):
                        seen.append(p.ppid())  # the worker that made the sandbox (and its cgroup)
                except psutil.Error:
                    pass
            stop.wait(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        yield seen
    finally:
        stop.set()
        t.join()


def test_the_report_shows_faults_only_when_one_was_counted(tmp_path):
    import json

    from grpokit.record.report import write_report
    from grpokit.record.report_data import load_run, panels

    quiet, noisy = tmp_path / "quiet", tmp_path / "noisy"
    for run, failures in [(quiet, 0.0), (noisy, 2.0)]:
        run.mkdir()
        rows = [
            {"step": s, "reward": 0.5, "rewards/r/failures": failures if s == 2 else 0.0, "rewards/r/timeouts": 0.0}
            for s in (1, 2, 3)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        write_report(run)
    # the page draws the panels its data names: no faults panel while every counter is 0
    assert "faults" not in [p["id"] for p in panels([load_run(quiet)])]
    faults = {p["id"]: p["keys"] for p in panels([load_run(noisy)])}["faults"]
    assert faults == ["rewards/r/failures"]  # the counter that was never non-zero is listed, not drawn
    assert "rewards/r/failures" in (noisy / "report.html").read_text()
