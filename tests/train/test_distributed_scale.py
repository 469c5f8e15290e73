"""Several ranks beyond the plain data-parallel step: FSDP resume, sampling in step under FSDP,
DAPO dynamic sampling and the entropy quantile over the global batch.

Each ``slow`` test spawns 2 gloo processes on CPU (a FileStore rendezvous, no network).
"""

import copy
import json
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpokit.algo.masks import entropy_token_mask
from grpokit.train import Trainer
from helpers.distributed import scripted_generate
from helpers.runs import ROWS, tiny_cfg

VOLATILE = ("time/", "tokens_per_second", "rollout/tokens_per_second")


def length_unless_digits(prompts, completions, **kwargs):
    """Flat (0.0) for prompts with a digit, so DAPO drops those groups; completion length otherwise."""
    return [0.0 if any(ch.isdigit() for ch in p) else len(c) / 6 for p, c in zip(prompts, completions)]


def trainer(model_dir, out, reward, resume=None, **over):
    cfg = tiny_cfg(model_dir, out, **over)
    cfg.data.dataset = ""  # rows are passed directly
    return Trainer(cfg, reward_funcs=[reward], train_rows=ROWS, eval_rows=ROWS[:2], resume=resume, quiet=True)


def weights_of(tr):
    return {n: p.detach().clone() for n, p in tr.model.named_parameters()}


def step_lines(run):
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in l.items() if not k.startswith(VOLATILE)} for l in lines if "reward" in l]


def _init(rank, world, init_file):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )  # a collective mismatch fails instead of hanging


# ------------------------------------------------------------------ FSDP: sampling in step, resume


class Stop(Exception):
    pass


def _fsdp_worker(rank, world, init_file, model_dir, out):
    _init(rank, world, init_file)
    try:
        _lockstep_sampling_matches_unsharded(rank, model_dir)
        _fsdp_resume(rank, model_dir, out)
    finally:
        dist.destroy_process_group()


