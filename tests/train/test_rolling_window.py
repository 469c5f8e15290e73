"""train.accumulation_slices > 1: TRL's rolling window, where an optimizer step may span two sampled
batches (steps_per_generation not a multiple of gradient_accumulation_steps).

The schedules below are worked out by hand from TRL 1.16's loop (GRPOTrainer._prepare_inputs and
training_step): micro-step s takes slice s % steps_per_generation of the buffered batch, a new batch is
sampled when s % (steps_per_generation * num_iterations) == 0, and the optimizer steps every
gradient_accumulation_steps micro-steps. The updates are compared with that loop written out by hand.
"""

import copy
import json
from types import SimpleNamespace

import pytest
import torch

import grpokit.train.loop as loop_module
from grpokit.config import Config, ConfigError
from grpokit.config.io import apply_overrides
from grpokit.train import Trainer
from grpokit.train.logprobs import completion_logprobs
from grpokit.train.update import make_optimizer
from grpokit.train.update_windows import (
    SliceCounts,
    batch_counts,
    stale_slices,
    total_updates,
    window_at,
    window_counts,
)
from helpers.equal_ranks import TwoEqualRanks

ROWS = [{"prompt": p, "answer": "a"} for p in ("ab", "cd", "ef", "gh", "ij", "12", "34", "56", "78", "90")]


def varied(prompts, completions, **kwargs):
    """Distinct characters of the completion / 6: rewards that differ within a group, so every slice has a gradient."""
    return [len(set(c)) / 6 for c in completions]


def rolling(model_dir, out, resume=None, callbacks=None, **over):
    """2 prompts x 4 completions = 8 rows cut into 4 slices of 2 (TRL: per_device_train_batch_size 2,
    steps_per_generation 4), 3 slices an update (gradient_accumulation_steps 3)."""
    cfg = Config()
    apply_overrides(
        cfg,
        [
            f"model.name_or_path={model_dir}",
            "data.task=",
            "data.dataset=",
            "reward.functions=[]",
            "data.eval_size=0",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "train.prompts_per_step=2",
            "train.steps=3",
            "train.updates_per_batch=4",
            "train.accumulation_slices=3",
            "optim.lr=1e-2",
            f"train.out={out}",
            "record.sinks=[]",
            "record.report=false",
            "train.threads=1",
            "train.deterministic=true",
            "train.save_every=1",
            "train.keep_checkpoints=5",
        ]
        + [f"{k}={v}" for k, v in over.items()],
    )
    return Trainer(
        cfg, reward_funcs=[varied], train_rows=ROWS, eval_rows=[], quiet=True, resume=resume, callbacks=callbacks
    )


# ------------------------------------------------------------------ pure functions, by hand


def test_window_counts_by_hand():
    # a batch of 8 rows with 40 loss tokens cut into 4 slices, 3 slices an update: a 2-row slice divides
    # by 2 x 3 = 6 sequences (grpo: the mean over the window's 6 rows) and 40 x 3 / 4 = 30 tokens (dapo:
    # TRL's num_items_in_batch x gradient_accumulation_steps / steps_per_generation)
    batch = SimpleNamespace(
        batch=SimpleNamespace(input_ids=torch.zeros(8, 7)), loss_mask=torch.tensor([[1.0] * 5] * 8), policy_mask=None
    )
    counts = batch_counts(batch, parts=4)
    c = window_counts(counts, 0, parts=4, window=3)
    assert (c.num_sequences, c.num_tokens, c.num_policy_tokens) == (6.0, 30.0, 30.0)  # no policy mask: = loss tokens
    assert c.slice_tokens == 10.0  # the slice's own 2 rows x 5 tokens: the divisor of the update's token metrics
    # the entropy top-fraction keeps 2 of each row's 5 tokens in the policy term: 16 x 3 / 4 = 12 policy tokens,
    # what the token-mean entropy bonus divides by (the loss still divides by the 30 loss tokens)
    batch.policy_mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0]] * 8)
    c = window_counts(batch_counts(batch, parts=4), 0, parts=4, window=3)
    assert (c.num_sequences, c.num_tokens, c.num_policy_tokens) == (6.0, 30.0, 12.0)


