"""``grpokit eval``: pass@k, maj@k and mean@k of a model or checkpoint on a dataset.

For every prompt, n completions are sampled (``--samples``, default the largest k) and graded by
one function: ``--reward`` when given, else the task's verifier, else the run's first reward
function. A completion is correct when it earns that function's full reward (>= 1 - 1e-6). The
estimators are in ``grpokit.record.passk``. maj@k (self-consistency, Wang et al. 2022) votes on the
answer that function reads, equivalent answers pooled (``eval_votes``): the samples it gave full reward
are one vote, for the gold; the others vote with the answer it reads (math_accuracy's final answer,
grpokit.rewards.answers.final_answer, keyed by value, so 0.5, 1/2 and \\dfrac12 are one vote; the
arithmetic task's first <answer> tag); a sample that left its answer slot blank casts no vote; ties go
to the answer seen first. A grader that reads no one answer (code tests, box IoU) has no maj@k (null,
"-" in the table); ``maj_votes_on`` says what was voted on. k > 1 needs sampling: at ``--temperature 0``
every sample is the same greedy completion, so only ``--k 1`` is valid there. A prompt the function
cannot grade on some sample (it answers None: math_accuracy for a gold that does not parse) is left
out of every estimate, not counted wrong; ``ungraded`` says how many.

``--model`` takes a model folder or hub id, a run folder (its newest checkpoint that verifies against its
manifest, as ``--resume`` picks it: train/run_checkpoints.py), a checkpoint folder (refused when it does not
verify), or a LoRA checkpoint: an adapter folder (adapter_config.json, no config.json) is loaded onto the base
model its adapter_config.json names and merged; a merged checkpoint is a plain model folder. A run's
checkpoint is evaluated as trained: its task or data, chat settings, grader and sampling settings
are the defaults, each flag overriding one (``eval_settings``). The table goes to stdout; the JSON goes
to ``--out FILE`` or, with ``--json``, to stdout instead; both name what was evaluated (a run's checkpoint by
its path and step) and how.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
from pathlib import Path

import torch

from grpokit.config.sections import Config, ConfigError
from grpokit.data.prompt_length import check_eval_prompts, completion_room
from grpokit.data.prompts import load_rows
from grpokit.record.passk import summarize
from grpokit.rewards.inputs import reward_inputs, reward_prompts
from grpokit.rewards.math import completion_text, prompt_text
from grpokit.rewards.runner import RewardRunner
from grpokit.rewards.spec import RewardSpec, reward_name
from grpokit.rollout.engine import HFEngine
from grpokit.rollout.sampling import sampling_params
from grpokit.train import run_checkpoints
from grpokit.train.models import eos_ids, load_model, load_tokenizer, quiet_transformers, resolve_device, resolve_dtype
from grpokit.train.resume import CONFIG_FILE, RUN_FILES
from grpokit.types import repeat_columns

from .eval_settings import Target, check_flags, eval_config, grader, run_of
from .eval_votes import Votes, vote_keys, votes_of

SPLIT_DEFAULT = "test"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="grpokit eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        default="demo",
        help="model folder, hub id, a run folder (its newest checkpoint that verifies), a checkpoint "
        "or its model/ folder (LoRA adapters included), or demo",
    )
    p.add_argument(
        "--task",
        help="built-in task giving prompts, answers and verifier (default: the run's, else arithmetic; "
        "empty: use --dataset)",
    )
    p.add_argument(
        "--dataset", default="", help="a .jsonl/.json/.parquet/.csv file or hub dataset (default: the run's)"
    )
    p.add_argument("--split", help="the hub dataset's split (default: the run's, else test)")
    p.add_argument(
        "--reward",
        action="append",
        default=[],
        help="the function that grades (built-in name or module:function), on a task's prompts too "
        "(default: the task's verifier, else the run's first reward function)",
    )
    p.add_argument("--k", default="1,4,8", help="comma-separated k values")
    p.add_argument("--samples", type=int, default=0, help="completions per prompt (default: the largest k)")
    p.add_argument("--limit", type=int, default=200, help="evaluate at most this many prompts (0 = all)")
    p.add_argument("--max-new-tokens", type=int, help="(default: the run's rollout.max_new_tokens, else 16)")
    p.add_argument("--temperature", type=float, help="0 = greedy (default: the run's, else 1.0)")
    p.add_argument("--top-p", type=float, help="(default: the run's, else 1.0 = off)")
    p.add_argument("--top-k", type=int, help="(default: the run's, else 0 = off)")
    p.add_argument("--min-p", type=float, help="(default: the run's, else 0 = off)")
    p.add_argument("--repetition-penalty", type=float, help="(default: the run's, else 1.0 = off)")
    p.add_argument("--stop", action="append", help="a text that ends a completion, repeatable (default: the run's)")
    p.add_argument(
        "--generation-kwargs",
        help="transformers generate() settings as a JSON object, e.g. '{\"no_repeat_ngram_size\": 3}' "
        "(default: the run's rollout.generation_kwargs, as it sampled; '{}': none)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout instead of the table")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="section.field=value",
        help="overrides of the fields eval reads: data columns and chat settings, env.*, model loading, "
        "reward.params (e.g. data.prompt_column=question)",
    )
    return p.parse_intermixed_args(argv)


def run_eval(args: argparse.Namespace) -> dict:
    """``grpokit eval``: sample ``--samples`` completions of each held-out prompt and report pass@k."""
    ks, n = check_flags(args)
    _check_out(args.out)
    model_dir, adapter, ckpt = resolve_model(args.model)
    cfg, sampling, target = eval_config(args, model_dir, run_of(adapter or model_dir))
    torch.manual_seed(args.seed)
    quiet_transformers()
    device = resolve_device(cfg.model)
    model, tokenizer = load_eval_model(cfg.model, adapter, device)
    rows = _rows(cfg, target, args.split)
    rows = rows[: args.limit] if args.limit else rows
    fn = grader(cfg, explicit=bool(args.reward))
    votes = votes_of(fn)
    from grpokit.train import build, episode_setup, run_data

    # tools: episodes, else one turn
    episodes = episode_setup.episode_runner(cfg, tokenizer, None, None, run_data.task_of(cfg))
    prompts = build.prompt_maker(cfg, tokenizer, episodes.row_schemas)(rows)  # images: the model's processor
    check_eval_prompts(cfg, model, prompts, completion_room(cfg, sampling.max_new_tokens, episodes.multi_turn, True))
    # the run's decode loop, as training's held-out evaluation takes it: rollout.engine, generate()'s generation_kwargs
    sample = HFEngine(
        eos_token_ids=eos_ids(tokenizer, model),
        pad_token_id=tokenizer.pad_token_id,
        decode=lambda x: tokenizer.decode(x, skip_special_tokens=True),
        generator=torch.Generator(device=device).manual_seed(args.seed),
        decoder=sampling.engine,
        generation_kwargs=sampling.generation_kwargs,
    ).turn_sampler(model)
    params = sampling_params(sampling)
    answers, correct = _sample_and_grade(prompts, episodes, sample, tokenizer, (fn, votes), params, n, cfg.reward)
    graded = [i for i, c in enumerate(correct) if None not in c]  # None: the grader could not grade it
    if not graded:
        raise ConfigError(
            f"the grading function graded none of the {len(prompts)} prompts (it answered None for each, "
            "e.g. math_accuracy for gold answers that do not parse); check the answer column and --reward"
        )
    return {
        "model": args.model,
        "checkpoint": str(ckpt) if ckpt is not None else None,  # the run's checkpoint evaluated, and its step
        "step": run_checkpoints.step_of(ckpt) if ckpt is not None else None,
        **dataclasses.asdict(target),
        "prompts": len(prompts),
        "ungraded": len(prompts) - len(graded),
        "samples_per_prompt": n,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_new_tokens": sampling.max_new_tokens,
        "generation_kwargs": sampling.generation_kwargs,  # the run's (or --generation-kwargs'): generate()'s
        "maj_votes_on": votes.reads,
        **_estimates([answers[i] for i in graded], [correct[i] for i in graded], ks, votes),
    }


def _estimates(answers: list, correct: list, ks: list[int], votes: Votes) -> dict:
    """pass@k, maj@k and mean@k; maj@k None where the grader reads no one answer to vote on."""
    out = summarize(answers, correct, ks)
    return {key: None if key.startswith("maj@") and votes.keys is None else v for key, v in out.items()}


def _check_out(out: str | None) -> None:
    """Refuse, before any work, an ``--out`` that would overwrite a run's own record or is a folder."""
    if not out:
        return
    path = Path(out)
    if path.is_dir():
        raise ConfigError(f"--out {out} is a folder; name a file, e.g. --out {path / 'eval.json'}")
    in_run = any((path.parent / name).is_file() for name in (CONFIG_FILE, "metrics.jsonl"))
    if path.name in RUN_FILES and in_run:
        raise ConfigError(
            f"--out {out} is the run's own {path.name}, which the evaluation would overwrite; write it beside "
            f"the run's files, e.g. --out {path.parent / 'eval.json'}"
        )


