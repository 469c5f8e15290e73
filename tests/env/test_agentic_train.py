"""Episodes through the whole trainer: TRL's tools= / environment_factory= / rollout_func=, reward
functions that see the conversation and the environments, the env config section, step-level
credit modes, the record (metrics, samples.jsonl, report), and the vLLM engines' fakes."""

import json
import types

import pytest
import torch

from grpokit.config import Config, ConfigError
from grpokit.config.io import apply_overrides
from grpokit.data.tasks.calculator import TAGS
from grpokit.data.tasks.chartok import ALPHABET, build_char_tokenizer
from grpokit.env import calculator
from grpokit.rollout.hf import SamplingParams
from grpokit.train import Trainer
from helpers.episodes import Counter, ScriptedSampler, calc_reply
from helpers.models import save_tiny_model
from helpers.paths import ROOT

ROWS = [{"prompt": f"{a}*{b}=", "answer": str(a * b)} for a, b in ((57, 68), (12, 34), (21, 43), (90, 11))]
SEEN: dict = {}


@pytest.fixture(scope="module")
def tag_model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tag-model"), build_char_tokenizer(ALPHABET, TAGS))


def exact_answer(prompts, completions, answer, environments=None, **kwargs):
    """Records what TRL would pass; 1.0 when the last message holds the gold answer."""
    SEEN.update(completions=completions, environments=environments)
    return [float(f"<answer>{a}</answer>" in c[-1]["content"]) for c, a in zip(completions, answer)]


def trainer(model_dir, out, tools=(calculator,), environment_factory=None, rollout_func=None, **over):
    cfg = apply_overrides(
        Config(),
        [
            f"model.name_or_path={model_dir}",
            "data.task=",
            "reward.functions=[]",
            "rollout.group_size=3",
            "rollout.max_new_tokens=12",
            "train.prompts_per_step=2",
            "train.steps=1",
            f"train.out={out}",
            "record.sinks=[]",
            "record.report=true",
            "record.samples_every=1",
            "train.threads=1",
            "data.eval_size=0",
        ]
        + [f"{k}={v}" for k, v in over.items()],
    )
    return Trainer(
        cfg,
        reward_funcs=[exact_answer],
        train_rows=ROWS,
        eval_rows=[],
        quiet=True,
        tools=list(tools) or None,
        environment_factory=environment_factory,
        rollout_func=rollout_func,
    )


def scripted(tr, reply=calc_reply):
    tr.turn_sampler = lambda model, generator=None: ScriptedSampler(reply)
    return tr


@pytest.mark.parametrize("advantage,ratio", [("group", "token"), ("gigpo", "token"), ("gagpo", "turn")])
def test_trainer_runs_episodes_with_tools(tag_model_dir, tmp_path, advantage, ratio):
    tr = scripted(trainer(tag_model_dir, tmp_path / "run", **{"algo.advantage": advantage, "algo.ratio_level": ratio}))
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    msgs = SEEN["completions"]  # the last group's (reward functions are called per group)
    assert len(msgs) == 3 and msgs[1][0]["tool_calls"][0]["function"]["name"] == "calculator"  # the conversation
    assert msgs[1][1]["role"] == "tool" and msgs[0] == [{"role": "assistant", "content": "<answer>4200</answer>"}]
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["reward"] == pytest.approx(4 / 6)  # the tool users are right, the guessers wrong
    assert line["episodes/tool_use_rate"] == pytest.approx(4 / 6) and line["tools/call_frequency"] == pytest.approx(
        4 / 6
    )
    assert line["episodes/turns_mean"] == pytest.approx(10 / 6) and line["episodes/env_tokens_mean"] > 0
    assert line["completions/max_length"] == 14  # model tokens only: call (7) + answer with eos (7), not the result
    assert any(not torch.equal(before[n], p) for n, p in tr.model.named_parameters())
    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in sample["completions"][1]["messages"]] == ["assistant", "tool", "assistant"]
    html = (tmp_path / "run" / "report.html").read_text()
    # the page draws the conversation turn by turn from its JSON (tests/record/test_report_browser.py renders one)
    assert '"role":"tool"' in html and '"tool_calls":[' in html and '"title":"Episodes (tools)"' in html


