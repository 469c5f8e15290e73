"""A run whose reference is refreshed (algo.ref_refresh_every) resumes against the refreshed copy: the
checkpoint keeps what rebuilds it, so the resumed run's KL is the uninterrupted run's, bit for bit."""

import json
import shutil

import pytest
import torch

from grpokit.config.base import ConfigError
from grpokit.train import Trainer
from grpokit.train.carried_state import reference_state
from grpokit.train.checkpoint import manifest
from helpers.runs import likes_a, tiny_cfg

ROWS = [{"prompt": p, "answer": "a"} for p in ("ab", "cd", "ef", "gh", "ij", "12")]
TIMES = ("time/", "tokens_per_second", "rollout/tokens_per_second")


def _cfg(model_dir, out, alpha):
    cfg = tiny_cfg(
        model_dir,
        out,
        **{
            "data.eval_size": 0,
            "algo.beta": 0.5,
            "algo.ref_refresh_every": 2,
            "algo.ref_mixup_alpha": alpha,
            "optim.lr": 0.05,
            "train.steps": 5,
            "train.save_every": 1,
            "train.keep_checkpoints": 10,
            "train.deterministic": "true",
        },
    )
    cfg.data.dataset = ""  # rows are passed directly
    return cfg


def _run(model_dir, out, alpha, resume=None):
    cfg = _cfg(model_dir, out, alpha)
    Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True, resume=resume).train()


def _lines(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMES)} for r in rows]


@pytest.fixture(scope="module", params=[1.0, 0.5])
def full_run(request, tiny_model_dir, tmp_path_factory):
    """The uninterrupted 5-step run (refreshes at the ends of steps 2 and 4) with ref_mixup_alpha 1 or 0.5."""
    out = tmp_path_factory.mktemp("full") / "run"
    _run(tiny_model_dir, out, request.param)
    return request.param, out


@pytest.mark.parametrize("at", [3, 4])
def test_a_resume_after_a_refresh_measures_kl_against_the_refreshed_reference(full_run, tiny_model_dir, tmp_path, at):
    alpha, full = full_run
    expected = _lines(full)
    # steps 3-4 train against the reference refreshed at the end of step 2, step 5 against that of step 4; before
    # the fix a resume measured them against the starting model, so its kl differed. Right after a plain copy
    # (alpha 1) the reference is the policy that samples the step: with one update a batch its kl is 0
    assert expected[3]["kl"] > 0
    assert (expected[2]["kl"] == 0.0) == (expected[4]["kl"] == 0.0) == (alpha == 1.0)
    run = tmp_path / "run"
    shutil.copytree(full, run)
    extra = torch.load(run / "checkpoints" / f"step-{at:06d}" / "extra_state.pt", weights_only=False)["reference"]
    assert extra["refreshed_at"] == (2 if at == 3 else 4)
    # weights kept unless the last refresh copied the policy at the checkpoint's own step (its weights are the model's)
    assert (extra["weights"] is None) == (alpha == 1.0 and at == 4)
    _run(tiny_model_dir, run, alpha, resume=run / "checkpoints" / f"step-{at:06d}")
    got = _lines(run)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5]
    for want, have in zip(expected[at:], got[at:]):
        assert have == want, want["step"]  # kl, loss, grad_norm ... bit-exact


def test_a_checkpoint_without_the_refreshed_reference_is_refused_unless_it_is_the_policy(
    full_run, tiny_model_dir, tmp_path
):
    alpha, full = full_run
    run = tmp_path / "run"
    shutil.copytree(full, run)
    for at in (3, 4):  # as a checkpoint written before grpokit kept the reference (its manifest rewritten)
        folder = run / "checkpoints" / f"step-{at:06d}"
        extra = torch.load(folder / "extra_state.pt", weights_only=False)
        torch.save({k: v for k, v in extra.items() if k != "reference"}, folder / "extra_state.pt")
        (folder / "manifest.json").write_text(json.dumps({**manifest(folder), "model_only": False}))
    # step 4 (alpha 1): the copy made at its end is its own policy, rebuilt exactly; step 3's is not
    if alpha == 1.0:
        _run(tiny_model_dir, run, alpha, resume=run / "checkpoints" / "step-000004")
        assert _lines(run)[4] == _lines(full)[4]
    message = "holds no reference model, yet algo.ref_refresh_every=2 refreshed it at step "
    with pytest.raises(ConfigError, match=message + ("2" if alpha == 1.0 else "4")):
        _run(
            tiny_model_dir, run, alpha, resume=run / "checkpoints" / ("step-000003" if alpha == 1.0 else "step-000004")
        )


def test_reference_state_keeps_weights_only_when_the_policy_is_not_the_reference():
    ref = torch.nn.Linear(2, 1)
    assert reference_state(None, 4, 4, True, 2) is None  # no reference (beta 0, LoRA)
    assert reference_state(ref, 3, 0, True, 0) is None  # no refreshes configured nor made
    assert reference_state(ref, 1, 0, True, 2) == {"refreshed_at": 0, "weights": None}  # the starting model
    assert reference_state(ref, 4, 4, True, 2)["weights"] is None  # copied at step 4: the checkpoint's policy
    kept = reference_state(ref, 5, 4, True, 2)["weights"]  # copied at 4, the policy moved on at 5
    assert torch.equal(kept["weight"], ref.weight.detach())
    assert reference_state(ref, 4, 4, False, 2)["weights"] is not None  # TR-DPO's mix at 4 is not the policy


def test_a_resume_that_changes_the_refresh_period_keeps_the_reference_it_refreshed(full_run, tiny_model_dir, tmp_path):
    """The last refresh is a fact of the run, not of its config: resumed from step 4 with algo.ref_refresh_every
    changed to 10 (config_history.yaml records it), the reference is still step 4's refresh, and step 5's checkpoint
    keeps it although 5 // 10 * 10 = 0 would say "the starting model". So a second resume, from step 5, trains step 6
    as the run that went on from step 4 did (a reference derived from the config would measure its KL against the
    starting model)."""
    alpha, full = full_run

    def resume(run, at):
        cfg = _cfg(tiny_model_dir, run, alpha)
        cfg.algo.ref_refresh_every, cfg.train.steps = 10, 6
        folder = run / "checkpoints" / f"step-{at:06d}"
        Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True, resume=folder).train()

    once = tmp_path / "once"
    shutil.copytree(full, once)
    resume(once, 4)  # steps 5 and 6 against the reference refreshed at the end of step 4
    extra = torch.load(once / "checkpoints" / "step-000005" / "extra_state.pt", weights_only=False)["reference"]
    assert extra["refreshed_at"] == 4 and extra["weights"] is not None  # step 4's reference, not step 5's policy
    twice = tmp_path / "twice"
    shutil.copytree(once, twice)
    resume(twice, 5)
    assert _lines(twice)[5] == _lines(once)[5]  # step 6: kl, loss ... bit-exact
