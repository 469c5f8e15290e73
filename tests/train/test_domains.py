"""Domains in one run, rounds and the frontier curriculum on the tiny model (docs/DOMAINS.md): the
per-domain metrics recomputed by hand from the logged samples, held-out sets scored per domain, a run
resumed in the middle of a stage equal to the uninterrupted one, and bad input refused in one sentence."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.config.sections import ConfigError
from grpokit.data.tasks.arithmetic import arithmetic_accuracy
from grpokit.train import Trainer
from grpokit.train.build import settle_config
from grpokit.train.stages import parse_stages
from helpers.runs import likes_a

OWN = ("ab", "cd", "ef", "gh", "ij", "12")


def domain_cfg(model_dir, tmp_path, *extra):
    data = tmp_path / "own.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "a"}) + "\n" for p in OWN))
    cfg = Config()
    apply_overrides(
        cfg,
        [
            f"model.name_or_path={model_dir}",
            "data.domains.add.task=arithmetic",
            "data.domains.add.share=2",
            "data.domains.add.eval_size=5",
            f"data.domains.own.dataset={data}",
            f"data.domains.own.eval_dataset={data}",
            "data.domains.own.eval_size=3",
            "data.domains.own.reward_functions=[helpers.runs:likes_a]",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "train.prompts_per_step=3",
            "train.steps=2",
            "optim.lr=1e-2",
            f"train.out={tmp_path / 'run'}",
            "record.sinks=[]",
            "record.report=false",
            "record.samples_every=1",
            "record.samples_prompts=3",
            "train.threads=1",
            *extra,
        ],
    )
    return cfg


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_domain_is_scored_by_its_own_rewards_and_logged_apart(tiny_model_dir, tmp_path):
    summary = Trainer(domain_cfg(tiny_model_dir, tmp_path), quiet=True).train()
    metrics = rows(tmp_path / "run" / "metrics.jsonl")
    samples = rows(tmp_path / "run" / "samples.jsonl")
    assert len(metrics) == 2
    for m in metrics:
        step_samples = [s for s in samples if s["step"] == m["step"]]
        by_domain = {"add": [], "own": []}
        for s in step_samples:
            by_domain["own" if s["prompt"] in OWN else "add"].append(s)
        assert m["domain/add/prompts"] == 2 and m["domain/own/prompts"] == 1  # shares 2:1 of 3 prompts
        # the own domain: likes_a on its completions, by hand; the arithmetic verifier never sees them
        own = [c["text"] for s in by_domain["own"] for c in s["completions"]]
        own_r = likes_a(None, own)
        assert m["domain/own/reward"] == pytest.approx(sum(own_r) / len(own_r))
        assert m["domain/own/accuracy"] == pytest.approx(sum(r >= 1 - 1e-6 for r in own_r) / len(own_r))
        add_groups = [
            arithmetic_accuracy(None, [c["text"] for c in s["completions"]], [str(eval(s["prompt"][:-1]))] * 4)
            for s in by_domain["add"]
        ]
        flat = [float(max(g) == min(g)) for g in add_groups]
        assert m["domain/add/zero_std"] == pytest.approx(sum(flat) / len(flat))
        assert m["rewards/add/arithmetic_accuracy/not_applicable"] == 4  # the own group's 4 completions
        assert m["rewards/own/likes_a/not_applicable"] == 8
    for when in ("eval_before", "eval_after"):
        ev = summary[when]
        assert ev["domain/add/n"] == 5 and ev["domain/own/n"] == 3 and ev["n"] == 8
        # over the graded prompts: each domain weighs its n - ungraded (here every prompt is graded: 5 and 3)
        graded = {d: ev[f"domain/{d}/n"] - ev[f"domain/{d}/ungraded"] for d in ("add", "own")}
        assert graded == {"add": 5, "own": 3} and ev["ungraded"] == 0
        weighted = (5 * ev["domain/add/accuracy"] + 3 * ev["domain/own/accuracy"]) / 8
        assert ev["accuracy"] == pytest.approx(weighted)


def final(run):
    ckpts = sorted((run / "checkpoints").glob("step-*"))
    weights = load_file(str(ckpts[-1] / "model" / "model.safetensors"))
    keep = [
        {k: v for k, v in m.items() if not k.startswith(("time/", "tokens_per_second", "rollout/tokens"))}
        for m in rows(run / "metrics.jsonl")
    ]
    return weights, keep


def test_rounds_resume_mid_stage_exactly(tiny_model_dir, tmp_path):
    """Stages (arithmetic alone, then both domains at another lr and group size) with the frontier
    curriculum: killed after step 3 (the second stage's step 1) and resumed, the run ends where the
    uninterrupted one does, bit for bit, metrics included."""
    stages = (
        "train.stages=[{domain: add, steps: 2}, {steps: 3, lr: 0.003, group_size: 2, reward_weights: {own: [0.5]}}]"
    )
    over = (
        stages,
        "train.steps=5",
        "data.curriculum=frontier",
        "train.save_every=1",
        "train.keep_checkpoints=10",
        "train.deterministic=true",
        "record.samples_every=0",
        "record.samples_prompts=2",  # domain_cfg's 3 would be read by no sample dump: refused beside samples_every=0
    )
    ref = tmp_path / "ref"
    ref.mkdir()
    Trainer(domain_cfg(tiny_model_dir, ref, *over), quiet=True).train()
    w_ref, m_ref = final(ref / "run")
    assert [(m["stage"], m["stage/step"]) for m in m_ref] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert "domain/own/prompts" not in m_ref[1] and m_ref[2]["domain/own/prompts"] == 1
    assert [m["learning_rate"] for m in m_ref] == pytest.approx([0.01, 0.01, 0.003, 0.003, 0.003])
    # the own reward skips the add domain's completions: 3 prompts x G=4, then 2 x G=2 (the stage's group size)
    assert [m["rewards/own/likes_a/not_applicable"] for m in m_ref] == [12, 12, 4, 4, 4]
    w_res, m_res = resumed_after(tiny_model_dir, tmp_path, over, ref / "run", 3, 5)
    for k in w_ref:
        assert torch.equal(w_ref[k], w_res[k]), k
    assert m_res == m_ref


def resumed_after(model_dir, tmp_path, over, ref_run, kept: int, steps: int):
    """The run ``ref_run`` cut back to its first ``kept`` steps (a kill after that step's checkpoint) and
    resumed to its end: its final weights and metrics."""
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copytree(ref_run, killed / "run")
    for step in range(kept + 1, steps + 1):
        shutil.rmtree(killed / "run" / "checkpoints" / f"step-{step:06d}")
    for name in ("metrics.jsonl", "samples.jsonl"):
        f = killed / "run" / name
        if f.exists():
            f.write_text(
                "".join(line for line in f.read_text().splitlines(keepends=True) if json.loads(line)["step"] <= kept)
            )
    (killed / "run" / "summary.json").unlink()
    Trainer(domain_cfg(model_dir, killed, *over), resume=killed / "run", quiet=True).train()
    return final(killed / "run")


def test_an_asynchronous_curriculum_resumes_exactly(tiny_model_dir, tmp_path):
    """rollout.async_staleness=1 with the frontier curriculum over domains: the checkpoint after step 2 keeps
    batch 3's prompts, drawn before it (unpickled at resume, copies of the pool's prompts). Before, the curriculum
    found its prompts by object identity and skipped those copies without a word: from step 3 on the resumed
    run's domain/*/curriculum/buckets_seen fell behind (add 6 -> 4) and by step 4 its pass rates, so its draws,
    differed. Now each prompt carries its place in its pool and the resumed run is the uninterrupted one."""
    over = (
        "rollout.async_staleness=1",
        "data.curriculum=frontier",
        "train.steps=4",
        "train.save_every=1",
        "train.keep_checkpoints=10",
        "train.deterministic=true",
        "data.domains.add.eval_size=0",
        "data.domains.own.eval_size=0",
    )
    ref = tmp_path / "ref"
    ref.mkdir()
    Trainer(domain_cfg(tiny_model_dir, ref, *over), quiet=True).train()
    w_ref, m_ref = final(ref / "run")
    samples_ref = [(s["step"], s["prompt"]) for s in rows(ref / "run" / "samples.jsonl")]
    # every group of every step is counted into its bucket: add's 2 prompts a step, own's 1 (shares 2:1)
    assert [m["domain/add/curriculum/buckets_seen"] for m in m_ref][:1] == [2.0]
    w_res, m_res = resumed_after(tiny_model_dir, tmp_path, over, ref / "run", 2, 4)
    for k in w_ref:
        assert torch.equal(w_ref[k], w_res[k]), k
    assert m_res == m_ref
    assert [(s["step"], s["prompt"]) for s in rows(tmp_path / "killed" / "run" / "samples.jsonl")] == samples_ref


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["train.stages=[{domain: maths, steps: 2}]"],
            "train.stages[0].domain names the domain 'maths', which data.domains does not define; defined: add, own",
        ),
        (["data.domains.add.share=0", "data.domains.own.share=0"], "the shares (add=0, own=0) sum to 0"),
        (["data.domains.add.weight=2"], "data.domains.add has the unknown key 'weight'"),
        (["data.domains.add.share=-1"], "data.domains.add.share must be a number >= 0"),
        (
            ["train.stages=[{steps: 2}, {steps: 1}]", "train.steps=4"],
            "train.stages add up to 3 steps but train.steps=4",
        ),
        (["train.stages=[{steps: 2, group_size: 1}]"], "train.stages[0]: rollout.group_size=1 is too small"),
        (["train.stages=[{steps: 0}]"], "train.stages[0].steps must be an integer >= 1"),
        (["data.dataset=x.jsonl"], "data.domains replaces data.dataset"),
        (  # before: dropped without a word, and the held-out evaluation covered the task domain only
            ["data.eval_dataset=x.jsonl", "data.eval_size=2"],
            "data.domains replaces data.eval_dataset, but data.eval_dataset='x.jsonl' is set beside it (each domain "
            "has its own); give it to the domain it belongs to as data.domains.<name>.eval_dataset, or leave "
            "data.eval_dataset out",
        ),
        (  # before: "the built-in task 'arithmetic' takes none", a default the user never set
            ["data.task_params={min_terms: 2}"],
            "data.domains replaces data.task_params, but data.task_params={'min_terms': 2} is set beside it",
        ),
        (["data.task=calculator"], "data.domains replaces data.task, but data.task='calculator' is set beside it"),
        (["data.domains.calc.task=calculator"], "task 'calculator' needs the episode loop"),
        (["data.curriculum=easy"], "data.curriculum='easy' is not a curriculum; valid: off, frontier"),
        (  # neither sampled nor evaluated: before, the run went on without a word
            ["data.domains.own.share=0", "data.domains.own.eval_dataset="],
            "data.domains.own.share=0 and no train.stages entry names it, and it has no held-out set, so it would be "
            "neither trained on nor evaluated; give it a positive share, name it in a stage's domain, or remove it",
        ),
        (  # an asynchronous sampler draws batch j before step j: a stage's sampling settings would come late
            ["rollout.async_staleness=1", "train.stages=[{steps: 2, lr: 0.001}, {steps: 2, temperature: 0.5}]"],
            "train.stages[1].temperature changes what is sampled, which the asynchronous sampler would apply late "
            "(rollout.async_staleness=1 draws each batch up to 1 step(s) before the step whose stage it belongs to)",
        ),
        (
            ["rollout.async_staleness=2", "train.stages=[{domain: add, steps: 2}, {steps: 2}]"],
            "train.stages[0].domain changes what is sampled",
        ),
        (["rollout.async_staleness=1", "train.stages=[{steps: 2, group_size: 8}]"], "train.stages[0].group_size"),
        (["rollout.async_staleness=1", "train.stages=[{steps: 2, max_new_tokens: 4}]"], "stages[0].max_new_tokens"),
    ],
)
def test_bad_input_is_one_sentence(tiny_model_dir, tmp_path, overrides, message):
    cfg = domain_cfg(tiny_model_dir, tmp_path)
    with pytest.raises(ConfigError) as e:
        apply_overrides(cfg, overrides)
        settle_config(cfg, own_rows=False)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_rows_passed_to_the_trainer_beside_domains_are_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"^data.domains replaces rows passed to the Trainer; give the rows as a"):
        settle_config(domain_cfg(tiny_model_dir, tmp_path), own_rows=True)


def test_a_domain_with_share_0_is_warned_about_once_when_it_is_only_evaluated(tiny_model_dir, tmp_path, capsys):
    settle_config(domain_cfg(tiny_model_dir, tmp_path, "data.domains.own.share=0"), own_rows=False)
    assert capsys.readouterr().out == (
        "grpokit: warning: data.domains.own has share 0 and no train.stages entry names it: it is evaluated on "
        "its held-out set but never trained on\n"
    )
    named = ("data.domains.own.eval_dataset=", "train.stages=[{domain: own, steps: 1}, {steps: 1}]")
    settle_config(domain_cfg(tiny_model_dir, tmp_path, "data.domains.own.share=0", *named), own_rows=False)
    assert capsys.readouterr().out == ""  # a stage trains on it


def test_a_stage_naming_a_share_0_domain_beside_a_shared_one_says_they_mix_equally(tiny_model_dir, tmp_path, capsys):
    stages = "train.stages=[{domain: [add, own], steps: 1}, {domain: own, steps: 1}]"
    settle_config(domain_cfg(tiny_model_dir, tmp_path, "data.domains.own.share=0", stages), own_rows=False)
    assert capsys.readouterr().out == (
        "grpokit: warning: train.stages[0] names own with share 0 beside domains with a share, so its domains "
        "add, own share its batches equally (shares cannot mix a share-0 domain); give every one of them a "
        "positive share to mix them by share\n"
    )


def test_a_domains_own_domain_column_is_refused(tiny_model_dir, tmp_path):
    from grpokit.train.domain_setup import domain_rows

    cfg = domain_cfg(tiny_model_dir, tmp_path)
    (tmp_path / "own.jsonl").write_text(json.dumps({"prompt": "ab", "answer": "a", "domain": "x"}) + "\n")
    with pytest.raises(ConfigError) as e:
        domain_rows(cfg)
    assert str(e.value) == (
        "data.domains.own: its data has a column 'domain', which grpokit sets to the domain's name and so would "
        "replace; rename that column"
    )


@pytest.mark.parametrize(
    "setting, message",
    [
        ("data.domains.own.answer_column=gold", "data.domains.own.answer_column='gold' is not a column of"),
        ("data.domains.own.prompt_column=question", "data.domains.own.prompt_column='question' is not a column of"),
        ("data.domains.own.reward_functions=[no_such_reward]", "data.domains.own.reward_functions: Unknown reward"),
        ("data.domains.add.task_params={digits: -3}", "data.domains.add.task_params"),
    ],
)
def test_an_error_in_a_domains_data_or_rewards_names_that_domains_setting(tiny_model_dir, tmp_path, setting, message):
    """A domain is read as a run of its own (train/domain_setup.py); its errors name the field the user set
    (data.domains.<name>.*), not the run's data.* or reward.* field that was left as it was."""
    cfg = domain_cfg(tiny_model_dir, tmp_path, setting)
    with pytest.raises(ConfigError) as e:
        Trainer(cfg, quiet=True)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not any(
        f" {run}" in f" {e.value}" for run in ("data.answer_column", "data.prompt_column", "reward.functions")
    )


def test_async_stages_may_change_what_acts_at_the_update(tiny_model_dir, tmp_path):
    """lr, reward_weights and teacher act at the update, after the sampler: an async run may stage them."""
    cfg = domain_cfg(
        tiny_model_dir,
        tmp_path,
        "rollout.async_staleness=1",
        "train.stages=[{steps: 1, lr: 0.001}, {steps: 1, reward_weights: {own: [2.0]}}]",
    )
    settle_config(cfg, own_rows=False)
    assert [s.overrides for s in parse_stages(cfg)] == [(("optim.lr", 0.001),), ()]


def test_a_stage_without_domains_in_a_run_without_domains_is_refused(tiny_model_dir, tmp_path):
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={tiny_model_dir}", "train.stages=[{domain: math, steps: 2}]"])
    with pytest.raises(ConfigError, match="names the domain 'math', which data.domains does not define; defined: none"):
        settle_config(cfg, own_rows=False)
