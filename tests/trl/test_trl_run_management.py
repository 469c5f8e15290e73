"""grpokit.trl's run-management arguments, worked out by hand and measured against TRL 1.16 itself:
``data_seed``, ``save_only_model``, ``load_best_model_at_end`` / ``metric_for_best_model`` /
``greater_is_better``, ``eval_delay``, and the vLLM engine's ``vllm_max_model_length``,
``vllm_tensor_parallel_size`` and ``vllm_importance_sampling_cap`` (vLLM is not installed: a fake
module records the engine's construction arguments)."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from grpokit.config import ConfigError
from grpokit.train import checkpoint
from grpokit.trl import best
from grpokit.trl.config import GRPOConfig
from grpokit.trl.mapping import to_config
from helpers.trl_models import make_chat_model, small_args

VLLM = dict(use_vllm=True, vllm_importance_sampling_mode="token_truncate")


def test_run_management_arguments_map_by_hand():
    c = to_config(
        GRPOConfig("o", **VLLM, vllm_importance_sampling_cap=2.5, vllm_max_model_length=1024, save_only_model=True),
        num_rows=4,
    )
    # the deprecated cap replaces clip_max (3.0 by default) as in TRL's __post_init__
    assert (c.rollout.tis_cap, c.rollout.vllm_max_model_len, c.train.save_only_model) == (2.5, 1024, True)
    c = to_config(GRPOConfig("o", **VLLM), num_rows=4)
    assert (c.rollout.tis_cap, c.rollout.vllm_max_model_len, c.train.save_only_model) == (
        3.0,
        0,
        False,
    )  # 0: the model's length
    # server mode: the server's own --tensor-parallel-size decides, TRL ignores the argument there
    assert (
        to_config(GRPOConfig("o", **VLLM, vllm_mode="server", vllm_tensor_parallel_size=2), num_rows=4).rollout.backend
        == "vllm_server"
    )
    # colocate: one engine per group of 2 processes, so 2 must divide their number (1 here)
    with pytest.raises(
        ConfigError, match=r"vllm_tensor_parallel_size=2 must divide the 1 training processes.*valid: 1$"
    ):
        to_config(GRPOConfig("o", **VLLM, vllm_tensor_parallel_size=2), num_rows=4, world_size=1)
    for name, value, gate in [
        ("vllm_tensor_parallel_size", 0, VLLM),  # read with use_vllm only (checks.GATES)
        ("vllm_max_model_length", 0, VLLM),
        ("vllm_importance_sampling_cap", -1.0, VLLM),
        ("eval_delay", float("nan"), {}),  # negative: no delay, as transformers
        ("data_seed", 1.5, {}),
        ("metric_for_best_model", "", {}),
    ]:
        with pytest.raises(ConfigError, match=f"GRPOConfig argument {name}="):
            GRPOConfig(**{name: value}, **gate)
    # transformers' defaults: load_best_model_at_end ranks by loss, smaller is better; other names: greater is better
    a = GRPOConfig(
        load_best_model_at_end=True, eval_strategy="steps", eval_steps=5, save_steps=10
    )  # strategies match, as TRL needs
    assert (a.metric_for_best_model, a.greater_is_better) == ("loss", False)
    assert GRPOConfig(metric_for_best_model="reward").greater_is_better is True
    assert GRPOConfig(metric_for_best_model="eval_loss", greater_is_better=True).greater_is_better is True


def test_load_best_model_at_end_needs_matching_strategies_in_one_sentence():
    best.check_args(
        GRPOConfig(load_best_model_at_end=True, eval_strategy="steps", eval_steps=5, save_steps=10)
    )  # 10 = 2 x 5
    best.check_args(GRPOConfig(load_best_model_at_end=True, eval_strategy="steps", eval_steps=0.1, save_steps=0.2))
    for kw, words in [
        ({}, "eval_strategy and save_strategy to match, but they are 'no' and 'steps'"),
        ({"eval_strategy": "steps", "eval_steps": 4, "save_steps": 10}, "save_steps=10 and eval_steps=4"),
        ({"eval_strategy": "steps", "eval_steps": 0.5, "save_steps": 10}, "save_steps=10 and eval_steps=0.5"),
    ]:
        with pytest.raises(ConfigError, match=words) as e:
            best.check_args(GRPOConfig(load_best_model_at_end=True, **kw))
        assert str(e.value).count(". ") == 0


def test_best_metric_is_tracked_as_transformers_by_hand(tmp_path):
    from transformers import TrainerState

    state, a = TrainerState(), GRPOConfig(metric_for_best_model="loss")  # eval_ added; smaller is better
    seen = []
    for step, loss in [(1, 0.5), (2, 0.3), (3, 0.3), (4, float("nan")), (5, 0.4)]:
        state.global_step = step
        seen.append(best.update_best(state, a, {"eval_loss": loss, "eval_reward": 1.0}))
    # 0.5 beats inf; 0.3 beats 0.5; an equal 0.3 is not strictly better; NaN never is; 0.4 is worse
    assert seen == [True, True, False, False, False] and (state.best_metric, state.best_global_step) == (0.3, 2)
    with pytest.raises(ConfigError, match=r"metric_for_best_model='acc' names 'eval_acc'.*\['eval_loss'\]"):
        best.update_best(state, GRPOConfig(metric_for_best_model="acc"), {"eval_loss": 0.1})
    # at a save, best_model_checkpoint follows best_global_step (2) only when that step was saved
    best.note_checkpoint(state, tmp_path, {1, 3})
    assert state.best_model_checkpoint is None and best.kept_folder(state, tmp_path) is None
    best.note_checkpoint(state, tmp_path, {1, 2, 3})
    assert state.best_model_checkpoint == str(tmp_path / "checkpoint-2")
    # the rotation keeps the folder the checkpoint-2 link points at
    (tmp_path / "checkpoints" / "step-000002" / "model").mkdir(parents=True)
    (tmp_path / "checkpoint-2").symlink_to(tmp_path / "checkpoints" / "step-000002" / "model")
    assert best.kept_folder(state, tmp_path) == (tmp_path / "checkpoints" / "step-000002").resolve()


def test_rotation_keeps_the_best_checkpoint_by_hand():
    s = [Path(f"step-{i}") for i in range(1, 6)]
    assert checkpoint.rotate(s, 2) == s[:3]  # no best: the two newest stay
    assert checkpoint.rotate(s, 2, s[1]) == [s[0], s[2], s[3]]  # best (2) moved before the newest (5): 2 and 5 stay
    assert checkpoint.rotate(s, 1, s[1]) == [s[0], s[2], s[3]]  # limit 1 with an older best keeps 2 (transformers)
    assert checkpoint.rotate(s, 1, s[4]) == s[:4]  # the best is the newest: it alone stays
    assert checkpoint.rotate(s, 3, s[0]) == [s[1], s[2]]  # 1, 4 and 5 stay


def test_save_only_model_checkpoint_resumes_with_the_weights_and_a_fresh_optimizer(tiny_model, tmp_path, caplog):
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    tiny_model(input_ids=torch.tensor([[3, 4, 5]])).logits.sum().backward()
    opt.step(), sched.step()  # the optimizer now has moments and the schedule a step count
    tok = types.SimpleNamespace(save_pretrained=lambda p: None)
    gen = torch.Generator()
    path = checkpoint.save(
        tmp_path,
        checkpoint.TrainerState(step=3, data_position=12),
        tiny_model,
        tok,
        opt,
        sched,
        gen,
        keep=2,
        model_only=True,
    )
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json",
        "model",
        "trainer_state.json",
    ]  # no optimizer.pt, rng.pt
    assert checkpoint.verify(path) is None
    saved = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(1.0)
    fresh_opt = torch.optim.AdamW(tiny_model.parameters(), lr=0.1)
    fresh_sched = torch.optim.lr_scheduler.LambdaLR(fresh_opt, lambda s: 1.0)
    with caplog.at_level("WARNING", logger="grpokit.checkpoint"):
        state = checkpoint.load(path, tiny_model, fresh_opt, fresh_sched, gen)
    assert (state.step, state.data_position) == (3, 12) and "save_only_model" in caplog.text
    assert all(torch.equal(v, saved[k]) for k, v in tiny_model.state_dict().items())  # the weights are back
    assert (
        fresh_opt.state_dict()["state"] == {} and fresh_sched.last_epoch == 0
    )  # as transformers: fresh optimizer and schedule


def test_colocated_engine_gets_max_model_len(tiny_model_dir, monkeypatch):
    from grpokit.rollout.hf import SamplingParams
    from grpokit.rollout.vllm import make_colocated_engine

    built = []
    fake = types.SimpleNamespace(LLM=lambda **kw: built.append(kw) or types.SimpleNamespace(), SamplingParams=object)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for length, expected in [(1024, 1024), (None, None)]:  # None: vLLM's own default, the model's length
        cfg = to_config(GRPOConfig("o", **VLLM, vllm_max_model_length=length), num_rows=4)
        cfg.model.name_or_path = str(tiny_model_dir)
        make_colocated_engine(cfg.rollout, cfg.model, SamplingParams(), torch.device("cuda"), seed=0)
        assert built[-1]["max_model_len"] == expected and built[-1]["gpu_memory_utilization"] == 0.3


ROWS8 = [
    {"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef", "gh", "ij", "kl", "mn", "op")
]


def test_data_seed_changes_no_prompt_order_in_trl_or_grpokit(tmp_path):
    trl = pytest.importorskip("trl")
    model = make_chat_model(tmp_path / "model")
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=4,
        num_generations=4,
        use_cpu=True,
        report_to="none",
        max_steps=1,
        seed=42,
    )
    tr = trl.GRPOTrainer(
        model=str(model),
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_list(ROWS8),
    )

    def order(**kw):
        for k, v in kw.items():
            setattr(tr.args, k, v)
        return list(iter(tr._get_train_sampler(tr.train_dataset)))

    plain, with_data_seed, other_seed = order(data_seed=None), order(data_seed=7), order(seed=1, data_seed=None)
    assert plain == with_data_seed  # TRL 1.16's RepeatSampler is seeded by seed alone
    assert plain != other_seed  # (the sampler does shuffle: seed changes the order)
    # grpokit: data_seed leaves the Config, whose train.seed orders the prompts, as it is
    assert to_config(GRPOConfig("o", data_seed=7), num_rows=8) == to_config(GRPOConfig("o"), num_rows=8)


PHASE = {2: 1.0, 3: 3.0, 4: 2.0}  # the "phase" reward at the evaluations after steps 2, 3, 4: best after step 3


class Phase(TrainerCallback):
    """Sets the phase reward for the evaluation that follows each step, and keeps the weights saved at step 4."""

    value, last, table = 0.0, None, PHASE

    def on_step_end(self, args, state, control, **kw):
        Phase.value = Phase.table.get(state.global_step, 0.0)

    def on_save(self, args, state, control, model=None, **kw):
        if state.global_step == 4:
            Phase.last = {k: v.detach().clone() for k, v in model.state_dict().items()}


def phase(completions, **kw):
    return [Phase.value] * len(completions)


def short(completions, **kw):
    return [-len(c[0]["content"]) / 10 for c in completions]


def phase_trainer(mod, model, out, **kw):
    """``mod``'s (TRL's or grpokit.trl's) GRPOTrainer on 4 prompts, evaluated on 1 after every step and
    saved at every step, keeping the best by the phase reward (``Phase``), weights only; ``kw`` adds
    GRPOConfig arguments."""
    args = small_args(
        mod.GRPOConfig,
        out,
        learning_rate=0.05,
        eval_strategy="steps",
        eval_steps=1,
        save_steps=1,
        load_best_model_at_end=True,
        metric_for_best_model="rewards/phase/mean",
        save_only_model=True,
        per_device_eval_batch_size=4,
        seed=0,
        **kw,
    )
    return mod.GRPOTrainer(
        model=str(model),
        reward_funcs=[short, phase],
        args=args,
        train_dataset=Dataset.from_list(ROWS8[:4]),
        eval_dataset=Dataset.from_list(ROWS8[:1]),
        callbacks=[Phase()],
    )


@pytest.mark.parametrize("lib", ["grpokit.trl", "trl"])
def test_best_model_eval_delay_and_save_only_model_as_trl(lib, tmp_path):
    """The same script under TRL and grpokit.trl: evaluations from step 2 (eval_delay=2), the best by the
    phase reward at step 3 (values 1, 3, 2 at steps 2, 3, 4), its weights loaded at the end, and with
    save_total_limit=1 only checkpoint-3 left, holding no optimizer state (save_only_model)."""
    from safetensors.torch import load_file

    mod = importlib.import_module(lib)
    model, out = make_chat_model(tmp_path / "model"), tmp_path / "out"
    tr = phase_trainer(
        mod, model, out, max_steps=4, bf16=False, logging_steps=1, eval_delay=2, save_total_limit=1, report_to="none"
    )
    tr.train()
    s = tr.state
    assert [(e["step"], e["eval_rewards/phase/mean"]) for e in s.log_history if "eval_rewards/phase/mean" in e] == [
        (2, 1.0),
        (3, 3.0),
        (4, 2.0),
    ]
    assert (s.best_metric, s.best_global_step, s.best_model_checkpoint) == (3.0, 3, str(out / "checkpoint-3"))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [
        "checkpoint-3"
    ]  # limit 1: only the best stays at the end
    folder = (out / "checkpoint-3").resolve()
    files = {p.name for p in folder.iterdir()} | (
        {p.name for p in folder.parent.iterdir()} if lib == "grpokit.trl" else set()
    )
    assert not files & {"optimizer.pt", "rng.pt", "rng_state.pth", "scheduler.pt"}
    weights = load_file(str(folder / "model.safetensors"))
    final = tr.model.state_dict()
    assert all(torch.equal(final[k], v) for k, v in weights.items())  # the best checkpoint's weights are the model's
    assert any(not torch.equal(final[k], Phase.last[k]) for k in weights)  # ... and not those of the last step
    out.rename(tmp_path / "moved")  # a run folder moved whole: its checkpoint-N still holds the checkpoint
    assert (tmp_path / "moved" / "checkpoint-3" / "trainer_state.json").is_file()


def test_script_flags_are_accepted_and_do_eval_follows_eval_strategy_as_trl(tmp_path):
    trl = pytest.importorskip("trl")
    ours = GRPOConfig("o", do_train=True, do_predict=True, eval_strategy="steps")
    theirs = trl.GRPOConfig(
        output_dir=str(tmp_path), do_train=True, do_predict=True, eval_strategy="steps", report_to="none", use_cpu=True
    )
    assert (
        (ours.do_train, ours.do_eval, ours.do_predict)
        == (theirs.do_train, theirs.do_eval, theirs.do_predict)
        == (True, True, True)
    )
    assert GRPOConfig("o").do_eval is False
    assert to_config(ours, num_rows=4) == to_config(
        GRPOConfig("o", eval_strategy="steps"), num_rows=4
    )  # flags change nothing


def test_log_level_sets_transformers_verbosity_on_main_and_replicas():
    from transformers.utils import logging as hf_logging

    from grpokit.trl.contract.surface import set_log_level

    before = hf_logging.get_verbosity()
    try:
        hf_logging.set_verbosity(hf_logging.ERROR)
        set_log_level(GRPOConfig(log_level="info"), main=True)
        assert hf_logging.get_verbosity() == 20  # logging.INFO
        set_log_level(GRPOConfig(log_level="info"), main=False)  # replicas: log_level_replica, "warning" by default
        assert hf_logging.get_verbosity() == 30
        set_log_level(GRPOConfig(log_level_replica="passive"), main=False)  # passive: left as it was
        assert hf_logging.get_verbosity() == 30
    finally:
        hf_logging.set_verbosity(before)
    with pytest.raises(ConfigError, match="log_level='loud' is not valid; use one of passive, detail, debug"):
        GRPOConfig(log_level="loud")


def test_project_names_the_trackio_project(monkeypatch):
    from grpokit.record.recorder import make_recorder

    assert to_config(GRPOConfig("o", report_to="trackio", project="p"), num_rows=4).record.project == "p"
    assert to_config(GRPOConfig("o", report_to="trackio"), num_rows=4).record.project == "huggingface"  # TRL's default
    assert to_config(GRPOConfig("o", project="p"), num_rows=4).record.project == ""  # no trackio: grpokit's own name
    inits = []
    fake = types.SimpleNamespace(init=lambda **kw: inits.append(kw), log=lambda *a, **k: None, finish=lambda: None)
    monkeypatch.setitem(sys.modules, "trackio", fake)
    make_recorder(None, ["trackio"], 1, {}, project="p", run_name="r").close()
    assert (inits[0]["project"], inits[0]["name"]) == ("p", "r")


# rounds of 1 TRL step begin after 0..5 completed steps: multiples of 2 are 0, 2, 4 (3 empties); rounds of 2 cover
# steps {0,1} {2,3} {4,5}: every 2 hits each (3), every 3 hits {0,1} and {2,3} but not {4,5} (2); None: never
@pytest.mark.parametrize("every, per_round, expected", [(2, 1, 3), (2, 2, 3), (3, 2, 2), (None, 1, 0)])
def test_torch_empty_cache_steps_empties_before_steps_whose_count_is_a_multiple(
    monkeypatch, every, per_round, expected
):
    from grpokit.trl.bridge import StepBridge

    calls = []
    args = GRPOConfig("o", torch_empty_cache_steps=every, max_steps=6)  # built on the CPU it is (accelerate looks)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    bridge = StepBridge(args, [], 6, dict, lambda p, s: None, {})
    bridge.per_round = per_round
    for begun in range(0, 6, per_round):  # completed TRL steps when each round begins
        bridge.state.global_step = begun
        bridge.on_step_begin(None, None, None)
    assert len(calls) == expected


def test_ddp_timeout_reaches_the_process_group(monkeypatch):
    import datetime

    import torch.distributed as dist

    from grpokit.train import distributed

    def timeout(processes, joined=False, **kw):  # the gate and the mapping read the GRPOConfig's world_size
        with monkeypatch.context() as m:
            m.setattr(GRPOConfig, "world_size", property(lambda self: processes))
            m.setattr(dist, "is_initialized", lambda: joined)
            return to_config(GRPOConfig("o", **kw), num_rows=4, world_size=processes).train.dist_timeout_s

    assert timeout(2) == 1800  # transformers' default
    assert timeout(2, ddp_timeout=7200) == 7200
    assert timeout(1, ddp_timeout=0) == 0  # one process: unread
    # a group joined already (by the GRPOConfig under torchrun, with ddp_timeout: transformers'): grpokit's setup
    # joins nothing, so nothing is mapped. Before: 7200, which setup warned "changes nothing" on every such run
    assert timeout(2, joined=True, ddp_timeout=7200) == 0
    joined = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: joined.append(kw))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    distributed.setup(timeout_s=7200)
    distributed.setup()  # 0: torch's own default, no timeout passed
    assert joined == [{"backend": "gloo", "timeout": datetime.timedelta(seconds=7200)}, {"backend": "gloo"}]
    monkeypatch.setattr(GRPOConfig, "world_size", property(lambda self: 2))
    with pytest.raises(ConfigError, match=r"ddp_timeout=0 is not valid.*\(read because world_size=2\)"):
        GRPOConfig(ddp_timeout=0)


def test_a_resumed_run_keeps_its_best_model_record_and_resumes_a_save_only_model_checkpoint(
    tmp_path, monkeypatch, caplog
):
    """Phase rewards 1, 3 at steps 1, 2, then 2 at step 3 after a resume: the best stays step 2's 3.0,
    the record carried over from checkpoint-2's trainer_state.json, and its weights are loaded at the end."""
    from safetensors.torch import load_file

    import grpokit.trl as grpokit_trl

    monkeypatch.setattr(Phase, "table", {1: 1.0, 2: 3.0, 3: 2.0})
    model, out = make_chat_model(tmp_path / "model"), tmp_path / "out"

    def run(max_steps, **kw):
        tr = phase_trainer(grpokit_trl, model, out, max_steps=max_steps)
        tr.train(**kw)
        return tr

    first = run(2)
    assert (first.state.best_metric, first.state.best_global_step) == (3.0, 2)
    with caplog.at_level("WARNING", logger="grpokit.checkpoint"):
        second = run(3, resume_from_checkpoint=True)
    assert "save_only_model" in caplog.text and second.state.global_step == 3
    s = second.state
    assert (s.best_metric, s.best_global_step, s.best_model_checkpoint) == (3.0, 2, str(out / "checkpoint-2"))
    weights = load_file(str(out / "checkpoint-2" / "model.safetensors"))
    assert all(torch.equal(second.model.state_dict()[k], v) for k, v in weights.items())


