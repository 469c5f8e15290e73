"""Multi-turn episodes: tool-call parsing, contained tool calls, the episode loop on a scripted
sampler (masks, turns, finish reasons, rows leaving the batch), environments (TRL's
environment_factory), and the loss mask: environment tokens carry no gradient, and a one-turn
episode without a tool call is exactly today's single-turn rollout and loss."""

import time

import pytest
import torch

from grpokit.algo.loss import policy_loss
from grpokit.config import ConfigError
from grpokit.env import TerminalToolError, calculator, call_tool, parse_tool_calls, tool_schema
from grpokit.env.parse import CALL_CLOSE, assistant_message
from grpokit.rollout.episode_metrics import episode_metrics
from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
from grpokit.rollout.hf import SamplingParams, generate
from grpokit.train.logprobs import completion_logprobs
from grpokit.train.token_batch import make_token_batch
from grpokit.types import Episode, Prompt, Rollout
from helpers.episodes import TOK, Counter, ScriptedSampler, calc_reply, chat_tokenizer, ids
from helpers.models import tiny_causal_lm

# ---------------------------------------------------------------- parsing and calling tools


def test_tool_call_formats():
    assert parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', ["add"])[0].arguments == {
        "a": 1
    }
    assert parse_tool_calls('x<tool_call>{"name": "f", "arguments": "{\\"q\\": 2}"}</tool_call>', ["f"])[
        0
    ].arguments == {"q": 2}
    c = parse_tool_calls("<tool_call>calculator: 2*3</tool_call>", ["calculator", "python"])[0]
    assert (c.name, c.arguments) == ("calculator", "2*3")
    assert parse_tool_calls("<tool_call>12*34</tool_call>", ["calculator"])[0].name == "calculator"  # the only tool
    assert parse_tool_calls("<tool_call>12*34</tool_call>", ["a", "b"])[0].name == ""  # ambiguous: unreadable
    assert parse_tool_calls("<tool_call>{oops</tool_call>", ["a"])[0].name == ""
    assert parse_tool_calls("<tool_call>12*34", ["calculator"]) == []  # not closed: no call
    msg = assistant_message(
        "hi <tool_call>1+1</tool_call>", parse_tool_calls("hi <tool_call>1+1</tool_call>", ["calculator"])
    )
    assert msg == {
        "role": "assistant",
        "content": "hi",
        "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": "1+1"}}],
    }


def test_tools_are_described_by_their_hints_and_docstrings():
    s = tool_schema(calculator)["function"]
    assert s["name"] == "calculator" and s["parameters"]["required"] == ["expression"]

    def bare(x):
        return x

    with pytest.raises(ConfigError, match="type hints"):
        tool_schema(bare)


def test_calls_are_contained():
    def boom(x: str) -> str:
        raise ValueError("bad input")

    def slow(x: str) -> str:
        time.sleep(5)
        return x

    def fatal(x: str) -> str:
        raise TerminalToolError("the world ended")

    tools = {"boom": boom, "slow": slow, "fatal": fatal, "calculator": calculator}
    r = call_tool(tools, "boom", "1", timeout_s=1, max_chars=100)
    assert r.error and not r.terminal and r.content == "{'error': 'bad input'}"  # TRL's error message form
    t0 = time.perf_counter()
    r = call_tool(tools, "slow", "1", timeout_s=0.2, max_chars=100)
    assert r.error and "timed out" in r.content and time.perf_counter() - t0 < 2
    assert call_tool(tools, "fatal", "1", timeout_s=1, max_chars=100).terminal
    assert "not found" in call_tool(tools, "nope", {}, timeout_s=1, max_chars=100).content
    assert call_tool(tools, "calculator", {"expression": "9" * 30 + "*9"}, timeout_s=1, max_chars=10).content.endswith(
        "[truncated]"
    )
    assert call_tool(tools, "calculator", "2**10**10", timeout_s=1, max_chars=100).error  # refused, not computed
    assert call_tool(tools, "calculator", "__import__('os')", timeout_s=1, max_chars=100).error
    assert calculator("(12+3)*45") == "675" and calculator("7/2") == "3.5"


