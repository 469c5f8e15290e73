"""Rollout worker processes (rollout.async_workers): real spawned workers sample the async schedule; a worker
killed with SIGKILL, stopped with SIGSTOP or returning garbage is a counted fault with its own sentence, which
stops the run or (async_worker_fault=drop) drops the worker while another one redoes its batch, equal to it."""

import os
import re
import signal

import pytest
import torch

from grpokit.rollout.async_workers import RolloutWorkerError
from helpers.config_errors import section_error
from helpers.rollout_workers import bump, garbage_sample, process_engine, run_steps, slow_sample


def test_two_workers_sample_the_schedule_and_a_killed_one_is_dropped(capsys):
    engine, model = process_engine(2, on_fault="drop")
    try:
        victim = engine.pool.workers[0].proc.pid
        os.kill(victim, signal.SIGKILL)
        _, metrics = run_steps(engine, model, 3)  # every batch still equals the schedule's, the victim's redone
        assert metrics["rollout/worker_faults"] == 1 and metrics["rollout/workers"] == 1
        assert metrics["rollout/staleness"] == 1 and metrics["time/weight_sync"] > 0
        assert f"rollout worker 0 (pid {victim})" in capsys.readouterr().out
    finally:
        engine.close()
    assert not engine.pool.workers


def test_a_busy_worker_killed_with_sigkill_is_said_to_be_killed_by_it(capfd):
    """kill -9 of a worker while it works on batch 0 closes its pipe and its process sentinel at once. The pipe
    is read first (a batch sent before a death is still taken), and its EOF used to end the sentence as "closed
    its connection while working on batch 0 (EOFError)", the signal lost; now the pool waits for the exit code.
    A worker killed while fetching a shared tensor's descriptor also left a ConnectionResetError traceback from
    multiprocessing's resource_sharer thread on stderr: nothing but the sentence is said."""
    engine, model = process_engine(1, on_fault="stop", sample=slow_sample)  # batch 0 takes SLOW_S to sample
    pid = engine.pool.workers[0].proc.pid
    try:
        assert engine.pool.workers[0].job.index == 0  # sent at the start: it loads version 0, then samples
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(
            RolloutWorkerError,
            match=rf"^rollout worker 0 \(pid {pid}\) was killed by SIGKILL while working on batch 0$",
        ):
            engine.prefetched(2, 3)
        assert engine.pool.stats.faults == 1
    finally:
        engine.close()
    assert "Traceback" not in capfd.readouterr().err


def test_an_idle_worker_killed_with_sigkill_is_said_to_be_killed_by_it_when_sent_its_next_batch():
    """Staleness 1: batches 0 and 1 done, batch 2 waits for version 1, the worker idles and is killed. No wait
    watches an idle worker; the next batch's send finds its pipe closed. Before: "could not be sent batch 2
    (BrokenPipeError: it died while idle)", the signal lost."""
    engine, model = process_engine(1, on_fault="stop")
    w = engine.pool.workers[0]
    try:
        engine.prefetched(2, 3)  # batch 0
        engine.pool.result(1)  # batch 1 done: nothing left that version 0 can sample
        assert w.phase == "idle"
        os.kill(w.proc.pid, signal.SIGKILL)
        w.proc.join(10)
        bump(model)
        with pytest.raises(
            RolloutWorkerError,
            match=rf"^rollout worker 0 \(pid {w.proc.pid}\) was killed by SIGKILL while idle \(found when it was "
            r"sent batch 2\)$",
        ):
            engine.after_update(model, 1)  # publishes version 1: batch 2 goes to the worker
    finally:
        engine.close()


