"""config/judge.py JUDGE_READERS: the one table of the features that read reward.judge, from which
judge_readers, validation's refusal of a judge nothing reads and the start-up warnings are built."""

import pytest

from grpokit.config import Config, ConfigError
from grpokit.config.io import apply_overrides
from grpokit.config.judge import DYNAMIC_SAMPLING, JUDGE_READERS, judge_readers, spoken
from grpokit.validation import validate

# one config turning on each reader alone, in the table's order
TURNED_ON = {
    "algo.dynamic_sampling=true": ["algo.dynamic_sampling=true"],
    "data.curriculum=frontier": ["data.curriculum=frontier"],
    "algo.error_correction": [
        "algo.error_correction=gold",
        "algo.error_correction_fn=grpokit.data.tasks.arithmetic:format_completion",
    ],
}


def test_names_are_listed_as_a_sentence_lists_them():
    assert spoken(["a"]) == "a" and spoken(["a", "b"]) == "a or b" and spoken(["a", "b", "c"]) == "a, b or c"
    assert spoken(["a", "b", "c"], "and") == "a, b and c" and spoken([]) == ""


def test_each_reader_of_the_table_reads_the_judge_and_nothing_else_does():
    assert [name for name, _ in JUDGE_READERS] == list(TURNED_ON)  # a new reader needs its row here too
    for name, over in TURNED_ON.items():
        cfg = apply_overrides(Config(), [*over, "reward.judge=[task]"])
        assert judge_readers(cfg) == [name]
        assert judge_readers(cfg, besides=(DYNAMIC_SAMPLING,)) == ([] if name == DYNAMIC_SAMPLING else [name])
        validate(cfg)  # read: accepted
    everything = apply_overrides(Config(), [o for over in TURNED_ON.values() for o in over])
    assert judge_readers(everything, besides=(DYNAMIC_SAMPLING,)) == [
        "data.curriculum=frontier",
        "algo.error_correction",
    ]
    # none on: the refusal names every reader of the table, in its order
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), ["reward.judge=[task]"]))
    assert str(e.value) == (
        "reward.judge=['task'] has no effect unless algo.dynamic_sampling=true, data.curriculum=frontier or "
        "algo.error_correction is on (nothing else judges a completion); set one, or leave it []"
    )


def _old_run(**sections) -> dict:
    """A config.yaml of the versions before reward.judge: the judge under algo.dynamic_sampling_on."""
    algo = {"dynamic_sampling": True, "dynamic_sampling_on": ["task"], **sections.pop("algo", {})}
    return {"algo": algo, **sections}


def test_an_old_judge_that_now_reaches_more_readers_is_warned_about():
    """Earlier versions read algo.dynamic_sampling_on for dynamic sampling alone and judged the frontier curriculum's
    passes and EDGE-GRPO's all-wrong groups by the reward as trained; now the old spelling is reward.judge, which
    they read too. Resuming such a run changed its recipe without a word; respelled_judge says so (and that no
    setting keeps the old split)."""
    from grpokit.config.io import from_dict
    from grpokit.config.judge import respelled_judge

    said = respelled_judge(from_dict(_old_run(data={"curriculum": "frontier"})))
    assert said == (
        "algo.dynamic_sampling_on=['task'] (the spelling of earlier versions) sets reward.judge, which "
        "data.curriculum=frontier reads too: it now judges a completion by ['task'], where earlier versions judged it "
        "by the reward as trained and read algo.dynamic_sampling_on for dynamic sampling alone; no setting keeps that "
        "split (one judge serves every reader), so keep it, or set reward.judge=[] to judge by the reward as trained "
        "everywhere, dynamic sampling included"
    )
    edge = {"error_correction": "gold", "error_correction_fn": "grpokit.data.tasks.arithmetic:format_completion"}
    said = respelled_judge(from_dict(_old_run(data={"curriculum": "frontier"}, algo=edge)))
    assert "which data.curriculum=frontier and algo.error_correction read too: they now judge" in said
    # nothing changed: dynamic sampling its only reader, an empty judge, the new spelling
    assert respelled_judge(from_dict(_old_run())) is None
    assert (
        respelled_judge(from_dict(_old_run(data={"curriculum": "frontier"}, algo={"dynamic_sampling_on": []}))) is None
    )
    new = {"algo": {"dynamic_sampling": True}, "reward": {"judge": ["task"]}, "data": {"curriculum": "frontier"}}
    assert respelled_judge(from_dict(new)) is None
    # the judge set again since, in the new spelling (a later layer) or in Python: that is the judge meant
    assert (
        respelled_judge(apply_overrides(from_dict(_old_run(data={"curriculum": "frontier"})), ["reward.judge=[task]"]))
        is None
    )
    cfg = from_dict(_old_run(data={"curriculum": "frontier"}))
    cfg.reward.judge = ["math_accuracy"]
    assert respelled_judge(cfg) is None


def test_resuming_an_old_run_whose_judge_reaches_the_curriculum_warns_once(tmp_path, capsys):
    """The run folder's config.yaml (no checksum line, as earlier versions wrote it) read as --resume reads it; the
    reward stage, built once a run, prints the warning once."""
    import yaml

    from grpokit.config.io import to_dict
    from grpokit.train.build import build_rewards
    from grpokit.train.resume import load_run_config

    class NoEpisodes:
        factory = None

    old = to_dict(apply_overrides(Config(), ["algo.dynamic_sampling=true", "data.curriculum=frontier"]))
    del old["reward"]["judge"]
    old["algo"]["dynamic_sampling_on"] = ["task"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    cfg = load_run_config(tmp_path)
    assert cfg.reward.judge == ["task"]
    build_rewards(cfg, None, NoEpisodes())
    out = capsys.readouterr().out
    assert out.count("grpokit: warning: algo.dynamic_sampling_on=['task'] (the spelling of earlier versions)") == 1
    assert "no setting keeps that split" in out
