"""Asynchronous rollout: batches are sampled in the background by a policy snapshot at most
max_staleness updates old, the staleness is reported, and TIS corrects the stale samples."""

import json

import pytest

from grpokit.rollout.engine import HFEngine
from helpers.runs import make


@pytest.mark.parametrize("staleness", [1, 2])
def test_staleness_is_bounded_and_reported(tiny_model_dir, tmp_path, staleness, caplog):
    tr = make(
        tiny_model_dir,
        tmp_path / "run",
        **{"rollout.async_staleness": staleness, "train.steps": 4, "data.eval_size": 0},
    )
    tr.train()
    eng = tr.engine
    assert eng.log, "the background thread produced nothing"
    for index, version in eng.log:  # the one rule (rollout/async_plan.py): batch j is sampled by version j - s
        assert version == max(0, index - staleness), (index, version)
    assert not eng.thread.is_alive()  # closed at the end of train()
    steps = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"reward"' in l]
    assert len(steps) == 4
    for s in steps:
        assert 0 <= s["rollout/staleness"] <= staleness
        assert "tis/ratio_max" in s and "tis/logp_abs_diff_mean" in s
        tokens = s["tokens_per_second"] * s["time/step"]  # the sampler's speed, not the trainer's take of the batch
        assert s["rollout/tokens_per_second"] == pytest.approx(tokens / s["time/sampling"], rel=1e-2)
    assert [s["rollout/staleness"] for s in steps] == [min(j, staleness) for j in range(4)]
    # every step trained the batch the sampler prefetched for it (none sampled by the trainer instead)
    assert not [r for r in caplog.records if "did not prefetch" in r.getMessage()]
    # on the CPU the sampler and the update share the cores: said once, as a warning, never silently slower
    slower = [r for r in caplog.records if r.levelname == "WARNING" and "slower than synchronous" in r.getMessage()]
    assert len(slower) == 1 and f"rollout.async_staleness={staleness} samples on the same CPU" in slower[0].getMessage()


@pytest.mark.parametrize("workers", [0, 1], ids=["thread", "worker process"])
def test_gfpo_oversampling_trains_on_the_prefetched_batches(tiny_model_dir, tmp_path, workers):
    """GFPO samples rollout.sample_group_size completions a prompt in a step's first batch: the sampler must
    prefetch batches of that size, or the trainer never takes one (it sampled every step itself while the
    sampler's batches piled up and their prompts were skipped)."""
    tr = make(
        tiny_model_dir,
        tmp_path / "run",
        **{
            "rollout.async_staleness": 1,
            "rollout.async_workers": workers,
            "rollout.sample_group_size": 6,
            "train.steps": 3,
            "data.eval_size": 0,
        },
    )
    tr.train()
    assert tr.engine.G == 6 and tr.engine.taken == 2  # every step's batch came from the sampler
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"reward"' in l]
    assert [r["rollout/staleness"] for r in rows] == [0.0, 1.0, 1.0]


def test_a_step_that_did_not_train_its_prefetched_batch_is_warned_about_once(tiny_model_dir, tmp_path, caplog):
    """A path that bypasses the prefetch (as GFPO's first batch size once did) must not go unsaid: the
    sampler's batch and its prompts would go unused while the trainer samples every step itself."""
    import logging

    tr = make(tiny_model_dir, tmp_path / "run", **{"rollout.async_staleness": 1, "data.eval_size": 0})
    with caplog.at_level(logging.WARNING):
        for step in (1, 2):  # two updates published with no batch taken
            tr.engine.after_update(tr.model, step)
    tr.engine.close()
    said = [r.getMessage() for r in caplog.records if "did not prefetch" in r.getMessage()]
    assert said == [
        "step 0 trained a batch the asynchronous sampler did not prefetch (rollout.async_staleness=1): the trainer "
        "sampled it itself, and the sampler's batch 0 and its prompts went unused; this is grpokit's fault, please "
        "report it with the run's config.yaml"
    ]