def test_the_handle_sharers_broken_connections_are_not_printed(capfd):
    """The resource_sharer thread's own failure when the process it serves has gone (here a client that
    authenticates and closes before asking: the thread's recv meets EOF) prints nothing once a pool has started;
    an exception of any other thread still reaches the hook as before."""
    import sys
    import threading
    from multiprocessing import connection, process, resource_sharer

    from grpokit.rollout.async_workers import quiet_handle_sharer

    quiet_handle_sharer()
    r, w = os.pipe()
    try:
        shared = resource_sharer.DupFd(r)  # registers the descriptor and starts the sharer's thread
        connection.Client(shared._id[0], authkey=process.current_process().authkey).close()  # gone, asking nothing
        os.close(shared.detach())  # the next request is served once the broken one is done with (one at a time)
    finally:
        os.close(r), os.close(w)
    assert "Traceback" not in capfd.readouterr().err  # before: EOFError's traceback from the sharer's thread
    other = threading.Thread(target=lambda: sys.excepthook(ConnectionResetError, ConnectionResetError(104, "x"), None))
    other.start(), other.join()
    assert "ConnectionResetError" in capfd.readouterr().err  # another thread's: said as before


def test_a_lora_policy_sends_only_its_adapters_to_the_worker():
    pytest.importorskip("peft")
    from grpokit.config.sections import ModelConfig
    from grpokit.train.lora import add_adapters
    from helpers.models import tiny_qwen2

    engine, model = process_engine(1, model=add_adapters(tiny_qwen2(seed=1), ModelConfig(lora_rank=4)))
    try:
        _, metrics = run_steps(engine, model, 3)  # the worker samples every version's adapters as the schedule says
    finally:
        engine.close()
    adapters = sum(p.numel() * 4 for n, p in model.named_parameters() if p.requires_grad)
    assert adapters < metrics["rollout/weight_sync_bytes"] < adapters + 4096  # the adapters and small buffers
    assert all("lora_" in name for name in engine.plan.trainable)


def test_a_stopped_worker_misses_its_deadline_and_stops_the_run():
    engine, model = process_engine(1, on_fault="stop", timeout_s=2.0)
    pid = engine.pool.workers[0].proc.pid
    try:
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(
            RolloutWorkerError,
            match=rf"rollout worker 0 \(pid {pid}\) did not .* within "
            r"rollout.async_timeout_s=2 s \(hung or stopped\)",
        ):
            run_steps(engine, model, 3)
        assert engine.pool.stats.faults == 1
    finally:
        engine.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed, not left stopped


def test_a_worker_returning_garbage_is_a_fault_named_by_what_is_wrong():
    engine, model = process_engine(1, on_fault="stop", sample=garbage_sample)
    try:
        with pytest.raises(
            RolloutWorkerError,
            match=r"rollout worker 0 \(pid \d+\) returned a malformed batch 0: "
            r"a token id outside the vocabulary",
        ):
            engine.prefetched(2, 3)
    finally:
        engine.close()


@pytest.mark.parametrize(
    "rollout, env, message",
    [
        ({"async_workers": 2}, {}, r"^rollout.async_workers=2 needs rollout.async_staleness >= 1$"),
        ({"async_workers": -1}, {}, r"^rollout.async_workers=-1 must be >= 0"),
        (
            {"async_staleness": 1, "async_timeout_s": 0},
            {},
            r"^rollout.async_timeout_s=0 must be a finite number > 0 of seconds$",
        ),
        ({"async_staleness": 1, "async_worker_fault": "retry"}, {}, r"^rollout.async_worker_fault='?retry'? "),
        (
            {"async_staleness": 1, "async_workers": 1, "backend": "vllm"},
            {},
            r"^rollout.async_workers runs the hf engines, not rollout.backend=vllm",
        ),
        (
            {"async_staleness": 1, "async_workers": 1},
            {"tools": ["python"]},
            r"^rollout.async_workers samples one-turn completions, not episodes",
        ),
        (
            {"async_staleness": 1, "async_workers": 1, "async_worker_device": "gpu1"},
            {},
            r"^rollout.async_worker_device='gpu1' is not valid; use \"\" \(the trainer's device\), cpu, cuda or "
            r"cuda:N$",
        ),
        (
            {"async_staleness": 1, "async_workers": 1, "async_worker_device": "cuda:x"},
            {},
            r"^rollout.async_worker_device='cuda:x' is not valid",
        ),
    ],
)
def test_what_workers_cannot_do_is_one_sentence(rollout, env, message):
    assert re.search(message, section_error(rollout=rollout, env=env))