def test_environment_factory_reward_and_reset(tag_model_dir, tmp_path):
    class Adder(Counter):
        pass

    rows = [{"prompt": "4=", "answer": "4"}, {"prompt": "6=", "answer": "6"}]
    tr = Trainer(
        apply_overrides(
            Config(),
            [
                f"model.name_or_path={tag_model_dir}",
                "data.task=",
                "reward.functions=[]",
                "rollout.group_size=2",
                "train.prompts_per_step=2",
                "train.steps=1",
                f"train.out={tmp_path / 'r'}",
                "record.sinks=[]",
                "record.report=false",
                "train.threads=1",
                "data.eval_size=0",
                "env.max_turns=5",
            ],
        ),
        train_rows=rows,
        eval_rows=[],
        quiet=True,
        environment_factory=Adder,
    )
    assert [s.name for s in tr.runner.specs] == ["Adder"]  # get_reward became a reward source, named after the class
    scripted(tr, lambda ctx, g: "<tool_call>add: 2</tool_call>" if g in (None, 1) else "<answer>0</answer><eos>")
    m = tr.train_step()
    assert m["rewards/Adder/mean"] == 0.5 and m["episodes/finished_done"] == 0.5  # the adders reach the target


def test_reward_functions_and_samples_get_the_prompt_with_the_reset_observation(tag_model_dir, tmp_path):
    """Counter.reset returns " go", which the model sees after "4=": the reward functions' prompts and the
    samples show "4= go" (before: "4=", the prompt without what the environment showed)."""
    seen = []

    def prompts_seen(prompts, completions, **kwargs):
        seen.extend(prompts)
        return [0.0] * len(completions)

    over = ["rollout.group_size=2", "train.prompts_per_step=1", "record.samples_every=1", "env.max_turns=1"]
    base = [f"model.name_or_path={tag_model_dir}", "data.task=", "reward.functions=[]", "train.steps=1"]
    run = [f"train.out={tmp_path / 'r'}", "record.sinks=[]", "record.report=false", "data.eval_size=0"]
    tr = Trainer(
        apply_overrides(Config(), base + over + run),
        reward_funcs=[prompts_seen],
        train_rows=[{"prompt": "4=", "answer": "4"}],
        eval_rows=[],
        quiet=True,
        environment_factory=Counter,
    )
    scripted(tr, lambda ctx, g: "<answer>4</answer><eos>").train()
    assert seen == ["4= go", "4= go"]
    assert json.loads((tmp_path / "r" / "samples.jsonl").read_text().splitlines()[0])["prompt"] == "4= go"


def test_rollout_func_and_env_mask(tag_model_dir, tmp_path):
    seen = {}

    def rollout_func(prompts, trainer):
        seen["prompts"] = prompts
        return {
            "prompt_ids": [[5, 6]] * 2,
            "completion_ids": [[7, 8, 9]] * 6,
            "logprobs": [[-1.0, 0.0, -1.0]] * 6,
            "env_mask": [[1, 0, 1]] * 6,
            "answer": ["x"] * 6,
        }

    def reward(completions, answer, **kw):
        seen["answer"] = answer
        return [float(i % 2) for i in range(len(completions))]

    cfg = apply_overrides(
        Config(),
        [
            f"model.name_or_path={tag_model_dir}",
            "data.task=",
            "reward.functions=[]",
            "rollout.group_size=3",
            "train.prompts_per_step=2",
            f"train.out={tmp_path / 'r'}",
            "record.sinks=[]",
            "record.report=false",
            "train.threads=1",
            "data.eval_size=0",
        ],
    )
    tr = Trainer(cfg, reward_funcs=[reward], train_rows=ROWS, eval_rows=[], quiet=True, rollout_func=rollout_func)
    m = tr.train_step()
    assert len(seen["prompts"]) == 2 and all(p in [r["prompt"] for r in ROWS] for p in seen["prompts"])  # raw prompts
    assert seen["answer"] == ["x"] * 3  # extra keys reach the reward functions (called per group of 3)
    assert m["completions/mean_length"] == 2.0  # the environment's token is not the model's


def test_a_rollout_func_with_an_asynchronous_sampler_is_refused_before_the_run_folder(tag_model_dir, tmp_path):
    """The async sampler's prefetched batches would be trained in the function's place (it would be called only
    for refills): refused in one sentence, before the run folder exists."""
    cfg = apply_overrides(
        Config(),
        [
            f"model.name_or_path={tag_model_dir}",
            "data.task=",
            "reward.functions=[]",
            "rollout.async_staleness=1",
            f"train.out={tmp_path / 'r'}",
            "record.sinks=[]",
        ],
    )
    with pytest.raises(ConfigError) as e:
        Trainer(cfg, train_rows=ROWS, eval_rows=[], quiet=True, rollout_func=lambda prompts, trainer: {})
    assert str(e.value) == (
        "a rollout_func samples every batch itself, so rollout.async_staleness=1 would train the asynchronous "
        "sampler's batches instead and call it only for refills; set rollout.async_staleness=0"
    )
    assert not (tmp_path / "r").exists()


