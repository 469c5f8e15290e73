"""summary.json of a resumed run: how the earlier session ended leaves the file at once, so a run resumed and
then killed, or read while it trains, never shows an end that was already dealt with (train/run_summary.py).
Before, a resumed run kept the earlier session's ``failed``, ``interrupted`` / ``stop_signal`` and ``eval_after``
in the file until it ended: the doctor named a failure after step 2 of a run at step 6, and the report drew a
step-3 evaluation as the held-out point of step 5."""

import json
import os
import re
import signal
from pathlib import Path

import pytest

from grpokit.config.sections import ConfigError
from grpokit.record.doctor import diagnose
from grpokit.record.report_data import heldout, load_run
from grpokit.rewards.errors import RewardError
from grpokit.train import Trainer
from grpokit.train.resume import check_same_model, write_config
from grpokit.train.run_summary import END_KEYS, end, reopen
from helpers.runs import ROWS, likes_a, tiny_cfg

SRC = Path(__file__).resolve().parents[2] / "src" / "grpokit"


def test_reopen_takes_every_end_key_out_at_once_and_keeps_the_history():
    failed = {"step": 2, "error": "RewardError: down"}
    summary = {"eval_before": {"accuracy": 0.25}, "steps": 2, "failed": failed}
    assert reopen(summary) == {"steps": 2, "failed": failed}
    assert summary == {"eval_before": {"accuracy": 0.25}, "earlier_sessions": [{"steps": 2, "failed": failed}]}
    end(summary, steps=4, interrupted=True, stop_signal="SIGTERM", eval_owed=4)
    reopen(summary)  # a second resume: its end follows the first
    assert summary["earlier_sessions"][1] == {"steps": 4, "interrupted": True, "stop_signal": "SIGTERM", "eval_owed": 4}
    assert reopen(summary) == {} and len(summary["earlier_sessions"]) == 2  # a killed session left no end
    end(summary, steps=6, eval_after={"accuracy": 0.5})
    end(summary, steps=6)  # an end replaces every end key: no eval_after of another ending is left behind
    assert summary == {"eval_before": {"accuracy": 0.25}, "earlier_sessions": summary["earlier_sessions"], "steps": 6}
    with pytest.raises(ValueError, match=r"\['finished'\] are not end keys of summary.json"):
        end(summary, finished=True)


def test_no_code_writes_an_end_key_of_summary_json_but_through_end():
    """By construction: a key written as ``summary["..."] = ...`` anywhere in the package is a history key, so the
    reopening (which clears END_KEYS) cannot miss an end key written beside ``end``."""
    written = {
        key
        for f in SRC.rglob("*.py")
        for key in re.findall(r"""\bsummary\[["'](\w+)["']\]\s*=""", f.read_text(encoding="utf-8"))
    }
    assert written == {"eval_before"} and not written & set(END_KEYS)


def _trainer(model_dir, run, steps, resume=None, reward=likes_a, callbacks=None):
    cfg = tiny_cfg(model_dir, run, **{"train.steps": steps, "train.save_every": 1})
    cfg.data.dataset = ""
    return Trainer(
        cfg, reward_funcs=[reward], train_rows=ROWS, eval_rows=ROWS[:2], resume=resume, quiet=True, callbacks=callbacks
    )


class Peek:
    """What a reader of the run folder (the doctor, the report) sees of summary.json after each step."""

    def __init__(self, run: Path):
        self.run, self.seen = run, {}

    def on_step_end(self, args, state, control, **kw):
        run = load_run(self.run)
        codes = {f.code for f in diagnose(run)}
        self.seen[state.global_step] = json.loads((self.run / "summary.json").read_text()), heldout(run), codes


def _first_session(how: str, model_dir, run: Path) -> dict:
    """A 2-step session that ended ``how``: it failed at step 2's rewards, a SIGTERM stopped it after step 1, or it
    finished. Returns its end."""
    if how == "finished":
        return _trainer(model_dir, run, 2).train()

    class Stop:
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 1:
                if how == "signal":
                    os.kill(os.getpid(), signal.SIGTERM)  # a real signal: the loop stops after this step
                else:
                    down.append(True)  # the reward backend goes down for step 2

    down: list[bool] = []

    def flaky(prompts, completions, **kw):
        if down:
            raise RuntimeError("reward backend down")
        return likes_a(prompts, completions)

    trainer = _trainer(model_dir, run, 2, reward=flaky, callbacks=[Stop()])
    if how == "failed":
        with pytest.raises(RewardError, match="reward backend down"):
            trainer.train()
        return json.loads((run / "summary.json").read_text())
    return trainer.train()