def _lockstep_sampling_matches_unsharded(rank, model_dir):
    """Rank 0 samples 2 tokens, rank 1 samples 7: rank 0 must keep stepping while rank 1 decodes."""
    from transformers import AutoModelForCausalLM

    from grpokit.rollout.hf import SamplingParams, generate
    from grpokit.rollout.lockstep import lockstep
    from grpokit.train.distributed import fully_shard_model, setup

    ctx = setup(fsdp=True)
    plain = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    sharded = fully_shard_model(copy.deepcopy(plain))
    params = SamplingParams(max_new_tokens=2 if rank == 0 else 7)
    prompts = [[5, 6, 7], [8, 9]]
    kw = dict(eos_token_ids={10_000}, pad_token_id=0)  # no EOS: each rank runs exactly max_new_tokens steps
    want = generate(plain, prompts, 2, params, generator=torch.Generator().manual_seed(rank), **kw)
    with lockstep(sharded, ctx.any_rank) as m:
        got = generate(m, prompts, 2, params, generator=torch.Generator().manual_seed(rank), **kw)
    assert got.completion_ids == want.completion_ids
    for a, b in zip(got.sampling_logprobs, want.sampling_logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    # prefill + (max_new_tokens - 1) decode steps of its own; rank 0 then idles through rank 1's 5 extra
    assert (m.real_forwards, m.idle_forwards) == ((2, 5) if rank == 0 else (7, 0))


def _fsdp_resume(rank, model_dir, out):
    over = {
        "train.fsdp": True,
        "train.steps": 4,
        "train.save_every": 2,
        "train.prompts_per_step": 4,
        "train.micro_batch_size": 4,
        "train.deterministic": True,
        "algo.beta": 0.04,
        "data.eval_size": 0,
    }
    full = trainer(model_dir, out / "full", length_unless_digits, **over)
    full.train()

    cut = trainer(model_dir, out / "cut", length_unless_digits, **over)
    save = cut.save

    def save_then_stop(*args):  # an interruption right after the step-2 checkpoint, on every rank
        path = save(*args)
        if cut.step == 2:
            raise Stop
        return path

    cut.save = save_then_stop
    with pytest.raises(Stop):
        cut.train()
    resumed = trainer(model_dir, out / "cut", length_unless_digits, resume=out / "cut", **over)
    assert resumed.step == 2 and len(resumed.optimizer.state) > 0  # every rank holds its optimizer shard
    resumed.train()
    torch.save({"full": full.model.state_dict(), "resumed": resumed.model.state_dict()}, out / f"rank{rank}.pt")


@pytest.mark.slow
def test_fsdp_samples_in_step_and_resumes_bit_exactly(tiny_model_dir, tmp_path):
    mp.spawn(_fsdp_worker, args=(2, str(tmp_path / "init"), str(tiny_model_dir), tmp_path), nprocs=2, join=True)
    from safetensors.torch import load_file

    for r in range(2):  # each rank's shards: resumed == uninterrupted, bit for bit
        states = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        for n, p in states["full"].items():
            assert torch.equal(p.to_local(), states["resumed"][n].to_local()), (r, n)
    a = load_file(str(tmp_path / "full" / "checkpoints" / "step-000004" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "checkpoints" / "step-000004" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert step_lines(tmp_path / "full") == step_lines(tmp_path / "cut")  # loss, grad_norm ... of all 4 steps
    opt = torch.load(tmp_path / "cut" / "checkpoints" / "step-000004" / "optimizer.pt", weights_only=False)
    assert "model.layers.0.mlp.up_proj.weight" in opt["optimizer"]["state"]  # full state, keyed by name


# ------------------------------------------------------------------ DAPO and entropy tokens over ranks


OVER = {
    "train.prompts_per_step": 4,
    "train.steps": 2,
    "algo.aggregation": "token-mean",
    "algo.beta": 0.04,
    "data.eval_size": 0,
    "train.deterministic": True,
    "train.micro_batch_size": 4,
    "algo.dynamic_sampling": True,
    "algo.entropy_top_fraction": 0.5,
    "rollout.sample_group_size": 6,
    "rollout.gfpo_adaptive": True,  # GFPO: extra samples for hard prompts
    "optim.adam_eps": 1e-4,
}  # keeps Adam from amplifying float noise in near-zero gradients (test_distributed.py)


def run_scripted(model_dir, out, over):
    import grpokit.rollout.engine as train_mod  # the hf engine samples with its module's generate

    real, train_mod.generate = train_mod.generate, scripted_generate
    try:
        tr = trainer(model_dir, out, length_unless_digits, **over)
        tr.train()
    finally:
        train_mod.generate = real
    return weights_of(tr)


def _dapo_worker(rank, world, init_file, model_dir, out):
    _init(rank, world, init_file)
    try:
        run_scripted(model_dir, out, {**OVER, "train.fsdp": True})  # rank 0 writes the full final checkpoint
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_dapo_gfpo_and_entropy_tokens_on_two_ranks_equal_one_process(tiny_model_dir, tmp_path):
    """With sampling scripted per prompt, two FSDP ranks keep the same groups, completions and tokens
    as one process: DAPO rounds stop on the global count, GFPO's extra sampling call is made on
    every rank (also one without hard prompts), the entropy quantile is global."""
    mp.spawn(_dapo_worker, args=(2, str(tmp_path / "init"), str(tiny_model_dir), tmp_path / "two"), nprocs=2, join=True)
    from safetensors.torch import load_file

    two = load_file(str(tmp_path / "two" / "checkpoints" / "step-000002" / "model" / "model.safetensors"))
    one = run_scripted(tiny_model_dir, tmp_path / "one", OVER)
    for n in one:
        assert torch.allclose(one[n], two[n], atol=1e-6, rtol=1e-5), (
            n,
            (one[n] - two[n]).abs().max().item(),
        )  # summation order
    m1, m2 = step_lines(tmp_path / "one"), step_lines(tmp_path / "two")
    assert any(m["dynamic_sampling/dropped_groups"] > 0 for m in m1)  # the digit prompts were dropped
    for a, b in zip(m1, m2):
        for key in (
            "dynamic_sampling/rounds",
            "dynamic_sampling/dropped_groups",
            "dynamic_sampling/kept_groups",
            "dynamic_sampling/sampled_prompts",
            "dynamic_sampling/flat_groups_trained",
            "gfpo/hard_prompts",
        ):
            assert a[key] == b[key], key  # global counts, not one rank's
        for key in ("loss", "grad_norm", "kl", "advantages/std"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


def test_entropy_quantile_over_a_pool_selects_what_the_whole_batch_selects():
    # Two "ranks" hold one row each. All six entropies sorted: 0.1 0.2 0.3 0.5 0.7 0.9; the 0.5
    # quantile sits halfway between 0.3 and 0.5, at 0.4, so the whole batch keeps 0.9, 0.5, 0.7.
    ent = torch.tensor([[0.1, 0.9, 0.5], [0.3, 0.7, 0.2]])
    mask = torch.ones(2, 3)
    whole = entropy_token_mask(ent, mask, 0.5)
    assert whole.tolist() == [[0, 1, 1], [0, 1, 0]]
    # Alone, row 1's median is 0.3, so it would also keep its 0.3: 4 tokens instead of 3.
    assert entropy_token_mask(ent[1:], mask[1:], 0.5).tolist() == [[1, 1, 0]]
    pool = ent.flatten()  # what gather_varlen assembles from both ranks
    halves = [entropy_token_mask(ent[r : r + 1], mask[r : r + 1], 0.5, pool=pool) for r in range(2)]
    assert torch.cat(halves).tolist() == whole.tolist()
