"""data/prompt_sampler.py: the plain seeded order, and data.drop_last's whole batches (TRL's RepeatSampler)."""

from __future__ import annotations

import random

import pytest

from grpokit.config.sections import Config, ConfigError
from grpokit.data.prompt_sampler import PromptSampler
from grpokit.types import Prompt


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(text=str(i), ids=[i]) for i in range(n)]


def _order(seed: int, epoch: int, n: int) -> list[str]:
    """The sampler's order of an epoch, written out: a permutation seeded by (seed, epoch)."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [str(i) for i in order]


def test_whole_batches_leave_an_epochs_remainder_out():
    # 5 prompts, batches of 4: each epoch serves the first 4 of its own order and skips the fifth (TRL's
    # RepeatSampler drops the short last chunk); before, the second batch was the fifth of epoch 0 and 3 of epoch 1
    s = PromptSampler(_prompts(5), seed=3, batch=4)
    batches = [[p.text for p in s.next_batch(4)] for _ in range(3)]
    assert batches == [_order(3, e, 5)[:4] for e in range(3)]
    assert s.position == 12  # prompts served; a resume at 4 serves epoch 1's batch
    assert [p.text for p in PromptSampler(_prompts(5), seed=3, batch=4, position=4).next_batch(4)] == batches[1]


def test_without_whole_batches_a_batch_runs_on_across_the_epoch():
    s = PromptSampler(_prompts(5), seed=3)
    first, second = [p.text for p in s.next_batch(4)], [p.text for p in s.next_batch(4)]
    assert first == _order(3, 0, 5)[:4] and second == _order(3, 0, 5)[4:] + _order(3, 1, 5)[:3]


def test_fewer_prompts_than_a_whole_batch_are_refused_when_a_batch_is_drawn():
    # 3 prompts, whole batches of 4: an epoch serves 3 // 4 * 4 = 0 prompts. Building the sampler is allowed
    # (before: refused there, so evaluate() before train() was too); the first batch is refused
    s = PromptSampler(_prompts(3), seed=0, batch=4)
    with pytest.raises(ConfigError) as e:
        s.next_batch(4)
    assert str(e.value) == (
        "the training data has 3 prompts, fewer than one batch of 4 (train.prompts_per_step; under grpokit.trl a "
        "generation batch), and only whole batches are served (data.drop_last=true, as TRL's sampler), so no step "
        "can train; give at least 4 rows or a smaller batch"
    )


def test_the_plain_order_warns_once_when_a_batch_must_repeat_a_prompt(caplog):
    from grpokit.train.domain_setup import make_sampler

    cfg = Config()
    cfg.train.prompts_per_step = 4
    s = make_sampler(cfg, _prompts(3), group_size=2)
    batch = [p.text for p in s.next_batch(4)]
    assert len(set(batch)) == 3  # 3 prompts in a batch of 4: one of them twice
    assert caplog.text.count("fewer than train.prompts_per_step=4, so every step samples some prompt twice") == 1
    cfg.data.drop_last = True
    with pytest.raises(ConfigError, match="^the training data has 3 prompts, fewer than one batch"):
        make_sampler(cfg, _prompts(3), group_size=2).next_batch(4)
    assert make_sampler(cfg, _prompts(5), group_size=2).epoch_size == 4


def test_drop_last_is_refused_where_no_plain_order_reads_it():
    from grpokit.validation import validate

    cfg = Config()
    cfg.data.drop_last, cfg.data.curriculum = True, "frontier"
    with pytest.raises(ConfigError, match=r"^data.drop_last=True has no effect with data.domains or data.curriculum"):
        validate(cfg)


def test_an_epoch_of_whole_batches_counts_and_rewinds_by_them():
    # 10 prompts, whole batches of 4: an epoch serves 10 // 4 * 4 = 8. After 3 batches (position 12) the run
    # is 12 / 8 = 1.5 epochs in (before: 12 / 10 = 1.2) and ignore_data_skip rewinds to 8, epoch 1's start
    # (before: 12 - 12 % 10 = 10, two prompts into epoch 1)
    s = PromptSampler(_prompts(10), seed=0, batch=4)
    for _ in range(3):
        s.next_batch(4)
    assert s.epoch == 1.5
    s.rewind_epoch()
    assert s.position == 8
    plain = PromptSampler(_prompts(10), seed=0, position=12)  # without whole batches an epoch is the 10
    assert plain.epoch == 1.2
    plain.rewind_epoch()
    assert plain.position == 10


def test_a_resume_that_changes_whole_batches_is_refused(tmp_path):
    from grpokit.train.resume import check_same_batches, write_config

    cfg = Config()
    cfg.train.prompts_per_step, cfg.data.drop_last = 4, True
    write_config(tmp_path, cfg, None)
    check_same_batches(tmp_path, cfg)  # the same batch: resumes
    cfg.train.prompts_per_step = 2  # position 12 of batches of 4 is epoch 1.5; of batches of 2 (epoch 10) 1.2
    with pytest.raises(ConfigError) as e:
        check_same_batches(tmp_path, cfg)
    assert str(e.value) == (
        f"train.prompts_per_step and data.drop_last were 4 and true when the run in {str(tmp_path)!r} was trained "
        "and are 2 and true now; with whole batches an epoch is the whole batches of the order, so the checkpoint's "
        "data position would land elsewhere; resume with train.prompts_per_step=4 and data.drop_last=true, or start "
        "a new run"
    )
    cfg.data.drop_last = False
    (tmp_path / "plain").mkdir()
    write_config(tmp_path / "plain", cfg, None)
    cfg.train.prompts_per_step = 8  # without whole batches an epoch is the data itself: a new batch may resume
    check_same_batches(tmp_path / "plain", cfg)
