"""The interference finding and the per-domain report panels (record/domain_checks.py) on hand-made runs."""

from pathlib import Path

from grpokit.config.health import HealthConfig
from grpokit.record.domain_checks import check_interference, domain_panels
from grpokit.record.findings import DoctorConfig
from grpokit.record.report_data import Run


def run(math_acc, calc_acc, evals=(2, 4)):
    """A 4-step run of two domains, evaluated before, at ``evals`` and after (the last in summary.json)."""
    metrics = [
        {"step": s, "stage": 0 if s <= 2 else 1, "domain/math/reward": 0.5, "domain/calc/reward": 0.5}
        for s in range(1, 5)
    ]
    for i, s in enumerate(evals[:-1], start=1):
        metrics[s - 1].update({"eval/domain/math/accuracy": math_acc[i], "eval/domain/calc/accuracy": calc_acc[i]})
    before = {"domain/math/accuracy": math_acc[0], "domain/calc/accuracy": calc_acc[0]}
    after = {"domain/math/accuracy": math_acc[-1], "domain/calc/accuracy": calc_acc[-1]}
    return Run(Path("."), "r", metrics=metrics, summary={"eval_before": before, "eval_after": after, "steps": 4})


def test_one_domain_falling_while_another_rises_is_flagged_with_its_steps_and_stage():
    # math 0.40 -> 0.42 -> 0.30 (falls 0.12 between steps 2 and 4), calc 0.10 -> 0.12 -> 0.50 (rises 0.38)
    f = check_interference(run([0.40, 0.42, 0.30], [0.10, 0.12, 0.50]), HealthConfig(), DoctorConfig())
    assert f is not None and f.code == "domain_interference"
    assert "between step 2 and step 4 (train.stages 1)" in f.evidence
    assert "math 0.42 -> 0.3, of calc 0.12 -> 0.5" in f.evidence


def test_domains_rising_together_or_a_small_dip_are_not_flagged():
    assert check_interference(run([0.4, 0.5, 0.6], [0.1, 0.2, 0.3]), HealthConfig(), DoctorConfig()) is None
    # math dips 0.04 (under heldout_drop=0.05) while calc rises: not interference
    assert check_interference(run([0.40, 0.40, 0.36], [0.1, 0.1, 0.5]), HealthConfig(), DoctorConfig()) is None


def test_a_run_without_domains_has_no_finding_and_no_panels():
    plain = Run(Path("."), "p", metrics=[{"step": 1, "reward": 0.1}], summary={"eval_before": {"accuracy": 0.1}})
    assert check_interference(plain, HealthConfig(), DoctorConfig()) is None
    assert domain_panels(["reward", "eval/accuracy"]) == []


def test_panels_per_domain():
    names = [
        "reward",
        "domain/math/reward",
        "domain/math/accuracy",
        "domain/math/zero_std",
        "eval/domain/math/accuracy",
    ]
    assert domain_panels(names) == [
        {"id": "domain-0-0", "title": "Domain math: reward and accuracy", "keys": names[1:3] + names[4:]},
        {
            "id": "domain-0-1",
            "title": "Domain math: groups without signal (fractions)",
            "keys": ["domain/math/zero_std"],
        },
    ]
