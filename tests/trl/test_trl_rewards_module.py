"""grpokit.trl.rewards equals trl.rewards on a table of cases (TRL's run where it is installed), and the
hand-worked values hold without TRL."""

import pickle

import pytest

from grpokit.trl import rewards as ours


def _conv(*texts):
    return [[{"role": "assistant", "content": t}] for t in texts]


ACCURACY = [  # (completion text, gold solution, expected by hand: math-verify equality of the first boxed answer)
    (r"My answer is \boxed{\frac{1}{3}}", r"\frac{1}{3}", 1.0),
    (r"My answer is \boxed{\frac{1}{2}}", r"\frac{1}{3}", 0.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),  # equal values, written differently
    (r"so the result is $0.5$", r"$\frac{1}{2}$", 0.0),  # no box and no anchor phrase: nothing is extracted
    (r"\boxed{2} or maybe \boxed{3}", "$3$", 0.0),  # the first match decides
    ("no math here at all", "$7$", 0.0),
    (r"\boxed{7}", "not a number", None),  # the gold does not parse: the row is skipped
    (r"\boxed{10\%}", r"$10\%$", 1.0),
    # TRL's rule, kept: math-verify skips an empty box and takes the first box with a value
    ("I put the final answer in \\boxed{}. 2+3 = 5.\n\\boxed{5}", "$5$", 1.0),
    (r"so I write \boxed{ } with 5 inside: \boxed{5}", "$5$", 1.0),
    (r"\boxed{} \boxed{3} \boxed{5}", "$5$", 0.0),  # the first box with a value: 3
]
THINK = [  # (completion, expected by hand)
    ("<think>\nreason\n</think>\nanswer", 1.0),
    ("<think>reason</think>", 1.0),
    ("<think>\nreason\nanswer", 0.0),  # never closed
    (" <think>x</think>y", 0.0),  # must open at the start
    ("<think>a</think><think>b</think>", 0.0),  # a second <think>
    ("answer <think>x</think>", 0.0),
    ("<think>line1\nline2</think>\n\nmore\nlines", 1.0),
]
REASONING = [
    (r"<think> Reasoning </think> The final answer is \boxed{\frac{1}{3}}", r"\frac{1}{3}", 1.0),
    (r"<think> Reasoning </think> The final answer is \boxed{\frac{1}{2}}", r"\frac{1}{3}", 0.0),
    (r"<think> partial \boxed{\frac{1}{3}} but no end", r"\frac{1}{3}", 0.0),  # unfinished reasoning
    (r"<think> \boxed{2} </think> \boxed{3} </think> \boxed{4}", "$4$", 1.0),  # after the last delimiter
    (r"<think> x </think> \boxed{5}", "not a number", None),
]
LENGTHS = [[1] * n for n in (0, 3, 79, 80, 81, 90, 100, 101, 250)]


def _trl():
    try:
        import trl.rewards  # noqa: F401

        return trl.rewards
    except ImportError:
        return None


def test_accuracy_reward_by_hand_and_as_trl():
    texts, golds, expected = zip(*ACCURACY)
    got = ours.accuracy_reward(_conv(*texts), list(golds))
    assert got == list(expected)
    trl = _trl()
    if trl is not None:
        assert got == trl.accuracy_reward(_conv(*texts), list(golds))


def test_accuracy_reward_logs_trls_extra_columns():
    seen = {}
    ours.accuracy_reward(_conv(r"\boxed{1}", "x"), ["$1$", "nope"], log_extra=lambda k, v: seen.__setitem__(k, v))
    assert seen["solution"] == ["$1$", "nope"] and seen["gold_parsed"][1] == "[unparseable]"
    assert seen["answer_parsed"][1] == "[skipped]"
    trl = _trl()
    if trl is not None:
        theirs = {}
        trl.accuracy_reward(_conv(r"\boxed{1}", "x"), ["$1$", "nope"], log_extra=lambda k, v: theirs.__setitem__(k, v))
        assert theirs == seen


def test_reasoning_accuracy_reward_by_hand_and_as_trl():
    texts, golds, expected = zip(*REASONING)
    got = ours.reasoning_accuracy_reward(_conv(*texts), list(golds))
    assert got == list(expected)
    custom = ours.reasoning_accuracy_reward(_conv(r"a [END] \boxed{3}"), ["$3$"], reasoning_delimiters=["[END]"])
    assert custom == [1.0]
    trl = _trl()
    if trl is not None:
        assert got == trl.reasoning_accuracy_reward(_conv(*texts), list(golds))
        assert custom == trl.reasoning_accuracy_reward(
            _conv(r"a [END] \boxed{3}"), ["$3$"], reasoning_delimiters=["[END]"]
        )