def test_use_cache_and_average_tokens_across_devices_change_nothing_as_in_trl():
    trl = pytest.importorskip("trl")
    # TRL only sets model.config.use_cache: a KV cache or not while sampling changes speed, not a number;
    # grpokit's Config is the same either way
    assert "use_cache" in {f.name for f in __import__("dataclasses").fields(trl.GRPOConfig)}
    assert to_config(GRPOConfig("o", use_cache=True), num_rows=4) == to_config(GRPOConfig("o"), num_rows=4)
    # average_tokens_across_devices: TRL's GRPO loss divides by its own gathered counts, so it changes nothing there
    assert to_config(GRPOConfig("o", average_tokens_across_devices=False), num_rows=4) == to_config(
        GRPOConfig("o"), num_rows=4
    )


@pytest.mark.parametrize("lib", ["grpokit.trl", "trl"])
def test_token_counts_in_every_entry_and_the_last_step_evaluated_as_trl(lib, tmp_path):
    """eval_steps=2 with max_steps=3: transformers evaluates at 2 and, being the last, at 3; with
    include_num_input_tokens_seen every entry carries the running token count (TRL's num_tokens) and the
    training entry also train_runtime and train_tokens_per_second, the final entry not the latter."""
    mod = importlib.import_module(lib)
    args = small_args(
        mod.GRPOConfig,
        tmp_path / "out",
        max_steps=3,
        bf16=False,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=4,
        seed=0,
        include_num_input_tokens_seen=True,
        report_to="none",
        save_strategy="no",
    )
    tr = mod.GRPOTrainer(
        model=str(make_chat_model(tmp_path / "model")),
        reward_funcs=[short],
        args=args,
        train_dataset=Dataset.from_list(ROWS8[:4]),
        eval_dataset=Dataset.from_list(ROWS8[:1]),
    )
    tr.train()
    h = tr.state.log_history
    assert [e["step"] for e in h if "eval_loss" in e] == [2, 3]
    assert all("num_input_tokens_seen" in e for e in h)
    train = [e for e in h if "loss" in e]
    assert len(train) == 1 and train[0]["num_input_tokens_seen"] == train[0]["num_tokens"]
    assert {"train_runtime", "train_tokens_per_second"} <= set(train[0])
    assert "train_tokens_per_second" not in h[-1] and "train_loss" in h[-1]


