"""grpokit.trl under several processes: TRL's num_tokens and terminated lengths count every process's
completions (TRL gathers them: grpo_trainer.py's ``_generate_and_score_completions``), and a group TRL would split
across processes is refused in TRL's own terms; under torchrun the process group's timeout is ddp_timeout where TRL
applies it, and no grpokit setting is warned unread."""

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpokit.config import ConfigError
from grpokit.trl import GRPOConfig
from grpokit.trl.bridge import StepBridge
from grpokit.trl.mapping import to_config
from grpokit.types import Rollout
from helpers.paths import ROOT, TESTS


class _OtherRank:
    """Rank 0 of two for the bridge: the other rank's sums and terminated lengths are fixed."""

    active = True

    def __init__(self, sums, done):
        self.sums, self.done = list(sums), done

    def sum_floats(self, values):  # one all-reduce: a second call would find no sums left
        out, self.sums = [v + s for v, s in zip(values, self.sums, strict=True)], []
        return out

    def gather_varlen(self, x):
        return torch.cat([x, torch.tensor(self.done, dtype=x.dtype)])


def test_a_rounds_tokens_and_terminated_lengths_are_every_processes():
    # this rank: one prompt of 3 tokens, 2 completions of 2 (eos) and 4 (cut at the cap) tokens: 3*2 + 6 = 12
    # tokens, terminated [2]; the other rank: one call, 20 tokens, terminated [5, 1].
    # The job: 32 tokens; terminated [2, 5, 1]: mean 8/3, min 1, max 5 (this rank alone: 12 and 2, 2, 2)
    bridge = StepBridge(GRPOConfig("o", max_steps=1), [], 1, dict, lambda p, s: None, {})
    bridge.dist = _OtherRank(sums=[1.0, 20.0], done=[5, 1])  # calls, then tokens
    rollout = Rollout(
        prompt_ids=[[7, 8, 9]],
        completion_ids=[[1, 2], [1, 2, 3, 4]],
        sampling_logprobs=[[0.0] * 2, [0.0] * 4],
        finish_reasons=["eos", "length"],
        group_size=2,
    )
    bridge.add_sampled(rollout, [2, 4])
    bridge.sampled_round({"reward": 1.0})
    assert bridge.state.num_input_tokens_seen == 32
    # the round's metrics wait in TRL's _metrics["train"] (the bridge's pending values) for the next log
    assert bridge.take_metrics() == {
        "reward": 1.0,
        "num_tokens": 32.0,
        "completions/mean_terminated_length": pytest.approx(8 / 3),
        "completions/min_terminated_length": 1.0,
        "completions/max_terminated_length": 5.0,
    }


def test_a_group_split_across_processes_is_refused_in_trls_terms():
    # TRL 1.16 trains 2 completions a process x 2 processes = one group of 4 (generation_batch_size 4 is a
    # multiple of num_generations); grpokit keeps a group on one process and names TRL's fields, not its own
    a = GRPOConfig("o", per_device_train_batch_size=2, num_generations=4, max_steps=1)
    with pytest.raises(ConfigError) as e:
        to_config(a, num_rows=16, world_size=2)
    assert str(e.value) == (
        "per_device_train_batch_size * steps_per_generation = 2 * 1 = 2 completions per process is not a multiple "
        "of num_generations=4: TRL would split a group across the 2 processes, grpokit.trl keeps each group on one "
        "process; use per_device_train_batch_size=4 (a multiple of 4), or a num_generations >= 2 that divides 2"
    )
    assert "train.prompts_per_step" not in str(e.value)
    # whole groups per process: 4 a process, or 2 a pass over 2 passes a generation
    assert to_config(GRPOConfig("o", per_device_train_batch_size=4, num_generations=4), num_rows=16, world_size=2)
    two_passes = GRPOConfig("o", per_device_train_batch_size=2, num_generations=4, steps_per_generation=2)
    assert to_config(two_passes, num_rows=16, world_size=2).train.prompts_per_step == 2


