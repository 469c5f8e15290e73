"""Every value TRL accepts, with TRL's meaning (issue 46, deliverable 5).

values_table.json holds, for each boundary value of each field of TRL's GRPOConfig (trl_values.py), TRL's
verdict (its GRPOConfig, and a 1-step run of its GRPOTrainer where grpokit once refused the value:
bench/trl_values_oracle.py), grpokit.trl's verdict and the reason. The first test walks every pair through
grpokit's GRPOConfig and mapping (no model, no trl needed) and checks the table; the last checks that the
TRL side of the table still is what the installed TRL says.
"""

from __future__ import annotations

import collections
import json

import pytest
from trl_values import boundary_values, grpokit_verdict, load_table, trl_verdict

ROWS = load_table()


def test_grpokit_verdicts_are_the_tables():
    changed = []
    for r in ROWS:
        verdict, why = grpokit_verdict(r["field"], r["value"])
        if verdict != r["grpokit"]:
            changed.append((r["field"], r["value"], r["grpokit"], verdict, why))
    assert not changed, (
        f"{len(changed)} verdicts differ from values_table.json (rerun bench/trl_values_oracle.py): "
        + (json.dumps(changed[:10]))
    )


def test_every_value_trl_runs_with_is_accepted_or_has_a_reason():
    """TRL is the oracle: a value its 1-step run trains with is accepted, or refused because TRL misbehaves on it
    (the refusal says so), or is listed as open with why; a value TRL fails on may be refused."""
    kinds = collections.Counter()
    for r in ROWS:
        if r["trl_config"] == "refuse":
            assert not r["trl_run"]  # never run: TRL's own GRPOConfig refuses it
            continue
        if r["trl_run"] == "runs" and r["grpokit"] == "refuse":
            assert r["reason"].split(":")[0] in ("refused", "open"), r
            if r["reason"].startswith("refused"):
                assert "TRL runs" in r["grpokit_why"], r  # the sentence says TRL runs it and what it does
        if r["trl_run"] == "fails" and r["grpokit"] == "refuse":
            assert r["reason"] == "TRL fails too", r
        if r["grpokit"] == "refuse":
            assert r["trl_run"], r  # every value grpokit refuses and TRL's config takes was tried on TRL
        kinds[(r["trl_run"] or "config only", r["grpokit"])] += 1
    # the measured state (see docs/TRL.md); an "open" row that gets carried out changes these numbers
    assert kinds[("runs", "accept")] >= 12


def test_values_named_by_the_issue_are_accepted():
    accepted = {(r["field"], json.dumps(r["value"])) for r in ROWS if r["grpokit"] == "accept"}
    for field, value in [
        ("num_completions_to_print", 0),
        ("save_total_limit", 0),
        ("shuffle_dataset", None),
        ("top_k", -1),
        ("max_grad_norm", -1),
    ]:
        assert (field, json.dumps(value)) in accepted, (field, value)


def test_trl_side_of_the_table_is_trls():
    trl = pytest.importorskip("trl")
    pairs = boundary_values(trl.GRPOConfig)
    assert [(r["field"], r["value"]) for r in ROWS] == [(f, v) for f, v in pairs], "TRL's fields changed: rerun"
    wrong = [(r["field"], r["value"]) for r in ROWS if trl_verdict(r["field"], r["value"])[0] != r["trl_config"]]
    assert not wrong, wrong


def test_a_negative_logging_steps_logs_at_trls_steps(chat_model, tmp_path):
    """transformers: logging_steps below 1 is ceil(max_steps * value); -1 on a 3-step run is the period -3,
    so ``step % -3 == 0`` logs step 3 only. grpokit's run logs the same steps (TRL's run, when installed)."""
    from datasets import Dataset

    from grpokit.trl import GRPOConfig, GRPOTrainer
    from helpers.trl_models import small_args

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd")])

    def reward(completions, **kwargs):
        return [float(len(c[0]["content"])) for c in completions]

    def logged(config_cls, trainer_cls, out):
        args = small_args(config_cls, out, max_steps=3, logging_steps=-1, report_to="none", save_strategy="no")
        tr = trainer_cls(chat_model, reward_funcs=[reward], train_dataset=data, args=args)
        tr.train()
        return [e["step"] for e in tr.state.log_history if "loss" in e]

    assert logged(GRPOConfig, GRPOTrainer, tmp_path / "g") == [3]
    trl = pytest.importorskip("trl")
    assert logged(trl.GRPOConfig, trl.GRPOTrainer, tmp_path / "t") == [3]
