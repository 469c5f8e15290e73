"""The doctor's advice reads the run's evidence and config (record/config_advice.py): a zero gradient is put down
to what each step's own metrics show, and a setting the run already has is never advised."""

from __future__ import annotations

from pathlib import Path

from grpokit.record.doctor import diagnose
from grpokit.record.report_data import load_run
from helpers.doctor_runs import healthy_rows, sick, write_run

# A real 12-step run (/tmp/hD/s2/trunc_mask.sh: group_size 4, 2 prompts a step, max_new_tokens 3,
# algo.mask_truncated=true): per step frac_reward_zero_std, completions/clipped_ratio, grad_norm as it logged them.
TRUNCATED_RUN = [
    (1.0, 0.875, 0.0),
    (0.0, 0.875, 0.764),
    (0.5, 1.0, 0.0),
    (0.5, 1.0, 0.0),
    (1.0, 1.0, 0.0),
    (1.0, 1.0, 0.0),
    (0.0, 1.0, 0.0),
    (0.0, 0.875, 1.51),
    (0.5, 0.625, 0.706),
    (0.5, 0.75, 0.0),
    (1.0, 0.75, 0.0),
    (1.0, 1.0, 0.0),
]


def _truncated_run(tmp_path: Path, mask: bool) -> Path:
    rows = [
        {
            "step": s,
            "frac_reward_zero_std": z,
            "completions/clipped_ratio": c,
            "grad_norm": g,
            "reward": 0.1,
            "loss": 0.0,
            "completions/mean_length": 3.0,
        }
        for s, (z, c, g) in enumerate(TRUNCATED_RUN, 1)
    ]
    config = f"algo:\n  mask_truncated: {str(mask).lower()}\nrollout:\n  max_new_tokens: 3\n  group_size: 4\n"
    return write_run(tmp_path / f"mask-{mask}", rows, config=config)


def _finding(path: Path, code: str):
    return next(f for f in diagnose(load_run(path)) if f.code == code)


def test_zero_gradient_steps_of_a_masked_truncated_run_name_the_mask(tmp_path: Path) -> None:
    """9 of 12 steps have grad_norm 0. Steps 3, 4, 7, 10 had groups with signal (frac_reward_zero_std 0.5 or 0)
    and truncated completions (clipped_ratio 1, 1, 1, 0.75) under algo.mask_truncated=true: the mask is the cause,
    an error (0.85) that does not advise dynamic sampling first; steps 1, 5, 6, 11, 12 scored alike (1.0)."""
    f = _finding(_truncated_run(tmp_path, mask=True), "zero_grad_steps")
    assert (f.level, f.score) == ("error", 0.85)
    assert f.title.endswith(": truncated completions masked out of the loss")
    assert f.evidence == (
        "grad_norm is exactly 0 at 9 of 12 steps (75%); at 4 of them (steps 3, 4, 7, 10) groups had signal but "
        "algo.mask_truncated=true left their truncated completions out of the loss (completions/clipped_ratio > 0); "
        "at 5 of them (steps 1, 5, 6, 11, 12) every group scored alike (frac_reward_zero_std 1)"
    )
    assert f.advice.startswith(
        "truncation masking is the cause there: raise rollout.max_new_tokens (now 3) so completions finish, "
        "or set algo.mask_truncated=false"
    )


def test_truncated_completions_under_the_mask_are_an_error_and_the_mask_is_not_advised(tmp_path: Path) -> None:
    """The window of a 12-step run is max(2, min(10, 12 // 3)) = 4: steps 9-12, clipped 0.625, 0.75, 0.75, 1.0,
    mean 0.78 > 0.5 with the mask on: an error that names it; without it, masking is still a choice to offer."""
    f = _finding(_truncated_run(tmp_path, mask=True), "truncated")
    assert (f.level, f.title) == ("error", "Many completions are cut at the length limit and masked out of the loss")
    assert f.evidence.startswith("78% of completions truncated (steps 9-12); algo.mask_truncated=true leaves them")
    assert "algo.mask_truncated=true)" not in f.advice and "set algo.mask_truncated=false" in f.advice
    f = _finding(_truncated_run(tmp_path, mask=False), "truncated")
    assert f.level == "warning" and f.advice.endswith("mask truncated ones (algo.mask_truncated=true)")
    # without the mask the same zero-gradient steps with signal are not put down to it
    z = _finding(_truncated_run(tmp_path, mask=False), "zero_grad_steps")
    assert "at 4 of them (steps 3, 4, 7, 10) groups had signal (frac_reward_zero_std < 1) and still no" in z.evidence