def test_a_batchs_counts_are_one_all_reduce_for_all_its_slices():
    # 8 rows (2 a slice) whose loss tokens are 1..8; no policy mask. Summed over two equal ranks: a slice has
    # 4 rows, the slices' tokens are 2 x (1+2, 3+4, 5+6, 7+8) = 6, 14, 22, 30 (72 in all); one all-reduce of
    # 5 numbers (rows and the 4 slices; no policy count: the policy tokens are the loss tokens)
    loss_mask = torch.tensor([[1.0] * k + [0.0] * (8 - k) for k in range(1, 9)])
    batch = SimpleNamespace(batch=SimpleNamespace(input_ids=torch.zeros(8, 9)), loss_mask=loss_mask, policy_mask=None)
    ranks = TwoEqualRanks()
    counts = batch_counts(batch, parts=4, dist=ranks)
    assert ranks.calls == [5]
    assert (counts.rows, counts.slice_tokens, counts.tokens, counts.policy) == (
        4.0,
        (6.0, 14.0, 22.0, 30.0),
        72.0,
        72.0,
    )
    # window 2: slice 3 divides by 4 x 2 = 8 sequences and 72 x 2 / 4 = 36 tokens; its own tokens are 30
    assert window_counts(counts, 3, parts=4, window=2) == SliceCounts(8.0, 36.0, 36.0, 30.0, window=2)
    assert ranks.calls == [5]  # the slices' counts need no further collective
    batch.policy_mask = loss_mask[:, :1]  # one policy token a row: 8, 16 over the two ranks, in the same all-reduce
    assert batch_counts(batch, parts=4, dist=ranks).policy == 16.0 and ranks.calls == [5, 6]


def test_total_updates_and_stale_slices_by_hand():
    assert total_updates(3, 4, 3) == 4  # 12 slices, 3 an update
    assert total_updates(3, 4, 3, cap=3) == 3  # TRL's max_steps 3 ends inside the third batch
    assert total_updates(2, 8, 3) == 5  # num_iterations 2: 16 slices -> 5 updates, one slice pending
    assert total_updates(5, 2, 1) == 10  # one slice, one update: rounds x slices
    assert stale_slices(4, 1, 3)  # update 2 = A3 B0 B1, so B2 and B3 come after an update that followed B's sampling
    assert not stale_slices(2, 1, 4)  # A0 A1 B0 B1: no update between a batch's sampling and its slices
    # epochs of 2 rounds x 8 slices = 16 slices, window 3: 5 windows of 3 and one of 1 an epoch (transformers)
    assert total_updates(6, 8, 3, epoch=2) == 18 and total_updates(3, 8, 3, epoch=2) == 6 + 2
    assert (
        window_at(14, 3, 16) == (3, True) and window_at(15, 3, 16) == (1, True) and window_at(16, 3, 16) == (3, False)
    )
    assert window_at(5, 3) == (3, True) and window_at(6, 3) == (3, False)  # no epochs: windows run on
    assert stale_slices(4, 1, 1)  # four updates per batch: A1 .. A3 come after an update, as TRL computes pi_old then
    assert not stale_slices(1, 1, 1)  # the default: one update per batch, on-policy
    assert stale_slices(1, 2, 1)  # num_iterations 2


def test_rolling_window_refuses_what_steps_per_update(tiny_model_dir, tmp_path):
    with pytest.raises(
        ConfigError, match=r"^train.accumulation_slices=3 does not support algo.aggregation=lambda-grpo"
    ):
        rolling(tiny_model_dir, tmp_path / "r", **{"algo.entropy_coef": 0.01})
    with pytest.raises(ConfigError, match=r"^train.accumulation_slices=3 does not support train.fsdp"):
        rolling(tiny_model_dir, tmp_path / "f", **{"train.fsdp": True})
    with pytest.raises(ConfigError, match=r"^train.accumulation_slices=0 must be at least 1"):
        rolling(tiny_model_dir, tmp_path / "r0", **{"train.accumulation_slices": 0})


