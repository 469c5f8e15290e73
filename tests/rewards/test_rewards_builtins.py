"""Built-in rewards with hand-worked expected values (the arithmetic is in the comments)."""

import time

import pytest

from grpokit.rewards.format import reasoning_steps, strict_format, tag_count
from grpokit.rewards.length import cosine_length, length_penalty, overlong_penalty, repetition_penalty
from helpers.verifier_answers import SLOW_ANSWER


def test_strict_format():
    good = "<think>2+2 is 4</think>\n<answer>4</answer>\n"
    assert strict_format([good]) == [1.0]
    assert strict_format(["<think>a</think><answer>4</answer> and more"]) == [0.0]  # text after
    assert strict_format(["<think>a<answer>1</answer></think><answer>4</answer>"]) == [0.0]  # tags inside
    assert strict_format(["<answer>4</answer>"]) == [0.0]
    assert strict_format([[{"role": "assistant", "content": good}]]) == [1.0]  # conversational form


def test_tag_count_partial_credit():
    # 0.25 per tag seen exactly once
    assert tag_count(["<think>x</think>"]) == [0.5]
    assert tag_count(["<think>x</think><answer>y</answer>"]) == [1.0]
    assert tag_count(["<think><think></think>"]) == [0.25]  # <think> twice earns nothing


def test_reasoning_steps_capped():
    assert reasoning_steps(["Step 1: a\nStep 2: b"]) == [pytest.approx(2 / 3)]
    assert reasoning_steps(["1. a\n2. b\n3. c\n4. d"]) == [1.0]  # 4 markers, capped at 3
    assert reasoning_steps(["First, x. Then, y."], cap=4) == [0.5]
    assert reasoning_steps(["no steps here"]) == [0.0]


def test_cosine_length():
    ids = lambda n: [0] * n  # noqa: E731
    # L=0: c=1 -> short value; L=max: c=0 -> long value; L=max/2: c=(1+cos(pi/2))/2=0.5
    out = cosine_length(
        ["a"] * 5,
        completion_ids=[ids(0), ids(10), ids(5), ids(5), ids(99)],
        max_length=10,
        correct=[True, True, True, False, True],
    )
    # correct L=5: 0.5 + (1.0-0.5)*0.5 = 0.75; wrong L=5: -0.5 + (-1.0+0.5)*0.5 = -0.75; L=99 clamps to 0.5
    assert out == pytest.approx([1.0, 0.5, 0.75, -0.75, 0.5])
    assert cosine_length(["a"], completion_ids=[[1]], correct=[None]) == [None]


def test_repetition_penalty():
    # bigrams of "a b a b a b": ab ba ab ba ab -> 5 total, 2 distinct -> -(1 - 2/5) = -0.6
    assert repetition_penalty(["a b a b a b"], ngram_size=2) == [pytest.approx(-0.6)]
    assert repetition_penalty(["one two"], ngram_size=3) == [0.0]  # fewer words than n
    assert repetition_penalty(["a b c d"], ngram_size=2) == [0.0]  # all distinct


def test_length_penalty_kimi_relative_to_group():
    # group lengths 2, 4, 6: lam = 0.5 - (L-2)/4 = 0.5, 0.0, -0.5; wrong answers get min(0, lam)
    out = length_penalty(
        ["a"] * 6,
        completion_ids=[[0] * n for n in (2, 4, 6, 2, 4, 6)],
        group_size=3,
        correct=[True, True, True, False, False, False],
    )
    assert out == [0.5, 0.0, -0.5, 0.0, 0.0, -0.5]
    assert length_penalty(["a", "b"], completion_ids=[[0], [1]], group_size=2, correct=[1, 1]) == [0.0, 0.0]


def test_overlong_penalty_dapo():
    # L_max=8, L_cache=4: 0 up to 4, then (4 - L)/4, -1 beyond 8
    out = overlong_penalty(["x"] * 5, completion_ids=[[0] * n for n in (3, 4, 6, 8, 9)], max_length=8, cache_length=4)
    assert out == [0.0, 0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError, match="cache_length <= max_length"):
        overlong_penalty(["x"], completion_ids=[[0]], max_length=4, cache_length=8)


