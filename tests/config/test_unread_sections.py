"""Settings of the model, optim and record sections that nothing reads in the run as configured are refused in one
sentence (each trained identical weights and exited 0 before); with the feature that reads them, accepted
(tests/trl/test_trl_unread_mapping.py: the TRL layer maps each only where TRL reads it)."""

import pytest

from grpokit.config import Config, ConfigError, RecordConfig, apply_overrides
from grpokit.validation import validate

CASES = [  # (the setting, what makes it read, the sentence)
    (
        "model.compile_mode=max-autotune",
        ["model.compile=true"],
        "model.compile_mode='max-autotune' has no effect with model.compile=false; set model.compile=true, or leave "
        "it 'default'",
    ),
    (
        "model.compile_backend=eager",
        ["model.compile=true"],
        "model.compile_backend='eager' has no effect with model.compile=false; set model.compile=true, or leave it "
        "'inductor'",
    ),
    (
        "optim.decay_norms_and_biases=false",
        ["optim.weight_decay=0.01"],
        "optim.decay_norms_and_biases=False has no effect with optim.weight_decay=0 (nothing decays); set "
        "optim.weight_decay > 0, or leave it True",
    ),
    (
        "record.samples_prompts=5",
        ["record.samples_every=1"],
        "record.samples_prompts=5 has no effect with record.samples_every=0; set record.samples_every > 0, or leave "
        "it 2",
    ),
]


@pytest.mark.parametrize("setting, feature, sentence", CASES, ids=[c[0].split("=")[0] for c in CASES])
def test_a_setting_nothing_reads_is_refused_and_accepted_where_read(setting, feature, sentence):
    off = ["record.samples_every=0"] if setting.startswith("record.") else []
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), [*off, setting]))
    assert str(e.value) == sentence
    validate(apply_overrides(Config(), [*off, *feature, setting]))


@pytest.mark.parametrize("setting", ["record.run_name=foo", "record.project=bar"])
def test_a_tracker_runs_name_without_a_tracker_that_names_runs_is_refused(setting):
    """record.run_name / project name wandb, mlflow and trackio runs (record/trackers.py NAMED_RUNS); with the
    console or tensorboard only nothing reads them (the repro's run_name=foo project=bar changed nothing)."""
    from grpokit.validation.model import check_unread_record

    name, value = setting.split("=")
    for sinks in (["console"], ["console", "tensorboard"]):
        with pytest.raises(ConfigError) as e:
            validate(apply_overrides(Config(), [f"record.sinks={sinks}".replace("'", ""), setting]))
        assert str(e.value) == (
            f"{name}={value!r} has no effect with no tracker that names runs in record.sinks (wandb, mlflow, trackio); "
            "add one to record.sinks, or leave it ''"
        )
    for tracker in ("wandb", "mlflow", "trackio"):  # read there (the packages need not be installed for this check)
        check_unread_record(RecordConfig(sinks=["console", tracker], **{name.split(".")[1]: value}))
