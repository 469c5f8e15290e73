"""A cluster's preemption: SIGTERM (Kubernetes, Slurm), SIGUSR1 (Slurm's --signal) and SIGHUP stop a real
`grpokit train` process as Ctrl-C does: a checkpoint of the last finished step, exit status 128 + the
signal's number, and `--resume` continues to the uninterrupted run's weights and metrics, each step
logged once. A step that cannot finish within train.stop_grace_s is cut and trained again."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from grpokit.train.stopping import GracefulStop, StepAbandoned, exit_status
from helpers.train_processes import (
    STEPS,
    final_state,
    finish,
    logged_steps,
    start,
    wait_for,
    write_setup,
)


def assert_equal_runs(a, b):
    (w_a, m_a), (w_b, m_b) = a, b
    assert w_a.keys() == w_b.keys()
    for k in w_a:
        assert torch.equal(w_a[k], w_b[k]), k
    assert m_a == m_b


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP])
def test_a_stop_signal_checkpoints_the_last_finished_step_and_resume_continues_exactly(
    tiny_model_dir, tmp_path, reference, sig
):
    cfg = write_setup(tmp_path, tiny_model_dir)  # save_every=1000: without the signal's checkpoint, nothing is kept
    run = tmp_path / "run"
    victim = start(["--config", str(cfg), "--out", str(run)], tmp_path)
    wait_for(lambda: len(logged_steps(run)) >= 2, victim)
    victim.send_signal(sig)
    rc, _, err = finish(victim, timeout=120)
    done = logged_steps(run)
    assert rc == 128 + sig == exit_status(sig), err[-2000:]
    assert 2 <= len(done) < STEPS and done == list(range(1, len(done) + 1))
    ckpt = f"{run.name}/checkpoints/step-{len(done):06d}"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"step-{len(done):06d}"]
    assert f"grpokit: stopped by {signal.Signals(sig).name} after step {len(done)} of {STEPS}; checkpoint " in err
    assert f"{ckpt} kept; continue with: grpokit train --resume {run}" in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["stop_signal"] == signal.Signals(sig).name
    assert not (run / "run.lock").exists()  # given back

    rc, _, err = finish(start(["--resume", str(run)], tmp_path))
    assert rc == 0, err[-2000:]
    assert logged_steps(run) == list(range(1, STEPS + 1))  # each step logged once
    assert_equal_runs(final_state(run), reference)


@pytest.mark.slow
def test_a_step_that_hangs_is_cut_after_the_grace_and_trained_again_at_resume(tiny_model_dir, tmp_path, reference):
    cfg = write_setup(tmp_path, tiny_model_dir, stop_grace_s=1.0)
    run = tmp_path / "run"
    # reward call 5 is step 3's first: it sleeps 600 s (its timeout is 300 s), so the step cannot finish
    victim = start(["--config", str(cfg), "--out", str(run)], tmp_path, env={"HANG_AT_CALL": "5"})
    wait_for(lambda: (tmp_path / "hanging").exists(), victim)
    sent = time.monotonic()
    victim.send_signal(signal.SIGTERM)
    rc, _, err = finish(victim, timeout=120)
    took = time.monotonic() - sent
    assert rc == 143, err[-2000:]
    assert took < 60, f"the stop took {took:.0f} s: the hung step was waited for, not cut"  # grace 1 s + a tiny save
    assert logged_steps(run) == [1, 2] and (run / "checkpoints" / "step-000002").is_dir()
    assert "stopped by SIGTERM after step 2 of 6" in err

    rc, _, err = finish(start(["--resume", str(run)], tmp_path))  # step 3 again, from the random state it began with
    assert rc == 0, err[-2000:]
    assert logged_steps(run) == list(range(1, STEPS + 1))
    assert_equal_runs(final_state(run), reference)


# ---------------------------------------------------------------- the handlers, in this process


def test_a_signal_ignored_at_start_stays_ignored_and_the_others_are_restored(handlers):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
    before = signal.getsignal(signal.SIGTERM)
    stop = GracefulStop()
    stop.install()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == stop._handle
    stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before


def test_ctrl_c_twice_stops_at_once_and_a_second_term_cuts_only_what_may_be_cut(handlers):
    exits = []
    stop = GracefulStop(grace_s=float("inf"), hard_exit=lambda: exits.append(1))
    stop.install()
    signal.raise_signal(signal.SIGINT)
    assert stop.requested and stop.signum == signal.SIGINT and not stop.cut_due and not exits
    signal.raise_signal(signal.SIGINT)
    assert exits == [1]  # the real one ends the process (tests/train/test_hard_stop.py)
    stop.uninstall()

    cuttable = []
    stop = GracefulStop(grace_s=float("inf"), cuttable=lambda: bool(cuttable))
    stop.install()
    signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGTERM)  # during an update: the cut waits for work that may be cut
    assert stop.cut_due
    cuttable.append(True)
    with pytest.raises(StepAbandoned):
        stop.cut_if_due()
    stop.cut_if_due()  # once per stop
    stop.uninstall()


def test_the_grace_timer_cuts_the_main_thread_when_it_runs_out(handlers):
    stop = GracefulStop(grace_s=0.2, cuttable=lambda: True)
    stop.install()
    try:
        signal.raise_signal(signal.SIGUSR1)
        start = time.monotonic()
        with pytest.raises(StepAbandoned):
            threading.Event().wait(30)  # a step that would sample for 30 s
        assert time.monotonic() - start < 10
    finally:
        stop.uninstall()


def test_a_grace_wake_up_still_pending_at_uninstall_is_absorbed_not_a_keyboard_interrupt(handlers, monkeypatch):
    """The timer's wake-up was sent just before the run's end, and the main thread has not run its
    handler yet when the handlers are restored: Python's own SIGINT handler must never see it."""
    import grpokit.train.stopping as stopping

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python starts (a background job's is ignored)
    stop = GracefulStop(grace_s=float("inf"))
    stop.install()
    signal.raise_signal(signal.SIGINT)  # Ctrl-C: the stop is requested
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        stop._grace_over()  # the timer's wake-up, held back by the mask: sent, not yet handled
        assert stop._nudged
        # the main thread gets to it only while uninstall waits (the mask lifts inside that wait)
        real_sleep = stopping.time.sleep
        monkeypatch.setattr(
            stopping.time,
            "sleep",
            lambda s: (signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}), real_sleep(s)),
        )
        stop.uninstall()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # with the old uninstall: KeyboardInterrupt here
    assert not stop._nudged and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_grpotrainer_train_stops_on_sigterm_with_a_checkpoint_and_resumes(tmp_path, handlers):
    """grpokit.trl's trainer.train() in this process: SIGTERM during step 2 (save_steps=1000) returns
    with the summary saying so and a checkpoint of step 2; a new trainer resumes to max_steps, each
    step logged once."""
    import os

    from datasets import Dataset

    from grpokit.trl import GRPOConfig, GRPOTrainer
    from helpers.trl_models import make_chat_model

    calls = []

    def short(completions, **kw):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return [1.0 / (1 + len(str(c))) for c in completions]

    model, out = make_chat_model(tmp_path / "model"), tmp_path / "out"
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh")])

    def trainer():
        args = GRPOConfig(
            output_dir=str(out),
            max_steps=4,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=4,
            use_cpu=True,
            disable_tqdm=True,
            learning_rate=0.05,
            logging_steps=1,
            save_steps=1000,
            seed=0,
            report_to="none",
        )
        return GRPOTrainer(model=str(model), reward_funcs=[short], args=args, train_dataset=rows)

    tr = trainer()
    tr.train()
    assert tr.summary["interrupted"] is True and tr.summary["stop_signal"] == "SIGTERM" and tr.summary["steps"] == 2
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000002"]
    tr = trainer()
    assert tr.train(resume_from_checkpoint=True).global_step == 4
    assert [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_stop_sent_to_the_whole_process_group_spares_the_reward_workers(tiny_model_dir, tmp_path):
    """Ctrl-C in a terminal and Slurm's signals reach every process of the job, reward workers included:
    they leave the decision to the trainer. Step 3's reward call hangs in the worker; the signal must not
    kill the worker (which would end the call as a counted failure, or retry it), but the trainer cuts
    the step after its grace, so the run keeps steps 1-2 and no failure."""
    import os

    cfg = write_setup(tmp_path, tiny_model_dir, stop_grace_s=2.0)
    run = tmp_path / "run"
    victim = start(
        ["--config", str(cfg), "--out", str(run), "reward.num_workers=1"],
        tmp_path,
        env={"HANG_AT_CALL": "5"},
        start_new_session=True,
    )
    wait_for(lambda: (tmp_path / "hanging").exists(), victim)
    os.killpg(victim.pid, signal.SIGTERM)
    rc, _, err = finish(victim, timeout=120)
    assert rc == 143, err[-2000:]
    assert "stopped by SIGTERM after step 2 of 6" in err and logged_steps(run) == [1, 2]
    assert (run / "checkpoints" / "step-000002").is_dir()
    assert (tmp_path / "calls").read_text() == "5"  # the hung call was not retried in a new worker


def test_grpokit_trl_grpo_stops_on_sigterm_with_128_plus_n_a_checkpoint_and_no_final_model(chat_model, tmp_path):
    """TRL's command line, `grpokit trl grpo ...`, under a cluster's SIGTERM while step 3's reward runs
    (save_steps=1000): exit 128 + 15, a checkpoint of step 2, and no final model saved as if it finished."""
    from helpers.train_processes import REWARD

    (tmp_path / "myrewards.py").write_text(REWARD)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {w}"}) + "\n" for w in ("ab", "cd", "ef", "gh")))
    out = tmp_path / "out"
    args = [
        "trl",
        "grpo",
        "--model_name_or_path",
        chat_model,
        "--dataset_name",
        str(data),
        "--reward_funcs",
        "myrewards.likes_a",
        "--output_dir",
        str(out),
        "--max_steps",
        "6",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "4",
        "--save_steps",
        "1000",
        "--report_to",
        "none",
        "--use_cpu",
        "True",
        "--bf16",
        "False",
        "--logging_steps",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "HANG_AT_CALL": "3"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpokit.cli", *args],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "hanging").exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the run never reached step 3's reward"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM after step 2" in err
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000002"]
    assert not (out / "model.safetensors").exists()  # not saved as a finished model
