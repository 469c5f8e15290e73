"""Resuming and re-running a TRL script's output_dir under grpokit.trl, worked out by hand and measured against
TRL 1.16 itself on the tiny chat model: a named checkpoint is resumed from exactly (never the newest in its
place), a re-run keeps the folder's earlier run (moved whole to earlier-runs/, where TRL keeps the checkpoints
the new run does not overwrite), and a resume continues log_history and the token count from the checkpoint's
trainer_state.json, as transformers.

The tiny run: 4 rows, one prompt of 4 completions a step, so 4 steps an epoch; a prompt is
``<user>say ab\\n<assistant>`` = 6 + 6 + 1 + 11 = 24 tokens of the character tokenizer and every completion
is cut at 4 tokens, so a step samples 4 * 24 + 4 * completions/mean_length tokens, 112 when every completion
runs to the cap (TRL's num_tokens counts both, a running total).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from grpokit.config import ConfigError
from helpers.trl_models import make_chat_model, small_args

ROWS = [{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh")]
LIBS = ["grpokit.trl", "trl"]


def short(completions, **kwargs):
    return [-len(c[0]["content"]) / 10 for c in completions]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(make_chat_model(tmp_path_factory.mktemp("m") / "model"))


def _trainer(lib, model, out, max_steps, **kw):
    if lib == "trl":
        pytest.importorskip("trl")
    mod = importlib.import_module(lib)
    args = small_args(
        mod.GRPOConfig, out, max_steps=max_steps, save_steps=1, logging_steps=1, report_to="none", seed=0, **kw
    )
    return mod.GRPOTrainer(model, reward_funcs=[short], train_dataset=Dataset.from_list(ROWS), args=args)


def _steps(trainer) -> list[int]:
    """The logged training steps, after checking that num_tokens is the running total of 4 * 24 prompt tokens
    and 4 * completions/mean_length completion tokens a step."""
    entries = [e for e in trainer.state.log_history if "loss" in e]
    total = 0.0
    for e in entries:
        total += 4 * 24 + 4 * e["completions/mean_length"]
        assert e["num_tokens"] == total, (e["step"], e["num_tokens"], total)
    return [e["step"] for e in entries]


@pytest.mark.parametrize("lib", LIBS)
def test_a_named_checkpoint_is_resumed_from_exactly(lib, model, tmp_path):
    """3 steps saved at every step, then a resume from checkpoint-1 (not the newest): steps 2 and 3 are trained
    again, after step 1's entry from the checkpoint; both libraries log steps 1, 2, 3, the token count running on."""
    out = tmp_path / "out"
    _trainer(lib, model, out, 3).train()
    again = _trainer(lib, model, out, 3)
    result = again.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    assert _steps(again) == [1, 2, 3]
    assert result.global_step == 3 and again.state.num_input_tokens_seen == again.state.log_history[-2]["num_tokens"]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    if lib == "trl":
        return
    # grpokit: the first run's step-2 and step-3 are kept aside with their links and a copy of its records
    (earlier,) = (out / "earlier-runs").iterdir()
    assert sorted(p.name for p in earlier.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    assert all((link / "config.json").is_file() for link in earlier.glob("checkpoint-*"))  # the links still resolve
    assert sorted(p.name for p in (earlier / "checkpoints").iterdir()) == ["step-000002", "step-000003"]
    assert (earlier / "metrics.jsonl").read_text().count("\n") == 3  # the first run's steps 1-3, as they were
    assert (out / "metrics.jsonl").read_text().count("\n") == 3  # the run's: step 1, then 2 and 3 again
    assert all((out / f"checkpoint-{n}" / "config.json").is_file() for n in (1, 2, 3))


@pytest.mark.parametrize("lib", LIBS)
def test_a_resume_continues_the_log_history_and_the_token_count(lib, model, tmp_path):
    """2 steps, then a resume of output_dir to max_steps=3: the history holds steps 1 and 2 from checkpoint-2's
    trainer_state.json and step 3 after them; num_tokens goes on from step 2's total (112 per step at the cap, not
    from 0 again); epoch 3/4;
    the final entry counts the one step this call trained (train_steps_per_second x train_runtime = 1)."""
    out = tmp_path / "out"
    first = _trainer(lib, model, out, 2)
    first.train()
    assert _steps(first) == [1, 2]
    resumed = _trainer(lib, model, out, 3)
    resumed.train(resume_from_checkpoint=True)
    s = resumed.state
    assert _steps(resumed) == [1, 2, 3] and s.log_history[:2] == first.state.log_history[:2]
    assert s.num_input_tokens_seen == s.log_history[-2]["num_tokens"] >= 2 * 112 + 4 * 24 + 4
    assert (s.total_flos, s.epoch, s.global_step) == (0.0, 0.75, 3)
    final = s.log_history[-1]
    assert "train_loss" in final and final["total_flos"] == 0.0
    assert final["train_steps_per_second"] * final["train_runtime"] == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("lib", LIBS)
def test_a_rerun_into_the_same_output_dir_keeps_the_earlier_runs_checkpoints(lib, model, tmp_path):
    """A 3-step run, then a 1-step run of the same script (no resume). TRL overwrites checkpoint-1 and keeps
    checkpoint-2 and -3 of the first run beside it; grpokit keeps the first run whole in earlier-runs/<time>/
    (its checkpoint-1..3 and records), so output_dir holds the new run alone: nothing of either is lost."""
    out = tmp_path / "out"
    _trainer(lib, model, out, 3).train()
    _trainer(lib, model, out, 1).train()
    links = sorted(p.name for p in out.glob("checkpoint-*"))
    if lib == "trl":
        assert links == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
        return
    assert links == ["checkpoint-1"] and (out / "metrics.jsonl").read_text().count("\n") == 1
    (earlier,) = (out / "earlier-runs").iterdir()
    assert sorted(p.name for p in earlier.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert all((link / "config.json").is_file() for link in earlier.glob("checkpoint-*"))
    assert (earlier / "metrics.jsonl").read_text().count("\n") == 3


class Counted:
    """Counts the optimizer steps (on_optimizer_step) of a train() call; with ``stop_at``, stops after that step."""

    def __init__(self, stop_at: int = 0):
        self.updates, self.stop_at = 0, stop_at

    def __getattr__(self, name):  # transformers calls every event; a TrainerCallback's are no-ops
        if name.startswith("on_"):
            return lambda *a, **kw: None
        raise AttributeError(name)

    def on_optimizer_step(self, args, state, control, **kw):
        self.updates += 1

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.stop_at:
            control.should_training_stop = True


def _trained(trainer) -> list[tuple[int, float, bool]]:
    """(step, learning_rate, whether num_tokens was logged) of each logged training step."""
    return [(e["step"], e["learning_rate"], "num_tokens" in e) for e in trainer.state.log_history if "loss" in e]


@pytest.mark.parametrize("lib", LIBS)
def test_a_run_ended_inside_a_generation_batch_resumes_to_the_new_max_steps(lib, model, tmp_path):
    """num_iterations=2: a generation batch feeds 2 steps, so max_steps=3 ends inside the second. Resumed to
    max_steps=6 from checkpoint-3: 3 more optimizer steps (6 - 3), steps 4, 5, 6 logged after the checkpoint's 1-3,
    a new batch sampled at step 4 (TRL samples one at a resume) and step 6, the token count going on, and the linear
    schedule over 6 steps at 1e-6 x 2 / 6, 1 / 6 for steps 5 and 6. Before grpokit kept the update count, it took the 2
    saved batches for 4 steps: 2 updates, logged as steps 5 and 6, the history and token count lost (no
    checkpoint-4 to read them from)."""
    out = tmp_path / "out"
    _trainer(lib, model, out, 3, num_iterations=2).train()
    resumed, counted = _trainer(lib, model, out, 6, num_iterations=2), Counted()
    resumed.add_callback(counted)
    result = resumed.train(resume_from_checkpoint=True)
    assert result.global_step == 6 and counted.updates == 3
    steps = _trained(resumed)
    assert [(s, sampled) for s, _, sampled in steps] == [(1, 1), (2, 0), (3, 1), (4, 1), (5, 0), (6, 1)]
    # step 4: transformers runs it at the rate the checkpoint's optimizer ended with (0, the end of a 3-step linear
    # schedule) and takes the new schedule from step 5; grpokit at the new schedule's rate for step 4 (docs/TRL.md)
    fourth = 0.0 if lib == "trl" else 1e-6 * 3 / 6
    assert [rate for _, rate, _ in steps[3:]] == pytest.approx([fourth, 1e-6 * 2 / 6, 1e-6 / 6])
    tokens = [e["num_tokens"] for e in resumed.state.log_history if "num_tokens" in e]
    assert tokens == sorted(tokens) and tokens[2] > tokens[1]


@pytest.mark.parametrize("lib", LIBS)
def test_a_stop_inside_a_generation_batch_resumes_with_its_step_count(lib, model, tmp_path):
    """num_iterations=2, steps_per_generation=2: 4 steps a generation batch; a callback stops at step 3, which
    checkpoint-3 holds (its scheduler after 3 steps). Resumed to max_steps=8: 5 more steps, 4-8, at 1e-6 x
    (8 - 3) / 8 ... 1 / 8. Before, grpokit resumed at step 4 (one whole batch), made 4 steps and logged from 5, the
    rates shifted by one. checkpoint-3 holds transformers' training_args.bin, the arguments object."""
    out, kw = tmp_path / "out", dict(num_iterations=2, steps_per_generation=2)
    first = _trainer(lib, model, out, 8, **kw)
    first.add_callback(Counted(stop_at=3))
    first.train()
    args = torch.load(out / "checkpoint-3" / "training_args.bin", weights_only=False)
    assert type(args).__name__ == "GRPOConfig" and args.max_steps == 8 and args.num_iterations == 2
    resumed, counted = _trainer(lib, model, out, 8, **kw), Counted()
    resumed.add_callback(counted)
    result = resumed.train(resume_from_checkpoint=True)
    assert result.global_step == 8 and counted.updates == 5
    steps = _trained(resumed)
    assert [s for s, _, _ in steps] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [rate for _, rate, _ in steps[3:]] == pytest.approx([1e-6 * k / 8 for k in (5, 4, 3, 2, 1)])


def test_what_cannot_be_resumed_as_named_is_refused_in_one_sentence(model, tmp_path):
    """A path that does not exist, a checkpoint-N folder that is not grpokit's, another output_dir's checkpoint:
    each refused before anything is built, never resumed from the newest checkpoint instead."""
    out, other = tmp_path / "out", tmp_path / "other"
    (other / "checkpoints" / "step-000001" / "model").mkdir(parents=True)
    (other / "checkpoint-1").symlink_to(other / "checkpoints" / "step-000001" / "model")
    (tmp_path / "checkpoint-5").mkdir()  # a folder another trainer wrote
    cases = [
        (tmp_path / "nowhere", r"^Can't find a valid checkpoint at .*nowhere: resume_from_checkpoint names no folder"),
        (tmp_path / "checkpoint-5", r"checkpoint-5' is not a grpokit checkpoint \(a checkpoint-N link to "),
        (other / "checkpoint-1", r"is of the run in '.*other', but output_dir is '.*out'; .* set output_dir="),
    ]
    for given, expected in cases:
        with pytest.raises(ConfigError, match=expected):
            _trainer("grpokit.trl", model, out, 1).train(resume_from_checkpoint=str(given))
    assert not Path(out).exists()


def test_restored_state_is_the_checkpoints_but_for_what_the_running_run_sets():
    """transformers loads the checkpoint's state whole, then sets max_steps, num_train_epochs and the process
    flags again; grpokit also keeps its own periods (it schedules by them) and leaves stateful_callbacks to
    callback_states.py. A field the running state lacks is not added."""
    from grpokit.trl.resumed_state import restored

    now = dict(
        global_step=0, log_history=[], num_input_tokens_seen=0, total_flos=0.0, epoch=0.0, max_steps=5,
        num_train_epochs=1, is_world_process_zero=True, is_local_process_zero=True, logging_steps=2, eval_steps=2,
        save_steps=1, train_batch_size=4, best_metric=None, stateful_callbacks={"A": 1},
    )  # fmt: skip
    saved = dict(
        global_step=2, log_history=[{"step": 1}, {"step": 2}], num_input_tokens_seen=224, total_flos=3.0,
        epoch=0.5, max_steps=3, num_train_epochs=2, is_world_process_zero=False, is_local_process_zero=False,
        logging_steps=1, eval_steps=1, save_steps=2, train_batch_size=8, best_metric=0.5,
        stateful_callbacks={"B": 2}, unknown="x",
    )  # fmt: skip
    assert restored(saved, now) == {
        **now,
        "global_step": 2,
        "log_history": [{"step": 1}, {"step": 2}],
        "num_input_tokens_seen": 224,
        "total_flos": 3.0,
        "epoch": 0.5,
        "best_metric": 0.5,
    }


def test_a_checkpoint_without_trls_state_is_resumed_with_a_warning(tmp_path, caplog):
    """A grpokit checkpoint written by `grpokit train` has no TRL trainer_state.json: the state keeps its resumed
    global_step, and the empty history is said once (before: silently)."""
    from transformers import TrainerState

    from grpokit.trl.resumed_state import restore

    state = TrainerState(global_step=3, max_steps=6)
    with caplog.at_level("WARNING", logger="grpokit.trl"):
        restore(state, tmp_path)
    assert "holds no trainer_state.json (not a grpokit.trl checkpoint): resuming at global_step 3" in caplog.text
    assert (state.global_step, state.log_history) == (3, [])