@pytest.mark.parametrize("how", ["failed", "signal", "finished"])
def test_a_resumed_run_shows_no_end_of_its_earlier_session_while_it_trains(tiny_model_dir, tmp_path, handlers, how):
    run = tmp_path / "run"
    first = _first_session(how, tiny_model_dir, run)
    ended = {k: v for k, v in first.items() if k in END_KEYS}
    expected = {"failed": {"failed"}, "signal": {"interrupted", "stop_signal", "steps"}}
    assert set(ended) == expected.get(how, {"eval_after", "steps"})

    peek = Peek(run)
    summary = _trainer(tiny_model_dir, run, 4, resume=run, callbacks=[peek]).train()
    mid, points, codes = peek.seen[3]  # as `grpokit doctor` / `report` read it while step 4 trains, or after a kill
    assert mid == {"eval_before": first["eval_before"], "earlier_sessions": [ended]}
    assert "run_failed" not in codes  # the doctor names no failure that was dealt with
    assert points == [[0, first["eval_before"]["accuracy"]]]  # the report draws no step-2 evaluation at step 3
    assert summary["steps"] == 4 and summary["earlier_sessions"] == [ended] and "eval_after" in summary
    assert not {"failed", "interrupted", "stop_signal", "eval_owed"} & set(summary)


def test_the_model_a_run_was_trained_with_is_kept_at_resume(tmp_path):
    """model.name_or_path, model.lora_rank and model.lora_alpha define the policy a checkpoint holds: a resume
    changing one is refused naming both values; the precision and the kernels may change (config_history.yaml
    records them)."""
    trained = tiny_cfg("models/m0", tmp_path, **{"model.lora_rank": 8, "model.lora_alpha": 16})
    write_config(tmp_path, trained, None)
    same = tiny_cfg("models/m0", tmp_path, **{"model.lora_rank": 8, "model.lora_alpha": 16, "model.dtype": "bfloat16"})
    check_same_model(tmp_path, same)
    for field, value in (("name_or_path", "models/m1"), ("lora_alpha", 32.0), ("lora_rank", 0)):
        changed = tiny_cfg("models/m0", tmp_path, **{"model.lora_rank": 8, "model.lora_alpha": 16})
        setattr(changed.model, field, value)
        was = getattr(trained.model, field)
        with pytest.raises(ConfigError) as e:
            check_same_model(tmp_path, changed)
        assert str(e.value).startswith(
            f"model.{field} was {was!r} when the run in {str(tmp_path)!r} was trained and is {value!r} now, so the "
            "resumed run would train something else: "
        ), e.value
        assert f"; resume with model.{field}={was!r}" in str(e.value)


@pytest.mark.parametrize("where", ["final save", "on_train_begin"])
def test_an_error_in_the_final_save_or_at_the_start_is_recorded_as_failed(tiny_model_dir, tmp_path, handlers, where):
    """A disk that fills on the last checkpoint of a stopped run (_finish_summary), or a callback's
    ``on_train_begin`` that raises, ran outside the try that writes ``failed``: summary.json kept no end, the
    lock was released, and the doctor read a process killed without a record (run_killed). Now each is the
    failure it was (run_failed), after the steps it recorded (1, and 0)."""
    from grpokit.record.doctor import examine

    run = tmp_path / "run"
    cfg = tiny_cfg(tiny_model_dir, run, **{"train.steps": 2, "train.save_every": 100})
    cfg.data.dataset = ""

    class Callback:
        def on_train_begin(self, args, state, control, **kw):
            if where == "on_train_begin":
                raise RuntimeError("callback broke")

        def on_step_end(self, args, state, control, **kw):
            if where == "final save":
                os.kill(os.getpid(), signal.SIGTERM)  # stopped after step 1: _finish_summary saves it

    trainer = Trainer(
        cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=ROWS[:2], quiet=True, callbacks=[Callback()]
    )

    def save(*a, **kw):
        raise OSError(28, "No space left on device")

    trainer.save = save
    with pytest.raises(OSError if where == "final save" else RuntimeError):
        trainer.train()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["failed"] == (
        {"step": 1, "error": "OSError: [Errno 28] No space left on device"}
        if where == "final save"
        else {"step": 0, "error": "RuntimeError: callback broke"}
    )
    codes = [f.code for f in examine(load_run(run)).findings]
    assert "run_failed" in codes and "run_killed" not in codes