def test_dynamic_sampling_is_not_advised_to_a_run_that_has_it(tmp_path: Path) -> None:
    rows = [r | {"frac_reward_zero_std": 0.95} for r in healthy_rows()]
    on = write_run(tmp_path / "on", rows, config="algo:\n  dynamic_sampling: true\n  max_sampling_rounds: 4\n")
    f = _finding(on, "zero_std_groups")
    assert "use dynamic sampling" not in f.advice
    assert f.advice.startswith("dynamic sampling is on (algo.dynamic_sampling=true) and still found too few groups")
    assert "raise algo.max_sampling_rounds (now 4)" in f.advice
    off = write_run(tmp_path / "off", rows, config="algo:\n  dynamic_sampling: false\n")
    assert _finding(off, "zero_std_groups").advice.startswith("use dynamic sampling (algo.dynamic_sampling=true")


def test_clipping_and_precision_advice_follow_the_config(tmp_path: Path) -> None:
    spikes = [r | ({"grad_norm": 50.0} if r["step"] in (30, 45) else {}) for r in healthy_rows()]
    off = write_run(tmp_path / "off", spikes, config="optim:\n  max_grad_norm: 0.0\nmodel:\n  dtype: float16\n")
    advice = _finding(off, "grad_spikes").advice
    assert "turn gradient clipping on (optim.max_grad_norm is 0: off" in advice and "keep gradient" not in advice
    assert "train in bfloat16 rather than float16 (model.dtype=bfloat16)" in advice
    on = write_run(tmp_path / "on", spikes, config="optim:\n  max_grad_norm: 1.0\nmodel:\n  dtype: bfloat16\n")
    advice = _finding(on, "grad_spikes").advice
    assert "keep gradient clipping on (optim.max_grad_norm=1" in advice and "fp16" not in advice
    # a run read without its config (a TRL output_dir) gets the general wording
    assert "prefer bf16 over fp16" in _finding(write_run(tmp_path / "bare", spikes, config=""), "grad_spikes").advice


def test_runaway_advice_asks_for_fewer_iterations_only_where_there_are_several(tmp_path: Path) -> None:
    run = sick(tmp_path, kl=lambda s, r: 0.01 * 1.2 ** (s - 20))  # 0.01 x 1.2^40 = 15 > kl_max 1
    (run / "config.yaml").write_text("algo:\n  num_iterations: 1\n")
    assert "fewer updates per batch" not in _finding(run, "kl_clip_runaway").advice
    (run / "config.yaml").write_text("algo:\n  num_iterations: 4\n")
    assert "fewer updates per batch (algo.num_iterations=4)" in _finding(run, "kl_clip_runaway").advice


def test_mismatch_and_throughput_advice_name_what_the_run_already_does(tmp_path: Path) -> None:
    run = sick(tmp_path, **{"mismatch/logp_abs_diff_mean": 0.2})
    (run / "config.yaml").write_text("rollout:\n  tis_cap: 2.0\n")
    advice = _finding(run, "sampler_mismatch").advice
    assert "truncated importance sampling weights the loss already (rollout.tis_cap=2)" in advice
    slow = sick(tmp_path / "slow", **{"time/reward": 3.0, "time/step": lambda s, r: 5.0})
    (slow / "config.yaml").write_text("reward:\n  num_workers: 4\n")
    assert _finding(slow, "throughput").advice == (
        "make the reward functions cheaper (they run in reward.num_workers=4 worker processes)"
    )
