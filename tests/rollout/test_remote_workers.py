"""Rollout workers on other hosts (rollout.async_remote_workers), tested on loopback with real
``grpokit rollout-worker`` processes: they join the trainer's listener with the shared key, sample the async
schedule bit for bit as a local worker does (their weights through gloo pairs, partial rollouts' later
versions pushed), and a remote worker that dies, stops, holds the wrong key or never comes is a fault named in
one sentence, never a hang."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from grpokit.rollout.async_workers import RolloutWorkerError
from grpokit.rollout.weight_wire import ALIGN, Layout
from helpers.config_errors import section_error
from helpers.net import free_port
from helpers.rollout_workers import process_engine, remote_worker, run_steps


def _ended(worker: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    return worker.wait(timeout), worker.stderr.read()


def test_a_remote_worker_beside_a_local_one_samples_the_schedule_and_stops_when_told():
    port = free_port()
    worker = remote_worker(port)  # started before the trainer listens: it retries until it does
    engine, model = process_engine(1, remote=1, port=port)
    try:
        assert [w.label() for w in engine.pool.workers] == [
            f"rollout worker 0 (pid {engine.pool.workers[0].proc.pid})",
            f"rollout worker 1 (pid {worker.pid} on 127.0.0.1)",
        ]
        _, metrics = run_steps(engine, model, 4)  # every batch equals the schedule's, whichever worker drew it
        assert metrics["rollout/workers"] == 2 and metrics["rollout/worker_faults"] == 0
    finally:
        engine.close()
    assert _ended(worker) == (0, "")  # told to stop: exit 0, nothing said


@pytest.fixture(scope="module")
def local_partial():
    """A local worker's partial batches (staleness 2, segments of 3 tokens), steps 0-3."""
    local, model = process_engine(1, staleness=2, partial_tokens=3)
    try:
        return run_steps(local, model, 4, check=False)[0]
    finally:
        local.close()


def test_partial_rollouts_reach_a_remote_worker_as_a_local_one(local_partial):
    """Staleness 2, segments of 3 tokens: the remote worker waits mid-batch for versions the trainer publishes
    later, pushed to it through its gloo pair; its batches (tokens, versions, log-probabilities) equal a local
    worker's bit for bit."""
    want = local_partial
    port = free_port()
    worker = remote_worker(port)
    engine, model = process_engine(0, staleness=2, partial_tokens=3, remote=1, port=port)
    try:
        got, metrics = run_steps(engine, model, 4, check=False)
    finally:
        engine.close()
    assert any(3 in vs for vs in got[3][2])  # batch 3 ends under version 3, published while it was drawn
    assert got == want
    assert metrics["rollout/staleness_max"] == 2
    code, err = _ended(worker)
    assert code == 0, err


def test_a_waiting_remote_worker_gives_its_batch_back_for_a_dead_workers_and_redoes_it(capsys, local_partial):
    """Local worker 0 dies on batch 0 while remote worker 1 waits, mid-batch 1, for version 1, which only batch
    0's update publishes: the remote worker gives batch 1 back, takes batch 0, then redoes batch 1 from its
    start; the versions it held for the batch it gave back are released and their buffers reused, and every
    batch still equals a local worker's."""
    port = free_port()
    worker = remote_worker(port)
    engine, model = process_engine(1, on_fault="drop", staleness=2, partial_tokens=3, remote=1, port=port)
    try:
        os.kill(engine.pool.workers[0].proc.pid, signal.SIGKILL)
        got, metrics = run_steps(engine, model, 4, check=False)
    finally:
        engine.close()
    assert got == local_partial
    assert metrics["rollout/worker_faults"] == 1 and engine.pool.stats.given_back == 1
    assert "rollout worker 0 (pid" in capsys.readouterr().out
    assert _ended(worker)[0] == 0


def test_a_killed_remote_worker_is_dropped_and_its_batch_redone(capsys):
    port = free_port()
    worker = remote_worker(port)
    engine, model = process_engine(1, on_fault="drop", remote=1, port=port)
    try:
        os.kill(worker.pid, signal.SIGKILL)
        _, metrics = run_steps(engine, model, 3)
    finally:
        engine.close()
    assert metrics["rollout/worker_faults"] == 1 and metrics["rollout/workers"] == 1
    out = capsys.readouterr().out
    assert re.search(
        rf"rollout worker 1 \(pid {worker.pid} on 127.0.0.1\) "  # the kill is seen on its socket or on its gloo pair
        rf"(closed its connection|could not be sent weights through its gloo pair) while .*; dropped it, 1 left",
        out,
    ), out


