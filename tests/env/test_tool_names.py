"""Tools are called by name, and ``done`` is read as a flag: what would make either ambiguous is refused at
start in one sentence (before: a duplicate name was resolved silently, and a ``done`` method, always true as
a bound method, ended every episode after its first tool call and was offered to the model as a tool)."""

import pytest

from grpokit.config import ConfigError
from grpokit.env import calculator
from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
from grpokit.rollout.hf import SamplingParams
from grpokit.types import Prompt
from helpers.episodes import TOK, ScriptedSampler, ids

SPEC = EpisodeSpec(max_turns=5, tool_format="tags")


def other_calculator(expression: str) -> str:
    """Another tool under the same name.

    Args:
        expression: ignored.
    """
    return "999"


other_calculator.__name__ = "calculator"


class ShadowsCalculator:
    def reset(self, **row):
        return None

    def calculator(self, expression: str) -> str:
        """An environment method named as the standalone tool.

        Args:
            expression: ignored.
        """
        return "999"


class DoneMethod:
    def reset(self, **row):
        self.moves = 0

    def done(self) -> bool:
        return self.moves >= 3

    def move(self, m: str) -> str:
        """Play a move.

        Args:
            m: the move.
        """
        self.moves += 1
        return str(self.moves)


class DoneProperty(DoneMethod):
    done = property(DoneMethod.done)


def test_two_tools_with_one_name_are_refused():
    with pytest.raises(ConfigError, match=r"^two tools are named 'calculator'; tool names must be unique"):
        EpisodeRunner(SPEC, TOK, tools=[calculator, other_calculator])


def test_an_environment_method_named_as_a_standalone_tool_is_refused():
    with pytest.raises(ConfigError) as e:
        EpisodeRunner(SPEC, TOK, tools=[calculator], environment_factory=ShadowsCalculator)
    assert str(e.value) == (
        "the environment ShadowsCalculator's method 'calculator' has the same name as a tool passed in tools; "
        "tool names must be unique, so rename one of them"
    )
    with pytest.raises(ConfigError, match="ShadowsCalculator's method 'calculator'"):  # named environments too
        EpisodeRunner(SPEC, TOK, tools=[calculator], environment_factory={"a": ShadowsCalculator})


def test_done_as_a_method_is_refused_and_as_a_property_ends_the_episode_when_true():
    with pytest.raises(ConfigError, match="^the environment DoneMethod defines done as a method; done must be an"):
        EpisodeRunner(SPEC, TOK, environment_factory=DoneMethod)
    runner = EpisodeRunner(SPEC, TOK, environment_factory=DoneProperty)
    assert runner.tool_names == ["move"]  # a property is no tool
    always_move = ScriptedSampler(lambda ctx, g: "<tool_call>move: up</tool_call>")
    ro = runner.run(always_move, [Prompt("play", ids("play"), {}, "play")], 1, SamplingParams())
    # done after the third move (moves >= 3), within max_turns=5
    assert ro.finish_reasons == ["done"] and ro.episodes[0].environment.moves == 3 and ro.episodes[0].turns == 3
