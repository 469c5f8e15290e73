"""An OpenEnv server (openenv-core's own echo environment, written by ``openenv init`` and served by
openenv's ``create_app`` in a real process on 127.0.0.1) trained against through OpenEnv's client
(grpokit.env.hubs.openenv_env): as grpokit's ``env.environment`` (an import path, as in YAML) and
through ``grpokit.trl.GRPOTrainer(environment_factory=...)``, TRL's pattern in
examples/scripts/openenv/. Server faults go through the environment stage's fault model: a slow
step, a server that is gone and a server that answers wrongly each end an episode (or fail a
reset) with one counted sentence, never the run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytest.importorskip("openenv.core")

from grpokit.env.hubs.openenv_env import OpenEnvError, openenv_environment  # noqa: E402
from grpokit.env.tools import TerminalToolError  # noqa: E402
from helpers.hubs import hub_trainer, save_tag_model, scripted  # noqa: E402
from helpers.net import free_port  # noqa: E402
from helpers.paths import TESTS  # noqa: E402
from helpers.trl_models import make_qwen2_tool_model, small_args  # noqa: E402


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    """The echo server's URL; its steps sleep 10 s when the message starts with "sleep"."""
    root = tmp_path_factory.mktemp("openenv")
    subprocess.run(
        [str(Path(sys.executable).parent / "openenv"), "init", "echo_env", "--output-dir", str(root)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    port, log = free_port(), root / "server.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(TESTS / "helpers" / "openenv_server.py"),
            str(root),
            "echo_env",
            str(port),
            "--sleep-word",
            "sleep",
            "--step-delay",
            "10",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the OpenEnv server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
    yield url
    proc.terminate()  # uvicorn waits for open sessions to close before it exits: kill it after a while
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("oe-model")
    save_tag_model(path)
    return path


def test_the_client_adapter_speaks_to_the_real_server(echo_server):
    Echo = openenv_environment(echo_server, action_field="message", observation_field="echoed_message", name="Echo")
    env = Echo()
    assert env.reset(prompt="hi") == "Echo Env environment ready!"  # the template's reset observation
    assert env.act("hello") == "hello" and env.get_reward() == pytest.approx(0.5)  # the template's reward: 0.1 per char
    assert not env.done
    every = openenv_environment(echo_server)()  # no observation field: every field, one line each
    assert every.reset() == "echoed_message: Echo Env environment ready!\nmessage_length: 0"


def reply(context, g):
    """g = 0 asks the server to echo "hello" and then answers; g = 1 answers at once."""
    if g == 1 or "<tool_result>" in context:
        return "ok<eos>"
    return "<tool_call>hello</tool_call>"


def test_an_openenv_server_trains_two_steps_as_env_environment(echo_server, model_dir, tmp_path, monkeypatch):
    mod = tmp_path / "echo_here.py"  # what a user writes beside their YAML: the class env.environment names
    mod.write_text(
        "from grpokit.env.hubs.openenv_env import openenv_environment\n"
        f"Echo = openenv_environment({echo_server!r}, observation_field='echoed_message', name='Echo')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"prompt": "Say hello."}, {"prompt": "Greet."}]
    tr = hub_trainer(model_dir, tmp_path / "run", rows, over=["env.environment=echo_here:Echo"])
    assert [s.name for s in tr.runner.specs] == ["Echo"]
    sampler = scripted(tr, reply)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:  # the server's reward for "hello" (0.5) on half the episodes
        assert m["rewards/Echo/mean"] == pytest.approx(0.25) and m["tools/call_frequency"] == pytest.approx(0.5)
        assert m["tools/failure_frequency"] == 0.0 and m["episodes/reset_failures"] == 0.0
    assert any("Echo Env environment ready!" in c for c in sampler.contexts)  # reset's observation joined the prompt
    assert any("<tool_result>hello</tool_result>" in c for c in sampler.contexts)  # the server's echo, a tool turn
    assert any(not torch.equal(before[n], p) for n, p in tr.model.named_parameters())


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory):
    """A tiny Qwen2 whose character tokenizer has TRL's copy of Qwen2.5's template (tools, <tool_call>;
    it keeps a conversation's prefix when tool turns are added, as multi-turn training needs)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    return make_qwen2_tool_model(tmp_path_factory.mktemp("qwen-tools"), qwen2_5_chat_template, max_positions=4096)


def test_an_openenv_server_trains_through_trl_environment_factory(echo_server, qwen_model, tmp_path):
    from datasets import Dataset

    from grpokit.trl import GRPOConfig, GRPOTrainer

    path, tok = qwen_model
    Echo = openenv_environment(echo_server, observation_field="echoed_message", name="Echo")
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "Say hello."}]}, {"prompt": [{"role": "user", "content": "Greet."}]}]
    )
    args = small_args(
        GRPOConfig,
        tmp_path / "run",
        max_steps=2,
        num_generations=2,
        max_completion_length=512,
        max_tool_calling_iterations=2,
        logging_steps=1,
        shuffle_dataset=False,
    )
    tr = GRPOTrainer(str(path), args=args, train_dataset=data, environment_factory=Echo)  # the env owns the reward
    inner = tr._get()
    contexts = []

    def model(ctxs, G, params):
        import types

        outs = []
        for c in ctxs:
            text = tok.decode(c)
            contexts.append(text)
            for g in range(G):
                said = "<tool_response>" in text
                out = (
                    "ok"
                    if said or (G == 2 and g == 1)
                    else '<tool_call>{"name": "act", "arguments": {"action": "hello"}}</tool_call>'
                )
                outs.append(tok(out, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        return types.SimpleNamespace(
            completion_ids=outs, sampling_logprobs=[[-0.5] * len(o) for o in outs], finish_reasons=["eos"] * len(outs)
        )

    inner.turn_sampler = lambda m, generator=None: model
    before = {n: p.detach().clone() for n, p in inner.model.named_parameters()}
    tr.train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(m["rewards/Echo/mean"] == pytest.approx(0.25) for m in lines)
    assert any(
        "<tool_response>\nhello\n</tool_response>" in c or "<tool_response>hello</tool_response>" in c for c in contexts
    )
    assert any(not torch.equal(before[n], p) for n, p in inner.model.named_parameters())


# ---------------------------------------------------------------------- faults of the server


def test_a_slow_step_ends_the_episode_with_one_sentence(echo_server):
    env = openenv_environment(echo_server, observation_field="echoed_message", timeout_s=1.0)()
    env.reset()
    start = time.monotonic()
    with pytest.raises(
        TerminalToolError, match=r"^the OpenEnv server at http://127\.0\.0\.1:\d+ did not answer step within 1 s$"
    ):
        env.act("sleep please")
    assert time.monotonic() - start < 6  # the deadline, not the server's 10 s


def test_a_gone_server_is_a_counted_reset_failure_and_the_run_goes_on(echo_server, model_dir, tmp_path):
    Gone = openenv_environment(f"http://127.0.0.1:{free_port()}", connect_timeout_s=1.0, name="Gone")
    with pytest.raises(OpenEnvError, match=r"^could not reach the OpenEnv server at http://127\.0\.0\.1:\d+ for reset"):
        Gone().reset()
    Echo = openenv_environment(echo_server, observation_field="echoed_message", name="Echo")
    rows = [
        {"prompt": "a", "environment": "live"},
        {"prompt": "b", "environment": "live"},
        {"prompt": "c", "environment": "gone"},
    ]  # one server of two is down: a partial outage
    tr = hub_trainer(
        model_dir,
        tmp_path / "run",
        rows,
        environment_factory={"live": Echo, "gone": Gone},
        over=["train.steps=1", "train.prompts_per_step=3"],
    )
    scripted(tr, reply)
    m = tr.train_step()
    assert m["episodes/reset_failures"] == 2.0  # the gone server's prompt: its 2 episodes started from the bare prompt
    assert m["tools/failure_frequency"] == pytest.approx(1 / 3)  # and its one call failed with the sentence, counted
    assert m["rewards/Echo/mean"] == pytest.approx(0.5 / 2)  # the live server's episodes trained as usual


class WrongServer:
    """A websocket server on 127.0.0.1 that answers every message with a reply OpenEnv never sends."""

    def __init__(self, reply: dict):
        from websockets.sync.server import serve

        def handler(ws):
            for _ in ws:
                ws.send(json.dumps(reply))

        self.port = free_port()
        self.server = serve(handler, "127.0.0.1", self.port)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.mark.parametrize(
    "reply,why",
    [
        (
            {"type": "observation", "data": {"observation": "text", "reward": 0.0}},
            "reset reply has no observation object",
        ),
        ({"type": "observation", "data": {"observation": {"x": 1}, "reward": "lots"}}, "reset reply has reward 'lots'"),
    ],
)
def test_a_wrong_reply_is_one_sentence(reply, why):
    server = WrongServer(reply)
    try:
        env = openenv_environment(f"http://127.0.0.1:{server.port}", timeout_s=2.0)()
        with pytest.raises(OpenEnvError, match=f"sent a wrong reply: its {why}"):
            env.reset()
    finally:
        server.close()