# ------------------------------------------------------------------ (1) which slices make which update


def record_schedule(monkeypatch, trainer) -> list[str]:
    """The loop's events: "sample X" (batch X sampled), a slice's label (X0 .. X3, X0' .. in the second
    pass of num_iterations 2) when it is backpropagated, "|" when an update is applied."""
    events, labels, calls = [], {}, [0]
    iterations = trainer.cfg.algo.num_iterations
    real_slices, real_acc, real_apply = loop_module.update_slices, trainer.loss_stage, loop_module.apply_update
    real_scored = trainer._scored_batch

    def slices(inputs, parts):
        c, calls[0] = calls[0], calls[0] + 1
        out = real_slices(inputs, parts)
        for k, part in enumerate(out):
            labels[id(part)] = f"{'ABCDEF'[c // iterations]}{k}" + "'" * (c % iterations)
        return out

    def scored():
        events.append(f"sample {'ABCDEF'[trainer.step]}")
        return real_scored()

    monkeypatch.setattr(loop_module, "update_slices", slices)
    monkeypatch.setattr(
        trainer,
        "loss_stage",  # stage 5's slot (update.accumulate)
        lambda m, o, part, *a, **k: events.append(labels[id(part)]) or real_acc(m, o, part, *a, **k),
    )
    monkeypatch.setattr(loop_module, "apply_update", lambda *a, **k: events.append("|") or real_apply(*a, **k))
    monkeypatch.setattr(trainer, "_scored_batch", scored)
    return events


def test_schedule_of_slices_and_updates_by_hand(tiny_model_dir, tmp_path, monkeypatch):
    # steps_per_generation 4, gradient_accumulation_steps 3, num_iterations 1: micro-steps 0..11 take
    # A0 A1 A2 | A3 B0 B1 | B2 B3 C0 | C1 C2 C3 |, B sampled at micro-step 4 (after update 1), C at 8
    tr = rolling(tiny_model_dir, tmp_path / "it1")
    events = record_schedule(monkeypatch, tr)
    tr.train()
    assert events == [
        "sample A",
        "A0",
        "A1",
        "A2",
        "|",
        "A3",
        "sample B",
        "B0",
        "B1",
        "|",
        "B2",
        "B3",
        "sample C",
        "C0",
        "|",
        "C1",
        "C2",
        "C3",
        "|",
    ]
    assert tr.updates == 4 and tr.scheduler.last_epoch == 4 and tr.pending.slices == 0


def test_schedule_with_two_iterations_by_hand(tiny_model_dir, tmp_path, monkeypatch):
    # num_iterations 2: a batch is sampled every 4 x 2 = 8 micro-steps and its slices come twice,
    # A0 A1 A2 | A3 A0' A1' | A2' A3' B0 | B1 B2 B3 | B0' B1' B2' | and B3' still pending at the end
    tr = rolling(tiny_model_dir, tmp_path / "it2", **{"algo.num_iterations": 2, "train.steps": 2})
    events = record_schedule(monkeypatch, tr)
    tr.train()
    assert events == [
        "sample A",
        "A0",
        "A1",
        "A2",
        "|",
        "A3",
        "A0'",
        "A1'",
        "|",
        "A2'",
        "A3'",
        "sample B",
        "B0",
        "|",
        "B1",
        "B2",
        "B3",
        "|",
        "B0'",
        "B1'",
        "B2'",
        "|",
        "B3'",
    ]
    assert tr.updates == 5 and tr.pending.slices == 1


def test_max_updates_ends_the_run_inside_a_batch(tiny_model_dir, tmp_path, monkeypatch):
    # TRL's max_steps 2: the run stops right after update 2 = A3 B0 B1; B2 and B3 are never computed
    tr = rolling(tiny_model_dir, tmp_path / "cap", **{"train.max_updates": 2})
    events = record_schedule(monkeypatch, tr)
    summary = tr.train()
    assert events == ["sample A", "A0", "A1", "A2", "|", "A3", "sample B", "B0", "B1", "|"]
    assert tr.updates == 2 and summary["steps"] == 2