def _rows(cfg: Config, target: Target, flag: str | None) -> list[dict]:
    """The rows evaluated: the dataset's (its split), else the task's held-out rows. A split given as ``--split``
    is refused on a file without splits unless it is the default; the run's own split was accepted by its
    training already."""
    if target.dataset:
        field, default = ("--split", SPLIT_DEFAULT) if flag is not None else ("the run's split", target.split)
        return load_rows(target.dataset, target.split or SPLIT_DEFAULT, cfg.data, field, default or SPLIT_DEFAULT)
    from grpokit.data.tasks import get_task

    return get_task(cfg.data.task, cfg.data.task_params).held_out_rows()


def _sample_and_grade(prompts, episodes, sample, tokenizer, grading, params, n: int, rcfg) -> tuple[list, list]:
    """``n`` episodes of every prompt, 32 prompts at a time: each sample's vote (``eval_votes``) and whether
    the grading function gave it full reward (None: it could not grade it). ``grading``: (the function, its
    Votes); the votes read the completions and prompts the function was given."""
    fn, votes = grading
    specs = [RewardSpec(fn=fn, name=reward_name(fn), weight=1.0)]
    answers, correct = [], []
    with RewardRunner(specs, num_workers=0, convention=rcfg.convention) as runner:
        for s in range(0, len(prompts), 32):
            chunk = prompts[s : s + 32]
            ro = episodes.run(sample, chunk, n, params)
            texts = [tokenizer.decode(c, skip_special_tokens=True) for c in ro.completion_ids]
            rows = [p for p in chunk for _ in range(n)]
            completions, env_columns = reward_inputs(ro, texts, rows, rcfg.convention, episodes.parse_message)
            columns = {**repeat_columns(chunk, n), **env_columns}  # no "prompt": training's TrlRewards reads it
            graded_prompts = reward_prompts(chunk, n, rcfg.convention, ro.episodes)
            res = runner.score(graded_prompts, completions, ro.completion_ids, n, columns)
            first = res.rewards_NF[:, 0]
            ok = [None if math.isnan(r) else r >= 1 - 1e-6 for r in first.tolist()]  # None: ungraded
            # an episode's answer is its last message when the model's (none: ""), as the grader reads it
            said = [completion_text(c) for c in completions]
            keys = vote_keys(votes, said, [prompt_text(p) for p in graded_prompts], ok)
            for i in range(len(chunk)):
                answers.append(keys[i * n : (i + 1) * n])
                correct.append(ok[i * n : (i + 1) * n])
    return answers, correct


