"""Colocated vLLM with tensor parallelism (rollout.vllm_tensor_parallel_size > 1) without vLLM.

1. The group logic worked out by hand: which ranks share an engine, the group's merged request, and
   which outputs each rank keeps; the engine with a scripted ``gather`` standing for the other ranks.
2. Real ``torch.distributed`` processes (gloo on 127.0.0.1) with a fake ``vllm`` module whose LLM
   records how it was built and what it was asked: each rank gets exactly its own completions, a rank
   done sampling keeps its group company, and a trainer step runs with the ranks sampling unevenly.
3. The config's and the TRL layer's refusals, one sentence each.
"""

from __future__ import annotations

import json
import sys
import types
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpokit.config import Config, ConfigError
from grpokit.rollout.hf import SamplingParams
from grpokit.rollout.vllm import VLLMColocated
from grpokit.rollout.vllm_tp import Request, TensorParallelEngine, merged_inputs, own_outputs, tp_groups
from grpokit.train import engines, world_check
from grpokit.train.distributed import DistContext, rank_seed
from grpokit.validation import validate
from helpers.net import free_port


def completion(index, ids):
    steps = [{t: types.SimpleNamespace(logprob=-0.5)} for t in ids]
    return types.SimpleNamespace(index=index, token_ids=ids, logprobs=steps, finish_reason="stop", stop_reason=None)


class FakeLLM:
    """vllm.LLM as grpokit uses it. Sample g of prompt p is [p[0] % 20 + 3, g + 3, 1] (1 = eos), logprob
    -0.5 per token; samples come back in reverse index order (vLLM does not promise an order)."""

    built: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.loaded = kwargs, [], None
        FakeLLM.built.append(self)

    def generate(self, prompts, sp, use_tqdm=False):
        sps = sp if isinstance(sp, list) else [sp] * len(prompts)
        assert len(sps) == len(prompts)  # vLLM: one SamplingParams per prompt, or one for all
        self.calls.append(
            [
                "generate",
                [p["prompt_token_ids"] for p in prompts],
                [s.n for s in sps],
                [p.get("multi_modal_data", {}).get("image") for p in prompts],
            ]
        )
        return [
            types.SimpleNamespace(
                outputs=[completion(g, [p["prompt_token_ids"][0] % 20 + 3, g + 3, 1]) for g in reversed(range(s.n))]
            )
            for p, s in zip(prompts, sps)
        ]

    def sleep(self, level):
        self.calls.append(["sleep", level])

    def wake_up(self, tags=None):
        self.calls.append(["wake_up", list(tags or ())])

    def apply_model(self, fn):
        self.calls.append(["apply_model"])
        return fn(types.SimpleNamespace(load_weights=lambda items: setattr(self, "loaded", dict(items))))

    def reset_prefix_cache(self):
        self.calls.append(["reset_prefix_cache"])


class FakeSP:
    def __init__(self, **kw):
        self.__dict__.update(kw)


P3 = SamplingParams(max_new_tokens=3)
OWN = object()  # in a scripted gather: this rank's own object


def scripted(*rounds):
    """A ``gather`` whose k-th call returns ``rounds[k]``, this rank's object where OWN stands."""
    it = iter(rounds)
    return lambda obj: [obj if x is OWN else x for x in next(it)]


def engine(gather, member, llm=None):
    return TensorParallelEngine(VLLMColocated(llm or FakeLLM(), FakeSP, P3, sleep=True), gather, member)


# ---------------------------------------------------------------- 1. by hand