# ------------------------------------------------------------------ (2) equal to TRL's loop written by hand


def trl_loop_by_hand(
    model, cfg, batches, loss_type: str, spg: int = 4, ga: int = 3, own_tokens: bool = False, epoch: int = 0
):
    """TRL 1.16's training loop on the recorded generation batches: micro-step s backpropagates slice
    s % spg of batch s // spg with TRL's normaliser, the optimizer steps every ga micro-steps. Returns
    the model, each step's gradient norm (before clipping) and loss. ``own_tokens``: a wrong dapo
    normaliser (each micro-step's own tokens x ga), to show the comparison can fail. ``epoch``: micro-steps
    of an epoch (0: none); transformers ends each with a shorter accumulation of the rest, whose micro-steps
    divide by that shorter count (current_gradient_accumulation_steps)."""
    opt, sched = make_optimizer(model, cfg.optim, 10)
    lo, hi = cfg.algo.clip_low, cfg.algo.clip_high
    steps, norms, losses, window_loss = 0, [], [], 0.0
    for s in range(len(batches) * spg):
        inputs, pos = batches[s // spg], s % epoch if epoch else s
        cur = min(ga, epoch - (pos - pos % ga)) if epoch else ga  # this micro-step's accumulation length
        rows = slice((s % spg) * 2, (s % spg) * 2 + 2)
        model.train()
        logp = completion_logprobs(model, inputs.batch.rows(rows), temperature=cfg.rollout.temperature)[0]
        old = inputs.old_logp[rows] if inputs.old_logp is not None else logp.detach()
        mask, adv = inputs.loss_mask[rows], inputs.advantages[rows].unsqueeze(1)
        ratio = torch.exp(logp - old)
        per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - lo, 1 + hi) * adv)
        if loss_type == "grpo":  # mean over the micro-batch's sequences, / gradient_accumulation_steps
            loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / cur
        elif own_tokens:
            loss = (per_token * mask).sum() / (mask.sum() * cur)
        else:  # dapo: / (the generation batch's tokens x gradient_accumulation_steps / steps_per_generation)
            loss = (per_token * mask).sum() / (inputs.loss_mask.sum().clamp(min=1.0) * cur / spg)
        loss.backward()
        window_loss += loss.item()
        if (pos + 1) % ga == 0 or (epoch and (pos + 1) == epoch):
            norms.append(float(torch.nn.utils.clip_grad_norm_(list(model.parameters()), cfg.optim.max_grad_norm)))
            losses.append(window_loss)
            window_loss = 0.0
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
            if steps == cfg.train.max_updates:
                break
    return model, norms, losses


class Updates:
    """Records every optimizer update's metrics (grpokit's on_optimizer_step)."""

    def __init__(self):
        self.seen = []

    def on_optimizer_step(self, args, state, control, metrics=None, **kw):
        self.seen.append(dict(metrics))


def train_recording_batches(tr, monkeypatch):
    """Trains ``tr``; returns a copy of its model before training and every ``UpdateInputs`` it built."""
    start = copy.deepcopy(tr.model)
    batches = []
    real = loop_module.update_inputs
    monkeypatch.setattr(loop_module, "update_inputs", lambda *a, **k: batches.append(real(*a, **k)) or batches[-1])
    tr.train()
    return start, batches


def assert_updates_equal(tr, updates, ref, norms, losses):
    """Every update's gradient norm before clipping and loss (which see the normaliser's scale that clipping
    and Adam hide) equal the loop by hand's, and so do the trained weights."""
    assert [u["grad_norm"] for u in updates.seen] == pytest.approx(norms, rel=1e-5)
    assert [u["loss"] for u in updates.seen] == pytest.approx(losses, rel=1e-5, abs=1e-7)
    for (n, p), q in zip(tr.model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6), n