def resolve_model(name: str) -> tuple[str, Path | None, Path | None]:
    """(the model to load, the LoRA adapter folder to merge into it or None, the run's checkpoint it is or None)
    for ``--model``: a run folder means its newest checkpoint that verifies against its manifest, a checkpoint
    folder (or its model/, or TRL's checkpoint-N) that one, refused when it does not verify
    (train/run_checkpoints.py: what --resume would read); an adapter folder loads the base its
    adapter_config.json names (with the adapter folder's tokenizer when it has one)."""
    folder = Path(name)
    if not folder.is_dir():
        return name, None, None
    named = run_checkpoints.checkpoint_folder(folder)
    ckpt = None
    if named is not None or (folder / "checkpoints").is_dir():  # a checkpoint, or a run folder: its newest
        run, at = named if named is not None else (folder, None)
        say = functools.partial(print, file=sys.stderr)  # stdout is the table or the JSON
        ckpt = run_checkpoints.pick(run, say, model_only_ok=True, at=at, reader=run_checkpoints.EVAL)
        inner = folder.resolve() if named is not None and folder.resolve() != ckpt.resolve() else None
        folder = inner or ckpt  # a checkpoint's adapter/ folder named: that one
    if (folder / "model").is_dir() and not (folder / "config.json").exists():  # a checkpoint folder
        folder = folder / "model"
    if (folder / "config.json").exists() or not (folder / "adapter_config.json").exists():
        return str(folder), None, ckpt
    base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise ConfigError(
            f"--model {name!r} is a LoRA adapter whose adapter_config.json names no base_model_name_or_path; "
            "set it to the base model's folder or hub id"
        )
    if not (Path(base).is_dir() or not Path(base).is_absolute()):
        raise ConfigError(
            f"--model {name!r} is a LoRA adapter for the base model {base!r}, which does not exist here; "
            "edit base_model_name_or_path in its adapter_config.json"
        )
    return base, folder, ckpt


