"""maj@k votes on the answer the grader reads, equivalent answers pooled (cli/eval_votes.py, rewards/answer_keys.py).

Every case is worked by hand: the grades come from the real grader, the votes from eval_votes, maj@k from passk.
"""

import pytest

from grpokit.cli.eval_votes import RIGHT, vote_keys, votes_of
from grpokit.data.tasks.arithmetic import arithmetic_accuracy
from grpokit.record.passk import maj_at_k
from grpokit.rewards.answer_keys import answer_keys, value_key
from grpokit.rewards.answers import FinalAnswer
from grpokit.rewards.code import code_all_pass
from grpokit.rewards.grounding import box_iou_reward, choice_accuracy
from grpokit.rewards.math import math_accuracy


def _maj(grader, samples, gold, prompt="q"):
    """(grades, votes, maj@k over all samples) as grpokit eval computes them."""
    grades = grader(samples, [prompt] * len(samples), answer=[gold] * len(samples))
    ok = [g >= 1 - 1e-6 for g in grades]
    keys = vote_keys(votes_of(grader), samples, [prompt] * len(samples), ok)
    return grades, keys, maj_at_k(keys, ok, len(samples))


def test_nested_braces_are_read_and_the_right_answers_win():
    # before: \boxed{\frac{1}{2}} was not read (the box regex took no nested braces), so each of the three
    # right samples voted with its whole text (three different votes of 1) and the tie went to sample 1, \boxed{3}:
    # maj@4 = 0.0. Now the three right samples are one vote (3) against \boxed{3} (1): maj@4 = 1.0.
    samples = [
        "Guess: \\boxed{3}",
        "Half of one is \\boxed{\\frac{1}{2}}",
        "1/2, so \\boxed{\\frac{1}{2}}",
        "dividing: \\boxed{\\frac{1}{2}}",
    ]
    grades, keys, maj = _maj(math_accuracy, samples, "\\frac{1}{2}")
    assert grades == [0.0, 1.0, 1.0, 1.0]
    assert keys == [("wrong", "number 3"), RIGHT, RIGHT, RIGHT]
    assert maj == 1.0


def test_answers_after_a_phrase_vote_with_the_answer_not_the_whole_text():
    # before: each completion voted with its whole text (4 different votes), the tie went to sample 1 ("6",
    # right): maj@4 = 1.0. The grader reads "answer is 4" in the last three: three votes for 4 against one
    # for 6, so maj@4 = 0.0.
    samples = ["The answer is 6", "I think 5\nThe answer is 4", "ok so\nThe answer is 4", "hmm\nThe answer is 4"]
    grades, keys, maj = _maj(math_accuracy, samples, "6")
    assert grades == [1.0, 0.0, 0.0, 0.0]
    assert keys == [RIGHT, *[("wrong", "number 4")] * 3]
    assert maj == 0.0


def test_equivalent_wrong_answers_are_one_vote():
    # gold 3. Right: sample 1 and 5 (2 votes). Wrong: 0.5, 1/2 and \dfrac12, one value to math-verify: one
    # answer with 3 votes, which wins 3:2 -> maj@5 = 0.0. Before: three different strings of one vote each,
    # and "3" (2 votes) won -> 1.0.
    samples = ["\\boxed{3}", "\\boxed{0.5}", "\\boxed{1/2}", "\\boxed{\\dfrac12}", "\\boxed{3}"]
    grades, keys, maj = _maj(math_accuracy, samples, "3")
    assert grades == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert keys[1] == keys[2] == keys[3] == ("wrong", "number 0.5")
    assert maj == 0.0
    # and equivalent right answers are one vote whatever their form: 0.5, 1/2, \dfrac12 right (3) vs 7 (2)
    _, keys, maj = _maj(math_accuracy, ["\\boxed{7}", "\\boxed{0.5}", "\\boxed{1/2}", "\\boxed{\\dfrac12}", "7"], "1/2")
    assert keys == [("wrong", "number 7"), RIGHT, RIGHT, RIGHT, ("wrong", "number 7")] and maj == 1.0