@pytest.mark.parametrize("loss_type, aggregation", [("grpo", "seq-mean-token-mean"), ("dapo", "token-mean")])
def test_rolling_updates_equal_trls_loop_by_hand(tiny_model_dir, tmp_path, monkeypatch, loss_type, aggregation):
    # max_updates 3 ends inside the third batch: A0 A1 A2 | A3 B0 B1 | B2 B3 C0 |, C1 .. C3 never used
    updates = Updates()
    tr = rolling(
        tiny_model_dir,
        tmp_path / loss_type,
        callbacks=[updates],
        **{"algo.aggregation": aggregation, "train.max_updates": 3, "optim.adam_eps": 1e-4},
    )
    start, batches = train_recording_batches(tr, monkeypatch)
    assert len(batches) == 3 and all(b.old_logp is not None for b in batches)  # stale slices: pi_old at sampling
    ref, norms, losses = trl_loop_by_hand(copy.deepcopy(start), tr.cfg, batches, loss_type)
    assert_updates_equal(tr, updates, ref, norms, losses)
    moved = max(float((p - s).detach().abs().max()) for p, s in zip(tr.model.parameters(), start.parameters()))
    assert moved > 1e-3  # the updates did something, so equality means something
    if loss_type == "dapo":  # each micro-step dividing by its own tokens weighs the slices differently: it fails
        _, wrong, _ = trl_loop_by_hand(copy.deepcopy(start), tr.cfg, batches, loss_type, own_tokens=True)
        assert [u["grad_norm"] for u in updates.seen] != pytest.approx(wrong, rel=1e-3)


# ------------------------------------------------------------------ (4) resume with an update pending


class StopAfter:
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            control.should_training_stop = True


@pytest.mark.parametrize("stop_after, pending", [(1, 1), (2, 2)])
def test_resume_with_an_update_pending_is_exact(tiny_model_dir, tmp_path, stop_after, pending):
    # after step 1 slice A3 waits for B0 B1; after step 2, B2 and B3 wait for C0: the checkpoint carries
    # that gradient and its sums, so the resumed run applies exactly the update the uninterrupted run does
    full = rolling(tiny_model_dir, tmp_path / "full")
    full.train()
    cut = rolling(tiny_model_dir, tmp_path / "cut", callbacks=[StopAfter(stop_after)])
    cut.train()
    assert cut.step == stop_after and cut.pending.slices == pending
    resumed = rolling(tiny_model_dir, tmp_path / "cut", resume=tmp_path / "cut")
    assert resumed.pending.slices == pending and resumed.updates == cut.updates
    resumed.train()
    for (n, p), q in zip(full.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), n
    assert resumed.updates == full.updates == 4
    # the metrics of the update that spans the checkpoint (its loss and token-weighted sums) are the same too
    assert len(step_metrics(tmp_path / "full")) == 3 and step_metrics(tmp_path / "full") == step_metrics(
        tmp_path / "cut"
    )


def step_metrics(run):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in x.items() if not k.startswith(("time/", "tokens_per_second", "rollout/tokens_per_second"))}
        for x in lines
        if "reward" in x
    ]


def test_a_step_may_apply_no_update(tiny_model_dir, tmp_path, monkeypatch):
    # steps_per_generation 1, gradient_accumulation_steps 2: A0 B0 | - step 1 applies nothing, its slice waits
    tr = rolling(
        tiny_model_dir,
        tmp_path / "none",
        **{"train.updates_per_batch": 1, "train.accumulation_slices": 2, "train.steps": 2},
    )
    events = record_schedule(monkeypatch, tr)
    tr.train()
    assert events == ["sample A", "A0", "sample B", "B0", "|"]
    assert tr.updates == 1
    first, second = step_metrics(tmp_path / "none")
    assert "grad_norm" not in first and "grad_norm" in second and "reward" in first


# ------------------------------------------- steps_per_generation a multiple of gradient_accumulation_steps