def test_env_config_section(tag_model_dir, tmp_path):
    tr = trainer(tag_model_dir, tmp_path / "c", tools=(), **{"env.tools": "[calculator]", "env.max_turns": 2})
    assert tr.episodes.tool_names == ["calculator"] and tr.episodes.spec.max_turns == 2
    assert tr.episodes.spec.tool_format == "tags"  # this tokenizer has no chat template
    with pytest.raises(ConfigError, match="env.tools"):
        trainer(tag_model_dir, tmp_path / "d", tools=(), **{"env.tools": "[abacus]"})
    with pytest.raises(ConfigError, match=r"env.max_turns=-1 must be at least 1, or 0 for no turn limit"):
        trainer(tag_model_dir, tmp_path / "e", **{"env.max_turns": -1})
    with pytest.raises(ConfigError, match=r"env.max_turns=0 \(no turn limit\) needs env.max_episode_tokens > 0"):
        trainer(tag_model_dir, tmp_path / "e", **{"env.max_turns": 0, "env.max_episode_tokens": 0})
    assert trainer(tag_model_dir, tmp_path / "e0", **{"env.max_turns": 0}).episodes.spec.max_turns == 0
    with pytest.raises(ConfigError, match="algo.advantage='ppo' is not valid"):
        trainer(tag_model_dir, tmp_path / "f", **{"algo.advantage": "ppo"})
    with pytest.raises(ConfigError, match="algo.advantage=gigpo normalises within groups"):
        trainer(tag_model_dir, tmp_path / "f2", **{"algo.advantage": "gigpo", "algo.scale": "batch"})
    with pytest.raises(ConfigError, match="env.environment"):
        trainer(tag_model_dir, tmp_path / "g", **{"env.environment": "helpers.episodes:Nope"})
    tr = trainer(tag_model_dir, tmp_path / "h", tools=(), **{"env.environment": "helpers.episodes:Counter"})
    assert tr.episodes.tool_names == ["add"]


def test_async_staleness_samples_episodes(tag_model_dir, tmp_path):
    tr = trainer(tag_model_dir, tmp_path / "a", **{"rollout.async_staleness": 1, "train.steps": 2})
    tr.train()  # the tiny random model rarely writes a call; what matters is the loop it ran through
    lines = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines() if '"reward"' in l]
    assert len(lines) == 2 and all("episodes/turns_mean" in l and "rollout/staleness" in l for l in lines)


# ---------------------------------------------------------------- vLLM engines (fakes)


class ToolFakeLLM:
    """Answers a prompt with a calculator call, and a context holding a result with the answer."""

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def generate(self, prompts, sp, use_tqdm=False):
        self.calls.append(("generate", sp.n, tuple(sp.stop or ())))
        self.include_stop = getattr(sp, "include_stop_str_in_output", False)
        outs = []
        for p in prompts:
            text = self.tok.decode(p["prompt_token_ids"])
            reply = calc_reply(text, 1)
            ids = list(self.tok(reply.replace("<eos>", ""), add_special_tokens=False)["input_ids"])
            ids += [1] if reply.endswith("<eos>") else []
            samples = [
                types.SimpleNamespace(
                    index=g,
                    token_ids=ids,
                    logprobs=[{t: types.SimpleNamespace(logprob=-0.5)} for t in ids],
                    finish_reason="stop",
                    stop_reason="</tool_call>" if not reply.endswith("<eos>") else None,
                )
                for g in range(sp.n)
            ]
            outs.append(types.SimpleNamespace(outputs=samples))
        return outs

    def sleep(self, level):
        self.calls.append(("sleep",))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up",))

    def apply_model(self, fn):
        return fn(types.SimpleNamespace(load_weights=lambda items: None))

    def reset_prefix_cache(self):
        pass


def test_vllm_colocated_runs_the_episode_loop_and_sleeps_once(tag_model_dir, tmp_path):
    from types import SimpleNamespace as FakeSP

    from grpokit.rollout.vllm import VLLMColocated

    tr = trainer(tag_model_dir, tmp_path / "v", **{"rollout.tis_cap": 2.0})
    llm = ToolFakeLLM(tr.tokenizer)
    tr.use_engine(VLLMColocated(llm, FakeSP, tr.params, sleep=True))
    tr.cfg.rollout.backend = "vllm"
    m = tr.train_step()
    kinds = [c[0] for c in llm.calls]
    assert kinds[:3] == ["generate", "generate", "sleep"]  # two turns, then one sleep for the update
    assert llm.calls[0][1] == 3 and llm.calls[1][1] == 1 and "</tool_call>" in llm.calls[0][2]
    assert llm.include_stop  # vLLM must keep the closing tag in the output, as the hf engine does
    assert m["episodes/tool_use_rate"] == 1.0 and m["reward"] == 1.0 and "tis/ratio_max" in m