def test_a_stopped_remote_worker_misses_its_deadline_and_exits_once_it_runs_again():
    port = free_port()
    worker = remote_worker(port)
    engine, model = process_engine(0, on_fault="stop", timeout_s=3.0, remote=1, port=port)
    try:
        os.kill(worker.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(
            RolloutWorkerError,
            match=rf"^rollout worker 0 \(pid {worker.pid} on 127.0.0.1\) did not .* within "
            r"rollout.async_timeout_s=3 s \(hung or stopped\)$",
        ):
            run_steps(engine, model, 3)
        assert time.monotonic() - t0 < 30
    finally:
        engine.close()
        os.kill(worker.pid, signal.SIGCONT)
    code, err = _ended(worker)  # it finds its connection closed: one sentence, status 1
    assert code == 1 and "closed the connection without telling this worker to stop" in err, err


def test_a_wrong_key_is_refused_on_both_sides_and_a_missing_worker_ends_the_start():
    # the listener itself (as RemoteWorkers.join opens it): the intruder's refusal is awaited before the start's
    # deadline is asked for, so a slow interpreter start on a loaded machine cannot outlast it
    from grpokit.rollout.async_remote import RemoteListener
    from helpers.rollout_workers import KEY

    port = free_port()
    listener = RemoteListener(("127.0.0.1", port), KEY.encode(), timeout_s=1.0)
    try:
        code, err = _ended(remote_worker(port, "another-key-of-enough-length"))
        assert code == 1 and "refused this worker's key (GRPOKIT_ROLLOUT_KEY differs" in err, err
        with pytest.raises(
            RolloutWorkerError,
            match=rf"^0 of the 1 remote rollout workers \(rollout.async_remote_workers\) connected to 127.0.0.1:{port} "
            r"within 0.5 s; refused 1: 127.0.0.1:\d+ \(AuthenticationError\); start each with `grpokit rollout-worker",
        ):
            listener.take(1, 0, 0.5)
    finally:
        listener.close()


def test_a_connection_that_never_answers_the_challenge_is_cut_off_and_holds_up_no_worker(monkeypatch, caplog):
    import socket
    import threading

    from grpokit.rollout import async_remote

    monkeypatch.setattr(async_remote, "CHALLENGE_S", 1.0)
    port = free_port()
    silent = socket.socket()

    def connect_and_say_nothing():
        for _ in range(600):  # the listener starts with the engine
            try:
                return silent.connect(("127.0.0.1", port))
            except ConnectionRefusedError:
                time.sleep(0.05)

    connector = threading.Thread(target=connect_and_say_nothing)
    connector.start()
    time.sleep(0.5)
    worker = remote_worker(port)
    with caplog.at_level("WARNING", logger="grpokit"):
        engine, model = process_engine(0, remote=1, port=port)  # the worker joins beside the silent connection
        try:
            run_steps(engine, model, 1)
            connector.join()
            silent.settimeout(30)
            while silent.recv(4096):  # the challenge, then the end: cut off after CHALLENGE_S
                pass
        finally:
            engine.close()
            silent.close()
        deadline = time.monotonic() + 10
        while "no answer within 1 s" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert re.search(
        r"refused a connection to rollout.async_listen from 127.0.0.1:\d+: .*no answer within 1 s", caplog.text
    )
    assert _ended(worker)[0] == 0


def test_a_failed_weights_send_is_a_fault_at_once_not_at_the_deadline(monkeypatch):
    """The trainer's sender thread fails (here: packing raises): the pool says so within a second or two,
    naming the worker and the cause, not after rollout.async_timeout_s as if the worker hung."""
    from grpokit.rollout import weight_wire

    def broken(self, tensors, out=None):
        raise ValueError("tensor x is torch.float64 (3,), the layout's torch.float32 (3,)")

    monkeypatch.setattr(weight_wire.Layout, "pack", broken)
    port = free_port()
    worker = remote_worker(port)
    engine, model = process_engine(0, timeout_s=60.0, remote=1, port=port)
    try:
        t0 = time.monotonic()
        with pytest.raises(
            RolloutWorkerError,
            match=rf"^rollout worker 0 \(pid {worker.pid} on 127.0.0.1\) could not be sent weights through its gloo "
            r"pair while working on batch 0 \(ValueError: tensor x is torch.float64",
        ):
            engine.prefetched(2, 3)
        assert time.monotonic() - t0 < 10
    finally:
        engine.close()
    assert _ended(worker)[0] == 1  # its connection closed by the fault


def test_a_policy_whose_sample_function_does_not_import_on_the_workers_host_is_one_sentence_each_side(
    tmp_path, monkeypatch
):
    # the trainer samples with a function from a module only its own process can import (tmp_path on its path,
    # not on the worker's): the worker says what did not load and what its host needs; the trainer names it
    (tmp_path / "only_here.py").write_text(
        "from grpokit.rollout.async_process import sample_one_turn\n\n"
        "def sample(ctx, model, generator, prompts):\n    return sample_one_turn(ctx, model, generator, prompts)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here

    port = free_port()
    worker = remote_worker(port)
    with pytest.raises(
        RolloutWorkerError,
        match=r"^rollout worker 0 \(on 127.0.0.1\) closed its connection while starting \(EOFError\)$",
    ):
        process_engine(0, remote=1, port=port, sample=only_here.sample)
    code, err = _ended(worker)
    assert (
        code == 1
        and (
            f"grpokit rollout-worker: the trainer's policy from 127.0.0.1:{port} does not load here "
            "(ModuleNotFoundError: No module named 'only_here'); this host needs the trainer's grpokit"
        )
        in err
    ), err


def test_a_worker_whose_trainer_never_listens_gives_up_in_one_sentence():
    port = free_port()
    code, err = _ended(remote_worker(port, "test-rollout-key-0123456789", "--wait", "1"))
    assert code == 1
    assert f"no trainer accepted a connection at 127.0.0.1:{port} within 1 s" in err, err


def test_a_device_this_host_lacks_ends_the_worker_in_one_sentence_before_it_connects():
    """``--device`` is checked before the worker connects: a name that is no device, or a card this host does not
    have, ends it at once (exit 1, one sentence saying what would do), not after a trainer sent it the policy."""
    port = free_port()  # nobody listens: a worker that tried to connect would wait --wait seconds first
    card = "cuda:99" if torch.cuda.is_available() else "cuda"
    lacks = (
        f"--device cuda:99: this host has {torch.cuda.device_count()} CUDA device(s)"
        if torch.cuda.is_available()
        else "--device cuda: torch sees no CUDA device on this host; use --device cpu"
    )
    for device, said in [("gpu0", "--device 'gpu0' is not valid; use cpu, cuda or cuda:N"), (card, lacks)]:
        t0 = time.monotonic()
        code, err = _ended(remote_worker(port, "test-rollout-key-0123456789", "--device", device, "--wait", "60"))
        assert code == 1 and err.startswith(f"grpokit rollout-worker: {said}") and err.count("\n") == 1, err
        assert time.monotonic() - t0 < 50  # it did not wait for a trainer


def test_a_worker_whose_trainer_is_killed_exits_in_one_sentence(tmp_path):
    """The trainer's process killed with SIGKILL mid-run: its worker finds the connection closed and ends."""
    port = free_port()
    worker = remote_worker(port)
    script = (
        "import sys, time; sys.path.insert(0, 'tests')\n"
        "from helpers.rollout_workers import process_engine\n"
        f"engine, model = process_engine(0, remote=1, port={port})\n"
        "engine.prefetched(2, 3); print('ready', flush=True); time.sleep(600)\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout.readline().startswith("grpokit: waiting for 1 rollout worker")
        assert trainer.stdout.readline() == "ready\n"
    finally:
        trainer.kill()
        trainer.wait()
    code, err = _ended(worker)
    assert code == 1 and f"the trainer at 127.0.0.1:{port} closed the connection without telling" in err, err


def test_the_weights_buffer_lays_each_tensor_at_an_aligned_offset_and_views_it_back():
    a = torch.arange(3, dtype=torch.float32)  # 12 bytes at 0
    b = torch.tensor([[1.5, -2.0, 3.25, 0.5, 8.0]], dtype=torch.bfloat16)  # 10 bytes at 64
    c = torch.tensor(7.0, dtype=torch.float64)  # 8 bytes at 128, a 0-d tensor
    tensors = {"a": a, "b": b, "c": c}
    layout = Layout.of(tensors, ["a", "b", "c"])
    assert ALIGN == 64 and layout.nbytes == 192
    assert [(e[0], e[3], e[4]) for e in layout.entries] == [("a", 0, 12), ("b", 64, 10), ("c", 128, 8)]
    buf = layout.pack(tensors)
    assert buf[:12].view(torch.float32).tolist() == [0.0, 1.0, 2.0]
    back = layout.unpack(buf)
    assert all(torch.equal(back[k], tensors[k]) and back[k].dtype == tensors[k].dtype for k in tensors)
    assert back["b"].shape == (1, 5) and back["c"].shape == ()
    with pytest.raises(ValueError, match=r"tensor a is torch.float64 \(3,\), the layout's torch.float32 \(3,\)"):
        layout.pack({**tensors, "a": a.double()})


@pytest.mark.parametrize(
    "rollout, key, message",
    [
        ({"async_remote_workers": 1}, "k" * 20, r"^rollout.async_remote_workers=1 needs rollout.async_staleness >= 1"),
        (
            {"async_staleness": 1, "async_remote_workers": 1},
            "",
            r"^remote rollout workers need a secret key of at least 16 characters in GRPOKIT_ROLLOUT_KEY .*it is "
            r"not set\)",
        ),
        (
            {"async_staleness": 1, "async_remote_workers": 1},
            "short",
            r"^remote rollout workers need a secret key .*it has 5 characters\)",
        ),
        (
            {"async_staleness": 1, "async_remote_workers": 1, "async_listen": "[::1]:29710"},
            "k" * 20,
            r"^rollout.async_listen='\[::1\]:29710' is not HOST:PORT with an IPv4 address",
        ),
        (
            {"async_staleness": 1, "async_remote_workers": 1, "async_listen": "127.0.0.1:0"},
            "k" * 20,
            r"^rollout.async_listen='127.0.0.1:0' is not HOST:PORT .* a port in 1..65535",
        ),
        (
            {"async_staleness": 1, "async_remote_workers": 1, "backend": "vllm"},
            "k" * 20,
            r"^rollout.async_remote_workers runs the hf engines, not rollout.backend=vllm",
        ),
        ({"async_remote_workers": -1}, "k" * 20, r"^rollout.async_remote_workers=-1 must be >= 0"),
    ],
)
def test_what_remote_workers_need_is_one_sentence(monkeypatch, rollout, key, message):
    monkeypatch.setenv("GRPOKIT_ROLLOUT_KEY", key)
    assert re.search(message, section_error(rollout=rollout))


def test_a_remote_workers_receive_counts_as_weight_sync_not_sampling():
    """The seconds a remote worker spends receiving a version through its pair are reported with the next
    ``synced`` (the trainer's time/weight_sync) and left out of the batch's sampling seconds (time/sampling)."""
    import multiprocessing

    from grpokit.rollout.async_worker import _Weights
    from grpokit.rollout.async_workers import Job
    from helpers.models import tiny_qwen2

    model = tiny_qwen2(seed=1)
    name, param = next(iter(model.named_parameters()))

    def slow_receive(version):
        time.sleep(0.3)
        return {name: torch.full_like(param, float(version))}

    trainer, worker = multiprocessing.Pipe()
    weights = _Weights(worker, model, [name], slow_receive)
    weights.start(Job(index=4, version=3, tensors=None, prompts=[]))
    _, version = weights.version_model(0)
    kind, index, segment, at, seconds = trainer.recv()
    assert (kind, index, segment, at, version) == ("synced", 4, 0, 3, 3) and seconds >= 0.3
    assert weights.received >= 0.3 and weights.waited == 0
    assert torch.equal(dict(model.named_parameters())[name], torch.full_like(param, 3.0))
