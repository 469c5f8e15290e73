"""The frontier curriculum (data/curriculum.py) and the domain mixer (data/domain_sampler.py): hand-worked
weights, the frequencies they give, shares to the prompt, and states that resume the same draws."""

import pytest

from grpokit.data.curriculum import FrontierSampler, frontier_weight
from grpokit.data.domain_sampler import DomainSampler
from grpokit.data.prompt_sampler import PromptSampler
from grpokit.types import Prompt


def prompts(names, **columns):
    return [Prompt(text=n, ids=[1], columns={**columns}) for n in names]


def test_frontier_weight_by_hand():
    # G = 4: 1 - p^4 - (1-p)^4
    assert frontier_weight(0.5, 4, 0.05) == pytest.approx(1 - 2 / 16)  # 0.875
    assert frontier_weight(0.25, 4, 0.05) == pytest.approx(1 - 1 / 256 - 81 / 256)  # 0.68359375
    assert frontier_weight(1.0, 4, 0.05) == 0.05  # solved: only the floor
    assert frontier_weight(0.0, 4, 0.05) == 0.05  # hopeless: only the floor


def test_pass_rates_are_smoothed_decayed_counts():
    s = FrontierSampler(prompts(["a", "b"]), seed=0, decay=0.5, group_size=4)
    a, b = s.prompts
    assert s.pass_rate(0) == 0.5  # unseen: (0 + 1) / (0 + 2)
    s.observe([a, b], [1, 1, 1, 1, 0, 1, 0, 0], 4)  # a: 4 of 4 pass, b: 1 of 4
    assert s.stats == {0: [4, 4], 1: [1, 4]}
    assert s.pass_rate(0) == pytest.approx(5 / 6) and s.pass_rate(1) == pytest.approx(2 / 6)
    s.observe([a], [0, 0, 0, 0], 4)  # decayed: passes 0.5 * 4 + 0, seen 0.5 * 4 + 4
    assert s.stats[0] == [2.0, 6.0]
    m = s.metrics()
    assert m["curriculum/zero_std_share"] == pytest.approx(2 / 3)  # a's two groups were flat, b's was not
    assert s.metrics()["curriculum/zero_std_share"] != s.metrics()["curriculum/zero_std_share"]  # reset: NaN


def test_solved_prompts_are_drawn_at_their_weight():
    """One prompt solved 64 times in a row (p = 65/66, weight the floor 0.05) beside one at p = 1/2
    (weight 0.875): one prompt a batch, the solved one is drawn 0.05 / 0.925 = 5.4% of the time."""
    s = FrontierSampler(prompts(["solved", "open"]), seed=3, floor=0.05, decay=1.0, group_size=4)
    s.stats = {0: [64.0, 64.0], 1: [32.0, 64.0]}
    draws = [s.next_batch(1)[0].text for _ in range(2000)]
    assert draws.count("solved") / 2000 == pytest.approx(0.05 / 0.925, abs=0.015)


def test_buckets_share_a_pass_rate():
    s = FrontierSampler(prompts(["x", "y"], level="hard"), seed=0, key="level", group_size=2)
    s.observe([s.prompts[0]], [1, 1], 2)
    assert s.stats == {"hard": [2, 2]} and s.pass_rate("hard") == 0.75


def test_a_restored_curriculum_draws_what_the_original_does():
    s = FrontierSampler(prompts("abcdefgh"), seed=1, group_size=2)
    s.next_batch(3)
    s.observe(s.prompts[:2], [1, 1, 0, 1], 2)
    t = FrontierSampler(prompts("abcdefgh"), seed=1)
    t.load_state_dict(s.state_dict())
    assert [p.text for p in t.next_batch(4)] == [p.text for p in s.next_batch(4)]


