"""Named environments routed per row (grpokit's side of TRL's ``environment_factory`` dict): each row's
``environment`` column picks its factory; its episodes see the standalone tools plus that environment's
methods only; ``reset`` gets the row without the routing column; one reward per environment class."""

import pytest

from grpokit.config import ConfigError
from grpokit.env import calculator, environment_rewards
from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
from grpokit.rollout.hf import SamplingParams
from grpokit.types import Prompt, Rollout
from helpers.episodes import chat_tokenizer

TOK = chat_tokenizer()  # letters, so that tag-format calls can name their tool


def prompt(text, **columns):
    return Prompt(text, list(TOK(text, add_special_tokens=False)["input_ids"]), columns, text)


def scripted(reply):
    """A turn sampler playing the model: ``reply(context_text) -> text`` (end of turn appended)."""

    def sample(contexts, G, params):
        outs = [
            list(TOK(reply(TOK.decode(c)), add_special_tokens=False)["input_ids"]) + [TOK.eos_token_id]
            for c in contexts
            for _ in range(G)
        ]
        return Rollout([list(c) for c in contexts], outs, [[-0.5] * len(o) for o in outs], ["eos"] * len(outs), G)

    return sample


RESETS: list = []


class Adder:
    def reset(self, **row):
        RESETS.append(("Adder", sorted(row)))
        self.count = 0

    def add(self, n: str) -> str:
        """Add n.

        Args:
            n: the amount.
        """
        self.count += int(n)
        return str(self.count)

    def get_reward(self) -> float:
        return float(self.count)


class Doubler:
    def reset(self, **row):
        RESETS.append(("Doubler", sorted(row)))

    def double(self, n: str) -> str:
        """Double n.

        Args:
            n: the number.
        """
        return str(2 * int(n))


NAMED = {"add": Adder, "dbl": Doubler}


def test_each_row_runs_in_the_environment_its_column_names():
    RESETS.clear()
    runner = EpisodeRunner(
        EpisodeSpec(max_turns=2, tool_format="tags"), TOK, tools=[calculator], environment_factory=NAMED
    )
    assert runner.tool_names == ["calculator", "add", "double"]  # what any row may call: the parser reads all of them
    # every row calls add(3) on turn 0 and then answers
    sampler = scripted(lambda ctx: "done" if "<tool_result>" in ctx else "<tool_call>add: 3</tool_call>")
    ro = runner.run(
        sampler,
        [prompt("1=", answer="1", environment="add"), prompt("2=", answer="2", environment="dbl")],
        2,
        SamplingParams(),
    )
    assert [type(e.environment).__name__ for e in ro.episodes] == ["Adder", "Adder", "Doubler", "Doubler"]
    # reset(**row): the prompt and the data columns, not the routing column
    assert sorted(RESETS) == [("Adder", ["answer", "prompt"])] * 2 + [("Doubler", ["answer", "prompt"])] * 2
    # add exists only in the Adder rows: there it counts to 3; in the Doubler rows it is an unknown tool
    # (an error reply)
    assert [e.environment.count for e in ro.episodes[:2]] == [3, 3]
    assert [e.tool_errors for e in ro.episodes] == [0, 0, 1, 1]
    assert "not found" in ro.episodes[2].messages[1]["content"]


def test_a_rows_prompt_shows_its_environments_tools_and_unknown_names_are_refused():
    runner = EpisodeRunner(EpisodeSpec(tool_format="chat_template"), TOK, tools=[calculator], environment_factory=NAMED)
    names = lambda row: [s["function"]["name"] for s in runner.row_schemas(row)]  # noqa: E731
    assert names({"environment": "add"}) == ["calculator", "add"]
    assert names({"environment": "dbl"}) == ["calculator", "double"]
    with pytest.raises(ConfigError, match=r"Example has `environment='mul'`, .* Expected one of: \['add', 'dbl'\]\."):
        runner.row_schemas({"environment": "mul"})
    with pytest.raises(ConfigError, match=r"`environment=None`"):  # a row without the column names no environment
        runner.route({"prompt": "x"})
    one = EpisodeRunner(EpisodeSpec(tool_format="chat_template"), TOK, environment_factory=Adder)
    assert [s["function"]["name"] for s in one.row_schemas({"environment": "ignored"})] == [
        "add"
    ]  # one factory: no routing


def test_one_reward_per_environment_class_scoring_only_its_own_episodes():
    # two names for Adder give one reward (TRL deduplicates by exact class); Doubler has no get_reward, so none
    rewards = environment_rewards({"a": Adder, "b": Adder, "dbl": Doubler})
    assert [r.__name__ for r in rewards] == ["Adder"]
    adder, doubler = Adder(), Doubler()
    adder.count = 5

    class SubAdder(Adder):  # a subclass is not "exactly that class": no score, as TRL
        pass

    assert rewards[0]([None] * 3, environments=[adder, doubler, SubAdder()]) == [5.0, None, None]
    assert environment_rewards(Doubler) == [] and environment_rewards(None) == []