@pytest.mark.parametrize(
    "rollout, message",
    [
        (
            {"async_staleness": 1, "async_worker_device": "cuda:1"},
            "rollout.async_worker_device='cuda:1' has no effect with rollout.async_workers=0; set "
            "rollout.async_workers >= 1, or leave it ''",
        ),
        (
            {"async_staleness": 1, "async_remote_workers": 1, "async_worker_threads": 4},
            "rollout.async_worker_threads=4 has no effect with rollout.async_workers=0; set "
            "rollout.async_workers >= 1, or leave it 0",
        ),
        (
            {"async_staleness": 1, "async_workers": 1, "async_listen": "0.0.0.0:29710"},
            "rollout.async_listen='0.0.0.0:29710' has no effect with rollout.async_remote_workers=0; set "
            "rollout.async_remote_workers >= 1, or leave it '127.0.0.1:29710'",
        ),
        (
            {"async_timeout_s": 30.0},
            "rollout.async_timeout_s=30.0 has no effect with rollout.async_staleness=0; set "
            "rollout.async_staleness >= 1, or leave it 600.0",
        ),
        (
            {"async_staleness": 1, "async_worker_fault": "drop"},
            "rollout.async_worker_fault='drop' has no effect with no rollout worker processes; set "
            "rollout.async_workers >= 1 or rollout.async_remote_workers >= 1, or leave it 'stop'",
        ),
    ],
)
def test_a_worker_setting_no_worker_reads_is_refused_not_ignored(rollout, message):
    assert section_error(rollout=rollout) == message


@pytest.mark.parametrize("workers", ["async_workers", "async_remote_workers"])
def test_a_quantised_base_is_not_sent_to_workers(workers):
    said = section_error(rollout={"async_staleness": 1, workers: 1}, model={"quantization": "4bit", "lora_rank": 4})
    assert said == (
        f"rollout.{workers} cannot send a 4bit quantised base to a worker process (bitsandbytes' packed weights and "
        f"their quantisation state are not plain tensors); set rollout.{workers}=0"
    )


def test_liger_kernels_methods_stay_with_the_trainer_and_the_worker_draws_the_schedule():
    """model.kernels binds liger-kernel's forward and name to the policy's modules, bound methods pickle cannot
    name: the copy sent to a worker goes without them (a worker on a card binds its own; on the CPU its layers
    run their own code), and the trainer's model keeps them. Stand-ins here: liger-kernel runs on CUDA only
    (tests/rollout/test_gpu_workers.py trains with the real one on a card)."""
    from helpers.models import tiny_qwen2

    ns = {"__name__": "liger_kernel.transformers.rms_norm"}  # the functions' module, as liger-kernel's own
    exec("def forward(self, x):\n    return type(self).forward(self, x)\n\nname = lambda self: 'LigerRMSNorm'", ns)
    model = tiny_qwen2(seed=1)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    for m in norms:
        vars(m)["forward"], vars(m)["_get_name"] = ns["forward"].__get__(m), ns["name"].__get__(m)
    engine, model = process_engine(1, model=model)
    try:
        run_steps(engine, model, 2)
    finally:
        engine.close()
    assert norms and all(vars(m)["forward"].__func__ is ns["forward"] and "_get_name" in vars(m) for m in norms)