def test_vllm_server_runs_the_episode_loop(tag_model_dir, tmp_path):
    """The server client (rollout/vllm_client.py) drives each turn; its HTTP calls are scripted
    here: readiness and the extension's info as a grpokit vllm-serve server answers them, and
    completions that call the calculator on the first turn and answer on the second."""
    from grpokit.rollout.vllm_client import INFO_METHOD, PROTOCOL, HTTPAnswer, VLLMServer

    tok = build_char_tokenizer(ALPHABET, TAGS)
    posts = []

    def call(method, url, body, timeout):
        if url.endswith("/health"):
            return HTTPAnswer(200, {}, "")
        if url.endswith("/v1/models"):
            return HTTPAnswer(200, {"data": [{"id": "m"}]}, "")
        if url.endswith("/collective_rpc") and body["method"] == INFO_METHOD:
            return HTTPAnswer(200, {"results": [{"protocol": PROTOCOL, "logprobs_mode": "processed_logprobs"}]}, "")
        assert url.endswith("/v1/completions"), url
        posts.append(body)
        choices = []
        for k, p in enumerate(body["prompt"]):
            reply = calc_reply(tok.decode(p), 1)
            ids = list(tok(reply.replace("<eos>", ""), add_special_tokens=False)["input_ids"]) + (
                [1] if reply.endswith("<eos>") else []
            )
            for g in range(body["n"]):
                choices.append(
                    {
                        "index": k * body["n"] + g,
                        "finish_reason": "stop",
                        "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5] * len(ids)},
                    }
                )
        return HTTPAnswer(200, {"choices": choices}, "")

    from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
    from grpokit.types import Prompt

    eng = VLLMServer("http://127.0.0.1:1", SamplingParams(max_new_tokens=12), tmp_path, call=call)
    runner = EpisodeRunner(EpisodeSpec(max_turns=3, tool_format="tags"), tok, tools=[calculator])
    p = Prompt("57*68=", list(tok("57*68=")["input_ids"]), {}, "57*68=")
    ro = runner.run(lambda ctx, G, params: eng.generate(ctx, G, params=params, sleep=False), [p], 2, eng.params)
    assert len(posts) == 2 and posts[0]["n"] == 2 and posts[1]["n"] == 1 and "</tool_call>" in posts[0]["stop"]
    assert posts[0]["include_stop_str_in_output"] is True
    assert ro.episodes[0].messages[-1]["content"] == "<answer>3876</answer>"


def test_agents_md_example_is_valid(tmp_path):
    """docs/AGENTS.md's example, run with a stand-in Trainer: its tool and environment are valid
    tools (schemas), its environment plays an episode, its reward reads the conversation."""
    import re

    from grpokit.env import environment_tools, tool_schema
    from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
    from grpokit.types import Prompt

    code = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "AGENTS.md").read_text(), re.S).group(1)
    got = {}

    class StandIn:
        def __init__(self, cfg, **kw):
            got.update(kw, cfg=cfg)

        def train(self):
            return {}

    ns = {}
    exec(
        compile(code.replace("from grpokit.train import Trainer", "Trainer = StandIn"), "AGENTS.md", "exec"),
        {"StandIn": StandIn},
        ns,
    )
    assert got["cfg"].env.max_turns == 4 and got["environment_factory"] is ns["Shop"]
    for fn in got["tools"] + environment_tools(ns["Shop"]()):
        assert tool_schema(fn)["function"]["parameters"]["properties"]
    tok = build_char_tokenizer(ALPHABET + "abcdefghijklmnopqrstuvwxyz:,()'{}\"", TAGS)
    runner = EpisodeRunner(
        EpisodeSpec(max_turns=3, tool_format="tags"), tok, tools=got["tools"], environment_factory=ns["Shop"]
    )
    sampler = ScriptedSampler(
        lambda ctx, g: (
            '<tool_call>{"name": "buy", "arguments": {"item": "fig", "price": 7}}</tool_call>'
            if "<tool_result>" not in ctx
            else "ok<eos>"
        )
    )
    rows = got["train_rows"][:1]
    ro = runner.run(
        lambda c, G, p: _retok(sampler, tok, c, G, p),
        [Prompt("p", [5], {"budget": 7}, rows[0]["prompt"])],
        2,
        SamplingParams(),
    )
    assert ro.finish_reasons == ["done", "done"] and ro.episodes[0].environment.basket == ["fig"]
    convs, envs = [e.messages for e in ro.episodes], [e.environment for e in ro.episodes]
    assert got["reward_funcs"][0](prompts=["p"] * 2, completions=convs, environments=envs) == [1.0, 1.0]


