"""One place decides a domain's grader (train/domain_setup.py:domain_graders): the held-out evaluation and
the per-step ``domain/<d>/accuracy`` read the same function."""

from __future__ import annotations

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.data.tasks.arithmetic import arithmetic_accuracy
from grpokit.train import domain_setup


def graders_of(*overrides):
    cfg = Config()
    apply_overrides(cfg, ["data.domains.add.task=arithmetic", *overrides])
    return domain_setup.domain_graders(cfg)


def test_a_task_domains_grader_is_its_verifier_wherever_it_stands_among_its_functions():
    """reward_functions [tag_count, task]: the grader is the task's verifier, the second function, whose
    training column is add/arithmetic_accuracy (before: the first function, tag_count, graded every step)."""
    spec, column = graders_of("data.domains.add.reward_functions=[tag_count, task]")["add"]
    assert spec.fn is arithmetic_accuracy and column == "add/arithmetic_accuracy"
    runners = domain_setup.domain_eval_runners({"add": (spec, column)})
    assert [s.fn for s in runners["add"].specs] == [arithmetic_accuracy]


def test_a_task_domain_without_task_among_its_functions_is_evaluated_by_the_verifier_and_warned_about(capsys):
    """reward_functions [tag_count]: the held-out set is graded by the verifier; no training column has it,
    so the domain gets no per-step accuracy and one warning says so."""
    graders = graders_of("data.domains.add.reward_functions=[tag_count]")
    assert graders["add"][0].fn is arithmetic_accuracy and graders["add"][1] is None
    assert domain_setup.training_graders(graders) == {}
    assert capsys.readouterr().out.count("domain/add/accuracy is not logged per step") == 1


def test_a_dataset_domains_grader_is_its_first_function(tmp_path):
    data = tmp_path / "own.jsonl"
    data.write_text('{"prompt": "p", "answer": "1"}\n')
    graders = graders_of(
        f"data.domains.own.dataset={data}", "data.domains.own.reward_functions=[math_accuracy, strict_format]"
    )
    assert domain_setup.training_graders(graders) == {"add": "add/arithmetic_accuracy", "own": "own/math_accuracy"}