def _worker(rank, init_file, model, out):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    try:
        from datasets import Dataset

        from grpokit.trl import GRPOTrainer
        from helpers.trl_models import small_args
        from helpers.trl_runs import PROMPTS

        seen = []  # this rank's sampling calls as the bridge sees them: (tokens, terminated lengths)
        real = StepBridge.add_sampled

        def add_sampled(self, rollout, lengths):
            real(self, rollout, lengths)
            seen.append(self.sampled[-1])

        StepBridge.add_sampled = add_sampled
        reward = lambda completions, **kw: [float(len(c[0]["content"])) for c in completions]  # noqa: E731
        args = small_args(GRPOConfig, out, max_steps=1, logging_steps=1, save_strategy="no", report_to="none")
        tr = GRPOTrainer(model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(PROMPTS))
        tr.train()
        (out / f"seen{rank}.json").write_text(json.dumps(seen))
        if rank == 0:
            (out / "log.json").write_text(json.dumps(tr.state.log_history))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_count_every_processes_tokens(chat_model, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    mp.spawn(_worker, args=(str(tmp_path / "init"), chat_model, out), nprocs=2, join=True)
    calls = [c for r in (0, 1) for c in json.loads((out / f"seen{r}.json").read_text())]
    tokens, done = sum(t for t, _ in calls), [n for _, lengths in calls for n in lengths]
    first = json.loads((out / "log.json").read_text())[0]
    assert first["num_tokens"] == tokens  # both processes' prompt and completion tokens
    assert first["completions/mean_terminated_length"] == pytest.approx(sum(done) / len(done) if done else 0.0)
    assert first["completions/max_terminated_length"] == (max(done) if done else 0.0)


# ---------------------------------------------------------------- a compute_loss override under 2 processes

SGD = dict(
    max_steps=1,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    seed=0,
    optim="sgd",
    max_grad_norm=0.0,
    lr_scheduler_type="constant",
    weight_decay=0.0,
)


def _loss_worker(rank, init_file, model, out):
    """Each rank trains 4 runs of one step: two compute_loss overrides returning a per-process mean (flag True;
    flag False with 2 micro-batches), and grpokit's own loss with and without a ``super()`` override."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    try:
        from datasets import Dataset

        from grpokit.trl import GRPOTrainer
        from helpers.trl_models import small_args
        from helpers.trl_runs import PROMPTS

        lengths = []  # this rank's rows' completion lengths, as its overrides saw them

        class Mean(GRPOTrainer):
            """The loss as TRL writes its own: a mean over this process's rows (of w - w.detach() + 1 times the
            row's completion length), so its gradient on w is the rows' mean length."""

            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                w = model.get_input_embeddings().weight[1, 0]
                length_N = inputs["completion_mask"].sum(-1).float()
                lengths.extend(length_N.tolist())
                return ((w - w.detach() + 1.0) * length_N).mean()

        class Halved(Mean):
            loss_is_scaled_for_ga = False

        class Super(GRPOTrainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        reward = lambda completions, **kw: [float(len(c[0]["content"])) for c in completions]  # noqa: E731
        data, result = Dataset.from_list(PROMPTS), {}
        runs = (
            ("mean", Mean, dict(learning_rate=0.1)),
            ("halved", Halved, dict(learning_rate=0.1, per_device_train_batch_size=2, gradient_accumulation_steps=2)),
            ("own", GRPOTrainer, dict(learning_rate=0.5)),
            ("super", Super, dict(learning_rate=0.5)),
        )
        for name, cls, kw in runs:
            lengths.clear()
            tr = cls(
                model, reward_funcs=[reward], args=small_args(GRPOConfig, out / name, **SGD, **kw), train_dataset=data
            )
            before = {k: v.clone() for k, v in tr.model.state_dict().items()}
            w_before = tr.model.get_input_embeddings().weight[1, 0].item()
            tr.train()
            delta = torch.cat([(v - before[k]).flatten() for k, v in tr.model.state_dict().items()])
            w_moved = w_before - tr.model.get_input_embeddings().weight[1, 0].item()
            result[name] = dict(
                lengths=list(lengths), moved=w_moved, loss=tr.state.log_history[0]["loss"], delta=delta.tolist()
            )
        (out / f"loss{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_compute_loss_override_trains_as_trl_under_two_processes(chat_model, tmp_path):
    """TRL's loss is a per-process loss and DDP averages the processes' gradients; grpokit sums them (its own
    loss is each process's share of the global loss), so an override's loss is divided by the 2 processes
    (before: every override moved the weights 2 x as far as under TRL, and logged 2 x its loss)."""
    out = tmp_path / "run"
    out.mkdir()
    mp.spawn(_loss_worker, args=(str(tmp_path / "init"), chat_model, out), nprocs=2, join=True)
    ranks = [json.loads((out / f"loss{r}.json").read_text()) for r in (0, 1)]
    for name in ("mean", "halved"):
        # one process under TRL on the same global rows: DDP's mean of the per-process gradients, each the mean
        # of that process's rows' lengths (False: each of its 2 micro-batches' means / 2, summed: the same);
        # SGD at lr 0.1 moves w by 0.1 x that; TRL logs the mean over processes of their losses, the same mean
        per_rank = [sum(r[name]["lengths"]) / len(r[name]["lengths"]) for r in ranks]
        assert [len(r[name]["lengths"]) for r in ranks] == [4, 4]
        expected = (per_rank[0] + per_rank[1]) / 2
        for r in ranks:  # every process applies the same step
            assert r[name]["moved"] == pytest.approx(0.1 * expected, rel=1e-4)
        assert ranks[0][name]["loss"] == pytest.approx(expected, rel=1e-5)
    # super().compute_loss is grpokit's own objective on TRL's per-process scale: it trains and logs as without it
    own, over = ranks[0]["own"], ranks[0]["super"]
    assert max(abs(x) for x in own["delta"]) > 0
    torch.testing.assert_close(torch.tensor(over["delta"]), torch.tensor(own["delta"]), atol=1e-6, rtol=1e-4)
    assert over["loss"] == pytest.approx(own["loss"], rel=1e-4, abs=1e-6)


# ---------------------------------------------------------------- ddp_timeout under torchrun

WORKER = TESTS / "helpers" / "ddp_timeout_worker.py"


@pytest.mark.slow
@pytest.mark.parametrize("lib", ["trl", "grpokit.trl"])
@pytest.mark.parametrize("use_cpu", [True, False])
def test_ddp_timeout_is_the_process_groups_as_under_trl_and_no_setting_is_warned_unread(
    lib, use_cpu, chat_model, tmp_path
):
    """Two processes under torchrun, ddp_timeout=7200. Building the GRPOConfig joins the gloo group (transformers'
    TrainingArguments, as TRL's): with use_cpu=True transformers passes no timeout (torch's default, 1800 s), so
    ddp_timeout is read nowhere, under TRL too; without use_cpu on this CPU machine no group is joined then and the
    trainer joins it with 7200 s (grpokit's train.dist_timeout_s). Before, grpokit.trl warned on every such run
    that "train.dist_timeout_s=7200 changes nothing" (=1800 when ddp_timeout was not set at all)."""
    if lib == "trl":
        pytest.importorskip("trl")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(TESTS)]),
        "TMPDIR": str(tmp_path),  # torchrun's log folders
        "OMP_NUM_THREADS": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
    }
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER)]
    args = [lib, chat_model, str(tmp_path), "7200", "1" if use_cpu else "0"]
    done = subprocess.run([*launch, *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["timeout_s"] for r in ranks] == [1800.0 if use_cpu else 7200.0] * 2
    assert [r["warnings"] for r in ranks] == [[], []]