def load_eval_model(mcfg, adapter: Path | None, device: torch.device):
    """(model in eval mode, tokenizer); a LoRA adapter is merged into the base it was trained on (the merged
    model computes what the adapter's run trained, a tied output layer included: train/lora.py)."""
    with_tokenizer = adapter is not None and (adapter / "tokenizer_config.json").exists()
    tokenizer = load_tokenizer(dataclasses.replace(mcfg, name_or_path=str(adapter)) if with_tokenizer else mcfg)
    model = load_model(mcfg, device, resolve_dtype(mcfg, device))
    if adapter is not None:
        from peft import PeftModel

        from grpokit.train.lora import merge_adapters

        model = merge_adapters(PeftModel.from_pretrained(model, str(adapter)))  # a tied head untied first
    return model.eval(), tokenizer


def describe(result: dict) -> str:
    """The line under the table: what was evaluated, graded by what, sampled how."""
    rows = (
        f"task {result['task']} (its held-out rows)" if result["task"] and not result["dataset"] else result["dataset"]
    )
    split = f" split {result['split']}" if result.get("split") else ""
    what = result["model"] if result.get("checkpoint") is None else f"{result['checkpoint']} (step {result['step']})"
    return (
        f"{what} on {rows}{split}, graded by {result['reward']}: {result['prompts']} prompts x "
        f"{result['samples_per_prompt']} samples, temperature {result['temperature']}, top-p {result['top_p']}, "
        f"up to {result['max_new_tokens']} new tokens"
        + (f", generate() with {result['generation_kwargs']}" if result.get("generation_kwargs") else "")
        + (f"; {result['ungraded']} ungraded prompts left out" if result.get("ungraded") else "")
        + (f"; maj@k votes on {result['maj_votes_on']}" if result.get("maj_votes_on") else "")
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    result = run_eval(args)
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text)
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="grpokit eval")
    for col in ("k", "pass@k", "maj@k", "mean@k"):
        table.add_column(col, justify="right")
    for k in sorted({int(key.split("@")[1]) for key in result if key.startswith("pass@")}):
        cells = (result[f"{m}@{k}"] for m in ("pass", "maj", "mean"))
        table.add_row(str(k), *("-" if v is None else f"{v:.3f}" for v in cells))  # "-": no maj@k
    Console().print(table)
    print(describe(result))
    if args.out:
        print(f"results written to {args.out}")
    return 0