@pytest.mark.parametrize("loss_type, aggregation", [("grpo", "seq-mean-token-mean"), ("dapo", "token-mean")])
def test_several_updates_per_batch_equal_trls_loop_by_hand(
    tiny_model_dir, tmp_path, monkeypatch, loss_type, aggregation
):
    # TRL steps_per_generation 4, gradient_accumulation_steps 2: grpokit cuts the 8 rows into 2 slices of 4
    # (2 micro-batches of 2), one update each. TRL takes pi_old at sampling (A1 follows the update of A0) and
    # divides dapo's loss by the batch's tokens x 2 / 4 (not A1 on-policy at ratio 1, nor dapo divided by the
    # slice's own tokens). max_updates 3 ends inside the second batch: A0 A1 | A2 A3 | B0 B1 |
    updates = Updates()
    tr = rolling(
        tiny_model_dir,
        tmp_path / loss_type,
        callbacks=[updates],
        **{
            "algo.aggregation": aggregation,
            "train.max_updates": 3,
            "optim.adam_eps": 1e-4,
            "train.updates_per_batch": 2,
            "train.accumulation_slices": 1,
            "train.micro_batch_size": 2,
        },
    )
    start, batches = train_recording_batches(tr, monkeypatch)
    assert len(batches) == 2 and all(b.old_logp is not None for b in batches)  # pi_old at sampling
    ref, norms, losses = trl_loop_by_hand(copy.deepcopy(start), tr.cfg, batches, loss_type, spg=4, ga=2)
    assert_updates_equal(tr, updates, ref, norms, losses)


@pytest.mark.parametrize("loss_type, aggregation", [("grpo", "seq-mean-token-mean"), ("dapo", "token-mean")])
def test_an_epochs_shorter_last_window_equals_trls_loop_by_hand(
    tiny_model_dir, tmp_path, monkeypatch, loss_type, aggregation
):
    # epochs of one batch (4 slices), 3 slices a window: A0 A1 A2 | A3 | B0 B1 B2 |, the second update a window of
    # one slice dividing by 1, not 3 (transformers' current_gradient_accumulation_steps); A3 does not wait for B0 B1
    updates = Updates()
    tr = rolling(
        tiny_model_dir,
        tmp_path / loss_type,
        callbacks=[updates],
        **{
            "algo.aggregation": aggregation,
            "train.max_updates": 3,
            "optim.adam_eps": 1e-4,
            "train.accumulation_epoch_steps": 1,
        },
    )
    start, batches = train_recording_batches(tr, monkeypatch)
    assert len(batches) == 2 and tr.updates == 3
    ref, norms, losses = trl_loop_by_hand(copy.deepcopy(start), tr.cfg, batches, loss_type, epoch=4)
    assert_updates_equal(tr, updates, ref, norms, losses)


def test_the_gradient_is_released_after_each_update_and_kept_while_one_accumulates(tiny_model_dir, tmp_path):
    # 4 slices a batch, 3 a step's update: updates end after slices 3, 6, 9 and 12 of 3 steps, so the
    # first two steps end with an update still accumulating (1, then 2 of its slices done) and the
    # third ends on an update's end. A held gradient between updates was a parameter-sized buffer in
    # every rollout's memory peak (0.9 GB of a 0.5B model's); transformers' order is kept: a callback
    # still sees the complete gradient at on_optimizer_step.
    tr = None
    seen = {"at_update": [], "at_step_end": []}

    def has_grad():
        return [p.grad is not None for p in tr.model.parameters() if p.requires_grad]

    class Watch:
        def on_optimizer_step(self, args, state, control, metrics=None, **kw):
            seen["at_update"].append(all(has_grad()))

        def on_step_end(self, args, state, control, metrics=None, **kw):
            seen["at_step_end"].append((tr.pending.slices, any(has_grad())))
            held = [n for n, p in tr.model.named_parameters() if p.grad is not None]
            seen.setdefault("held", []).append((state.global_step, tr.updates, held[:3], len(held)))

    tr = rolling(tiny_model_dir, tmp_path / "run", callbacks=[Watch()])
    tr.train()
    assert seen["at_update"] == [True] * 4
    assert seen["at_step_end"] == [(1, True), (2, True), (0, False)], seen["held"]
