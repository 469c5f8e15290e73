"""``grpokit eval``: pass@k, maj@k and mean@k of a model or checkpoint on a dataset.

For every prompt, n completions are sampled (``--samples``, default the largest k) and graded by
the first reward function: a completion is correct when it earns that function's full reward
(>= 1 - 1e-6). maj@k votes over the extracted answers (the text inside <answer> tags, else a
\\boxed{...}, else the stripped completion). The estimators are in ``grpokit.record.passk``. A prompt
the function cannot grade on some sample (it answers None: math_accuracy for a gold that does not
parse) is left out of every estimate, not counted wrong; ``ungraded`` says how many.

``--model`` takes a model folder or hub id, a run folder (its latest checkpoint), a checkpoint folder,
or a LoRA checkpoint: an adapter folder (adapter_config.json, no config.json) is loaded onto the base
model its adapter_config.json names and merged; a merged checkpoint is a plain model folder. The
table goes to stdout; the JSON goes to ``--out FILE`` or, with ``--json``, to stdout instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from pathlib import Path

import torch

from grpokit.config.io import apply_overrides
from grpokit.config.sections import Config, ConfigError
from grpokit.data.prompts import load_rows, to_prompts
from grpokit.record.passk import summarize
from grpokit.rewards.inputs import reward_inputs
from grpokit.rewards.runner import RewardRunner
from grpokit.rewards.spec import RewardSpec, resolve_reward
from grpokit.rollout.hf import SamplingParams, generate
from grpokit.train.models import eos_ids, load_model, load_tokenizer, quiet_transformers, resolve_device, resolve_dtype
from grpokit.train.resume import CONFIG_FILE, RUN_FILES
from grpokit.types import repeat_columns
from grpokit.validation import validate

SPLIT_DEFAULT = "test"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def extract_answer(text: str) -> str | None:
    for pattern in (_ANSWER, _BOXED):
        m = pattern.findall(text)
        if m:
            return m[-1].strip()
    return text.strip() or None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="grpokit eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        default="demo",
        help="model folder, hub id, a run folder (its latest checkpoint), a checkpoint "
        "or its model/ folder (LoRA adapters included), or demo",
    )
    p.add_argument(
        "--task", default="arithmetic", help="built-in task giving prompts, answers and reward (empty: use --dataset)"
    )
    p.add_argument("--dataset", default="", help="a .jsonl/.json/.parquet/.csv file or hub dataset (with --reward)")
    p.add_argument(
        "--split",
        default=SPLIT_DEFAULT,
        help="split of a hub dataset or save_to_disk folder (a single file has none: leave the default)",
    )
    p.add_argument(
        "--reward",
        action="append",
        default=[],
        help="reward function (built-in name or module:function); the first grades",
    )
    p.add_argument("--k", default="1,4,8", help="comma-separated k values")
    p.add_argument("--samples", type=int, default=0, help="completions per prompt (default: the largest k)")
    p.add_argument("--limit", type=int, default=200, help="evaluate at most this many prompts (0 = all)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout instead of the table")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="section.field=value",
        help="data/model config overrides (e.g. data.prompt_column=question)",
    )
    return p.parse_intermixed_args(argv)


def run_eval(args: argparse.Namespace) -> dict:
    """``grpokit eval``: sample ``--samples`` completions of each held-out prompt and report pass@k."""
    ks, n = _ks_and_samples(args)
    _check_out(args.out)
    cfg, adapter = _eval_config(args)
    torch.manual_seed(args.seed)
    quiet_transformers()
    device = resolve_device(cfg.model)
    model, tokenizer = load_eval_model(cfg.model, adapter, device)
    rows, fns = _rows_and_rewards(cfg, args)
    rows = rows[: args.limit] if args.limit else rows
    from grpokit.train import episode_setup, run_data

    # tools: episodes, else one turn
    episodes = episode_setup.episode_runner(cfg, tokenizer, None, None, run_data.task_of(cfg))
    prompts = to_prompts(rows, tokenizer, cfg.data, episodes.row_schemas)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def sample(ctx, G, p, images=None, **kw):
        return generate(
            model,
            ctx,
            G,
            p,
            eos_token_ids=eos_ids(tokenizer, model),
            pad_token_id=tokenizer.pad_token_id,
            generator=gen,
            **kw,
            decode=lambda x: tokenizer.decode(x, skip_special_tokens=True),
        )

    answers, correct = _sample_and_grade(prompts, episodes, sample, tokenizer, fns, params, n)
    graded = [i for i, c in enumerate(correct) if None not in c]  # None: the first function could not grade it
    if not graded:
        raise ConfigError(
            f"the first reward function graded none of the {len(prompts)} prompts (it answered None for each, "
            "e.g. math_accuracy for gold answers that do not parse); check the answer column and --reward"
        )
    return {
        "model": args.model,
        "prompts": len(prompts),
        "ungraded": len(prompts) - len(graded),
        "samples_per_prompt": n,
        "temperature": args.temperature,
        **summarize([answers[i] for i in graded], [correct[i] for i in graded], ks),
    }


def _ks_and_samples(args: argparse.Namespace) -> tuple[list[int], int]:
    """The k of pass@k (``--k``) and the samples per prompt (``--samples``, default the largest k)."""
    ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
    if not ks or ks[0] < 1:
        raise ConfigError(f"--k {args.k!r} must list positive integers, e.g. 1,4,8")
    n = args.samples or ks[-1]
    if n < ks[-1]:
        raise ConfigError(f"--samples {n} is smaller than the largest k ({ks[-1]}); pass@k needs n >= k")
    return ks, n


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


def _eval_config(args: argparse.Namespace) -> tuple[Config, Path | None]:
    """The validated config of the evaluation (model, task or dataset, overrides) and the LoRA adapter
    folder to merge, if any."""
    cfg = apply_overrides(Config(), args.overrides)
    model_dir, adapter = resolve_model(args.model)
    cfg.model.name_or_path = model_dir
    cfg.data.task, cfg.data.dataset = (args.task, "") if not args.dataset else ("", args.dataset)
    validate(cfg)
    from grpokit.train import run_data

    run_data.use_task_model(cfg)  # --task calculator --model demo: the task's own checkpoint
    return cfg, adapter


def _rows_and_rewards(cfg: Config, args: argparse.Namespace) -> tuple[list[dict], list]:
    """The held-out rows (the task's, or ``--dataset``'s split) and the reward functions that grade
    them (the task's verifier first, then each ``--reward``)."""
    if cfg.data.task:
        from grpokit.data.tasks import get_task

        task = get_task(cfg.data.task, cfg.data.task_params)
        return task.held_out_rows(), [task.reward_fn] + [resolve_reward(r) for r in args.reward]
    if not args.reward:
        raise ConfigError("--dataset needs at least one --reward to grade completions")
    return load_rows(args.dataset, args.split, cfg.data, "--split", SPLIT_DEFAULT), [
        resolve_reward(r) for r in args.reward
    ]


def _sample_and_grade(prompts, episodes, sample, tokenizer, fns, params, n: int) -> tuple[list, list]:
    """``n`` episodes of every prompt, 32 prompts at a time: each sample's extracted answer, and
    whether the first reward function gave it full reward (None where it answered None: ungraded)."""
    specs = [RewardSpec(fn=f, name=f"r{i}_{getattr(f, '__name__', 'reward')}", weight=1.0) for i, f in enumerate(fns)]
    answers, correct = [], []
    with RewardRunner(specs, num_workers=0) as runner:
        for s in range(0, len(prompts), 32):
            chunk = prompts[s : s + 32]
            ro = episodes.run(sample, chunk, n, params)
            texts = [tokenizer.decode(c, skip_special_tokens=True) for c in ro.completion_ids]
            completions, env_columns = reward_inputs(ro, texts)
            columns = {**repeat_columns(chunk, n), **env_columns}
            res = runner.score([p.text for p in chunk for _ in range(n)], completions, ro.completion_ids, n, columns)
            if ro.episodes is not None:  # an episode's answer is in its last message
                texts = [str(e.messages[-1].get("content", "")) if e.messages else "" for e in ro.episodes]
            first = res.rewards_NF[:, 0]
            ok = [None if math.isnan(r) else r >= 1 - 1e-6 for r in first.tolist()]  # None: ungraded
            for i in range(len(chunk)):
                answers.append([extract_answer(t) for t in texts[i * n : (i + 1) * n]])
                correct.append(ok[i * n : (i + 1) * n])
    return answers, correct


def resolve_model(name: str) -> tuple[str, Path | None]:
    """(the model to load, the LoRA adapter folder to merge into it or None) for ``--model``: a run
    folder means its latest checkpoint, a checkpoint folder its model/; an adapter folder loads the
    base its adapter_config.json names (with the adapter folder's tokenizer when it has one)."""
    from grpokit.train import checkpoint

    folder = Path(name)
    if not folder.is_dir():
        return name, None
    if (folder / "checkpoints").is_dir():  # a run folder
        latest = checkpoint.latest(folder / "checkpoints")
        if latest is None:
            raise ConfigError(f"--model {name!r} is a run folder without a complete checkpoint under checkpoints/")
        folder = latest
    if (folder / "model").is_dir() and not (folder / "config.json").exists():  # a checkpoint folder
        folder = folder / "model"
    if (folder / "config.json").exists() or not (folder / "adapter_config.json").exists():
        return str(folder), None
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
    return base, folder


def load_eval_model(mcfg, adapter: Path | None, device: torch.device):
    """(model in eval mode, tokenizer); a LoRA adapter is merged into the base it was trained on."""
    with_tokenizer = adapter is not None and (adapter / "tokenizer_config.json").exists()
    tokenizer = load_tokenizer(dataclasses.replace(mcfg, name_or_path=str(adapter)) if with_tokenizer else mcfg)
    model = load_model(mcfg, device, resolve_dtype(mcfg, device))
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return model.eval(), tokenizer


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

    table = Table(
        title="grpokit eval",
        caption=f"{result['model']}: {result['prompts']} prompts x {result['samples_per_prompt']} samples, "
        f"temperature {result['temperature']}"
        + (f"; {result['ungraded']} ungraded prompts left out" if result.get("ungraded") else ""),
    )
    for col in ("k", "pass@k", "maj@k", "mean@k"):
        table.add_column(col, justify="right")
    for k in sorted({int(key.split("@")[1]) for key in result if key.startswith("pass@")}):
        table.add_row(str(k), *(f"{result[f'{m}@{k}']:.3f}" for m in ("pass", "maj", "mean")))
    Console().print(table)
    if args.out:
        print(f"results written to {args.out}")
    return 0