def _retok(sampler, tok, contexts, G, params):
    """The scripted sampler of helpers.episodes speaks its module's tokenizer; use this one's."""
    from helpers import episodes

    saved = episodes.TOK
    episodes.TOK = tok
    try:
        return sampler(contexts, G, params)
    finally:
        episodes.TOK = saved


def test_trainer_with_a_chat_template_and_an_environment(tmp_path):
    """The chat-template format through the trainer: tools listed in the prompt, reset()'s observation
    appended to the user's message (re-rendered by the template), JSON calls, template-rendered results."""
    from helpers.episodes import chat_tokenizer

    tok = chat_tokenizer()
    save_tiny_model(tmp_path / "m", tok, max_positions=512, eos_token_id=tok.eos_token_id)
    rows = [{"prompt": [{"role": "user", "content": "count to"}], "answer": "4"}] * 2
    seen = {}

    def reward(completions, environments, **kw):
        seen["c"], seen["e"] = completions, environments
        return [e.get_reward() for e in environments]

    tr = Trainer(
        apply_overrides(
            Config(),
            [
                f"model.name_or_path={tmp_path / 'm'}",
                "data.task=",
                "reward.functions=[]",
                "rollout.group_size=2",
                "train.prompts_per_step=2",
                f"train.out={tmp_path / 'r'}",
                "record.sinks=[]",
                "record.report=false",
                "train.threads=1",
                "data.eval_size=0",
            ],
        ),
        reward_funcs=[reward],
        train_rows=rows,
        eval_rows=[],
        quiet=True,
        environment_factory=Counter,
    )
    assert tr.episodes.spec.tool_format == "chat_template" and "Tools: add" in tr.prompts[0].text
    eos = tok.eos_token_id
    call = '<tool_call>{"name": "add", "arguments": {"n": "2"}}</tool_call>'
    contexts = []

    def model(ctxs, G, params):
        contexts.extend(tok.decode(c) for c in ctxs)
        outs = [
            tok(
                call if "<tool_response>" not in tok.decode(c) or "<tool_response>2<" in tok.decode(c) else "done",
                add_special_tokens=False,
            )["input_ids"]
            + [eos]
            for c in ctxs
            for _ in range(G)
        ]
        return types.SimpleNamespace(
            completion_ids=outs, sampling_logprobs=[[-0.5] * len(o) for o in outs], finish_reasons=["eos"] * len(outs)
        )

    tr.turn_sampler = lambda m, generator=None: model
    m = tr.train_step()
    assert "<|im_start|>user\ncount to go<|im_end|>" in contexts[0]  # the observation joined the user message
    assert m["episodes/finished_done"] == 1.0 and m["episodes/turns_mean"] == 2.0
    assert (
        m["rewards/reward/mean"] == 1.0 and m["rewards/Counter/mean"] == 1.0 and m["reward"] == 2.0
    )  # ours + get_reward
    assert seen["c"][0][1] == {"role": "tool", "name": "add", "content": "2"} and seen["e"][0].count == 4


@pytest.mark.parametrize(
    "given, named",
    [
        ({"tools": (calculator,)}, "tools="),
        ({"tools": (), "environment_factory": lambda: None}, "environment_factory="),
        ({"tools": (), "env.tools": "[calculator]"}, "env.tools=['calculator']"),
    ],
)
def test_a_rollout_func_beside_tools_is_refused_before_the_run_folder(tag_model_dir, tmp_path, given, named):
    """TRL runs its tool loop on a rollout_func's completions; grpokit's episode loop is the stage the function
    replaces, so the tools would never be called (before: trained with exit 0, no tool ever run)."""
    with pytest.raises(ConfigError) as e:
        trainer(tag_model_dir, tmp_path / "r", rollout_func=lambda prompts, trainer: {}, **given)
    assert f"so {named} would never be called" in str(e.value) and "inside the rollout_func" in str(e.value)
    assert not (tmp_path / "r").exists()