def test_think_format_reward_by_hand_and_as_trl():
    texts, expected = zip(*THINK)
    assert ours.think_format_reward(_conv(*texts)) == list(expected)
    trl = _trl()
    if trl is not None:
        assert ours.think_format_reward(_conv(*texts)) == trl.think_format_reward(_conv(*texts))


def test_soft_overlong_punishment_by_hand_and_as_trl():
    f = ours.get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    # free up to 80 tokens, then (80 - L) / 20: 81 -> -0.05, 90 -> -0.5, 100 -> -1.0; beyond 100: -1.0
    assert f(LENGTHS) == [0.0, 0.0, 0.0, 0.0, -0.05, -0.5, -1.0, -1.0, -1.0]
    assert f.__name__ == "soft_overlong_punishment_reward"
    assert ours.get_soft_overlong_punishment(10, 0)([[1] * 10, [1] * 11]) == [0.0, -1.0]
    trl = _trl()
    if trl is not None:
        for L, cache in [(100, 20), (10, 0), (50, 50)]:
            assert ours.get_soft_overlong_punishment(L, cache)(LENGTHS) == trl.get_soft_overlong_punishment(L, cache)(
                LENGTHS
            )


def test_cosine_scaled_reward_by_hand_and_as_trl():
    f = ours.get_cosine_scaled_reward(max_len=100)
    completions = _conv(r"\boxed{\frac{1}{3}}", r"\boxed{\frac{1}{2}}", r"\boxed{1}", r"\boxed{1}", r"\boxed{2}")
    solution = [r"\frac{1}{3}", r"\frac{1}{3}", "$1$", "nope", "$1$"]
    ids = [[1] * 50, [1] * 50, [1] * 0, [1] * 5, [1] * 300]
    # half of max_len: cos(pi/2) = 0, so the middle of each range: 0.5 + 0.25 = 0.75, -0.5 - 0.25 = -0.75;
    # length 0 and correct: max_value_correct 1.0; unparseable gold: None; wrong and past max_len: -0.5
    got = f(completions, solution, ids)
    assert got == pytest.approx([0.75, -0.75, 1.0, None, -0.5]) and f.__name__ == "cosine_scaled_reward"
    trl = _trl()
    if trl is not None:
        for kw in [{}, dict(min_value_wrong=-2.0, max_value_wrong=-0.1, min_value_correct=0.2, max_value_correct=3.0)]:
            assert ours.get_cosine_scaled_reward(100, **kw)(completions, solution, ids) == trl.get_cosine_scaled_reward(
                100, **kw
            )(completions, solution, ids)


def test_repetition_penalty_reward_by_hand_and_as_trl():
    f = ours.get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0)
    cases = [[1, 2, 3, 4], [5, 5, 5, 5, 5], [1], [], [1, 2, 1, 2, 1, 2]]
    # [5]*5: 4 bigrams, 1 unique: -(1 - 1/4) = -0.75; [1,2,1,2,1,2]: 5 bigrams, 2 unique: -0.6
    assert f(cases) == pytest.approx([0.0, -0.75, 0.0, 0.0, -0.6])
    with pytest.raises(ValueError, match="max_penalty"):
        ours.get_repetition_penalty_reward(max_penalty=0.5)
    trl = _trl()
    if trl is not None:
        for n, p in [(2, -1.0), (3, -0.5), (1, -2.0)]:
            assert ours.get_repetition_penalty_reward(n, p)(cases) == trl.get_repetition_penalty_reward(n, p)(cases)


def test_every_trl_reward_exists_and_the_factories_pickle():
    trl = _trl()
    if trl is not None:
        import importlib

        module = importlib.import_module("trl.rewards")
        names: set = set()
        for group in getattr(module, "_import_structure", {}).values():
            names |= set(group)
        assert names and names <= set(ours.__all__)
    for f in (
        ours.get_soft_overlong_punishment(10, 2),
        ours.get_cosine_scaled_reward(10),
        ours.get_repetition_penalty_reward(),
    ):
        assert pickle.loads(pickle.dumps(f)).__name__ == f.__name__


def test_plain_text_completions_are_read_too():
    assert ours.think_format_reward(["<think>a</think>b"]) == [1.0]
    assert ours.accuracy_reward([r"\boxed{4}"], ["$4$"]) == [1.0]
