"""rollout/staleness.py: the age of what a step trains, per token, from the trained batch itself (refills
sampled on the trainer's model count 0), worked out by hand; and a real asynchronous run with dynamic sampling
whose every step's rollout/staleness is that of the batch it trained, with the thread and with a worker process."""

import json

import pytest
import torch

from grpokit.rollout.collect import concat
from grpokit.rollout.staleness import Ages, ages, arrived, check_staleness, staleness_metrics, token_staleness
from grpokit.types import Episode, OneVersion, Rollout, ScoredBatch
from helpers.runs import make


def rollout(completions, versions=None, G=1):
    n = len(completions)
    return Rollout(
        [[1]] * (n // G), completions, [[-1.0] * len(c) for c in completions], ["length"] * n, G, None, None, versions
    )


def test_a_mixed_batch_by_hand():
    """Step 5 (s = 2) trains 4 rows: a prefetched row of version 4 (3 tokens, age 1 each), a partial row drawn
    by versions 3, 4, 5 (ages 2, 1, 0), a dynamic-sampling refill sampled on the step's own policy (no versions,
    2 tokens of age 0) and an empty completion (no token). Mean over the 8 tokens: (3 + 3 + 0) / 8 = 0.75; max 2.
    Before, the step logged the prefetched batch's age alone: 1.0 whatever the refills were."""
    ro = rollout([[7, 7, 7], [7, 7, 7], [7, 7], []], [[4, 4, 4], [3, 4, 5], None, []])
    assert token_staleness(ro, 5) == [1, 1, 1, 2, 1, 0, 0, 0]
    assert staleness_metrics(ro, 5) == {"rollout/staleness": 0.75, "rollout/staleness_max": 2.0}
    # a step that trained only refills (0 of its prefetched groups): 0, not the prefetched batch's 1
    assert staleness_metrics(rollout([[7, 7], [7]]), 5) == {"rollout/staleness": 0.0, "rollout/staleness_max": 0.0}


def test_a_prefetched_batch_is_stamped_on_arrival_and_checked():
    ro = arrived(rollout([[7, 7], [7]]), 3, 2, 1)  # batch 3 sampled by version 2: every token version 2
    assert ro.sampling_versions == [[2, 2], [2]]
    partial = rollout([[7, 7]], [[2, 3]])
    assert arrived(partial, 3, 2, 1).sampling_versions == [[2, 3]]  # partial rollouts keep their own
    with pytest.raises(RuntimeError, match="drawn 2 steps ago, more than rollout.async_staleness=1"):
        arrived(rollout([[7]]), 3, 1, 1)


def test_a_mixed_batch_of_one_version_rows_and_partial_rows_by_hand(monkeypatch):
    """Step 6 trains 5 rows: two drawn by one version each (version 5: 3 tokens, age 1 each, sum 3; version 4:
    2 tokens, age 2 each, sum 4), two partial rows spanning versions ([4, 5, 6, 6]: ages 2, 1, 0, 0, sum 3;
    [6, 5]: ages 0, 1, sum 1), a refill (None, 2 tokens of age 0) and an empty one-version row (no token).
    3 + 4 + 2 + 2 + 2 = 13 tokens, summed age 3 + 3 + 0 + 4 + 1 = 11: mean 11/13, oldest 2."""
    versions = [OneVersion(5, 3), [4, 5, 6, 6], None, OneVersion(4, 2), [6, 5], OneVersion(3, 0)]
    ro = rollout([[7] * 3, [7] * 4, [7] * 2, [7] * 2, [7] * 2, []], versions)
    assert token_staleness(ro, 6) == [1, 1, 1, 2, 1, 0, 0, 0, 0, 2, 2, 0, 1]  # 13 entries, ages summing 11
    assert ages(ro, 6) == Ages(tokens=13, total=11, oldest=2)
    assert staleness_metrics(ro, 6) == {"rollout/staleness": 11 / 13, "rollout/staleness_max": 2.0}
    with pytest.raises(RuntimeError, match="drawn 2 steps ago, more than rollout.async_staleness=1"):
        check_staleness(ro, 6, 1)

    # a one-version row is one product: never a list per token (before, 1024 x 2048 tokens cost 0.25 s a step)
    def per_token(self, i):
        assert isinstance(self.sampling_versions[i], list), f"row {i} of one version read token by token"
        return [1] * len(self.completion_ids[i])

    monkeypatch.setattr(Rollout, "model_mask", per_token)
    assert ages(ro, 6) == Ages(13, 11, 2)
    big = arrived(rollout([[7] * 2048] * 1024), 3, 2, 1)  # stamped with one int a row, read in one product each
    assert all(v == OneVersion(2, 2048) for v in big.sampling_versions)
    assert staleness_metrics(big, 3) == {"rollout/staleness": 1.0, "rollout/staleness_max": 1.0}


def test_environment_tokens_of_a_one_version_row_have_no_age():
    """An episode row of version 1 at step 3: 5 tokens, 2 of them the environment's; 3 model tokens 2 old."""
    ep = Episode(model_mask=[1, 1, 0, 0, 1], turn_ids=[0, 0, 0, 0, 1])
    ro = Rollout([[1]], [[7] * 5], [[-1.0] * 5], ["eos"], 1, [ep], None, [OneVersion(1, 5)])
    assert ages(ro, 3) == Ages(3, 6, 2) and token_staleness(ro, 3) == [2, 2, 2]


def test_one_version_reads_as_its_list():
    v = OneVersion(2, 3)
    assert v == [2, 2, 2] and [2, 2, 2] == v and v != [2, 2] and v != [2, 2, 3] and list(v) == [2, 2, 2]
    assert v[0] == v[-1] == 2 and v[1:] == [2, 2] and len(v) == 3 and OneVersion(2, 0) == []
    with pytest.raises(IndexError):
        v[3]


def test_a_refill_joined_to_a_prefetched_batch_keeps_each_rows_versions():
    """Dynamic sampling concatenates the prefetched batch's kept groups with the refill's: the prefetched rows
    keep their versions, the refill's rows are None (the step's own policy); a batch of refills only has none."""

    def scored(ro):
        n = ro.num_sequences
        return ScoredBatch([None] * (n // 2), ro, [""] * n, torch.zeros(n, 1), torch.zeros(n), ["r"], {})

    stale = scored(rollout([[7], [7, 7]], [[1], [1, 1]], G=2))
    fresh = scored(rollout([[7, 7, 7], [7]], G=2))
    both = concat([stale, fresh]).rollout
    assert both.sampling_versions == [[1], [1, 1], None, None]
    assert staleness_metrics(both, 2) == {
        "rollout/staleness": 3 / 7,
        "rollout/staleness_max": 1.0,
    }  # 3 of 7 tokens 1 old
    assert concat([fresh, fresh]).rollout.sampling_versions is None


@pytest.mark.parametrize("workers", [0, 1], ids=["thread", "worker process"])
def test_each_steps_staleness_is_that_of_the_batch_it_trained(tiny_model_dir, tmp_path, workers):
    """rollout.async_staleness=1 with dynamic sampling: a step trains the prefetched batch's informative groups
    (1 step old from step 2 on) and refills sampled on its own policy (0 old). Each step's rollout/staleness is
    the share of its trained tokens that came from the prefetched batch (ages 1 and 0), whatever the mix."""
    over = {"rollout.async_staleness": 1, "rollout.async_workers": workers, "algo.dynamic_sampling": "true"}
    tr = make(tiny_model_dir, tmp_path / "run", **over, **{"train.steps": 4, "data.eval_size": 0})
    trained = []  # per step: (tokens of prefetched rows, all tokens)

    def record(sb, inputs, every):
        ro = sb.rollout
        vs = ro.sampling_versions or [None] * ro.num_sequences
        stale = sum(len(c) for c, v in zip(ro.completion_ids, vs) if v is not None and v and v[0] < tr.step)
        trained.append((stale, sum(len(c) for c in ro.completion_ids)))

    tr.on_inputs.append(record)
    tr.train()
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["rollout/staleness"] for m in steps] == pytest.approx([s / n for s, n in trained])
    assert [m["rollout/staleness_max"] for m in steps] == [float(s > 0) for s, _ in trained]
    assert trained[0][0] == 0  # step 1's batch is version 0's: 0 old
    mixed = [s / n for s, n in trained[1:] if 0 < s < n]
    assert mixed, f"no step mixed prefetched and refilled rows: {trained}; pick other rows"
