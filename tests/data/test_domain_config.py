"""data.domains and train.stages: any value is domains and stages or one sentence (never a traceback),
and the dotted spelling of the command line reaches inside the mapping."""

from hypothesis import given, settings
from hypothesis import strategies as st

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.config.sections import ConfigError
from grpokit.data.domains import parse_domains
from grpokit.train.stages import parse_stages

SCALARS = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=True) | st.text(max_size=6)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
KEYS = st.sampled_from(
    ["task", "dataset", "share", "reward_functions", "reward_weights", "eval_size", "task_params", "x"]
)
SPECS = st.dictionaries(st.text(max_size=6), st.dictionaries(KEYS, VALUES, max_size=4) | VALUES, max_size=3)


def sentence_or_value(fn):
    try:
        return fn()
    except ConfigError as e:
        assert str(e) and "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(raw=SPECS | VALUES)
def test_any_domains_value_is_domains_or_one_sentence(raw):
    cfg = Config()
    sentence_or_value(lambda: parse_domains(raw, cfg.data, cfg.reward))


@settings(max_examples=50, deadline=None)
@given(
    raw=st.lists(
        st.dictionaries(
            st.sampled_from(["steps", "domain", "lr", "group_size", "reward_weights", "y"]), VALUES, max_size=3
        ),
        max_size=3,
    )
)
def test_any_stages_value_is_stages_or_one_sentence(raw):
    cfg = Config()
    cfg.train.stages = raw
    sentence_or_value(lambda: parse_stages(cfg))


def test_dotted_overrides_reach_inside_the_mapping():
    cfg = apply_overrides(
        Config(), ["data.domains.math.task=arithmetic", "data.domains.math.share=2", "data.domains.b.dataset=x.jsonl"]
    )
    assert cfg.data.domains == {"math": {"task": "arithmetic", "share": 2}, "b": {"dataset": "x.jsonl"}}
    d = parse_domains(cfg.data.domains, cfg.data, cfg.reward)
    assert [(x.name, x.task, x.dataset, x.share) for x in d] == [
        ("math", "arithmetic", "", 2.0),
        ("b", "", "x.jsonl", 1.0),
    ]
    assert d[0].reward_functions == ("task",)  # the run's reward section, unless the domain gives its own


def test_a_domain_reward_scores_its_own_rows_and_passes_its_logs_on_under_its_name():
    from grpokit.data.domains import DomainReward

    def graded(prompts, completions, log_metric, log_extra, **kw):
        log_metric("seen", len(completions))
        log_extra("why", [f"len {len(c)}" for c in completions])
        return [float(len(c)) for c in completions]

    metrics, extra = [], []
    fn = DomainReward(graded, "m")
    out = fn(
        prompts=["p", "q", "r"],
        completions=["a", "bb", "ccc"],
        domain=["m", "c", "m"],
        log_metric=lambda k, v: metrics.append((k, v)),
        log_extra=lambda k, v: extra.append((k, v)),
    )
    assert out == [1.0, None, 3.0]  # the other domain's completion: not applicable
    # log_metric's name gains the domain (before: "seen", pooled with every other domain's "seen")
    assert metrics == [("m/seen", 2.0)] and extra == [("why", ["len 1", None, "len 3"])]
    DomainReward(graded, "c")(
        prompts=["p", "q", "r"],
        completions=["a", "bb", "ccc"],
        domain=["m", "c", "m"],
        log_metric=lambda k, v: metrics.append((k, v)),
        log_extra=lambda k, v: extra.append((k, v)),
    )
    assert metrics[1:] == [("c/seen", 1.0)]  # the same function in domain c: its own metric, 1 completion
    assert fn(prompts=["p"], completions=["a"], domain=["c"]) == [None]