# ---------------------------------------------------------------- the loop on a scripted sampler


def prompt(text, **columns):
    return Prompt(text, ids(text), columns, text)


def test_episode_loop_masks_turns_and_rows_leaving_the_batch():
    # a generous tool time limit: one CI run on a loaded machine saw row 2's turn-1 context differ from
    # row 1's (the only input that can differ is the calculator's result, i.e. a timed-out call)
    runner = EpisodeRunner(EpisodeSpec(max_turns=3, tool_format="tags", tool_timeout_s=120), TOK, tools=[calculator])
    sampler = ScriptedSampler(calc_reply)
    ro = runner.run(sampler, [prompt("57*68="), prompt("12*34=")], 3, SamplingParams(max_new_tokens=16))
    # turn 0: both prompts x 3 rows in one decode (prompt cache shared); turn 1: only the 4 rows that called
    assert [c[:2] for c in sampler.calls] == [(2, 3), (4, 1)]
    assert CALL_CLOSE in sampler.calls[0][2]  # a tag-format call ends the model's turn
    assert ro.finish_reasons == ["eos"] * 6
    e = ro.episodes[1]
    call, result, answer = (
        ids("<tool_call>57*68</tool_call>"),
        ids("<tool_result>3876</tool_result>"),
        ids("<answer>3876</answer>"),
    )
    assert ro.completion_ids[1] == call + result + answer + [TOK.eos_token_id]
    assert ro.completion_ids[2] == ro.completion_ids[1], TOK.decode(ro.completion_ids[2])
    assert e.model_mask == [1] * len(call) + [0] * len(result) + [1] * (len(answer) + 1)
    assert e.turn_ids == [0] * (len(call) + len(result)) + [1] * (len(answer) + 1)
    assert ro.sampling_logprobs[1] == [-0.5] * len(call) + [0.0] * len(result) + [-0.5] * (len(answer) + 1)
    assert e.messages == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": "57*68"}}],
        },
        {"role": "tool", "name": "calculator", "content": "3876"},
        {"role": "assistant", "content": "<answer>3876</answer>"},
    ]
    assert e.turns == 2 and e.tool_calls == 1 and ro.episodes[0].turns == 1 and ro.episodes[0].tool_calls == 0
    # anchor states: turn 0 of every row of a prompt shares one state; turn 1 states follow the context
    assert (
        len({ro.episodes[i].state_keys[0] for i in range(3)}) == 1
        and ro.episodes[1].state_keys[1] == ro.episodes[2].state_keys[1]
    )
    m = episode_metrics(ro)
    assert m["episodes/turns_mean"] == pytest.approx(10 / 6) and m["episodes/tool_use_rate"] == pytest.approx(4 / 6)
    result_408 = ids("<tool_result>408</tool_result>")  # 12*34: a 3-digit result, one token shorter
    assert m["episodes/env_tokens_mean"] == pytest.approx((2 * len(result) + 2 * len(result_408)) / 6)
    assert m["tools/failure_frequency"] == 0.0
    assert ro.model_lengths()[1] == len(call) + len(answer) + 1


