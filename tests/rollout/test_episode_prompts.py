"""Each episode's prompt with its environment's reset() observation (rollout/episode_starts.py): what the
reward functions get as ``prompts`` (rewards/inputs.py), as TRL appends the observation to the last message
of the prompt it passes them. Before, they got the dataset's prompt without it."""

import re

import pytest

from grpokit.data.observations import with_observation
from grpokit.rewards.inputs import reward_prompts
from grpokit.rollout.episodes import EpisodeRunner, EpisodeSpec
from grpokit.rollout.hf import SamplingParams
from grpokit.types import ObservedPrompt, Prompt
from helpers.episodes import TOK, Counter, ScriptedSampler, chat_tokenizer, ids

ANSWER = "<answer>0</answer><eos>"


def run(factory, prompt, G=2, spec=None, tok=TOK, render=None):
    seen = []
    sampler = ScriptedSampler(lambda ctx, g: seen.append(ctx) or ANSWER)
    runner = EpisodeRunner(spec or EpisodeSpec(max_turns=1, tool_format="tags"), tok, environment_factory=factory)
    runner.render_prompt = render
    return runner.run(sampler, [prompt], G, SamplingParams()), seen


def test_the_reward_functions_get_the_prompt_with_its_observation():
    # Counter.reset returns " go": the model saw "4= go", so do the reward functions (both conventions)
    text = Prompt("4=", ids("4="), {"answer": "4"}, "4=")
    ro, _ = run(Counter, text)
    assert [e.observed for e in ro.episodes] == [ObservedPrompt("4= go", "4= go")] * 2
    assert reward_prompts([text], 2, "grpokit", ro.episodes) == ["4= go", "4= go"]  # before: ["4=", "4="]
    assert reward_prompts([text], 2, "trl", ro.episodes) == ["4= go", "4= go"]
    # chat messages: TRL's form appends the observation to the last message's content
    chat = Prompt("4=", ids("4="), {"answer": "4"}, [{"role": "user", "content": "4="}])
    ro, _ = run(Counter, chat)
    assert reward_prompts([chat], 2, "trl", ro.episodes) == [[{"role": "user", "content": "4= go"}]] * 2
    assert reward_prompts([chat], 2, "trl", None) == [chat.raw] * 2  # plain completions: the dataset's prompt


def test_an_episode_whose_reset_returns_none_starts_from_the_bare_prompt():
    """TRL skips a None observation row by row; before, a group with one str() it into "4=None"."""

    class Sometimes(Counter):
        n = 0

        def reset(self, **row):
            Sometimes.n += 1
            self.count, self.target, self.done = 0, 9, False
            return None if Sometimes.n == 1 else " 12"

    Sometimes.n = 0  # the runner's probe instance is never reset
    p = Prompt("4=", ids("4="), {"answer": "4"}, "4=")
    with pytest.warns(UserWarning, match="different observations"):
        ro, seen = run(Sometimes, p)
    assert sorted(seen) == ["4=", "4= 12"]  # resets run side by side: which episode drew None is not fixed
    assert sorted(reward_prompts([p], 2, "grpokit", ro.episodes)) == ["4=", "4= 12"]
    assert sorted(e.observed is None for e in ro.episodes) == [False, True]


def test_a_failed_reset_leaves_the_bare_prompt():
    class Broken(Counter):
        def reset(self, **row):
            raise RuntimeError("no board")

    p = Prompt("4=", ids("4="), {"answer": "4"}, "4=")
    ro, _ = run(Broken, p, spec=EpisodeSpec(max_turns=1, tool_format="tags", max_failure_fraction=1.0))
    assert [e.observed for e in ro.episodes] == [None, None] and reward_prompts([p], 2, "trl", ro.episodes) == [
        "4="
    ] * 2


def test_a_rendered_prompt_is_the_text_the_chat_template_made_with_the_observation():
    from grpokit.config import DataConfig
    from grpokit.data import render_prompt

    tok = chat_tokenizer()
    question = [{"role": "user", "content": "4="}]
    text = render_prompt(question, tok, DataConfig())
    p = Prompt(text, list(tok(text, add_special_tokens=False)["input_ids"]), {"answer": "4"}, question)

    def render(raw, obs, schemas):
        return render_prompt(with_observation(raw, obs), tok, DataConfig(), schemas)

    spec = EpisodeSpec(max_turns=1, tool_format="chat_template")
    ro, _ = run(Counter, p, 1, spec, tok, render)
    shown = "<|im_start|>system\nTools: add<|im_end|>\n<|im_start|>user\n4= go<|im_end|>\n<|im_start|>assistant\n"
    assert ro.episodes[0].observed == ObservedPrompt(shown, [{"role": "user", "content": "4= go"}])
    assert ro.prompt_ids == [list(tok(shown, add_special_tokens=False)["input_ids"])]  # what the model saw