def test_a_blank_slot_casts_no_vote_and_a_hedge_is_not_the_gold():
    # "so 42 \boxed{}" left its answer slot empty (answers.left_empty): no vote. The hedge's last box is the
    # gold but the grader scored it 0: it votes apart from the right sample. Votes: right 1, wrong "5" 1,
    # wrong-hedge "42" 1 -> tie of three, the first seen (the right sample, sample 2) wins -> 1.0.
    samples = ["so 42 \\boxed{}", "\\boxed{42}", "\\boxed{5}", "\\boxed{7} or rather \\boxed{42}"]
    grades, keys, maj = _maj(math_accuracy, samples, "42")
    assert grades == [0.0, 1.0, 0.0, 0.0]
    assert keys == [None, RIGHT, ("wrong", "number 5"), ("wrong", "number 42")]
    assert maj == 1.0


def test_lines_echoed_from_the_prompt_are_not_the_vote():
    # the grader drops lines copied from the prompt (>= 10 characters): the last line "Give the answer as
    # a number." is the prompt's, so the vote is 8 (the line before), as the grader reads it. Two wrong 8s
    # beat one right 9 -> 0.0.
    prompt = "What is 4+5?\nGive the answer as a number."
    samples = ["9", "8\nGive the answer as a number.", "8\nGive the answer as a number."]
    grades, keys, maj = _maj(math_accuracy, samples, "9", prompt)
    assert grades == [1.0, 0.0, 0.0] and keys[1:] == [("wrong", "number 8")] * 2 and maj == 0.0


@pytest.mark.parametrize(
    "a, b",
    [
        ("\\boxed{0.5}", "\\boxed{\\frac{1}{2}}"),  # math-verify parses both to the rational 1/2
        ("\\boxed{50\\%}", "\\boxed{0.5}"),  # a percentage: 50 * 1/100, simplified to 1/2
        ("\\boxed{x = 3}", "\\boxed{3}"),  # an assignment is its right side
        ("\\boxed{2(y+1)}", "\\boxed{2y+2}"),  # simplified formulas
        ("\\boxed{\\{2, 1\\}}", "\\boxed{\\{1, 2\\}}"),  # a set's elements are ordered
        ("\\boxed{\\sqrt{2}/2}", "\\boxed{0.7071068}"),  # numbers to 6 decimals: 0.707107 both
        ("\\boxed{3.0}", "\\boxed{3}"),
        ("\\boxed{10^{30}}", "The answer is 1000000000000000000000000000000"),  # integers exactly
    ],
)
def test_equal_values_have_one_key(a, b):
    from grpokit.rewards.answers import final_answer

    ka, kb = answer_keys([final_answer(a), final_answer(b)])
    assert ka == kb and ka.startswith(("number ", "sympy "))


def test_different_values_have_different_keys():
    from grpokit.rewards.answers import final_answer

    texts = ["\\boxed{1/2}", "\\boxed{1/3}", "\\boxed{10^{30}}", "\\boxed{10^{30}+1}", "\\boxed{2y}", "\\boxed{x<3}"]
    keys = answer_keys([final_answer(t) for t in texts])
    assert len(set(keys)) == len(texts)
    # no value to parse, or too big to check: the text, loosely normalised (spacing, $, case)
    no_value = [
        FinalAnswer("It is Paris", "last_line"),
        FinalAnswer("it is  paris.", "phrase"),
        FinalAnswer(None, "none"),
    ]
    assert answer_keys(no_value) == ["text itisparis", "text itisparis", None]
    assert answer_keys([FinalAnswer("9" * 5000, "boxed")])[0].startswith("text 999")


def test_value_key_of_numbers():
    import sympy

    assert value_key(sympy.Rational(1, 3)) == "number 0.333333"  # math-verify's float rounding: 6 places
    assert value_key(sympy.Float(-0.0000001)) == "number 0"  # -0.0 is 0
    assert value_key(sympy.Integer(7) + 2 * sympy.I) == "number 7 2i"
    assert value_key(sympy.Eq(sympy.Symbol("x"), sympy.Integer(4))) == "number 4"