def test_turn_budget_token_budget_and_tool_errors_end_episodes():
    always_call = ScriptedSampler(lambda ctx, g: "<tool_call>1+1</tool_call>")
    ro = EpisodeRunner(EpisodeSpec(max_turns=2, tool_format="tags"), TOK, tools=[calculator]).run(
        always_call, [prompt("1+1=")], 2, SamplingParams()
    )
    assert ro.finish_reasons == ["turns", "turns"] and ro.episodes[0].turns == 2
    assert episode_metrics(ro)["episodes/truncated_by_turns"] == 1.0
    # the last allowed turn's call is not run (as TRL): one call ran, and the episode ends on the model's turn
    call, reply = ids("<tool_call>1+1</tool_call>"), ids("<tool_result>2</tool_result>")
    assert ro.episodes[0].tool_calls == 1 and ro.completion_ids[0] == call + reply + call
    assert [m["role"] for m in ro.episodes[0].messages] == ["assistant", "tool", "assistant"]
    assert "tool_calls" in ro.episodes[0].messages[-1]
    # the call is 5 tokens, its reply <tool_result>2</tool_result> 3: 8 > 7, so the reply is not appended
    ro = EpisodeRunner(EpisodeSpec(max_turns=4, max_episode_tokens=7, tool_format="tags"), TOK, tools=[calculator]).run(
        always_call, [prompt("1+1=")], 1, SamplingParams()
    )
    assert ro.finish_reasons == ["length"] and ro.episodes[0].env_tokens == 0 and len(ro.completion_ids[0]) == 5
    assert ro.episodes[0].messages[-1]["role"] == "assistant"

    def fatal(expression: str) -> str:
        """Fails for good.

        Args:
            expression: ignored.
        """
        raise TerminalToolError("no")

    ro = EpisodeRunner(EpisodeSpec(max_turns=4, tool_format="tags"), TOK, tools=[fatal]).run(
        always_call, [prompt("1+1=")], 1, SamplingParams()
    )
    assert ro.finish_reasons == ["tool_error"] and ro.episodes[0].tool_errors == 1
    assert ro.episodes[0].messages[-1]["content"] == "{'error': 'no'}"


def test_environment_instances_reset_observation_tools_and_done():
    sampler = ScriptedSampler(
        lambda ctx, g: "<tool_call>add: 2</tool_call>" if g in (None, 1) else "<answer>0</answer><eos>"
    )
    runner = EpisodeRunner(EpisodeSpec(max_turns=5, tool_format="tags"), TOK, environment_factory=Counter)
    assert runner.tool_names == ["add"]
    ro = runner.run(sampler, [prompt("4=", answer="4")], 2, SamplingParams())
    assert ro.prompt_ids == [ids("4= go")]  # the reset observation joins the prompt
    envs = [e.environment for e in ro.episodes]
    assert envs[0] is not envs[1] and envs[0].count == 0 and envs[1].count == 4  # one instance per episode
    assert ro.finish_reasons == ["eos", "done"] and ro.episodes[1].turns == 2


def test_random_reset_starts_each_episode_from_its_own_observation():
    """TRL accepts a reset() whose observation differs between the G episodes (its 2048 example's random
    tiles): each episode's context is the prompt + its own observation, its own prompt as in TRL (before: the
    group shared the common prefix "4= 1" and each completion began with the rest as environment tokens)."""

    class Random(Counter):
        n = 0

        def reset(self, **row):
            Random.n += 1
            self.count, self.target, self.done = 0, 9, False
            return f" 1{Random.n}"

    seen = []
    sampler = ScriptedSampler(lambda ctx, g: seen.append(ctx) or "<answer>0</answer><eos>")
    runner = EpisodeRunner(EpisodeSpec(max_turns=2, tool_format="tags"), TOK, environment_factory=Random)
    Random.n = 0  # the probe instance built by the runner is never reset
    with pytest.warns(UserWarning, match="different observations"):
        ro = runner.run(sampler, [prompt("4=", answer="4")], 2, SamplingParams())
    # resets run in parallel threads, so which episode drew " 11" is not fixed; each must see its own
    assert sorted(seen) == ["4= 11", "4= 12"]  # each episode's first turn saw its own observation
    assert [ro.prompt_of(i) for i in range(2)] == [ids(s) for s in seen]  # each row's own prompt (rows in order)
    assert ro.prompt_ids == [ids(seen[0])]  # the group's: its first row's
    assert [e.model_mask for e in ro.episodes] == [[1] * len(ids("<answer>0</answer>")) + [1]] * 2  # the model's only