def test_groups_are_consecutive_ranks():
    assert tp_groups(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert (
        tp_groups(4, 2) == [[0, 1], [2, 3]] and tp_groups(4, 4) == [[0, 1, 2, 3]] and tp_groups(3, 1) == [[0], [1], [2]]
    )
    with pytest.raises(
        ConfigError, match=r"rollout.vllm_tensor_parallel_size=2 must divide the 3 ranks; use one of: 1, 3$"
    ):
        tp_groups(3, 2)


def test_merged_request_and_each_members_share():
    # member 0 asks 2 prompts (G=2), member 1 is done (None), member 2 asks 1 prompt with an image (G=1)
    q0, q2 = Request([[3, 4], [5]], None, 2, P3), Request([[6]], [["img"]], 1, P3)
    ids, images, settings = merged_inputs([q0, None, q2])
    assert ids == [[3, 4], [5], [6]]  # member order; None adds nothing
    assert images == [[], [], ["img"]]  # a prompt without images: an empty list (llm_inputs adds no multi_modal_data)
    assert [n for n, _ in settings] == [2, 2, 1]
    assert merged_inputs([q0])[1] is None  # no image anywhere: plain token prompts
    outs = ["o0", "o1", "o2"]  # one output per merged prompt
    assert own_outputs(outs, [q0, None, q2], 0) == ["o0", "o1"]
    assert own_outputs(outs, [q0, None, q2], 2) == ["o2"]  # starts after member 0's 2 prompts


def test_rank_1_of_4_with_tp_2_keeps_its_own_rows_in_order():
    # ranks 0-3, T = 2: rank 1 is member 1 of group [0, 1]; rank 0 asks [[10, 11], [12]] in the same call
    llm = FakeLLM()
    peer = Request([[10, 11], [12]], None, 2, P3)
    eng = engine(scripted([peer, OWN], [None, OWN]), member=1, llm=llm)
    ro = eng.generate([[20], [21, 22], [23]], 2)
    # the group's engine sampled all 5 prompts at once, rank 0's first
    assert llm.calls[0][1:] == [[[10, 11], [12], [20], [21, 22], [23]], [2] * 5, [None] * 5]
    assert ro.prompt_ids == [[20], [21, 22], [23]] and ro.group_size == 2
    # sample g of prompt p: [p[0] % 20 + 3, g + 3, 1]: 20 -> 3, 21 -> 4, 23 -> 6 (rank 0's would start 13, 15); by index
    assert ro.completion_ids == [[3, 3, 1], [3, 4, 1], [4, 3, 1], [4, 4, 1], [6, 3, 1], [6, 4, 1]]
    assert ro.sampling_logprobs == [[-0.5] * 3] * 6 and ro.finish_reasons == ["eos"] * 6
    assert llm.calls[1:] == [["sleep", 2]]  # sleep=True: the group was done (second gather: rank 0 None)


def test_members_on_different_turns_share_one_call_with_their_own_settings():
    # rank 0 is on a later episode turn (1 sample per context, a stop string); rank 1 on turn 0 (G = 2)
    llm = FakeLLM()
    turn = SamplingParams(max_new_tokens=3, stop=["</tool>"])
    ro = engine(scripted([Request([[7, 1, 2]], None, 1, turn), OWN]), member=1, llm=llm).generate([[5]], 2, sleep=False)
    assert llm.calls == [["generate", [[7, 1, 2], [5]], [1, 2], [None, None]]]
    assert ro.completion_ids == [[8, 3, 1], [8, 4, 1]]  # 5 % 20 + 3 = 8


def test_a_member_done_sampling_joins_the_groups_calls_and_sleeps_only_for_the_update():
    llm = FakeLLM()
    eng = engine(scripted([Request([[9]], [["cat"]], 1, P3), None], [None, None], [None, None]), member=1, llm=llm)
    eng.finish_sampling()  # round 1: rank 0 still samples (an image prompt); round 2: everyone is done
    assert llm.calls == [["generate", [[9]], [1], [["cat"]]]]
    eng.sleep_for_update()  # the step's sampling is over
    assert llm.calls[1:] == [["sleep", 2]]
    eng.finish_sampling()  # again (no prompt this round): one all-None round, and the engine is already asleep
    eng.sleep_for_update()
    assert len(llm.calls) == 2


def test_requests_without_prompts_make_no_engine_call():
    llm = FakeLLM()
    ro = engine(scripted([Request([], None, 2, P3), OWN]), member=1, llm=llm).generate([], 2, sleep=False)
    assert llm.calls == [] and ro.num_sequences == 0


def test_weights_go_to_every_ranks_engine_as_before(tiny_model):
    llm = FakeLLM()
    eng = engine(scripted(), member=0, llm=llm)
    assert eng.after_update(tiny_model, 3) == {"rollout/weight_sync_step": 3.0}
    assert llm.calls == [["apply_model"], ["reset_prefix_cache"]]  # awake: no wake_up
    assert set(llm.loaded) == set(tiny_model.state_dict())


# ---------------------------------------------------------------- 2. real processes


def _tp_config(model_dir: str) -> Config:
    cfg = Config()
    cfg.model.name_or_path = model_dir
    cfg.rollout.backend, cfg.rollout.vllm_tensor_parallel_size = "vllm", 2
    return cfg


RANK_PROMPTS = {0: [[3, 4], [5]], 1: [[6], [7, 8], [9]], 2: [[10]], 3: [[11], [12]]}


def _engine_part(rank: int, world: int, model_dir: str, tmp: str) -> dict:
    """Each rank samples its prompts (G = 2); then rank 0 samples a second turn alone while rank 1 is
    done; the others are done at once. Then every rank sleeps and syncs weights."""
    from helpers.models import tiny_llama

    cfg = _tp_config(model_dir)
    eng = engines.colocated_engine(cfg, P3, torch.device("cuda"), DistContext(rank, world, rank))
    ro = eng.generate(RANK_PROMPTS[rank], 2, sleep=False)
    second = eng.generate([[11]], 1, sleep=False).completion_ids if rank == 0 else None
    eng.finish_sampling()
    eng.sleep_for_update()  # what the trainer does once the step's sampling is over
    eng.after_update(tiny_llama(), 1)
    llm = FakeLLM.built[-1]
    return {
        "kwargs": {k: llm.kwargs[k] for k in ("tensor_parallel_size", "distributed_executor_backend", "seed")},
        "prompts": ro.prompt_ids,
        "completions": ro.completion_ids,
        "second": second,
        "calls": llm.calls,
        "env": [int(__import__("os").environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")],
    }


def by_rank(prompts, completions, **kwargs):
    """Rank 0's groups score 0 (hard for GFPO adaptive), the other ranks' 1 (easy)."""
    return [0.0 if dist.get_rank() == 0 else 1.0 for _ in completions]


def _trainer_part(rank: int, world: int, model_dir: str, tmp: str) -> dict:
    """One trainer step with GFPO adaptive: only rank 0 samples the extra completions, and rank 1,
    with no prompt, keeps its group's engine company (the loop calls finish_sampling anyway)."""
    from grpokit.train import Trainer
    from helpers.runs import ROWS, tiny_cfg

    cfg = tiny_cfg(
        model_dir,
        Path(tmp) / "run",
        **{
            "train.steps": 1,
            "train.prompts_per_step": 4,
            "rollout.max_new_tokens": 3,
            "rollout.sample_group_size": 6,
            "rollout.gfpo_adaptive": True,
        },
    )
    cfg.data.dataset = ""
    tr = Trainer(cfg, reward_funcs=[by_rank], train_rows=ROWS, quiet=True)
    tr.cfg.rollout.backend, tr.cfg.rollout.vllm_tensor_parallel_size = "vllm", 2  # as if built on GPUs
    tr.use_engine(engines.colocated_engine(tr.cfg, tr.params, torch.device("cuda"), tr.dist))
    m = tr.train_step()
    llm = FakeLLM.built[-1]
    return {
        "calls": [c[:3] for c in llm.calls],
        "hard": m["gfpo/hard_prompts"],
        "synced": m["rollout/weight_sync_step"],
    }


PARTS = {"engine": _engine_part, "trainer": _trainer_part}


def _worker(rank, world, port, model_dir, tmp, part):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )  # a group out of step fails the test instead of hanging it
    sys.modules["vllm"] = types.SimpleNamespace(LLM=FakeLLM, SamplingParams=FakeSP)
    try:
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(PARTS[part](rank, world, model_dir, tmp)))
    finally:
        dist.destroy_process_group()


def spawn(world: int, part: str, model_dir, tmp: Path) -> list[dict]:
    mp.spawn(_worker, args=(world, free_port(), str(model_dir), str(tmp), part), nprocs=world, join=True)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_gets_exactly_its_own_completions(tiny_model_dir, tmp_path, world):
    out = spawn(world, "engine", tiny_model_dir, tmp_path)
    seed = Config().train.seed
    for rank, r in enumerate(out):
        group = rank // 2
        assert r["kwargs"] == {
            "tensor_parallel_size": 2,
            "distributed_executor_backend": "external_launcher",
            "seed": rank_seed(seed, group),
        }  # the same seed within a group
        assert r["env"] == [rank, rank, world]  # what vLLM's external launcher reads
        mine = RANK_PROMPTS[rank]
        assert r["prompts"] == mine
        assert r["completions"] == [[p[0] % 20 + 3, g + 3, 1] for p in mine for g in range(2)]
        # every engine of a group sampled the group's prompts, in rank order, and nothing of another group
        group_prompts = RANK_PROMPTS[2 * group] + RANK_PROMPTS[2 * group + 1]
        assert r["calls"][0] == ["generate", group_prompts, [2] * len(group_prompts), [None] * len(group_prompts)]
        if group == 0:  # rank 0's second turn: rank 1, already done, joined it
            assert r["calls"][1] == ["generate", [[11]], [1], [None]]
        rest = r["calls"][2:] if group == 0 else r["calls"][1:]
        assert rest == [
            ["sleep", 2],
            ["wake_up", ["weights"]],
            ["apply_model"],
            ["wake_up", ["kv_cache"]],
            ["reset_prefix_cache"],
        ]
    assert out[0]["second"] == [[14, 3, 1]]  # 11 % 20 + 3 = 14
    assert out[0]["kwargs"]["seed"] == seed  # group 0 keeps the plain seed
    if world == 4:
        assert out[2]["kwargs"]["seed"] != seed  # another group, another seed


@pytest.mark.slow
def test_a_trainer_step_with_ranks_sampling_unevenly(tiny_model_dir, tmp_path):
    r0, r1 = spawn(2, "trainer", tiny_model_dir, tmp_path)
    # round 1: each rank's 2 prompts x G=4 in one call; round 2 (GFPO adaptive): rank 0's 2 hard prompts x 2 more,
    # a call rank 1 made too although it had nothing to sample
    for r in (r0, r1):
        gens = [c for c in r["calls"] if c[0] == "generate"]
        assert [len(c[1]) for c in gens] == [4, 2] and gens[0][2] == [4] * 4 and gens[1][2] == [2] * 2
        assert gens[1][1] == gens[0][1][:2] and r["synced"] == 1.0  # the extra samples: rank 0's prompts
    assert r0["calls"] == r1["calls"]  # the two shards saw the same engine calls
    assert r0["hard"] == 2.0  # the sum over ranks: rank 0's 2 prompts


# ---------------------------------------------------------------- 3. refusals


@pytest.mark.parametrize(
    "over, words",
    [
        (
            {"vllm_tensor_parallel_size": 0},
            "rollout.vllm_tensor_parallel_size=0 must be an integer >= 1 (1: one whole engine per rank)",
        ),
        ({"vllm_tensor_parallel_size": 1.5}, "rollout.vllm_tensor_parallel_size=1.5 must be an integer >= 1"),
        (
            {"vllm_tensor_parallel_size": 2, "backend": "hf"},
            "rollout.vllm_tensor_parallel_size=2 shards the colocated engine of rollout.backend=vllm, "
            "but rollout.backend=hf; set it to 1",
        ),
        (
            {"vllm_tensor_parallel_size": 2, "backend": "vllm_server"},
            "but rollout.backend=vllm_server; set it to 1 (a vLLM server takes",
        ),
    ],
)
def test_config_refuses_a_size_that_cannot_work_in_one_sentence(over, words):
    cfg = Config()
    for k, v in over.items():
        setattr(cfg.rollout, k, v)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert words in str(e.value) and str(e.value).count(". ") == 0


def test_the_size_must_divide_the_ranks():
    cfg = Config()
    cfg.rollout.backend, cfg.rollout.vllm_tensor_parallel_size, cfg.train.prompts_per_step = "vllm", 2, 12
    validate(cfg)  # the field alone is fine; the number of ranks is known when the run starts
    world_check.check_world(cfg, DistContext(0, 4))  # 4 ranks: groups [0 1] [2 3]
    for world, valid in [(1, "1"), (3, "1, 3"), (6, "1, 2, 3, 6")]:
        if world == 6:
            cfg.rollout.vllm_tensor_parallel_size = 4
        with pytest.raises(ConfigError) as e:
            world_check.check_world(cfg, DistContext(0, world))
        tp = cfg.rollout.vllm_tensor_parallel_size
        assert str(e.value) == (
            f"rollout.vllm_tensor_parallel_size={tp} must divide the {world} ranks (one engine per group "
            f"of {tp} consecutive ranks); use one of: {valid}"
        )