def test_an_observation_joins_typed_content_parts_as_one_more_text_part():
    # TRL: a list content gets [{"type": "text", "text": observation}] appended (before: str() of the list)
    parts = [{"role": "user", "content": [{"type": "text", "text": "play"}]}]
    assert with_observation(parts, " go") == [
        {"role": "user", "content": [{"type": "text", "text": "play"}, {"type": "text", "text": " go"}]}
    ]


def test_a_random_resets_observation_takes_nothing_from_the_models_token_budget():
    """Each episode's observation is its prompt, as TRL's: the model keeps all max_episode_tokens=3 of its turn
    ("<answer>", "0", "</answer>" of its 4-token answer, cut there). Before, the part of the observation the
    group did not share ("1" / "2" after "4= 1": one token) began each completion as environment tokens and
    counted against the cap, leaving the model 2."""

    class Random(Counter):
        n = 0

        def reset(self, **row):
            Random.n += 1
            self.count, self.target, self.done = 0, 9, False
            return f" 1{Random.n}"

    Random.n = 0
    p = Prompt("4=", ids("4="), {"answer": "4"}, "4=")
    with pytest.warns(UserWarning, match="different observations"):
        ro, seen = run(Random, p, spec=EpisodeSpec(max_turns=1, max_episode_tokens=3, tool_format="tags"))
    assert ro.model_lengths() == [3, 3] and ro.finish_reasons == ["length", "length"]
    assert ro.completion_ids == [ids("<answer>0</answer>")] * 2  # no environment token before the model's
    assert sorted(TOK.decode(ro.prompt_of(i)) for i in range(2)) == ["4= 11", "4= 12"]


class Parts(Counter):
    """reset() returns TRL's other form: a list of text content parts (before: joined as "4=[{'type': ...}]")."""

    board: object = [{"type": "text", "text": " 1"}, {"type": "text", "text": "2"}]

    def reset(self, **row):
        super().reset(**row)
        return Parts.board


def test_text_parts_from_reset_join_a_chat_prompt_as_parts_and_the_model_sees_their_text():
    chat = Prompt("4=", ids("4="), {"answer": "4"}, [{"role": "user", "content": "4="}])
    ro, seen = run(Parts, chat, G=1)
    # TRL: the string content becomes one text part, then the observation's parts follow it
    parts = [{"type": "text", "text": "4="}, {"type": "text", "text": " 1"}, {"type": "text", "text": "2"}]
    assert reward_prompts([chat], 1, "trl", ro.episodes) == [[{"role": "user", "content": parts}]]
    assert seen[0] == "4= 12"  # not rendered (tags): the parts' texts " 1" + "2" after the prompt
    assert ro.prompt_of(0) == ids("4= 12") and ro.episodes[0].observed.text == "4= 12"


@pytest.mark.parametrize(
    "board, words",
    [
        ([{"role": "user", "content": "go"}], "item 0 ({'role': 'user', 'content': 'go'}) is not a content part"),
        (["go"], "item 0 ('go') is not a content part"),  # TRL: TypeError in _tokenize_prompts
        ([{"type": "image", "image": "x.png"}], "a 'image' content part (item 0"),  # environments take no images
        (3, "returned a int (3)"),  # TRL: str + int, a TypeError
        ({"text": "go"}, "returned a dict"),
    ],
)
def test_a_reset_value_trl_cannot_join_is_refused_in_one_sentence(board, words):
    from grpokit.config.sections import ConfigError

    Parts.board = board
    chat = Prompt("4=", ids("4="), {"answer": "4"}, [{"role": "user", "content": "4="}])
    try:
        with pytest.raises(ConfigError, match=re.escape(words)):  # before: str() of it joined the prompt
            run(Parts, chat, G=1)
    finally:
        Parts.board = [{"type": "text", "text": " 1"}, {"type": "text", "text": "2"}]


def test_text_parts_after_a_text_prompt_are_refused():
    from grpokit.config.sections import ConfigError

    with pytest.raises(ConfigError, match="content parts for a prompt that is a text"):
        with_observation("4=", (" go",))  # TRL reads prompt[-1]["content"]: no message, no parts


def test_text_parts_are_cut_at_max_observation_chars_in_all():
    from grpokit.rollout.episode_starts import capped

    # 3 + 4 = 7 characters > 5: "abc" kept (2 left), "defg" cut after "de" and marked, "h" dropped
    assert capped(("abc", "defg", "h"), 5) == ("abc", "de...[truncated]")
    assert capped(("abc", "de"), 5) == ("abc", "de")  # exactly 5: not cut
    assert capped(("abc", "de"), 0) == ("abc", "de")  # 0: no cap
    assert capped(("abc", "defg"), 3) == ("abc", "...[truncated]")  # the cap falls between parts: the mark alone
