"""Tampering with the sandbox's result channel scores 0, never an exception or a NaN.

Four ways a program in call mode (it shares the harness's process) can write on descriptor 3, each
followed by an honest or a wrong solution: forged records, a recursion bomb (a record nested 200,000
deep), pickled payloads, a flood on the descriptor. Each scores 0.0 as a plain float to a direct
caller (code_pass_fraction used to raise SandboxTampering, which TRL would have let end the step or
drop the completion), and RewardRunner counts it as ``tampering``, not as a failure of the function.
"""

from __future__ import annotations

import pytest

from grpokit.rewards.calls import collecting_faults
from grpokit.rewards.code import code_pass_fraction, probe
from grpokit.rewards.runner import RewardRunner
from grpokit.rewards.spec import RewardSpec

ok, why = probe()
pytestmark = pytest.mark.skipif(not ok, reason=f"sandbox isolation unavailable on this host: {why}")

CASES = [{"fn": "f", "args": [1], "expected": 2}, {"fn": "f", "args": [3], "expected": 6}]
HONEST = "def f(x):\n    return 2 * x\n"
TAMPERING = {
    "forged records": (
        "import os\n"
        'os.write(3, b\'{"case": 0, "status": "ok", "value": 2}\\n{"case": 1, "status": "ok", "value": 6}\\n\')\n'
        "def f(x):\n    return 0\n"
    ),
    "recursion bomb": 'import os\nos.write(3, b"[" * 200000 + b"]" * 200000 + b"\\n")\n' + HONEST,
    "pickled payload": (
        'import os, pickle\nos.write(3, pickle.dumps({"case": 0, "status": "ok", "value": 2}) + b"\\n")\n' + HONEST
    ),
    "flood": "import os\ndef f(x):\n    os.write(3, b'x' * (8 << 20))\n    return 2 * x\n",
}


def _fenced(program: str) -> str:
    return f"```python\n{program}```"


def test_tampering_programs_score_zero_directly_and_honest_ones_one():
    programs = [*TAMPERING.values(), HONEST]
    with collecting_faults() as faults:
        out = code_pass_fraction([_fenced(p) for p in programs], [CASES] * len(programs), wall_s=10)
    assert out == [0.0, 0.0, 0.0, 0.0, 1.0] and all(type(v) is float for v in out)
    assert sorted(faults) == [0, 1, 2, 3] and {k for k, _ in faults.values()} == {"tampering"}


@pytest.mark.parametrize("workers", [0, 1])
def test_tampering_is_counted_by_kind_through_the_runner(workers):
    programs = [*TAMPERING.values(), HONEST, HONEST, HONEST, HONEST]  # two groups of 4
    with RewardRunner([RewardSpec(code_pass_fraction, "code")], num_workers=workers, timeout_s=120) as runner:
        res = runner.score(["p"] * 8, [_fenced(p) for p in programs], [[1]] * 8, 4, {"test_cases": [CASES] * 8})
    m = res.metrics
    assert res.total_N.tolist() == [0.0] * 4 + [1.0] * 4
    assert m["rewards/code/tampering"] == 4.0 and m["rewards/code/zeroed"] == 4.0
    assert m["rewards/code/failures"] == 0.0 and m["rewards/failed_fraction"] == 0.0
    assert m["rewards/code/mean"] == 0.5  # the tamperers' zeros are scores, in the mean as a wrong answer's


def test_a_program_past_its_limits_is_counted_as_limits():
    slow = "import time\ndef f(x):\n    time.sleep(60)\n"
    with collecting_faults() as faults:
        assert code_pass_fraction([_fenced(slow), _fenced(HONEST)], [CASES] * 2, wall_s=1) == [0.0, 1.0]
    assert list(faults) == [0] and faults[0][0] == "limits" and "wall_s=1" in faults[0][1]