def test_async_on_the_trainers_gpu_is_warned_about_with_its_measurement(caplog):
    """A sampler thread on the trainer's own GPU shares the card with the update: replaying graphs on its own stream
    it measured 5.5-5.7 s a step against sync's 5.2-5.4 on an H200 (bench/RESULTS.md, 2026-11-30), no faster, so it
    is said once, as on the CPU, with the measurement and the settings that do overlap."""
    import logging

    import torch

    from grpokit.train.engines import warn_shared_device_async

    with caplog.at_level(logging.WARNING):
        warn_shared_device_async(1, torch.device("cuda", 0))
    (msg,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert msg.startswith("rollout.async_staleness=1 samples in a thread on the trainer's own cuda device")
    assert "a step is no faster than synchronous" in msg and "5.5-5.7 s a step against 5.2-5.4" in msg
    assert "rollout.backend=vllm_server" in msg and "rollout.async_worker_device=cuda:N" in msg
    assert msg.endswith("or set rollout.async_staleness=0")


def test_synchronous_on_the_cpu_is_not_warned_about(tiny_model_dir, tmp_path, caplog):
    make(tiny_model_dir, tmp_path / "sync", **{"train.steps": 1})
    assert not [r for r in caplog.records if "slower than synchronous" in r.getMessage()]


def test_synchronous_by_default(tiny_model_dir, tmp_path):
    tr = make(tiny_model_dir, tmp_path / "sync", **{"train.steps": 1})
    assert isinstance(tr.engine, HFEngine)  # sampling on the trainer's own model
    assert "rollout/staleness" not in tr.train_step()


def test_a_checkpoint_keeps_the_in_flight_batches_and_refuses_another_staleness(tiny_model_dir, tmp_path):
    from grpokit.config import ConfigError
    from grpokit.train import Trainer
    from grpokit.train.checkpoint import load_extra
    from helpers.runs import ROWS, likes_a, tiny_cfg

    over = {"rollout.async_staleness": 2, "train.steps": 3, "train.save_every": 3, "data.eval_size": 0}
    make(tiny_model_dir, tmp_path / "run", **over).train()
    state = load_extra(tmp_path / "run" / "checkpoints" / "step-000003")["async_rollout"]
    assert state["step"] == 3 and state["staleness"] == 2
    assert sorted(state["prompts"]) == [3, 4, 5]  # batches 3 .. 3 + s, drawn before the checkpoint
    assert sorted(state["snapshots"]) == [1, 2]  # the weights batches 3 and 4 are sampled with
    assert state["snapshots"][1].keys() == {n for n, p in make(tiny_model_dir, tmp_path / "x").model.named_parameters()}

    cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{**over, "rollout.async_staleness": 1, "train.steps": 4})
    cfg.data.dataset = ""
    with pytest.raises(ConfigError, match=r"saved with rollout.async_staleness=2 at step 3, not 1 at step 3"):
        Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, resume=tmp_path / "run", quiet=True)


def test_a_process_that_ends_after_train_step_without_close_exits_cleanly(tiny_model_dir, tmp_path):
    """A script that drives the trainer by ``train_step`` and returns without ``close`` (bench/worker.py
    did) ended with the sampler thread inside a decode: the C++ runtime aborted the process ("terminate
    called without an active exception", exit -6), after the script's work was done. The sampler is
    closed at interpreter exit: the thread finishes its batch and the process exits 0."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    script = (
        "import sys; sys.path.insert(0, sys.argv[3])\n"
        "from helpers.runs import make\n"
        "tr = make(sys.argv[1], sys.argv[2], **{'rollout.async_staleness': 2, 'rollout.max_new_tokens': 48,\n"
        "          'train.steps': 50, 'data.eval_size': 0, 'train.threads': 2})\n"
        "tr.train_step()\n"
        "print('stepped', flush=True)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", script, str(tiny_model_dir), str(tmp_path / "run"), str(tests)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "stepped" in p.stdout, p.stderr[-2000:]
    assert p.returncode == 0 and "terminate called" not in p.stderr, (p.returncode, p.stderr[-2000:])


def test_a_worker_card_this_host_lacks_is_refused_before_the_run_folder_exists(tiny_model_dir, tmp_path):
    import torch

    from grpokit.config import ConfigError

    if torch.cuda.device_count() > 7:
        pytest.skip("this host has a cuda:7")
    over = {"rollout.async_staleness": 1, "rollout.async_workers": 1, "rollout.async_worker_device": "cuda:7"}
    with pytest.raises(ConfigError, match=r"^rollout.async_worker_device=cuda:7 but "):
        make(tiny_model_dir, tmp_path / "run", **over)
    assert not (tmp_path / "run").exists()


def test_the_workers_device_is_the_trainers_unless_set():
    import torch

    from grpokit.config.sections import RolloutConfig
    from grpokit.train.engines import worker_device

    card = torch.device("cuda", 1)  # a device object needs no card to exist
    assert worker_device(RolloutConfig(), card, 1) == card
    assert worker_device(RolloutConfig(async_worker_device="cpu"), card, 1) == torch.device("cpu")
    assert worker_device(RolloutConfig(), torch.device("cpu"), 2) == torch.device("cpu")


def test_a_worker_device_this_process_cannot_use_is_refused_in_one_sentence_and_nothing_else_said(caplog):
    """rollout.async_worker_device names a card: without CUDA, or one fixed card for several ranks, the run is
    refused in one sentence saying what would do, before anything is built or warned about."""
    import logging

    import torch

    from grpokit.config import Config, ConfigError
    from grpokit.train.distributed import DistContext
    from grpokit.train.engines import make_engine

    cfg = Config()
    cfg.rollout.async_staleness, cfg.rollout.async_workers, cfg.rollout.async_worker_device = 1, 2, "cuda:1"
    with caplog.at_level(logging.WARNING), pytest.raises(ConfigError) as e:
        make_engine(cfg, None, 0, None, torch.device("cpu"), DistContext(world_size=2), None, None)
    assert str(e.value) == (
        'rollout.async_worker_device=cuda:1 would put every one of the 2 ranks\' workers on that card; leave it "" '
        "(each rank's own card), or start `grpokit rollout-worker --device cuda:1` workers "
        "(rollout.async_remote_workers)"
    )
    if not torch.cuda.is_available():
        cfg.rollout.async_worker_device = "cuda"
        with caplog.at_level(logging.WARNING), pytest.raises(ConfigError) as e:
            make_engine(cfg, None, 0, None, torch.device("cpu"), DistContext(), None, None)
        assert str(e.value) == (
            'rollout.async_worker_device=cuda but torch sees no CUDA device on this host; use cpu or "" (the '
            "trainer's device)"
        )
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
