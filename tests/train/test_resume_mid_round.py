"""A checkpoint written between two updates of a step's batch (train.max_updates reached there, or a callback's
stop; TRL's max_steps and should_training_stop under grpokit.trl) resumes with the updates it applied, the
slices it trained and the windows where they fell: the resumed run samples the next step's batch (as TRL's
resume samples a new generation batch) and says once that the cut batch's untrained slices stay untrained.

Before grpokit kept those counts, a resume took every saved step for a whole one: 2 steps of 4 updates made 8,
though train.max_updates had stopped the second after its first, and a rolling window restarted off its
boundaries (the first resumed update took one slice where it needs 3).
"""

import json

import pytest
import torch

import grpokit.train.loop as loop_module
from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.train import Trainer
from grpokit.train import checkpoint as ckpt_module
from grpokit.train.resume import load_run_config
from grpokit.train.update_windows import resumed_counts, rounds_to_make
from helpers.train_processes import finish, start, write_setup

ROWS = [{"prompt": p, "answer": "a"} for p in ("ab", "cd", "ef", "gh", "ij", "12", "34", "56", "78", "90")]


def varied(prompts, completions, **kwargs):
    return [len(set(c)) / 6 for c in completions]


def run(model_dir, out, resume=None, until_max_updates=False, callbacks=None, **over):
    """2 prompts x 4 completions a step, cut into train.updates_per_batch slices."""
    cfg = Config()
    fields = {
        "model.name_or_path": model_dir,
        "data.task": "",
        "data.dataset": "",
        "reward.functions": "[]",
        "data.eval_size": 0,
        "rollout.group_size": 4,
        "rollout.max_new_tokens": 6,
        "train.prompts_per_step": 2,
        "optim.lr": 1e-2,
        "train.out": out,
        "record.sinks": "[]",
        "record.report": "false",
        "train.threads": 1,
        "train.deterministic": "true",
        "train.save_every": 1,
        "train.keep_checkpoints": 5,
        **over,
    }
    apply_overrides(cfg, [f"{k}={v}" for k, v in fields.items()])
    return Trainer(
        cfg,
        reward_funcs=[varied],
        train_rows=ROWS,
        eval_rows=[],
        quiet=True,
        resume=resume,
        until_max_updates=until_max_updates,
        callbacks=callbacks,
    )


def saved_state(run_dir, step):
    return json.loads((run_dir / "checkpoints" / f"step-{step:06d}" / "trainer_state.json").read_text())


# ------------------------------------------------------------------ by hand


def test_resumed_counts_by_hand():
    t = Config().train
    t.updates_per_batch = 2
    # kept by the checkpoint: as written (2 steps of 2 x 2 slices, train.max_updates 5 after the second's first)
    assert resumed_counts(2, 5, 5, 5, t, 2) == (5, 5)
    # an older checkpoint: the schedule's count (stepped once an update), whole steps of 2 x 2 = 4 slices
    assert resumed_counts(2, None, None, 5, t, 2) == (5, 8)
    # an older model-only checkpoint (no schedule saved): whole steps, 2 x 4 = 8 updates
    assert resumed_counts(2, None, None, None, t, 2) == (8, 8)


def test_rounds_to_make_by_hand():
    # every slice its own update, 4 a round: 5 updates from anywhere take ceil(5 / 4) = 2 rounds
    assert rounds_to_make(5, 3, 4, 1) == 2
    # windows of 3, 2 slices a round, from slice 5 (slices 3 and 4 of its window done): 5 6 | 7 8 | 9 10 | 11 12,
    # updates ending at 5, 8 and 11: 1 update takes 1 round, 2 take 2, 3 take 4
    assert [rounds_to_make(n, 5, 2, 3) for n in (1, 2, 3)] == [1, 2, 4]
    # from a window's start (slice 6): 6 7 | 8 ...: the first update ends at 8, in the second round
    assert rounds_to_make(1, 6, 2, 3) == 2
    # epochs of 4 slices, windows of 3: slices 0 1 2 | 3 | 4 5 6 | 7 |: 4 updates in 2 rounds of 4
    assert rounds_to_make(4, 0, 4, 3, 4) == 2
    assert rounds_to_make(0, 7, 4, 3) == 0