def test_groups_whose_resets_agree_keep_their_shared_prompt_beside_random_ones():
    """Turn 0 is decided group by group: prompt "4=" resets to " 7" in both episodes (one prompt, G = 2 from it),
    prompt "5=" (shuffle) to a random observation each (two rows of G = 1). Before, one random group sent every
    group's rows to G = 1: one decode of 4 rows, "4= 7" twice with no shared cache."""

    class Mixed(Counter):
        n = 0

        def reset(self, prompt, answer, shuffle=False, **kwargs):
            self.target, self.count, self.done = int(answer), 0, False
            if not shuffle:
                return " 7"
            Mixed.n += 1
            return f" 1{Mixed.n}"

    sampler = ScriptedSampler(lambda ctx, g: f"<answer>{g}</answer><eos>")  # g: the row of a G > 1 decode
    runner = EpisodeRunner(EpisodeSpec(max_turns=2, tool_format="tags"), TOK, environment_factory=Mixed)
    with pytest.warns(UserWarning, match="different observations"):
        ro = runner.run(
            sampler, [prompt("4=", answer="4"), prompt("5=", answer="5", shuffle=True)], 2, SamplingParams()
        )
    # the agreeing group first (1 prompt x G = 2), then the random group's 2 rows one each
    assert [c[:2] for c in sampler.calls] == [(1, 2), (2, 1)]
    answers = [ids(f"<answer>{g}</answer>") + [TOK.eos_token_id] for g in (0, 1, None, None)]
    assert ro.completion_ids == answers  # rows back in order: group 0's rows 0 and 1, then group 1's
    assert ro.prompt_of(0) == ro.prompt_of(1) == ids("4= 7")
    assert sorted(TOK.decode(ro.prompt_of(i)) for i in (2, 3)) == ["5= 11", "5= 12"]


# ---------------------------------------------------------------- stage 5 sees only the mask


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_environment_tokens_carry_no_gradient(aggregation):
    runner = EpisodeRunner(EpisodeSpec(max_turns=3, tool_format="tags"), TOK, tools=[calculator])
    ro = runner.run(ScriptedSampler(calc_reply), [prompt("57*68=")], 2, SamplingParams())
    batch = make_token_batch(ro, TOK.pad_token_id)
    model = tiny_causal_lm(len(TOK))
    logp, _ = completion_logprobs(model, batch)
    logp.retain_grad()
    loss, m = policy_loss(
        logp,
        logp.detach() - 0.1,
        torch.tensor([1.0, -1.0]),
        batch.completion_mask,
        aggregation=aggregation,
        norm_constant=16.0,
        ref_logp_NT=logp.detach() + 0.3,
        beta=0.1,
    )
    loss.backward()
    env = torch.zeros_like(batch.completion_mask, dtype=torch.bool)
    env[1, : len(ro.episodes[1].model_mask)] = torch.tensor(ro.episodes[1].model_mask) == 0
    assert env.sum() == 6  # <tool_result>3876</tool_result>
    # token by token: every environment token's logprob has exactly zero gradient, every model token a non-zero one
    assert torch.all(logp.grad[env] == 0)
    assert torch.all(logp.grad[batch.completion_mask.bool()] != 0)
    assert m["num_tokens"] == batch.completion_mask.sum().item() == sum(ro.model_lengths())