def test_activation_checkpointing_is_transformers_5s_name_and_wins_when_set(tmp_path):
    trl = pytest.importorskip("trl")
    if not hasattr(trl.GRPOConfig, "activation_checkpointing"):
        pytest.skip("this transformers has no activation_checkpointing (5.17 has gradient_checkpointing only)")
    # (activation_checkpointing, gradient_checkpointing) -> checkpointing: the new name decides when set, else the old
    cases = [(None, True, True), (None, False, False), (False, True, False), (True, False, True)]
    for new, old, expected in cases:
        theirs = trl.GRPOConfig(
            output_dir=str(tmp_path),
            activation_checkpointing=new,
            gradient_checkpointing=old,
            report_to="none",
            use_cpu=True,
        )
        assert bool(theirs.activation_checkpointing) is expected  # what transformers' Trainer reads
        ours = to_config(GRPOConfig("o", activation_checkpointing=new, gradient_checkpointing=old), num_rows=4)
        assert ours.model.gradient_checkpointing is expected, (new, old)
    with pytest.raises(ConfigError, match=r"activation_checkpointing_kwargs=\{'use_reentrant': True\}"):
        to_config(GRPOConfig("o", activation_checkpointing_kwargs={"use_reentrant": True}), num_rows=4)
    to_config(GRPOConfig("o", activation_checkpointing_kwargs={"use_reentrant": False}), num_rows=4)


