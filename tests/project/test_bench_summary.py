"""bench/compare_trl.py's summary of a side's steps: an asynchronous side samples outside the step, so its wait is
no rollout phase, it has no in-step tokens/s, and its training seconds leave the wait out (hand-worked figures)."""

import sys

from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import compare_trl  # noqa: E402


def _run(first: str, sampler_tok_s=None) -> dict:
    step = {
        "step_s": 2.0,
        "phases": {first: 0.5, "ref_fwd": 0.0, "policy_fwd": 0.5, "update_rest": 1.0},
        "gen_tokens": 1000,
        "prompts": 4,
        "flops": {"rollout": 1.0e12, "ref": 0.0, "train": 3.0e12},
        "sampler_tok_s": sampler_tok_s,
    }
    return {"steps": [step], "peak_rss_mb": 1.0}


def test_a_synchronous_side_times_its_rollout_in_the_step():
    s = compare_trl.summarise([_run("rollout")], peak_gflops=4000.0)
    assert s["gen_tok_s"] == 1000 / 0.5 and s["sampler_tok_s"] is None
    assert s["train_s"] == 1.5 and s["train_frac_peak"] == 3.0e12 / 1.5 / 1e9 / 4000.0  # 0.5
    assert compare_trl._tok(s) == "2000"


def test_an_asynchronous_side_waits_and_its_sampler_thread_is_timed_apart():
    s = compare_trl.summarise([_run("rollout_wait", sampler_tok_s=4000.0)], peak_gflops=4000.0)
    assert s["gen_tok_s"] is None and s["sampler_tok_s"] == 4000.0
    assert s["train_s"] == 1.5 and s["train_frac_peak"] == 0.5  # the wait is not training
    assert compare_trl._tok(s) == "async (4000)"
    assert compare_trl._tok(compare_trl.summarise([_run("rollout_wait")], 4000.0)) == "async"  # worker processes