def test_one_turn_episode_without_a_tool_call_is_todays_rollout_and_loss(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [Prompt("ab", tok("ab")["input_ids"], {}, "ab"), Prompt("c12", tok("c12")["input_ids"], {}, "c12")]
    params = SamplingParams(max_new_tokens=6)

    def sampler(seed):
        g = torch.Generator().manual_seed(seed)
        return lambda ctx, G, p: generate(
            model,
            ctx,
            G,
            p,
            eos_token_ids={1},
            pad_token_id=0,
            generator=g,
            decode=lambda x: tok.decode(x, skip_special_tokens=True),
        )

    today = sampler(3)([p.ids for p in prompts], 4, params)
    plain = EpisodeRunner(EpisodeSpec(), tok).run(sampler(3), prompts, 4, params)  # no tools: the one-turn episode
    assert (
        plain.episodes is None
        and plain.completion_ids == today.completion_ids
        and plain.sampling_logprobs == today.sampling_logprobs
    )
    # with a tool offered (this model never writes a call): one turn per episode, the same tokens and loss
    with_tool = EpisodeRunner(EpisodeSpec(max_turns=4, tool_format="tags"), tok, tools=[calculator]).run(
        sampler(3), prompts, 4, params
    )
    assert with_tool.completion_ids == today.completion_ids and with_tool.sampling_logprobs == today.sampling_logprobs
    assert all(e.turns == 1 and e.env_tokens == 0 for e in with_tool.episodes)
    adv = torch.linspace(-1, 1, 8)
    losses = []
    for ro in (today, with_tool):
        batch = make_token_batch(ro, 0)
        logp, _ = completion_logprobs(model, batch)
        losses.append(policy_loss(logp, logp.detach(), adv, batch.completion_mask)[0])
    assert torch.equal(losses[0], losses[1])


def test_mixed_batches_keep_their_masks():
    from grpokit.types import gather_rows

    a = Rollout([[5]], [[7, 8, 9]], [[-1.0] * 3], ["eos"], 1)
    b = Rollout([[6]], [[7, 8, 9]], [[-1.0, 0.0, -1.0]], ["eos"], 1, [Episode([1, 0, 1], [0, 0, 1])])
    both = gather_rows([(a, 0), (b, 0)], 1)
    assert both.prompt_ids == [[5], [6]] and both.row_prompt_ids is None
    assert both.model_mask(0) == [1, 1, 1] and both.model_mask(1) == [1, 0, 1]
    assert make_token_batch(both, 0).completion_mask.tolist() == [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]]


# ---------------------------------------------------------------- the chat-template format