def test_the_arithmetic_task_votes_on_its_first_tag_as_written():
    # arithmetic_accuracy reads the first <answer> tag exactly: "<answer>12</answer><answer>13</answer>" is 12.
    # Right: sample 1 (1 vote). Wrong: 12 twice (one as a second tag's first), "012" once (exact rule: not 12).
    samples = [
        "<answer>13</answer>",
        "<answer>12</answer>",
        "<answer>12</answer><answer>13</answer>",
        "<answer>012</answer>",
    ]
    grades = arithmetic_accuracy(None, samples, ["13"] * 4)
    ok = [g == 1.0 for g in grades]
    keys = vote_keys(votes_of(arithmetic_accuracy), samples, [None] * 4, ok)
    assert keys == [RIGHT, ("wrong", "12"), ("wrong", "12"), ("wrong", "012")]
    assert maj_at_k(keys, ok, 4) == 0.0  # 12 has 2 votes, 13 and 012 one each


def test_a_blank_arithmetic_tag_casts_no_vote():
    # extract_answer reads "" from "<answer></answer>" (and from "<answer> </answer>"), not None. Before, those
    # three blanks were one wrong vote ("wrong", "") with 3 votes against the right answer's 2: maj@5 = 0.0.
    # A blank slot casts no vote: the only votes are the right answer's 2 -> maj@5 = 1.0.
    samples = [
        "<answer></answer>",
        "<answer>13</answer>",
        "<answer> </answer>",
        "<answer></answer>",
        "<answer>13</answer>",
    ]
    grades = arithmetic_accuracy(None, samples, ["13"] * 5)
    ok = [g == 1.0 for g in grades]
    assert ok == [False, True, False, False, True]
    keys = vote_keys(votes_of(arithmetic_accuracy), samples, [None] * 5, ok)
    assert keys == [None, RIGHT, None, None, RIGHT]
    assert maj_at_k(keys, ok, 5) == 1.0


def test_an_empty_reading_casts_no_vote_whichever_grader_reads_it():
    # choice_accuracy reads no letters from "<answer>none</answer>" (""): no vote, like a blank tag; "(C)" is C.
    samples = ["<answer>none</answer>", "<answer></answer>", "(C)"]
    ok = [g == 1.0 for g in choice_accuracy(None, samples, ["B"] * 3)]
    assert vote_keys(votes_of(choice_accuracy), samples, [None] * 3, ok) == [None, None, ("wrong", "C")]


def test_a_choice_grader_votes_on_the_letters():
    samples = ["(B)", "A or B", "the answer: <answer>A</answer>", "<answer>B</answer>"]
    ok = [g == 1.0 for g in choice_accuracy(None, samples, ["B"] * 4)]
    assert ok == [True, False, False, True]
    assert vote_keys(votes_of(choice_accuracy), samples, [None] * 4, ok) == [
        RIGHT,
        ("wrong", "AB"),
        ("wrong", "A"),
        RIGHT,
    ]


def test_graders_without_one_answer_have_no_votes_and_others_say_what_they_vote_on():
    import functools

    assert votes_of(code_all_pass).keys is None and votes_of(box_iou_reward).keys is None
    assert votes_of(functools.partial(math_accuracy, allow_multiple=True)) is votes_of(math_accuracy)  # reward.params
    assert votes_of(code_all_pass).reads == "none: code_all_pass grades no one answer"
    assert votes_of(math_accuracy).reads.startswith("math_accuracy's final answer")

    def my_grader(completions, **kw):
        return [1.0] * len(completions)

    votes = votes_of(my_grader)  # a function grpokit does not know: the final answer as text, and it says so
    assert votes.reads == "the final answer as text (grpokit does not know how my_grader reads an answer)"
    assert vote_keys(votes, ["x\nThe answer is 5.", "so \\boxed{ 5 }"], [None] * 2, [False, False]) == [
        ("wrong", "5"),
        ("wrong", "5"),
    ]