def test_hub_revision_is_the_branch_of_every_push_to_a_fake_hub(tmp_path, monkeypatch):
    from grpokit.trl import GRPOTrainer
    from helpers.trl_models import FakeHub

    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        args = small_args(
            GRPOConfig,
            tmp_path / "run",
            max_steps=2,
            push_to_hub=True,
            hub_model_id="me/tiny",
            hub_revision="dev",
            hub_always_push=True,
            save_steps=1,
        )
        GRPOTrainer(
            str(make_chat_model(tmp_path / "model")),
            reward_funcs=[short],
            args=args,
            train_dataset=Dataset.from_list(ROWS8[:4]),
        ).train()
    # every_save: checkpoints at steps 1 and 2, then the final model, all on branch dev
    assert [m for _, m in hub.commits] == [
        "Training in progress, step 1",
        "Training in progress, step 2",
        "End of training",
    ]
    assert hub.revisions == ["dev", "dev", "dev"]


@pytest.mark.parametrize("ignore", [False, True])
def test_ignore_data_skip_resumes_at_the_start_of_the_epoch(tmp_path, ignore):
    """4 prompts, 1 prompt a step (4 completions = G): steps 1-3 take the first 3 of epoch 0's order.
    A resume for step 4 takes the 4th (the data skipped to where it was), or with ignore_data_skip the
    1st again (epoch 0 from its start, as transformers counts whole epochs only)."""
    from grpokit.trl import GRPOTrainer

    seen = []

    def record(prompts, completions, **kw):
        seen.append(prompts[0][0]["content"])
        return [0.0] * len(completions)

    out, model = tmp_path / "out", make_chat_model(tmp_path / "model")

    def run(max_steps, **kw):
        args = small_args(
            GRPOConfig,
            out,
            max_steps=max_steps,
            max_completion_length=2,
            save_steps=1,
            ignore_data_skip=ignore,
        )
        GRPOTrainer(str(model), reward_funcs=[record], args=args, train_dataset=Dataset.from_list(ROWS8[:4])).train(
            **kw
        )

    run(3)
    run(4, resume_from_checkpoint=True)
    first_three, fourth = seen[:3], seen[3]
    assert len(set(first_three)) == 3
    if ignore:
        assert fourth == first_three[0]
    else:
        assert fourth not in first_three
