"""Batch collection: DAPO dynamic sampling and GFPO filtering with a scripted fake sampler."""

import pytest
import torch

from grpokit.rollout.collect import collect, gfpo_keep, kept_reward_metrics
from grpokit.types import Prompt, Rollout, ScoredBatch


class FakeSampler:
    """Scripted rewards: rewards_for(prompt_index, group_size) -> list of floats; completion of
    reward r has length lengths_for(...)."""

    def __init__(self, rewards_for, lengths_for=None):
        self.rewards_for, self.lengths_for = rewards_for, lengths_for or (lambda i, g: [3] * g)
        self.next = 0
        self.calls = []

    def __call__(self, prompts, G):
        if isinstance(prompts, int):
            prompts = [Prompt(text=f"p{self.next + k}", ids=[1], columns={"i": self.next + k}) for k in range(prompts)]
            self.next += len(prompts)
        self.calls.append(([p.columns["i"] for p in prompts], G))
        rewards, comps = [], []
        for p in prompts:
            rs, ls = self.rewards_for(p.columns["i"], G), self.lengths_for(p.columns["i"], G)
            rewards += rs
            comps += [[5] * l for l in ls]
        N = len(comps)
        ro = Rollout([p.ids for p in prompts], comps, [[0.0] * len(c) for c in comps], ["eos"] * N, G)
        total = torch.tensor(rewards)
        runner = {"rewards/r/failures": 0.0, "rewards/r/mean": total.mean().item(), "reward": total.mean().item()}
        return ScoredBatch(prompts, ro, [f"t{i}" for i in range(N)], total[:, None], total, ["r"], runner)


