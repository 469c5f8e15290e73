"""Which slices make an optimizer update: every ``train.accumulation_slices`` slices of the stream
of batches (TRL's rolling window when steps_per_generation is not a multiple of
gradient_accumulation_steps), restarting each epoch (train.accumulation_epoch_steps) with a shorter
last window. Pure arithmetic: the loop (train/loop.py) asks where a slice falls (by its place in the stream:
the slices trained before it, which a checkpoint keeps, since a step may end between two of its updates), how
many updates a run makes in some steps (the schedule's length), what a resumed run has done (``resumed_counts``)
and still needs (``rounds_to_make``); and what a slice of such a window divides its loss by (``window_counts``,
from the batch's counts taken once: ``batch_counts``).
"""

from __future__ import annotations

import dataclasses


def stale_slices(parts: int, iterations: int, window: int) -> bool:
    """Whether an update can fall between a batch's sampling and the use of one of its slices when
    ``window`` slices of a stream of batches (``parts`` x ``iterations`` slices each) make an update;
    such slices need pi_old from a pass at sampling time (TRL's condition for old_per_token_logps).
    Examples: parts 4, window 3: window 2 is A3 B0 B1, so B2 and B3 come after it -> True; parts 2,
    window 1 (steps_per_generation = 2 x gradient_accumulation_steps): A1 comes after the update of A0
    -> True; parts 1, one iteration, window 1 (the default) -> False."""
    return window % (parts * iterations) != 0


def total_updates(rounds: int, slices_per_round: int, window: int, cap: int = 0, epoch: int = 0) -> int:
    """Optimizer updates after ``rounds`` steps of ``slices_per_round`` slices each (num_iterations x
    updates_per_batch) when every ``window`` slices make one (train.accumulation_slices), at most
    ``cap`` (train.max_updates; 0: no cap); ``epoch`` rounds (train.accumulation_epoch_steps, 0: none)
    end with a shorter window. Examples: 3 rounds of 4 slices, window 3: 12 // 3 = 4; 6 rounds of 8
    slices, window 3, epochs of 2 rounds: 16 slices an epoch = 6 updates (5 of 3 slices, 1 of 1), 18."""
    if epoch:
        done = rounds // epoch * -(-epoch * slices_per_round // window) + rounds % epoch * slices_per_round // window
    else:
        done = rounds * slices_per_round // window
    return min(done, cap) if cap else done


def run_updates(rounds: int, t, num_iterations: int) -> int:
    """``total_updates`` after ``rounds`` steps of a run with train section ``t`` and ``num_iterations``."""
    return total_updates(
        rounds, t.updates_per_batch * num_iterations, t.accumulation_slices, t.max_updates, t.accumulation_epoch_steps
    )


def resumed_counts(step: int, updates: int | None, slices: int | None, scheduled: int | None, t, iterations: int):
    """``(optimizer updates applied, slices trained)`` at a checkpoint of ``step`` steps that recorded
    ``updates`` and ``slices`` (None: written before grpokit kept them). An older checkpoint's updates are its
    schedule's count (``scheduled``: the scheduler's last_epoch, stepped once an update; None for a model-only
    save, which has no schedule: then whole rounds, ``run_updates``); its slices, whole rounds.
    Example: steps of 2 iterations x 2 slices, every slice an update, the second step cut after its first update by
    train.max_updates 5: recorded (5, 5); an older checkpoint, its schedule at 5: (5, 8)."""
    if updates is None:
        updates = scheduled if scheduled is not None else run_updates(step, t, iterations)
    return updates, slices if slices is not None else step * t.updates_per_batch * iterations


def rounds_to_make(updates: int, start: int, per_round: int, window: int, epoch_slices: int = 0) -> int:
    """Rounds of ``per_round`` slices that make ``updates`` more optimizer updates when the stream's next
    slice is number ``start`` (windows of ``window`` slices, restarting every ``epoch_slices``: ``window_at``).
    Example: 2 slices a round, window 3, from slice 5 (slices 3 and 4 of its window done): rounds 5 6 and 7 8, the
    first update ending at slice 5 and the second at 8, so 2 updates take 2 rounds (and 3 updates, 4 rounds)."""
    rounds = made = 0
    while made < updates:
        first = start + rounds * per_round
        made += sum(window_at(p, window, epoch_slices)[1] for p in range(first, first + per_round))
        rounds += 1
    return rounds


def window_at(position: int, window: int, epoch_slices: int = 0) -> tuple[int, bool]:
    """``(length of the window that holds slice number position, whether that slice ends it)``: windows
    of ``window`` slices, restarting every ``epoch_slices`` slices (0: never) with a shorter last one.
    Example: window 3, 16 slices an epoch: slice 15 (the epoch's last) is a window of 1 that it ends;
    slice 16 starts the next epoch's first window of 3."""
    s = position % epoch_slices if epoch_slices else position
    start = s - s % window
    length = min(window, epoch_slices - start) if epoch_slices else window
    return length, s + 1 == start + length


@dataclasses.dataclass(frozen=True)
class BatchCounts:
    """A batch cut into slices, counted over every rank once (one all-reduce) for all its slices."""

    rows: float  # one slice's sequences
    slice_tokens: tuple[float, ...]  # each slice's loss tokens
    policy: float  # the batch's policy tokens (the loss tokens without a policy mask)

    @property
    def tokens(self) -> float:
        """The batch's loss tokens."""
        return sum(self.slice_tokens)


@dataclasses.dataclass(frozen=True)
class SliceCounts:
    """What a slice divides its loss by when slices share an update (``window_counts``), and its own loss
    tokens over every rank (the divisor of the update's token-weighted metrics)."""

    num_sequences: float
    num_tokens: float
    num_policy_tokens: float
    slice_tokens: float
    window: int = 1  # the slices of the optimizer update this slice belongs to


def batch_counts(batch, parts: int, dist=None) -> BatchCounts:
    """The counts of ``batch`` (an algo.pipeline.UpdateInputs) for its ``parts`` equal slices
    (update.update_slices), summed over every rank in one all-reduce (``dist``: a distributed.DistContext;
    the one collective here); the policy tokens counted only under a policy mask (else the loss tokens)."""
    local = [float(batch.batch.input_ids.shape[0] // parts), *batch.loss_mask.reshape(parts, -1).sum(dim=1).tolist()]
    if batch.policy_mask is not None:
        local.append(float(batch.policy_mask.sum().item()))
    sums = dist.sum_floats(local) if dist is not None else [float(v) for v in local]
    slices = tuple(sums[1 : 1 + parts])
    return BatchCounts(sums[0], slices, sums[1 + parts] if batch.policy_mask is not None else sum(slices))


def window_counts(counts: BatchCounts, index: int, parts: int, window: int) -> SliceCounts:
    """What slice ``index`` of a batch cut into ``parts`` (``counts``: ``batch_counts``) divides its loss by
    when ``window`` slices make one update (train.accumulation_slices), as TRL divides a micro-step's: its
    rows x window, so per-sequence means (grpo, dr_grpo) become a mean over the window's equal slices; and the
    batch's loss tokens x window / parts, the tokens of an average window (TRL's dapo/cispo/vespo normaliser;
    the policy-mask tokens likewise, for the entropy bonus). Counts over every rank; no collective.
    Example: 8 rows, 40 loss tokens, parts 4, window 3: a 2-row slice divides by 6 sequences and 30 tokens.
    """
    return SliceCounts(
        num_sequences=counts.rows * window,
        num_tokens=counts.tokens * window / parts,
        num_policy_tokens=counts.policy * window / parts,
        slice_tokens=counts.slice_tokens[index],
        window=window,
    )