def test_chat_template_episode_is_the_templates_own_tokens():
    from grpokit.config import DataConfig
    from grpokit.data import render_prompt

    tok = chat_tokenizer()
    runner = EpisodeRunner(EpisodeSpec(max_turns=3, tool_format="chat_template"), tok, tools=[calculator])
    assert runner.schemas[0]["function"]["name"] == "calculator"
    question = [{"role": "user", "content": "2*3?"}]
    text = render_prompt(question, tok, DataConfig(), runner.schemas)
    # TRL hands the callables to the template, which describes them with the same schema function
    assert text == tok.apply_chat_template(question, tools=[calculator], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nTools: calculator<|im_end|>\n")  # the template lists the tools
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
    eos = tok.eos_token_id

    def model(contexts, G, params):
        assert CALL_CLOSE not in params.stop  # here a turn ends with the end-of-turn token
        outs = [
            tok(call if "<tool_response>" not in tok.decode(c) else "6", add_special_tokens=False)["input_ids"] + [eos]
            for c in contexts
            for _ in range(G)
        ]
        return Rollout([list(c) for c in contexts], outs, [[-0.5] * len(o) for o in outs], ["eos"] * len(outs), G)

    p = Prompt(text, list(tok(text, add_special_tokens=False)["input_ids"]), {}, question)
    ro = runner.run(model, [p], 1, SamplingParams())
    e = ro.episodes[0]
    assert e.messages[0]["tool_calls"] == [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2*3"}}}
    ]
    assert e.messages[1] == {"role": "tool", "name": "calculator", "content": "6"}
    # prompt + episode == the template's rendering of the whole conversation (up to the newline after the last turn)
    whole = tok.apply_chat_template(question + e.messages, tools=runner.schemas, tokenize=False)
    assert tok.decode(p.ids + ro.completion_ids[0]) + "\n" == whole
    reply = tok(
        "\n<|im_start|>user\n<tool_response>6</tool_response><|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )["input_ids"]
    n_call = len(tok(call, add_special_tokens=False)["input_ids"]) + 1
    assert e.model_mask == [1] * n_call + [0] * len(reply) + [1, 1] and ro.finish_reasons == ["eos"]


# ---------------------------------------------------------------- the sandboxed python tool, episode limits


def test_python_tool_runs_in_the_sandbox():
    from grpokit.env import make_python_tool
    from grpokit.rewards.code import probe

    ok, why = probe()
    if not ok:
        pytest.skip(f"sandbox isolation unavailable on this host: {why}")
    python = make_python_tool(wall_s=2.0)
    assert python("print(6 * 7)") == "42\n"
    assert tool_schema(python)["function"]["name"] == "python"
    tools = {"python": python}
    t0 = time.perf_counter()
    r = call_tool(tools, "python", "while True: pass", timeout_s=10, max_chars=200)
    assert r.error and "killed" in r.content and time.perf_counter() - t0 < 8  # the sandbox's hard wall-clock kill
    r = call_tool(
        tools,
        "python",
        "import socket; socket.create_connection(('127.0.0.1', 22), timeout=1); print('connected')",
        timeout_s=10,
        max_chars=200,
    )
    assert "connected" not in r.content  # no network inside
    r = call_tool(tools, "python", "print(open('/etc/passwd').read())", timeout_s=10, max_chars=200)
    assert r.error and "root:" not in r.content  # the host's files are not there


def test_python_tool_refuses_without_isolation(monkeypatch):
    from grpokit.env import make_python_tool
    from grpokit.rewards import code

    monkeypatch.setattr(code, "probe", lambda: (False, "bubblewrap (bwrap) is not installed"))
    r = call_tool({"python": make_python_tool()}, "python", "print(1)", timeout_s=5, max_chars=300)
    assert r.error and "allow_unsafe_code_execution" in r.content


def test_episode_tool_time_limit_ends_the_episode():
    def nap(expression: str) -> str:
        """Sleep a little.

        Args:
            expression: ignored.
        """
        time.sleep(0.3)
        return "ok"

    always_call = ScriptedSampler(lambda ctx, g: "<tool_call>1</tool_call>")
    ro = EpisodeRunner(EpisodeSpec(max_turns=10, episode_timeout_s=0.5, tool_format="tags"), TOK, tools=[nap]).run(
        always_call, [prompt("1=")], 1, SamplingParams()
    )
    assert ro.finish_reasons == ["timeout"] and ro.episodes[0].tool_calls == 2  # 0.3 s + 0.3 s >= 0.5 s


def test_rows_tool_calls_run_side_by_side():
    import threading

    barrier = threading.Barrier(4, timeout=10)

    def meet(expression: str) -> str:
        """Wait until four calls are in flight at once.

        Args:
            expression: ignored.
        """
        barrier.wait()  # raises BrokenBarrierError if the four rows' calls ran one after another
        return "met"

    sampler = ScriptedSampler(
        lambda ctx, g: "<tool_call>1</tool_call>" if "<tool_result>" not in ctx else "<answer>1</answer><eos>"
    )
    ro = EpisodeRunner(EpisodeSpec(max_turns=3, tool_format="tags", tool_timeout_s=20), TOK, tools=[meet]).run(
        sampler, [prompt("1="), prompt("2=")], 2, SamplingParams()
    )
    assert [e.messages[1]["content"] for e in ro.episodes] == ["met"] * 4 and ro.finish_reasons == ["eos"] * 4


def test_an_episode_that_ends_on_a_tool_message_has_no_answer():
    """The tool's result "2" equals the gold "2", but the model never answered: the built-in graders read
    only the model's own last message, and the episode counts in episodes/no_answer_fraction. Before, the
    last message (the tool's) was graded: 1.0 for an episode whose model only called a tool."""
    from grpokit.data.tasks.arithmetic import arithmetic_accuracy
    from grpokit.rewards.inputs import reward_inputs

    class Two(Counter):
        def reset(self, prompt, answer, **kwargs):
            self.target, self.count, self.done = 2, 0, False

    calls_add = ScriptedSampler(lambda ctx, g: "<tool_call>add: 2</tool_call>" if g == 0 else "<answer>2</answer><eos>")
    runner = EpisodeRunner(EpisodeSpec(max_turns=4, tool_format="tags"), TOK, environment_factory=Two)
    ro = runner.run(calls_add, [prompt("1+1=", answer="2")], 2, SamplingParams())
    assert ro.finish_reasons == ["done", "eos"]  # row 0: add 2 reaches the target, done after the tool
    assert ro.episodes[0].messages[-1] == {"role": "tool", "name": "add", "content": "2"}
    texts = [TOK.decode(c) for c in ro.completion_ids]
    completions, _ = reward_inputs(ro, texts)
    assert arithmetic_accuracy(["1+1="] * 2, completions, ["2", "2"]) == [0.0, 1.0]
    assert episode_metrics(ro)["episodes/no_answer_fraction"] == 0.5  # 1 of 2 episodes


def test_max_turns_0_runs_until_the_episode_token_cap():
    """env.max_turns=0 (TRL's max_tool_calling_iterations=None): no turn limit. Each turn is a 5-token call
    and a 3-token reply: 8, 16, then the third call brings 21 = the cap and its reply (24 > 21) does not fit,
    so the episode ends "length" after 3 turns and 3 calls, on the model's call (no answer)."""
    always_call = ScriptedSampler(lambda ctx, g: "<tool_call>1+1</tool_call>")
    spec = EpisodeSpec(max_turns=0, max_episode_tokens=21, tool_format="tags")
    ro = EpisodeRunner(spec, TOK, tools=[calculator]).run(always_call, [prompt("1+1=")], 1, SamplingParams())
    assert ro.finish_reasons == ["length"] and ro.episodes[0].turns == 3 and ro.episodes[0].tool_calls == 3
    assert len(ro.completion_ids[0]) == 21 and episode_metrics(ro)["episodes/no_answer_fraction"] == 1.0


def test_cut_tool_results_and_observations_are_counted_and_warned_about_once(caplog):
    """max_tool_output_chars=4: "123456" (6 > 4) is cut to "1234...[truncated]", "12" is not; 1 of the 2 calls
    cut -> tools/truncated_frequency 0.5. max_observation_chars=3: " go" (3) is not cut, " gone" (5) is; the
    two runs below warn once per kind (before: cut in silence)."""
    import logging

    def echo(expression: str) -> str:
        """Echo.

        Args:
            expression: what to echo.
        """
        return expression

    class Obs(Counter):
        text = " go"

        def reset(self, prompt, answer, **kwargs):
            self.target, self.count, self.done = 9, 0, False
            return Obs.text

    turns = {"123456=": "<tool_call>echo: 123456</tool_call>", "12=": "<tool_call>echo: 12</tool_call>"}
    sampler = ScriptedSampler(lambda ctx, g: "<answer>1</answer><eos>" if "<tool_result>" in ctx else turns[ctx])
    runner = EpisodeRunner(EpisodeSpec(max_turns=2, max_tool_output_chars=4, tool_format="tags"), TOK, tools=[echo])
    with caplog.at_level(logging.WARNING, logger="grpokit.env"):
        for _ in range(2):
            ro = runner.run(sampler, [prompt("123456="), prompt("12=")], 1, SamplingParams())
    assert [e.messages[1]["content"] for e in ro.episodes] == ["1234...[truncated]", "12"]
    assert episode_metrics(ro)["tools/truncated_frequency"] == 0.5
    spec = EpisodeSpec(max_turns=1, max_observation_chars=3, tool_format="tags")
    answer = ScriptedSampler(lambda ctx, g: "<answer>1</answer><eos>")
    with caplog.at_level(logging.WARNING, logger="grpokit.env"):
        runner = EpisodeRunner(spec, TOK, environment_factory=Obs)
        ro = runner.run(answer, [prompt("4=", answer="4")], 1, SamplingParams())
        assert episode_metrics(ro)["episodes/observations_truncated"] == 0.0 and ro.prompt_ids == [ids("4= go")]
        Obs.text = " gone"
        for _ in range(2):
            ro = runner.run(answer, [prompt("4=", answer="4")], 1, SamplingParams())
    assert episode_metrics(ro)["episodes/observations_truncated"] == 1.0
    said = [r.getMessage() for r in caplog.records]
    assert sum("tool results were longer than env.max_tool_output_chars=4" in m for m in said) == 1
    assert sum("observations were longer than env.max_observation_chars=3" in m for m in said) == 1