def test_a_domain_rewards_wrong_count_reaches_the_runner_as_its_own_count():
    """The function a domain wraps returns 3 values for its 2 completions: the runner stops the run naming
    those counts (before, the 3 values were spread over the domain's rows and the third dropped)."""
    import pytest

    from grpokit.data.domains import DomainReward
    from grpokit.rewards import RewardRunner
    from grpokit.rewards.spec import RewardError, RewardSpec

    def three(completions, **kw):
        return [1.0, 2.0, 3.0]

    with RewardRunner([RewardSpec(DomainReward(three, "m"), "m/three")], num_workers=0) as runner:
        with pytest.raises(RewardError, match=r"^Reward 'm/three' returned 3 values for 2 completions;"):
            runner.score(["p"] * 4, ["a", "b", "c", "d"], [[1]] * 4, 4, {"domain": ["m", "c", "m", "c"]})


def _other_value(default):
    """A value of the default's type that is neither it nor empty (a run's setting a user gave)."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 3
    if isinstance(default, dict):
        return {"k": 1}
    return f"{default}-x"


def test_every_data_field_is_inherited_by_domains_shared_or_refused_beside_them():
    """One table (config/sections.py BESIDE_DOMAINS) says how each data.* field stands beside data.domains, and
    every field of DataConfig is in it, so a new field cannot be left to be silently ignored. For each field given
    at run level, beside a task domain and a dataset domain that set none of their keys: an "inherited" one is
    each domain's value; a "shared" one stays the run's in the config each domain is read with; an "own" one is
    refused in one sentence that names the field that was set (before: data.eval_dataset was dropped without a
    word, and data.task_params blamed "the built-in task 'arithmetic'", a default nobody set)."""
    import dataclasses

    import pytest

    from grpokit.config.sections import BESIDE_DOMAINS, DataConfig
    from grpokit.data.domains import KEYS, Domain
    from grpokit.train.domain_setup import domain_config, refuse_beside_domains

    fields = [f.name for f in dataclasses.fields(DataConfig)]
    assert sorted(BESIDE_DOMAINS) == sorted(fields)
    assert set(BESIDE_DOMAINS.values()) == {"own", "inherited", "shared", "domains"}
    keyed = [k for k, rule in BESIDE_DOMAINS.items() if rule in ("own", "inherited")]
    assert set(keyed) <= set(KEYS) and set(keyed) <= {f.name for f in dataclasses.fields(Domain)}
    raw = {"add": {"task": "arithmetic"}, "mine": {"dataset": "x.jsonl"}}
    for name, rule in BESIDE_DOMAINS.items():
        if rule == "domains":
            continue
        cfg = Config()
        cfg.data.domains = raw
        value = _other_value(getattr(DataConfig(), name))
        setattr(cfg.data, name, value)
        if rule == "own":
            with pytest.raises(ConfigError) as e:
                refuse_beside_domains(cfg, own_rows=False)
            assert str(e.value).startswith(f"data.domains replaces data.{name}, but data.{name}={value!r} is set")
            continue
        domains = parse_domains(cfg.data.domains, cfg.data, cfg.reward)
        for d in domains:
            got = getattr(d, name) if rule == "inherited" else getattr(domain_config(cfg, d).data, name)
            assert got == value, (name, d.name)


def test_a_domains_own_inherited_key_wins_and_none_means_left_out():
    """data.eval_size=7 at run level: a domain giving eval_size=2 keeps 2, one giving None (a YAML key left
    empty) takes the run's 7, like one that leaves it out; a wrong type is refused naming the domain's key."""
    import pytest

    cfg = Config()
    cfg.data.eval_size, cfg.data.split = 7, "dev"
    raw = {"a": {"dataset": "x", "eval_size": 2}, "b": {"dataset": "y", "eval_size": None}, "c": {"dataset": "z"}}
    d = parse_domains(raw, cfg.data, cfg.reward)
    assert [x.eval_size for x in d] == [2, 7, 7] and [x.split for x in d] == ["dev"] * 3
    with pytest.raises(ConfigError, match=r"^data.domains.a.split must be a string, got 3$"):
        parse_domains({"a": {"dataset": "x", "split": 3}}, cfg.data, cfg.reward)