def test_shares_fill_batches_to_the_prompt():
    pools = {d: PromptSampler(prompts([f"{d}{i}" for i in range(5)], domain=d), 0) for d in ("m", "c")}
    mix = DomainSampler(pools, {"m": 2.0, "c": 1.0})
    assert mix.schedule(6) == [
        "m",
        "c",
        "m",
        "m",
        "c",
        "m",
    ]  # credits (2,1) -> m; (1,2) -> c; (3,0) -> m; (2,1) -> m ...
    batch = mix.next_batch(3)
    assert [p.columns["domain"] for p in batch].count("m") == 2 and mix.position == 3
    mix.set_domains(["c"])
    assert {p.columns["domain"] for p in mix.next_batch(4)} == {"c"}


def test_a_stage_naming_a_share_0_domain_beside_a_shared_one_mixes_them_equally():
    """Shares m 2, x 0; a stage names [m, x]. A share-0 domain has no share to mix by, so the stage's domains
    weigh 1 each (total 2). Credits (m, x) before each pick: (1, 1) -> m pays 2: (-1, 1); (0, 2) -> x: (0, 0);
    (1, 1) -> m; (0, 2) -> x. So m, x, m, x: half each (before: x weighed 0 and was never sampled). Outside
    the stage (None) only m, share 2 of 2."""
    pools = {d: PromptSampler(prompts([f"{d}{i}" for i in range(5)], domain=d), 0) for d in ("m", "x")}
    mix = DomainSampler(pools, {"m": 2.0, "x": 0.0})
    assert mix.schedule(2) == ["m", "m"]
    mix.set_domains(["m", "x"])
    assert mix.schedule(4) == ["m", "x", "m", "x"]
    mix.set_domains(None)
    assert mix.schedule(2) == ["m", "m"]


def test_a_restored_mix_serves_what_the_original_does():
    def make():
        pools = {d: PromptSampler(prompts([f"{d}{i}" for i in range(5)], domain=d), i) for i, d in enumerate("mc")}
        return DomainSampler(pools, {"m": 1.0, "c": 2.0})

    a = make()
    a.next_batch(4)
    b = make()
    b.load_state_dict(a.state_dict())
    assert [p.text for p in b.next_batch(7)] == [p.text for p in a.next_batch(7)]


@pytest.mark.parametrize(
    "name, value, shown",
    [("curriculum_key", "level", "'level'"), ("curriculum_threshold", 0.5, "0.5"), ("curriculum_floor", 0.1, "0.1")],
)
def test_a_curriculum_setting_with_the_curriculum_off_is_refused(name, value, shown):
    from grpokit.config import Config, ConfigError
    from grpokit.validation import validate

    cfg = Config()
    setattr(cfg.data, name, value)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    default = {"curriculum_key": "''", "curriculum_threshold": "1.0", "curriculum_floor": "0.05"}[name]
    assert str(e.value) == (
        f"data.{name}={shown} has no effect with data.curriculum=off; set data.curriculum=frontier, "
        f"or leave it {default}"
    )
    cfg.data.curriculum = "frontier"
    validate(cfg)  # read by the frontier sampler


def test_copies_of_its_prompts_are_counted_and_strangers_are_not():
    """observe() finds a prompt by the place in the pool it carries, not by object identity: an asynchronous
    checkpoint's in-flight prompts come back as unpickled copies (before: skipped without a word)."""
    import pickle

    s = FrontierSampler(prompts(["a", "b"]), seed=0, decay=0.5, group_size=2)
    a_copy, b_copy = pickle.loads(pickle.dumps(s.prompts))
    assert a_copy is not s.prompts[0] and (a_copy.pool_index, b_copy.pool_index) == (0, 1)
    s.observe([b_copy, a_copy], [1, 0, 1, 1], 2)  # b: 1 of 2 pass, a: 2 of 2
    assert s.stats == {1: [1, 2], 0: [2, 2]}
    stranger = Prompt(text="z", ids=[1], pool_index=0)  # another pool's place 0, or a prompt made elsewhere
    s.observe([stranger, Prompt(text="a", ids=[1])], [1, 1, 1, 1], 2)
    assert s.stats == {1: [1, 2], 0: [2, 2]}  # neither is this pool's: not counted