def test_dynamic_sampling_refills_with_informative_groups():
    # even prompts are flat (all 1.0), odd prompts informative: each round of 4 keeps 2
    fake = FakeSampler(lambda i, g: [1.0] * g if i % 2 == 0 else [1.0, 0.0] * (g // 2))
    out = collect(fake, 4, 4, dynamic_sampling=True, max_rounds=5)
    assert len(out.prompts) == 4 and all(p.columns["i"] % 2 == 1 for p in out.prompts)
    assert out.metrics["dynamic_sampling/rounds"] == 2 and out.metrics["dynamic_sampling/dropped_groups"] == 4
    assert out.rewards_NF.shape == (16, 1) and out.rollout.group_size == 4


def test_dynamic_sampling_logs_each_functions_mean_over_the_kept_rows_as_the_reward_is():
    """P=2, G=2, one function of weight 1. Round 1: prompts 0 (1, 1: flat, dropped) and 1 (1, 0); round 2:
    prompts 2 (1, 1: dropped) and 3 (1, 0). Kept rows 1, 0, 1, 0: rewards/r/mean 0.5 and std 0.5, the kept
    reward's 0.5. Every completion sampled: each round's mean is 3/4, so sampled/rewards/r/mean and
    sampled/reward are 0.75 (before: 0.75 was logged as rewards/r/mean beside a reward of 0.5)."""
    fake = FakeSampler(lambda i, g: [1.0, 1.0] if i % 2 == 0 else [1.0, 0.0])
    out = collect(fake, 2, 2, dynamic_sampling=True, max_rounds=4)
    m = out.metrics
    assert out.total_N.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert (m["rewards/r/mean"], m["rewards/r/std"]) == (0.5, 0.5)
    assert m["sampled/rewards/r/mean"] == 0.75 and m["sampled/reward"] == 0.75 and "reward" not in m
    assert m["rewards/r/failures"] == 0.0  # counts stay over every completion scored


def test_kept_reward_metrics_leave_out_failed_and_not_applicable_rows():
    """One prompt of G=4 with values 1, 0 (the function failed: failure_value), 1, None (NaN). Scored rows: 1
    and 1, so mean 1 and std 0, as the runner counts them; without a failure mask the 0 would count."""
    batch = FakeSampler(lambda i, g: [1.0, 0.0, 1.0, 0.0])(1, 4)
    batch.rewards_NF[3, 0] = float("nan")
    batch.failed_NF = torch.tensor([[False], [True], [False], [False]])
    m = kept_reward_metrics(batch)
    assert (m["rewards/r/mean"], m["rewards/r/std"]) == (1.0, 0.0)
    batch.failed_NF = None
    assert kept_reward_metrics(batch)["rewards/r/mean"] == pytest.approx(2 / 3)


def test_dynamic_sampling_keeps_small_scaled_rewards():
    # rewards 1e-7 * {1, 0}: spread 1e-7, a real difference at the rewards' scale (flat means spread
    # <= max(1e-6 * 1e-7, 1e-8) = 1e-8). Even prompts are truly flat (all 1e-7) and dropped; the old
    # absolute 1e-6 rule dropped every group and trained on zero advantages after max_rounds.
    fake = FakeSampler(lambda i, g: [1e-7] * g if i % 2 == 0 else [1e-7, 0.0] * (g // 2))
    out = collect(fake, 2, 2, dynamic_sampling=True, max_rounds=3)
    assert [p.columns["i"] for p in out.prompts] == [1, 3]
    assert out.metrics["dynamic_sampling/rounds"] == 2


def test_dynamic_sampling_stops_at_the_round_cap():
    fake = FakeSampler(lambda i, g: [0.0] * g if i != 5 else [1.0, 0.0, 0.0, 0.0])
    out = collect(fake, 4, 4, dynamic_sampling=True, max_rounds=3)
    assert out.metrics["dynamic_sampling/rounds"] == 3 and len(fake.calls) == 3
    assert [p.columns["i"] for p in out.prompts] == [5]  # trains on what it found


def test_gfpo_keeps_shortest_and_most_token_efficient():
    # 6 samples of prompt 0: lengths 5 1 4 2 6 3, rewards 1 0 1 1 0 1
    fake = FakeSampler(lambda i, g: [1.0, 0.0, 1.0, 1.0, 0.0, 1.0], lambda i, g: [5, 1, 4, 2, 6, 3])
    batch = fake(1, 6)
    by_len = gfpo_keep(batch, 3, "length")
    assert [len(c) for c in by_len.rollout.completion_ids] == [1, 2, 3]  # samples 1, 3, 5 in order
    # reward per token: 0.2 0 0.25 0.5 0 0.333 -> best three: samples 3 (0.5), 5 (0.333), 2 (0.25)
    by_eff = gfpo_keep(batch, 3, "token_efficiency")
    assert [len(c) for c in by_eff.rollout.completion_ids] == [4, 2, 3]
    assert by_eff.total_N.tolist() == [1.0, 1.0, 1.0] and by_eff.rollout.group_size == 3


NAN = float("nan")


class RunnerSampler(FakeSampler):
    """A FakeSampler whose NaN (None) rewards are what the reward runner makes of a completion every function
    answered None for: NaN in rewards_NF, 0 in the weighted total (the sum of nothing)."""

    def __call__(self, prompts, G):
        b = super().__call__(prompts, G)
        b.total_N = torch.nan_to_num(b.total_N, nan=0.0)
        return b


def test_unscorable_completions_are_no_zero_rewards_for_dynamic_sampling_and_gfpo():
    # prompt 0: [1, 1, None] is flat over its scored completions (its totals [1, 1, 0] are not): dropped;
    # prompt 1: [1, 0, None] is informative and kept
    fake = RunnerSampler(lambda i, g: [1.0, 1.0, NAN] if i % 2 == 0 else [1.0, 0.0, NAN])
    out = collect(fake, 1, 3, dynamic_sampling=True, max_rounds=2)
    assert [p.columns["i"] for p in out.prompts] == [1] and out.metrics["dynamic_sampling/dropped_groups"] == 1
    # GFPO keeps scored completions first: the unscorable one (sample 1) is the shortest (length 1), and its
    # "reward per token" 0 / 1 ties sample 2's 0 / 2 and would win as the earlier sample; neither keeps it
    batch = RunnerSampler(lambda i, g: [1.0, NAN, 0.0, 1.0], lambda i, g: [4, 1, 2, 3])(1, 4)
    assert [len(c) for c in gfpo_keep(batch, 3, "length").rollout.completion_ids] == [4, 2, 3]
    assert [len(c) for c in gfpo_keep(batch, 3, "token_efficiency").rollout.completion_ids] == [4, 2, 3]


def test_gfpo_collect_oversamples_then_filters():
    fake = FakeSampler(lambda i, g: [float(k % 2) for k in range(g)], lambda i, g: list(range(1, g + 1)))
    out = collect(fake, 2, 4, sample_group_size=8, gfpo_criterion="length")
    assert fake.calls == [([0, 1], 8)]
    assert out.rollout.group_size == 4 and [len(c) for c in out.rollout.completion_ids] == [1, 2, 3, 4] * 2


def test_gfpo_adaptive_gives_only_hard_prompts_more_samples():
    # prompt 0 easy (all correct), prompt 1 hard (1 of 4 correct) -> only prompt 1 is resampled
    fake = FakeSampler(
        lambda i, g: [1.0] * g if i == 0 else [1.0, 0.0, 0.0, 0.0][:g] + [0.0] * max(0, g - 4),
        lambda i, g: [9 - k for k in range(g)],
    )
    out = collect(fake, 2, 4, sample_group_size=8, gfpo_adaptive=True, adaptive_threshold=0.5)
    assert fake.calls == [([0, 1], 4), ([1], 4)]
    assert out.rollout.group_size == 4 and out.metrics["gfpo/hard_prompts"] == 1.0
    # easy prompt keeps its first 4 (lengths 9 8 7 6). The hard prompt has 8 samples, lengths
    # 9 8 7 6 | 9 8 7 6; the 4 shortest are samples 3 and 7 (length 6) and 2 and 6 (length 7),
    # kept in sample order: 2, 3, 6, 7 -> lengths 7 6 7 6
    assert [len(c) for c in out.rollout.completion_ids[:4]] == [9, 8, 7, 6]
    assert [len(c) for c in out.rollout.completion_ids[4:]] == [7, 6, 7, 6]


@pytest.mark.parametrize(
    "rollout, message",
    [
        ({"sample_group_size": 4}, "rollout.sample_group_size=4 must be 0 (off) or larger than rollout.group_size=8"),
        ({"gfpo_adaptive": True}, "rollout.gfpo_adaptive needs rollout.sample_group_size > group_size"),
        (
            {"gfpo_criterion": "token_efficiency"},
            "rollout.gfpo_criterion='token_efficiency' has no effect with rollout.sample_group_size=0 (GFPO off); "
            "set rollout.sample_group_size > group_size, or leave it 'length'",
        ),
        (
            {"sample_group_size": 16, "gfpo_adaptive_threshold": 0.3},
            "rollout.gfpo_adaptive_threshold=0.3 has no effect with rollout.gfpo_adaptive=false; set "
            "rollout.gfpo_adaptive=true, or leave it 0.5",
        ),
    ],
)
def test_gfpo_settings_it_cannot_use_are_refused_in_one_sentence(rollout, message):
    from helpers.config_errors import section_error

    assert section_error(rollout=rollout) == message


def test_a_steps_zeroed_share_is_over_every_completion_it_scored():
    """Dynamic sampling scores 2 rounds of P=2 x G=2 = 8 completions; 2 of them were zeroed (their own fault). The
    live alarm's share is 2 / 8 = 0.25 over the rows scored (the runner's rewards/scored, summed over rounds), not
    2 / 4 over the kept batch of prompts_per_step x group_size (before: 0.5, twice the real share)."""
    from grpokit.record.health_checks import zeroed_share

    def with_counts(prompts, G):
        sb = FakeSampler(lambda i, g: [1.0, 1.0] if i % 2 == 0 else [1.0, 0.0])(prompts, G)
        sb.metrics.update({"rewards/r/zeroed": 1.0, "rewards/scored": float(len(sb.texts))})
        return sb

    out = collect(with_counts, 2, 2, dynamic_sampling=True, max_rounds=4)
    assert out.metrics["rewards/scored"] == 8.0 and out.metrics["rewards/r/zeroed"] == 2.0
    assert zeroed_share(out.metrics, 2 * 2) == 0.25
    assert zeroed_share({"rewards/r/zeroed": 2.0}, 4) == 0.5  # a run that logs no rewards/scored: the config's batch


def test_dynamic_sampling_that_finds_no_informative_group_samples_no_round_past_the_limit():
    """P=4, G=4, every group flat, max_rounds=3. Before: a fourth, uncounted sample(P, G) call trained (prompts
    12-15) while the metrics said rounds 3, kept_groups 4. Now: 3 calls (prompts 0-11), the step trains on round 3's
    groups as drawn (8-11, flat: zero advantages), kept_groups 0, the 4 trained flat groups counted apart, the 8
    others dropped; the fault counts and sampled/reward cover all 12 prompts x 4 = 48 completions (3 x 16)."""
    fake = FakeSampler(lambda i, g: [0.0] * g)
    said = []
    out = collect(fake, 4, 4, dynamic_sampling=True, max_rounds=3, warn=said.append)
    assert [c[0] for c in fake.calls] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [p.columns["i"] for p in out.prompts] == [8, 9, 10, 11] and out.total_N.tolist() == [0.0] * 16
    m = out.metrics
    assert (m["dynamic_sampling/rounds"], m["dynamic_sampling/sampled_prompts"]) == (3.0, 12.0)
    assert (m["dynamic_sampling/kept_groups"], m["dynamic_sampling/flat_groups_trained"]) == (0.0, 4.0)
    assert m["dynamic_sampling/dropped_groups"] == 8.0  # 12 flat found, 4 of them trained
    assert m["rewards/r/failures"] == 0.0 and m["sampled/reward"] == 0.0
    assert len(said) == 1 and "fewer than train.prompts_per_step=4 informative groups" in said[0]
    assert "algo.max_sampling_rounds=3 rounds" in said[0]


def test_dynamic_sampling_counts_every_rounds_scored_completions_and_warns_when_short():
    """P=2, G=2, max_rounds=2; only prompt 1 is informative ([1, 0]; the others [1, 1]). Round 1 keeps prompt 1,
    round 2 (prompts 2, 3) keeps none: the step trains on prompt 1 alone (kept_groups 1 < 2: warned), 3 flat groups
    dropped. rewards/scored sums both rounds' 4 + 4 = 8 completions (before: only the rounds that kept a group, 4)."""

    fake = FakeSampler(lambda i, g: [1.0, 0.0] if i == 1 else [1.0, 1.0])

    def numbered(prompts, G):
        sb = fake(prompts, G)
        sb.metrics["rewards/scored"] = float(len(sb.texts))  # as the reward runner counts its completions
        return sb

    said = []
    out = collect(numbered, 2, 2, dynamic_sampling=True, max_rounds=2, warn=said.append)
    assert [p.columns["i"] for p in out.prompts] == [1]
    m = out.metrics
    assert (m["dynamic_sampling/kept_groups"], m["dynamic_sampling/dropped_groups"]) == (1.0, 3.0)
    assert m["dynamic_sampling/flat_groups_trained"] == 0.0 and m["rewards/scored"] == 8.0
    assert len(said) == 1
    # a batch that fills says nothing
    said.clear()
    full = collect(FakeSampler(lambda i, g: [1.0, 0.0]), 2, 2, dynamic_sampling=True, max_rounds=2, warn=said.append)
    assert full.metrics["dynamic_sampling/kept_groups"] == 2.0 and said == []


class ThreadRanks:
    """K fake ranks as threads: ``sum_float(s)``, ``gather_rows`` and ``gather_objects`` meet at a barrier, as
    torch.distributed's collectives do; ``collectives[r]`` names each one rank r called, in order."""

    def __init__(self, K):
        import threading

        self.K, self.barrier, self.slots = K, threading.Barrier(K), [None] * K
        self.collectives = [[] for _ in range(K)]

    def meet(self, r, obj):
        self.slots[r] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def rank(self, r):
        ranks = self

        class Rank:
            rank, world_size, active = r, ranks.K, True

            def gather_objects(self, obj):
                ranks.collectives[r].append("gather_objects")
                return ranks.meet(r, obj)

            def sum_float(self, value):
                ranks.collectives[r].append("sum_float")
                return float(sum(ranks.meet(r, float(value))))

            def gather_rows(self, x):
                ranks.collectives[r].append("gather_rows")
                return torch.cat(ranks.meet(r, x))

            def sum_floats(self, values):
                ranks.collectives[r].append("sum_floats")
                return [float(sum(column)) for column in zip(*ranks.meet(r, [float(v) for v in values]))]

        return Rank()


def test_dynamic_sampling_on_two_ranks_samples_no_round_past_the_limit():
    """Two ranks, P=2 each, G=2, max_rounds=2, every group flat: each rank samples 2 rounds (before: a third,
    sample(P, G) after _share_rounds found nothing) and trains on its round-2 groups as drawn; the counts are
    global: 8 prompts sampled (4 a rank), 4 flat groups trained (2 a rank), 4 dropped (8 found flat - 4 trained),
    none kept."""
    import threading

    ranks, results, calls = ThreadRanks(2), {}, {}

    def run(r):
        fake = FakeSampler(lambda i, g: [0.5, 0.5])
        fake.next = 100 * r
        said = []
        results[r] = collect(fake, 2, 2, dynamic_sampling=True, max_rounds=2, dist=ranks.rank(r), warn=said.append)
        calls[r] = (fake.calls, said)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join(timeout=30) for t in threads]
    for r in range(2):
        assert [c[0] for c in calls[r][0]] == [[100 * r, 100 * r + 1], [100 * r + 2, 100 * r + 3]]
        assert [p.columns["i"] for p in results[r].prompts] == [100 * r + 2, 100 * r + 3]
        m = results[r].metrics
        assert (m["dynamic_sampling/rounds"], m["dynamic_sampling/sampled_prompts"]) == (2.0, 8.0)
        assert (m["dynamic_sampling/kept_groups"], m["dynamic_sampling/flat_groups_trained"]) == (0.0, 4.0)
        assert m["dynamic_sampling/dropped_groups"] == 4.0 and len(calls[r][1]) == 1
        # one collective a round (the stop rule's count), the pooling of kept groups, then the step's three counts
        # (sampled, flat found, kept) together in one: before, a sum_float each, every one its own wait
        assert ranks.collectives[r] == ["sum_float", "sum_float", "gather_objects", "sum_floats"]


class TwoColumnSampler:
    """Two functions, an accuracy and an overlong penalty (weight 1 each): prompt i's groups are scripted
    as (accuracy values, penalty values); the total is their sum."""

    def __init__(self, groups):
        self.groups, self.next = groups, 0

    def __call__(self, n, G):
        prompts = [Prompt(text=f"p{self.next + k}", ids=[1], columns={"i": self.next + k}) for k in range(n)]
        self.next += n
        acc = [a for p in prompts for a in self.groups[p.columns["i"]][0]]
        pen = [x for p in prompts for x in self.groups[p.columns["i"]][1]]
        N = len(acc)
        rewards_NF = torch.tensor([acc, pen]).T  # (N, 2)
        ro = Rollout([p.ids for p in prompts], [[5, 5]] * N, [[0.0, 0.0]] * N, ["eos"] * N, G)
        return ScoredBatch(prompts, ro, ["t"] * N, rewards_NF, rewards_NF.sum(1), ["acc", "overlong"], {"reward": 0.0})


def test_dynamic_sampling_judges_the_chosen_functions_not_the_shaped_total():
    """DAPO keeps a group when some but not all answers are correct (0 < correct < G). Prompt 0: all wrong
    (accuracy 0, 0, 0, 0) but penalties -1, -1, -1, 0, so totals -1, -1, -1, 0 differ; prompt 1: accuracy
    1, 0, 0, 1 with no penalty; prompt 2: all right (1 each) with penalties 0, -0.5, 0, 0; prompt 3: accuracy
    0, 1, 1, 1. Judged by the total (the default) prompts 0, 1, 2, 3 all stay; judged by the accuracy
    column (judged=[0]) only 1 and 3 do, and P=2 is filled in one round."""
    groups = {
        0: ([0.0] * 4, [-1.0, -1.0, -1.0, 0.0]),
        1: ([1.0, 0.0, 0.0, 1.0], [0.0] * 4),
        2: ([1.0] * 4, [0.0, -0.5, 0.0, 0.0]),
        3: ([0.0, 1.0, 1.0, 1.0], [0.0] * 4),
    }
    out = collect(TwoColumnSampler(groups), 4, 4, dynamic_sampling=True, max_rounds=1)
    assert [p.columns["i"] for p in out.prompts] == [0, 1, 2, 3]
    out = collect(TwoColumnSampler(groups), 4, 4, dynamic_sampling=True, judged=[0], max_rounds=1)
    assert [p.columns["i"] for p in out.prompts] == [1, 3]
    assert out.metrics["dynamic_sampling/dropped_groups"] == 2 and out.metrics["dynamic_sampling/kept_groups"] == 2
    # a completion the judged function did not score (None: NaN) is left out, not a 0: prompt 0's one scored
    # member is alone, so its group is flat and dropped; prompt 1 (1, 0 among the scored) stays
    groups = {0: ([float("nan")] * 3 + [1.0], [0.0, -1.0, 0.0, 0.0]), 1: ([1.0, float("nan"), 0.0, 1.0], [0.0] * 4)}
    out = collect(TwoColumnSampler(groups), 2, 4, dynamic_sampling=True, judged=[0], max_rounds=1)
    assert [p.columns["i"] for p in out.prompts] == [1]
