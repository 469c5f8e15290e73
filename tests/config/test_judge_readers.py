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
