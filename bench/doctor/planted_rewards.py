"""Reward functions of the doctor comparison's planted runs (bench/doctor_compare.py): each is a
fault a real run can have. Imported by `grpokit train` as `planted_rewards:NAME` with bench/doctor on
PYTHONPATH."""

import zlib

from grpokit.data.tasks.arithmetic import arithmetic_accuracy


def always_zero(prompts, completions, **kwargs):
    """A verifier that never matches (a wrong answer column, a parser that never fires)."""
    return [0.0 for _ in completions]


def length_only(prompts, completions, **kwargs):
    """A length reward alone: paid for characters, not for the answer (the demo's completions run to
    about 20 characters of 8 tokens; capped at 1 at 40)."""
    return [min(1.0, len(c) / 40) for c in completions]


def constant_one(prompts, completions, **kwargs):
    """A format term every completion earns: it adds the same to every member of a group."""
    return [1.0 for _ in completions]


def flaky_task(prompts, completions, answer, **kwargs):
    """The task's reward, but the verifier crashes on about 30% of completions (by a hash of the text)."""
    scores = arithmetic_accuracy(prompts, completions, answer)
    if any(zlib.crc32(f"{p}|{c}".encode()) % 10 < 3 for p, c in zip(prompts, completions)):
        raise RuntimeError("verifier crashed")  # the whole call fails: every item of it is a counted failure
    return scores