def test_math_accuracy_and_power_tower_is_cut_off():
    from grpokit.rewards.math import MathVerifyPool

    with MathVerifyPool(num_workers=1, timeout_s=1.5) as pool:
        assert pool.verify(["1/2", "3"], ["so $\\boxed{0.5}$", "<answer>4</answer>"]) == [1.0, 0.0]
        start = time.monotonic()
        # sympy would spend forever on this tower: it is refused from the text (answer_limits.py), a
        # counted 0.0 at once, no worker killed
        assert pool.verify(["1"], ["$\\boxed{9^{9^{9^{9^{9}}}}}$"]) == [0.0] and pool.limits == 1
        assert time.monotonic() - start < 4.0
        # 28 CPU seconds of sympy under every text limit: the budget kills and replaces the worker
        (out,) = pool.verify(["1"], [SLOW_ANSWER])
        assert out == 0.0 and type(out) is float
        # one worker killed at the budget; two when a loaded machine starved the first try past WALL_FACTOR
        # budgets of wall time (the machine's fault: retried once, pool.py)
        assert pool.timeouts == 1 and pool.pool.restarts in (1, 2)
        assert pool.verify(["2"], ["<answer>2</answer>"]) == [1.0]  # later items still verify


def test_validate_gold_answers_reports_bad_golds():
    from grpokit.rewards import validate_gold_answers

    report = validate_gold_answers(["42", "\\frac{1}{3}", "", None])
    assert not report.ok and report.num_valid == 2
    assert [i for i, _, _ in report.invalid] == [2, 3]
    assert "2 of 4 gold answers do not parse" in report.message()


def test_a_gold_that_parses_to_its_text_alone_is_no_gold():
    """math-verify parses "???" to the string "???" and nothing else: only the same punctuation could match,
    so every answer scored 0. It is now reported at load and answers None (not applicable), as "" does."""
    from grpokit.rewards import validate_gold_answers
    from grpokit.rewards.math import math_accuracy

    report = validate_gold_answers(["???", "-", "x", "70"])
    assert [(i, why) for i, _, why in report.invalid] == [
        (0, "math-verify found no mathematical value in it"),
        (1, "math-verify found no mathematical value in it"),
    ]
    answer = ["???", "70"]
    assert math_accuracy(prompts=["p", "p"], completions=["<answer>70</answer>"] * 2, answer=answer) == [None, 1.0]


@pytest.mark.parametrize("failure", ["machine", "fatal"])
def test_validate_gold_answers_raises_when_a_gold_could_not_be_checked(monkeypatch, failure):
    """A gold no worker began (the machine's failure) or a broken math-verify is nobody's bad gold: calling
    it invalid would drop a good row from the run's scoring without a word about why."""
    from grpokit.rewards import math as rmath
    from grpokit.rewards.errors import RewardInfrastructureError
    from grpokit.rewards.pool import Outcome, WorkerPool

    real_run = WorkerPool.run

    def second_not_begun(self, tasks, timeout_s):
        outcomes = real_run(self, tasks, timeout_s)
        bad = Outcome(False, error="no math-verify worker began the task within 120 s, twice", kind="machine")
        if failure == "fatal":
            bad = Outcome(False, error="math-verify could not be imported", fatal=True)
        return [outcomes[0], bad, *outcomes[2:]]

    monkeypatch.setattr(WorkerPool, "run", second_not_begun)
    with pytest.raises(
        RewardInfrastructureError, match=r"gold answer 1 \('7'\) could not be checked: .*nobody judged invalid"
    ):
        rmath.validate_gold_answers(["42", "7", "x+1"])


def test_conversations_are_graded_on_the_models_own_last_message():
    """An episode's conversation: only the model's last message is its answer. One that ends on a tool's
    message (ended by env.max_turns / done / a terminal tool error / the tool time) or on a turn that calls a
    tool has none: "" for the graders, 0.0 for math_accuracy even when the tool's result equals the gold."""
    from grpokit.rewards.inputs import model_answer
    from grpokit.rewards.math import completion_text, math_accuracy

    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "c"}}]}
    tool = {"role": "tool", "name": "c", "content": "3876"}
    final = {"role": "assistant", "content": "<answer>3876</answer>"}
    assert completion_text("<answer>3876</answer>") == "<answer>3876</answer>"  # plain text as it is
    assert completion_text([call, tool, final]) == "<answer>3876</answer>"
    assert completion_text([call, tool]) == "" and model_answer([call, tool]) is None  # ends on the tool's message
    assert completion_text([call, tool, {**call, "content": "3876"}]) == ""  # a turn that calls a tool: no answer
    assert completion_text([{"content": "3876"}]) == "3876"  # no role: the model's (a user's own list)
    assert model_answer([]) is None
    assert math_accuracy(completions=[[call, tool], [call, tool, final]], answer=["3876", "3876"]) == [0.0, 1.0]
    assert strict_format([[call, {"role": "tool", "content": "<think>a</think>\n<answer>4</answer>\n"}]]) == [0.0]