# ------------------------------------------------------------------ a native run


def schedule(monkeypatch, trainer) -> list[str]:
    """The loop's events: "sample" when a batch is sampled, its slice number when backpropagated, "|" at an update."""
    events, real_acc, real_apply = [], trainer.loss_stage, loop_module.apply_update
    real_scored, real_slices, number = trainer._scored_batch, loop_module.update_slices, {}

    def slices(inputs, parts):
        out = real_slices(inputs, parts)
        number.update({id(p): str(k) for k, p in enumerate(out)})
        return out

    monkeypatch.setattr(loop_module, "update_slices", slices)
    monkeypatch.setattr(trainer, "_scored_batch", lambda: events.append("sample") or real_scored())
    monkeypatch.setattr(
        trainer,
        "loss_stage",
        lambda m, o, part, *a, **k: events.append(number[id(part)]) or real_acc(m, o, part, *a, **k),
    )
    monkeypatch.setattr(loop_module, "apply_update", lambda *a, **k: events.append("|") or real_apply(*a, **k))
    return events


def test_a_rolling_window_cut_by_max_updates_resumes_on_a_windows_boundary(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    # 4 slices a batch, 3 an update (TRL: steps_per_generation 4, gradient_accumulation_steps 3), max_updates 2:
    # A0 A1 A2 | A3 B0 B1 | and the run ends, B2 B3 untrained: 2 updates, 6 slices, 2 left.
    # Resumed without the cap for a third step: C0 C1 C2 | C3 (pending). A resume counting whole steps put C0 at
    # slice 2 x 4 = 8, the end of the window 6 7 8, so it applied C0 alone as an update of 3 slices' weight.
    window = {"train.updates_per_batch": 4, "train.accumulation_slices": 3, "train.steps": 3}
    first = run(tiny_model_dir, tmp_path / "cut", **window, **{"train.max_updates": 2})
    first.train()
    saved = saved_state(tmp_path / "cut", 2)
    assert (saved["step"], saved["updates"], saved["slices"], saved["round_left"]) == (2, 2, 6, 2)
    capsys.readouterr()
    resumed = run(tiny_model_dir, tmp_path / "cut", resume=tmp_path / "cut", **window)
    said = capsys.readouterr().out
    assert "was written between two updates of step 2's batch, 2 of its slices untrained" in said
    assert (resumed.step, resumed.updates, resumed.slices) == (2, 2, 6)
    events = schedule(monkeypatch, resumed)
    resumed.train()
    assert events == ["sample", "0", "1", "2", "|", "3"]
    assert (resumed.updates, resumed.pending.slices, resumed.scheduler.last_epoch) == (3, 1, 3)
    assert saved_state(tmp_path / "cut", 3)["round_left"] == 0


def test_a_callback_stop_between_updates_resumes_with_its_update_count(tiny_model_dir, tmp_path):
    # 2 iterations x 2 slices = 4 updates a step; a callback stops before the third update of step 1:
    # the checkpoint holds 2 updates (the schedule's last_epoch too), where whole steps counted 4, and
    # train.max_updates 3 on resume ends the run after one more update (whole steps: already done at "4")
    class StopAtTwo:
        def __init__(self):
            self.seen = 0

        def on_update_begin(self, args, state, control, **kw):
            control.should_training_stop = self.seen == 2
            self.seen += 1

    over = {"algo.num_iterations": 2, "train.updates_per_batch": 2, "train.steps": 3}
    cut = run(tiny_model_dir, tmp_path / "stop", callbacks=[StopAtTwo()], **over)
    cut.train()
    assert (cut.step, cut.updates, saved_state(tmp_path / "stop", 1)["round_left"]) == (1, 2, 2)
    resumed = run(tiny_model_dir, tmp_path / "stop", resume=tmp_path / "stop", **over, **{"train.max_updates": 3})
    assert resumed.updates == 2
    resumed.train()
    assert (resumed.step, resumed.updates, resumed.scheduler.last_epoch) == (2, 3, 3)


def test_an_older_checkpoint_takes_its_update_count_from_the_schedule(tiny_model_dir, tmp_path):
    # as above, cut by train.max_updates 5 in step 2 (4 + 1 updates); the counts taken out of trainer_state.json
    # (a checkpoint of an earlier grpokit, its manifest rewritten): the schedule's last_epoch says 5, not 2 x 4
    over = {"algo.num_iterations": 2, "train.updates_per_batch": 2, "train.steps": 3}
    run(tiny_model_dir, tmp_path / "old", **over, **{"train.max_updates": 5}).train()
    folder = tmp_path / "old" / "checkpoints" / "step-000002"
    state = json.loads((folder / "trainer_state.json").read_text())
    assert (state.pop("updates"), state.pop("slices"), state.pop("round_left")) == (5, 5, 3)
    (folder / "trainer_state.json").write_text(json.dumps(state))
    (folder / ckpt_module.MANIFEST).write_text(json.dumps({**ckpt_module.manifest(folder), "model_only": False}))
    resumed = run(tiny_model_dir, tmp_path / "old", resume=tmp_path / "old", **over)
    assert (resumed.updates, resumed.slices) == (5, 8)


def test_until_max_updates_adds_the_steps_a_cut_batch_left(tiny_model_dir, tmp_path):
    # grpokit.trl's reading: train.steps are the rounds that make train.max_updates from step 0 (8 updates: 2
    # steps of 4). The first run ends at 3 updates (inside step 1); resumed to 8, it needs 5 more: step 2 makes
    # 4, step 3 one, so train.steps becomes 1 + 2 = 3 (as the run's config records). A native run keeps its 2 steps.
    over = {"algo.num_iterations": 2, "train.updates_per_batch": 2, "train.steps": 2}
    run(tiny_model_dir, tmp_path / "trl", **over, **{"train.max_updates": 3}).train()
    resumed = run(
        tiny_model_dir, tmp_path / "trl", resume=tmp_path / "trl", until_max_updates=True, **over,
        **{"train.max_updates": 8},
    )  # fmt: skip
    assert resumed.cfg.train.steps == 3 and resumed.state.max_steps == 3
    resumed.train()
    assert (resumed.step, resumed.updates) == (3, 8)
    assert load_run_config(tmp_path / "trl").train.steps == 3  # config_history.yaml: 2 -> 3 at step 1


@pytest.mark.slow
def test_grpokit_train_resume_after_max_updates_inside_a_step(tiny_model_dir, tmp_path):
    # the real command: 2 updates a step (algo.num_iterations 2); train.max_updates=3 ends the run inside step 2;
    # --resume with train.max_updates=5 makes updates 4 and 5 (step 3) and ends: 5 in the schedule, not 4
    cfg = write_setup(tmp_path, tiny_model_dir)
    rc, _, err = finish(start(["--config", str(cfg), "--out", str(tmp_path / "run"), "train.max_updates=3"], tmp_path))
    assert rc == 0, err[-2000:]
    assert saved_state(tmp_path / "run", 2)["updates"] == 3
    rc, out, err = finish(start(["--resume", str(tmp_path / "run"), "train.max_updates=5"], tmp_path))
    assert rc == 0, err[-2000:]
    assert "was written between two updates of step 2's batch, 1 of its slices untrained" in out + err
    final = tmp_path / "run" / "checkpoints" / "step-000003"
    assert saved_state(tmp_path / "run", 3)["updates"] == 5
    scheduler = torch.load(final / "optimizer.pt", weights_only=False)["scheduler"]
    assert scheduler["last_epoch"] == 5