def test_a_forward_the_worker_could_not_rebuild_is_refused_naming_the_setting():
    """A module whose forward was replaced by anything but oneDNN routing or liger-kernel (NEFTune's noise, a
    user's patch) cannot reach a worker: one sentence naming the workers' setting, the trainer's model as it was."""
    from grpokit.config import ConfigError
    from grpokit.rollout.async_process import sendable
    from helpers.models import tiny_qwen2

    model = tiny_qwen2(seed=1)
    embed = model.get_input_embeddings()
    embed.forward = lambda ids: torch.nn.Embedding.forward(embed, ids) + 0.1  # a patch of the user's
    with pytest.raises(ConfigError) as e:
        process_engine(1, model=model)
    assert str(e.value) == (
        "rollout.async_workers cannot send a model whose Embedding has a replaced forward (model.lm_head_fp32, "
        "NEFTune, ...); set rollout.async_workers=0"
    )
    with pytest.raises(ConfigError, match=r"^rollout.async_remote_workers cannot send .*async_remote_workers=0$"):
        with sendable(model, "rollout.async_remote_workers"):
            pass
    assert "forward" in vars(embed)


def test_a_checkpointed_policy_reaches_the_worker():
    # gradient checkpointing (or the memory plan turning it on) hooks the input embeddings with a local function
    # pickle cannot name: the worker's copy goes without it (a no-op under no_grad) and samples the schedule
    from grpokit.train.models import enable_checkpointing
    from helpers.models import tiny_qwen2

    model = tiny_qwen2(seed=1)
    enable_checkpointing(model)
    hooked = [m for m in model.modules() if m._forward_hooks]
    assert hooked, "transformers no longer hooks the embeddings: this test checks nothing"
    engine, model = process_engine(1, model=model)
    try:
        run_steps(engine, model, 2)
    finally:
        engine.close()
    assert all(m._forward_hooks for m in hooked)  # the trainer's model keeps its hook


def test_a_policy_of_more_tensors_than_a_process_start_can_carry_reaches_the_worker():
    # a forkserver child's arguments carry at most ~250 file descriptors, one per shared tensor: SmolLM2-135M's
    # 272 stopped every worker run at its start ("too many fds"); the init record now goes through the pipe
    import transformers

    torch.manual_seed(1)
    cfg = transformers.Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=24, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    assert len(list(model.parameters())) > 256
    engine, model = process_engine(1, model=model)
    try:
        run_steps(engine, model, 1)
    finally:
        engine.close()


def test_cpu_threads_split_between_the_trainer_and_its_workers(tiny_model_dir, tmp_path):
    """rollout.async_workers on the CPU: the trainer's train.threads split evenly (at least one each), so the
    processes do not run twice the threads between them; rollout.async_worker_threads sets the workers' own."""
    from grpokit.train import Trainer
    from grpokit.train.engines import split_cpu_threads
    from helpers.runs import ROWS, likes_a, tiny_cfg

    # (threads, workers) -> (trainer's, each worker's), by hand: an even share, at least one
    assert [split_cpu_threads(t, w) for t, w in [(2, 1), (16, 1), (16, 3), (2, 2), (1, 1), (5, 1)]] == [
        (1, 1),
        (8, 8),
        (4, 4),
        (1, 1),
        (1, 1),
        (3, 2),
    ]
    before = torch.get_num_threads()
    try:
        for over, want in [({}, (2, 2)), ({"rollout.async_worker_threads": 3}, (4, 3))]:
            cfg = tiny_cfg(tiny_model_dir, tmp_path / f"run{len(over)}", **{"train.threads": 4, "train.steps": 1})
            for k, v in {"rollout.async_staleness": 1, "rollout.async_workers": 1, **over}.items():
                setattr(cfg.rollout, k.split(".")[1], v)
            cfg.data.dataset = ""
            trainer = Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True)
            try:
                trainer.train_step()  # the worker has said it is ready, with its threads
                assert (torch.get_num_threads(), trainer.engine.pool.workers[0].threads) == want
            finally:
                trainer.engine.close()
    finally:
        torch.set_num_threads(before)
