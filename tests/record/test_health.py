"""Health monitors: each fires on a synthetic run with its failure and stays quiet on a healthy run."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from grpokit.config.health import HealthConfig
from grpokit.record.health import (
    HealthEvent,
    HealthMonitor,
    TrainingHealthError,
    group_signatures,
    solved_signatures,
)
from grpokit.record.health_checks import MONITORS

STEPS = 60


def healthy(step: int, rng: random.Random) -> dict[str, float]:
    """A run that learns: reward rises, entropy drifts down gently, lengths and KL stay moderate."""
    noise = lambda scale: rng.uniform(-scale, scale)  # noqa: E731
    return {
        "reward": 0.2 + 0.6 * step / STEPS + noise(0.05),
        "entropy": 0.9 - 0.3 * step / STEPS + noise(0.05),
        "frac_reward_zero_std": 0.3 + noise(0.1),
        "completions/mean_length": 120 + 20 * step / STEPS + noise(5),
        "kl": 0.002 * step + noise(0.001),
        "clip_ratio/region_mean": 0.02 + noise(0.01),
        "completions/frac_groups_same_length": 0.05 + noise(0.05),
        "completions/frac_groups_same_text": 0.0,
        "rewards/failed_fraction": 0.0,
        "loss": 0.1 + noise(0.05),
        "grad_norm": 1.0 + noise(0.3),
    }


def run(
    make: Callable[[int, random.Random], dict[str, float]], cfg: HealthConfig | None = None
) -> tuple[list[HealthEvent], list[dict[str, float]]]:
    monitor = HealthMonitor(cfg or HealthConfig())
    rng = random.Random(0)
    events: list[HealthEvent] = []
    health_metrics = []
    for step in range(1, STEPS + 1):
        ev, hm = monitor.observe(make(step, rng), step)
        events += ev
        health_metrics.append(hm)
    return events, health_metrics


def with_failure(**override: Callable[[int], float]) -> Callable[[int, random.Random], dict[str, float]]:
    def make(step: int, rng: random.Random) -> dict[str, float]:
        m = healthy(step, rng)
        m.update({k: f(step) for k, f in override.items()})
        return m

    return make


def test_healthy_run_is_quiet() -> None:
    events, hms = run(healthy)
    assert events == []
    # Every monitor has data by the end and reports 0.0.
    assert hms[-1] == {"health/nonfinite": 0.0, **{f"health/{n}": 0.0 for n in MONITORS}}


# Each failure starts at step 30 so the monitors have a healthy early window to compare with.
FAILURES: dict[str, Callable[[int, random.Random], dict[str, float]]] = {
    # entropy decays 0.9 -> 0.01: falls below 0.2 x early (~0.9) and then below entropy_min.
    "entropy_collapse": with_failure(entropy=lambda s: 0.9 if s < 30 else max(0.9 * 0.8 ** (s - 30), 0.01)),
    "zero_std_groups": with_failure(frac_reward_zero_std=lambda s: 0.3 if s < 30 else 0.95),
    # length doubles (120 -> 240) while reward is stuck at 0.4.
    "length_inflation": with_failure(
        **{"completions/mean_length": lambda s: 120 if s < 30 else 240.0, "reward": lambda s: 0.4}
    ),
    "kl_runaway": with_failure(kl=lambda s: 0.01 if s < 30 else 0.01 * 1.3 ** (s - 30)),
    "clip_runaway": with_failure(**{"clip_ratio/region_mean": lambda s: 0.02 if s < 30 else 0.6}),
    "same_length": with_failure(**{"completions/frac_groups_same_length": lambda s: 0.05 if s < 30 else 0.9}),
    "same_text": with_failure(**{"completions/frac_groups_same_text": lambda s: 0.0 if s < 30 else 0.75}),
    "reward_failures": with_failure(**{"rewards/failed_fraction": lambda s: 0.0 if s < 30 else 0.25}),
}


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_monitor_fires_on_its_failure_only(name: str) -> None:
    events, hms = run(FAILURES[name])
    fired = {e.monitor for e in events}
    assert fired == {name}, f"expected only {name}, got {fired}"
    first = events[0]
    assert first.step > 30 and first.message.endswith(".") and ";" in first.message  # diagnosis; advice.
    assert hms[-1][f"health/{name}"] == 1.0
    # Warned once, not on every step while firing (repeat_every = 50 > 30 steps of failure).
    assert len(events) == 1


def test_warmup_silences_early_noise() -> None:
    # Terrible values from step 1, but nothing can fire before warmup_steps observations.
    cfg = HealthConfig(warmup_steps=15, window=5)
    monitor = HealthMonitor(cfg)
    for step in range(1, 15):
        events, hm = monitor.observe({"entropy": 0.0, "kl": 50.0, "frac_reward_zero_std": 1.0}, step)
        assert events == [] and hm == {}
    events, _ = monitor.observe({"entropy": 0.0, "kl": 50.0, "frac_reward_zero_std": 1.0}, 15)
    assert {e.monitor for e in events} == {"entropy_collapse", "kl_runaway", "zero_std_groups"}


def test_repeat_every_and_refire_after_quiet() -> None:
    monitor = HealthMonitor(HealthConfig(warmup_steps=1, window=1, repeat_every=3))
    kl = [2.0, 2.0, 2.0, 2.0, 0.1, 2.0]  # fires at 1, repeats at 4, quiet at 5, fires again at 6
    steps = [s for s, v in enumerate(kl, start=1) for e in monitor.observe({"kl": v}, s)[0]]
    assert steps == [1, 4, 6]
    assert monitor.counts["kl_runaway"] == 5


def test_nonfinite_streak_raises_after_k_and_resets() -> None:
    monitor = HealthMonitor(HealthConfig(max_nonfinite_steps=3))
    seq = [1.0, math.nan, math.nan, 0.5, math.inf, math.nan]  # streak: 0 1 2 0 1 2
    for step, loss in enumerate(seq, start=1):
        events, hm = monitor.observe({"loss": loss, "grad_norm": 1.0}, step)
        monitor.raise_if_fatal()
        assert hm["health/nonfinite"] == (0.0 if math.isfinite(loss) else 1.0)
    assert monitor.nonfinite_streak == 2
    events, _ = monitor.observe({"loss": 1.0, "grad_norm": math.nan}, 7)  # third in a row
    assert "3 of at most 3" in events[0].message
    with pytest.raises(TrainingHealthError, match=r"step 7: grad_norm=nan for 3 steps in a row"):
        monitor.raise_if_fatal()


def test_nonfinite_values_do_not_poison_other_monitors() -> None:
    monitor = HealthMonitor(HealthConfig(warmup_steps=2, window=2, max_nonfinite_steps=100))
    for step in range(1, 6):
        _, hm = monitor.observe({"kl": math.nan if step % 2 else 0.01, "loss": 0.1}, step)
    assert hm["health/kl_runaway"] == 0.0  # mean of the finite values only


def test_disabled_monitor_does_nothing() -> None:
    monitor = HealthMonitor(HealthConfig(enabled=False))
    for step in range(1, 10):
        assert monitor.observe({"loss": math.nan}, step) == ([], {})
    monitor.raise_if_fatal()


def test_config_validation_names_field() -> None:
    with pytest.raises(ValueError, match=r"health.window must be a positive integer, got 0"):
        HealthConfig(window=0)


def test_group_signatures_hand_worked() -> None:
    # G = 2: group 0 = ("a", "a") one text, one length; group 1 = ("b", "c") two texts, one length.
    assert group_signatures(["a", "a", "b", "c"], [3, 3, 2, 2], group_size=2) == {
        "completions/frac_groups_same_length": 1.0,
        "completions/frac_groups_same_text": 0.5,
    }
    # G = 3, 2 groups: lengths (1,2,3) differ, (5,5,5) agree -> 1/2; no group shares a text -> 0.
    sig = group_signatures(["x", "y", "z", "u", "v", "w"], [1, 2, 3, 5, 5, 5], group_size=3)
    assert sig == {"completions/frac_groups_same_length": 0.5, "completions/frac_groups_same_text": 0.0}
    assert group_signatures(["a", "b"], [1, 2], group_size=1)["completions/frac_groups_same_text"] == 0.0


def test_group_signatures_ignores_fully_truncated_groups() -> None:
    # G = 2: group 0 both cut at the limit (length 6, "length") -> truncation, not a signature;
    # group 1 both stopped at length 4 -> counts. same_length = 1/2.
    sig = group_signatures(
        ["aaaaaa", "bbbbbb", "abcd", "dcba"], [6, 6, 4, 4], 2, finish_reasons=["length", "length", "stop", "stop"]
    )
    assert sig["completions/frac_groups_same_length"] == 0.5


def test_group_signatures_validates() -> None:
    with pytest.raises(ValueError, match="cannot be split into groups of 2"):
        group_signatures(["a", "b", "c"], [1, 2, 3], group_size=2)
    with pytest.raises(ValueError, match="3 texts but 2 lengths"):
        group_signatures(["a", "b", "c"], [1, 2], group_size=3)
    with pytest.raises(ValueError, match="3 texts but 3 lengths and 1 finish reasons"):
        group_signatures(["a", "b", "c"], [1, 2, 3], group_size=3, finish_reasons=["stop"])


def test_group_signatures_ignore_short_shared_lengths():
    # group 0: two different 2-token answers (short: a number shares its length naturally) -> not counted
    # group 1: two different 20-token completions of one length -> counted; 1 of 2 groups -> 0.5
    sig = group_signatures(["ab", "cd", "x" * 20, "y" * 20], [2, 2, 20, 20], 2, min_length=16)
    assert sig["completions/frac_groups_same_length"] == 0.5
    assert group_signatures(["ab", "cd"], [2, 2], 2)["completions/frac_groups_same_length"] == 1.0


def converging(step: int, rng: random.Random) -> dict[str, float]:
    """A run that learns its task, shaped like `make train`: accuracy 0.3 -> ~0.97, so prompts get solved
    (their groups turn identical and all-correct) and entropy falls well below entropy_min."""
    acc = min(0.97, 0.3 + 0.03 * step) + rng.uniform(-0.02, 0.02)
    solved = max(0.0, (acc - 0.6) / 0.4)  # fraction of groups with every completion correct
    return {
        **healthy(step, rng),
        "reward": acc,
        "entropy": max(0.01, 0.12 - 0.003 * step),
        "frac_reward_zero_std": min(1.0, solved + 0.05),
        "completions/frac_groups_same_text": solved,
        "completions/reward_max": 1.0,
        "completions/reward_min": 0.0,
        "completions/frac_groups_solved": solved,
        "completions/frac_groups_same_text_solved": solved,
    }


def test_a_converging_run_says_converged_as_information_not_a_warning() -> None:
    events, hms = run(converging)
    assert [e for e in events if e.level != "info"] == []
    # same_text, zero_std_groups and entropy_collapse would all have fired without the solved metrics
    assert {e.monitor for e in events} == {"same_text", "zero_std_groups", "entropy_collapse"}
    assert all(e.message.startswith("Converged:") for e in events) and len(events) == 3  # once each
    assert hms[-1]["health/converged"] == 1.0 and hms[-1]["health/same_text"] == 0.0
    without = lambda s, r: {k: v for k, v in converging(s, r).items() if not k.startswith("completions/reward_")}  # noqa: E731
    assert {e.monitor for e in run(without)[0] if e.level == "warning"} == {
        "same_text",
        "zero_std_groups",
        "entropy_collapse",
    }


def test_a_few_solved_groups_under_the_limit_are_no_convergence() -> None:
    # A reward that scores few completions, rising slowly (0.02 -> 0.1, so the run learned): 31% of groups one
    # text, 1% of groups solved. Discounted, 30% <= same_text_max 0.3, so same_text does not fire; but 1 of 31
    # identical groups solved is no convergence (it needs half of them): no "Converged" information either.
    def few_solved(step: int, rng: random.Random) -> dict[str, float]:
        return {
            **healthy(step, rng),
            "reward": 0.02 + 0.08 * step / STEPS,
            "completions/frac_groups_same_text": 0.31,
            "completions/reward_max": 1.0,
            "completions/reward_min": 0.0,
            "completions/frac_groups_solved": 0.01,
            "completions/frac_groups_same_text_solved": 0.01,
        }

    events, hms = run(few_solved)
    assert [e for e in events if e.monitor == "same_text"] == [] and hms[-1]["health/same_text"] == 0.0
    assert not any(e.message.startswith("Converged") for e in events)


def collapsed(step: int, rng: random.Random) -> dict[str, float]:
    """Same signals from step 30, but the identical groups are wrong and the reward is low: a collapse."""
    m = converging(step, rng)
    if step >= 30:
        m.update(
            {
                "reward": 0.25,
                "completions/frac_groups_solved": 0.0,
                "completions/frac_groups_same_text_solved": 0.0,
                "entropy": 0.01,
                "frac_reward_zero_std": 0.9,
                "completions/frac_groups_same_text": 0.7,
            }
        )
    return m


def test_a_collapse_onto_wrong_answers_still_warns() -> None:
    events, _ = run(collapsed)
    warned = {e.monitor for e in events if e.level == "warning"}
    assert warned == {"same_text", "zero_std_groups", "entropy_collapse"}


def test_an_all_wrong_batch_is_not_solved() -> None:
    # Every completion of every step from 30 on gets 0 (so the batch's best is 0, every group "at the
    # batch best"), while the run once reached 1.0: those groups are not solved, the alarms warn.
    def all_wrong(step: int, rng: random.Random) -> dict[str, float]:
        m = collapsed(step, rng)
        if step >= 30:
            m.update(
                {
                    "reward": 0.0,
                    "completions/reward_max": 0.0,
                    "completions/frac_groups_solved": 1.0,
                    "completions/frac_groups_same_text_solved": 0.7,
                }
            )
        return m

    assert {e.monitor for e in run(all_wrong)[0] if e.level == "warning"} >= {"same_text", "zero_std_groups"}


def test_reward_failures_fire_without_warmup() -> None:
    monitor = HealthMonitor(HealthConfig(warmup_steps=10, window=5))
    events, hm = monitor.observe({"rewards/failed_fraction": 0.5}, 1)
    assert [e.monitor for e in events] == ["reward_failures"] and hm["health/reward_failures"] == 1.0
    assert "50% of reward items failed" in events[0].message


def test_reward_failures_count_zeroed_completions() -> None:
    # 4 prompts x G=8 = 32 items, one function: 3 failed (3/32) and 2 zeroed time-outs (2/32) per step,
    # 5/32 = 15.6% > reward_failure_max 10% from the first step; either alone (9.4%, 6.2%) stays quiet
    run_config = {"train": {"prompts_per_step": 4}, "rollout": {"group_size": 8}}
    row = {"rewards/failed_fraction": 3 / 32, "rewards/math/zeroed": 2.0, "rewards/math/timeouts": 2.0}
    events, hm = HealthMonitor(HealthConfig(), run_config=run_config).observe(row, 1)
    assert [e.monitor for e in events] == ["reward_failures"] and hm["health/reward_failures"] == 1.0
    assert "16% of reward items failed, or scored 0 for their own fault" in events[0].message
    assert (
        "(9% got failure_value" in events[0].message and "6% scored 0 for what the completion did" in events[0].message
    )
    for only in ({**row, "rewards/math/zeroed": 0.0}, {**row, "rewards/failed_fraction": 0.0}):
        assert HealthMonitor(HealthConfig(), run_config=run_config).observe(only, 1)[0] == []
    # without the batch size (a run_config that lacks it) the zeroed items cannot be a share: failures only
    assert HealthMonitor(HealthConfig()).observe(row, 1)[0] == []


def test_solved_signatures_hand_worked() -> None:
    # G = 2: group 0 ("a","a") rewards (1,1): solved, one text; group 1 (1,0): not solved;
    # group 2 ("d","d") (0,0): one text, not solved (0 is not the best, 1). -> 1/3 and 1/3.
    assert solved_signatures(["a", "a", "b", "c", "d", "d"], [1, 1, 1, 0, 0, 0], 2) == {
        "completions/reward_max": 1.0,
        "completions/reward_min": 0.0,
        "completions/frac_groups_solved": 1 / 3,
        "completions/frac_groups_same_text_solved": 1 / 3,
    }
    with pytest.raises(ValueError, match="2 texts but 3 rewards"):
        solved_signatures(["a", "b"], [1, 2, 3], 2)


def low_entropy_task(reward: Callable[[int], float]) -> Callable[[int, random.Random], dict[str, float]]:
    """Shaped like the calculator task: entropy starts near the floor (0.07) and drifts to 0.04 over
    the run (never below 0.2 x early ~ 0.0135), so only entropy_min (0.05) can trigger: one value is
    under it from s > 40 (0.07 - 0.0005 s < 0.05), the 10-step recent mean (centred on s - 4.5) from s >= 45."""
    return with_failure(entropy=lambda s: 0.07 - 0.0005 * s, reward=reward)


def test_entropy_under_the_floor_is_sharpening_while_the_reward_still_rises() -> None:
    # reward 0.3 + 0.01 s: each 10-step window averages 0.1 more than the one before (>= reward_flat_tol 0.05)
    events, hms = run(low_entropy_task(lambda s: 0.3 + 0.01 * s))
    assert events == [] and hms[-1]["health/entropy_collapse"] == 0.0


def test_entropy_under_the_floor_warns_once_the_reward_is_flat() -> None:
    # the same entropy, reward flat at 0.4: windows differ by 0 < 0.05, so the floor counts
    events, _ = run(low_entropy_task(lambda s: 0.4))
    assert [e.monitor for e in events if e.level == "warning"] == ["entropy_collapse"]
    # and a reward that rose, then stalled at 0.6 from step 30: quiet while rising, warns after it stops
    events, _ = run(low_entropy_task(lambda s: min(0.6, 0.3 + 0.01 * s)))
    warned = [e for e in events if e.level == "warning"]
    assert [e.monitor for e in warned] == ["entropy_collapse"] and warned[0].step >= 40
