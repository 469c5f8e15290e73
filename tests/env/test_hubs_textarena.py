"""A TextArena game (GuessTheNumber-v0, the real textarena package) as a multi-turn environment
(grpokit.env.hubs.textarena_env): the game's opening text joins the prompt, each guess is a tool
call the real game engine answers, and the game's own reward is the episode's reward; two steps of
GRPO train end to end."""

import json

import pytest
import torch

pytest.importorskip("textarena")

from grpokit.config import ConfigError  # noqa: E402
from grpokit.env.hubs.textarena_env import textarena_environment  # noqa: E402
from helpers.hubs import hub_trainer, save_tag_model, scripted  # noqa: E402

GuessTheNumber = textarena_environment("GuessTheNumber-v0")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("ta-model")
    save_tag_model(path)
    return path


def secret(seed):
    """The game's number for a seed, found by bisection through the adapter (the game is the oracle)."""
    lo, hi = 1, 20
    env = GuessTheNumber()
    env.reset(seed=seed)
    while True:
        mid = (lo + hi) // 2
        reply = env.move(str(mid))
        if env.done:
            return mid
        lo, hi = (mid + 1, hi) if "higher" in reply else (lo, mid - 1)


def test_the_adapter_plays_the_real_game():
    env = GuessTheNumber()
    opening = env.reset(prompt="play", seed=3)
    assert "Guess The Number" in opening and "between 1 and 20" in opening
    n = secret(3)
    env.reset(seed=3)
    low = 1 if n > 1 else 2
    assert "higher" in env.move(str(low)) or "lower" in env.move(str(low))  # only the new text, not the history
    assert env.get_reward() == 0.0 and not env.done  # an unfinished game scores nothing
    assert "Congratulations" in env.move(str(n)) and env.done and env.get_reward() == 1.0
    other = GuessTheNumber()
    other.reset(seed=3)
    other.move("hello")
    assert other.move("again").startswith("Game over") and other.get_reward() == 0.0  # invalid moves lose


def test_a_game_trains_two_steps_with_its_own_reward(model_dir, tmp_path):
    answers = {s: secret(s) for s in (3, 11)}
    assert 1 not in answers.values()  # so the first guess below is always wrong
    rows = [{"prompt": f"Play game {s}.", "seed": s} for s in answers]
    tr = hub_trainer(model_dir, tmp_path / "run", rows, environment_factory=GuessTheNumber)
    assert [s.name for s in tr.runner.specs] == ["GuessTheNumber"]  # get_reward: a reward named after the game

    def reply(context, g):  # g = 0 guesses 1, reads "higher", then guesses the secret; g = 1 does not play
        if g == 1:
            return "no<eos>"
        seed = int(context.split("Play game ")[1].split(".")[0])
        return "<tool_call>1</tool_call>" if "[Player]" not in context else f"<tool_call>{answers[seed]}</tool_call>"

    sampler = scripted(tr, reply)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:  # per step: 2 games x (one won in two moves, one not played)
        assert m["rewards/GuessTheNumber/mean"] == pytest.approx(0.5)
        assert m["episodes/finished_done"] == pytest.approx(0.5) and m["episodes/turns_mean"] == pytest.approx(1.5)
        assert m["tools/call_frequency"] == pytest.approx(1.0) and m["tools/failure_frequency"] == 0.0
    second = [c for c in sampler.contexts if "<tool_result>" in c]
    assert second and all("The target number is higher." in c for c in second)  # the game's reply, as a tool turn
    assert any(not torch.equal(before[n], p) for n, p in tr.model.named_parameters())


def test_unknown_game_is_one_sentence():
    with pytest.raises(ConfigError, match="textarena has no game 'NoSuchGame-v0'"):
        textarena_environment("NoSuchGame-v0")
