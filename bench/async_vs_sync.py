"""Synchronous against asynchronous rollout on the smollm2-math recipe (issue 50 item 7), at equal samples.

    python bench/async_vs_sync.py --out runs/async-vs-sync                     # every arm, seed 0, full size
    python bench/async_vs_sync.py --out runs/async-vs-sync --show              # the tables, from saved results
    python bench/async_vs_sync.py --out runs/avs-tiny --steps 3 --eval-every 1 --eval-size 8 --max-new-tokens 16

The full measurement for a quiet machine (every arm, three seeds, the preset's 24 steps, 200 held-out prompts
every 6 steps, 48 new tokens): ``python bench/async_vs_sync.py --out runs/async-vs-sync --seeds 0 1 2``.

The arms, each ``grpokit train --preset smollm2-math`` (SmolLM2-135M-Instruct, 4 prompts x G=8 a step, 48 new
tokens, CPU) in its own process, from the same weights and ``train.seed``, for the same number of steps, so every
arm trains on steps x 4 x 8 completions (checked from the runs' own records):

    sync            rollout.async_staleness=0: the trainer samples, then updates
    async1          rollout.async_staleness=1 (one-step-off: batch j sampled by version j - 1, in a thread)
    async2          rollout.async_staleness=2
    async2-partial  rollout.async_staleness=2, rollout.async_partial_tokens=K
    async1-worker   rollout.async_staleness=1, rollout.async_workers=1 (one sampler process; not by default)

K = ceil(max_new_tokens / 2) (24 at full size). Segment m of batch j is drawn by version min(j - 2 + m, j)
(docs/SCALING.md), and version j exists only once step j begins, which is when batch j is needed: any segment
m >= 2 would therefore be decoded while the trainer waits, every step, whatever the machine. K = T/2 is the
smallest K with no such segment; the second half of each completion is then drawn one version fresher (token
staleness 1.5 on average instead of 2). It is also near what the sampler decodes during one update here (the
update takes about half as long as the rollout on this CPU).

Order: arms run one after another, never at once (each is a training run whose steps depend on each other,
and two runs at once would share the two cores that async exists to keep busy); with several seeds the order
rotates from seed to seed (bench/alternate.py), so the machine's drift falls on every arm alike. Results are
kept per arm (``OUT/seed<s>/<arm>/``, grpokit's run folder, and ``arm.json`` once it finished): a stopped
measurement, run again with the same arguments, skips the finished arms and restarts the unfinished one from
its beginning. A second invocation with other sizes is refused (``OUT/settings.json``).

Per arm (medians over seeds' pooled steps):

- seconds per step: ``time/step`` (evaluation excluded) over the counted steps, median and [min, max]. Counted:
  every step after the first, except the steps whose batch the sampler could have drawn while an evaluation
  ran (the s steps after each evaluation, and the first s + 1 after the one before training: the sampler
  keeps going while the trainer evaluates, which would flatter async). Wall time of the whole run is also kept.
- rollout, update, wait, sync: medians of the sampling seconds (sync: ``time/rollout``; async: ``time/sampling``,
  the sampler's own clock on the batch the step trained), ``time/update``, ``time/waiting_for_rollout`` and
  ``time/weight_sync``.
- hidden: the share of the rollout that overlapped the trainer's work (rewards, update, weight sync),
  ``1 - time/waiting_for_rollout / time/sampling`` per step, clipped to [0, 1], median over counted steps; 0 for
  sync (the trainer samples itself, nothing overlaps). On a CPU the overlap is contention as well: the sampler
  and the update share the cores (a worker process takes as many threads as the trainer), so a hidden share
  near 1 is not a speed-up unless the seconds per step fall too.
- rollout/staleness: mean over steps of the per-step mean, and the max of ``rollout/staleness_max``.
- the held-out curve: greedy accuracy on the task's held-out prompts before training and every E steps, by
  grpokit's own evaluator (train/evaluate.py, as bench/smollm2_curve.py reads it), per step: the arms' points
  sit at equal samples.

Wall time on a quiet 2-core machine: the recipe's synchronous run took 501 s there on 2026-11-27 (13.8 s a
step, five 200-prompt evaluations of ~45 s, bench/RESULTS.md); an asynchronous arm does the same evaluations and
at most as many step-seconds, so about 8-9 min per arm and seed: ~45 min for the five arms and one seed, ~2.2 h
for the three seeds above. (The tiny run under load, 16 new tokens, took 100-130 s a synchronous step, about 6x
a quiet machine's rollout speed: not a basis to scale from.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from alternate import turns  # noqa: E402
from smollm2_curve import PRESET, grpokit_curve  # noqa: E402
from timing import spread  # noqa: E402

ARMS: dict[str, dict[str, object]] = {
    "sync": {},
    "async1": {"rollout.async_staleness": 1},
    "async2": {"rollout.async_staleness": 2},
    "async2-partial": {"rollout.async_staleness": 2, "rollout.async_partial_tokens": "K"},
    "async1-worker": {"rollout.async_staleness": 1, "rollout.async_workers": 1},
}
DEFAULT_ARMS = ["sync", "async1", "async2", "async2-partial"]


def settings_of(args) -> dict:
    """What every arm shares, from the preset and the command line (None: the preset's own value)."""
    from grpokit.config import presets

    cfg = presets.apply(PRESET)
    T = args.max_new_tokens or cfg.rollout.max_new_tokens
    return {
        "preset": PRESET,
        "steps": args.steps or cfg.train.steps,
        "eval_every": args.eval_every or cfg.train.eval_every,
        "eval_size": args.eval_size if args.eval_size is not None else cfg.data.eval_size,
        "max_new_tokens": T,
        "partial_tokens": args.partial_tokens or math.ceil(T / 2),
        "prompts_per_step": cfg.train.prompts_per_step,
        "group_size": cfg.rollout.group_size,
    }


def overrides(arm: str, seed: int, s: dict) -> list[str]:
    shared = {
        "train.seed": seed,
        "train.steps": s["steps"],
        "train.eval_every": s["eval_every"],
        "data.eval_size": s["eval_size"],
        "rollout.max_new_tokens": s["max_new_tokens"],
        "train.save_every": 0,
        "train.save_last": False,
        "record.report": False,
        "train.memory_plan": "manual",  # no activation checkpointing, one micro-batch: what the plan picks
        "train.activation_memory_mb": 0,  # on a quiet 24 GB machine, pinned so free memory cannot differ by arm
    }
    own = {k: (s["partial_tokens"] if v == "K" else v) for k, v in ARMS[arm].items()}
    return [f"{k}={v}" for k, v in {**shared, **own}.items()]


def run_arm(folder: Path, arm: str, seed: int, s: dict) -> None:
    """One arm's training run in its own process; arm.json marks it finished."""
    run = folder / "run"
    cmd = [sys.executable, "-m", "grpokit", "train", "--preset", PRESET, "--out", str(run), "--overwrite"]
    cmd += overrides(arm, seed, s)
    folder.mkdir(parents=True, exist_ok=True)
    print(f"[{time.strftime('%H:%M:%S')}] seed {seed} {arm}: {' '.join(cmd[2:])}", flush=True)
    start = time.time()
    with (folder / "train.log").open("w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()).returncode
    wall = time.time() - start
    if rc != 0:
        tail = (folder / "train.log").read_text().strip().splitlines()[-3:]
        sys.exit(f"arm {arm} (seed {seed}) failed with exit code {rc}: {' | '.join(tail)}")
    (folder / "arm.json").write_text(json.dumps({"arm": arm, "seed": seed, "cmd": cmd, "wall_s": round(wall, 1)}))
    print(f"    done in {wall:.0f} s", flush=True)


def rows_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def counted(rows: list[dict], staleness: int) -> list[dict]:
    """The steps whose time is compared: after the first, and not drawn while an evaluation ran."""
    evals = [0] + [int(r["step"]) for r in rows if any(k.startswith("eval/") for k in r)]
    tainted = {e + d for e in evals for d in range(1, staleness + 1)} | set(range(1, staleness + 2))
    return [r for r in rows if int(r["step"]) > 1 and (staleness == 0 or int(r["step"]) not in tainted)]


def hidden_share(r: dict) -> float:
    """1 - waiting / sampling, clipped to [0, 1]; 0 for a synchronous step (no time/sampling)."""
    sampled = r.get("time/sampling")
    if not sampled or not math.isfinite(sampled):
        return 0.0
    return min(1.0, max(0.0, 1.0 - r.get("time/waiting_for_rollout", 0.0) / sampled))


def tokens_per_second(rows: list[dict], s: dict) -> float:
    """Completion tokens trained per second of step over ``rows``: the arms' completions differ in length
    (a stale policy's are longer while the fresh one shortens them), which seconds per step do not see."""
    tokens = sum(float(r["completions/mean_length"]) * s["prompts_per_step"] * s["group_size"] for r in rows)
    return tokens / sum(float(r["time/step"]) for r in rows)


def arm_figures(folders: list[Path], arm: str, s: dict) -> dict:
    """One arm's figures over its finished seeds' runs."""
    staleness = int(ARMS[arm].get("rollout.async_staleness", 0))
    rows = [r for f in folders for r in counted(rows_of(f / "run"), staleness)]
    all_rows = [r for f in folders for r in rows_of(f / "run")]
    samples = {len(rows_of(f / "run")) * s["prompts_per_step"] * s["group_size"] for f in folders}
    curves = [grpokit_curve(f / "run") for f in folders]
    if not rows:  # too few steps for a timing; the curve still counts
        return {"arm": arm, "seeds": len(folders), "samples": samples, "curves": curves}

    def med(key: str) -> float:
        vals = [float(r[key]) for r in rows if key in r]
        return statistics.median(vals) if vals else math.nan

    return {
        "arm": arm,
        "seeds": len(folders),
        "samples": samples,
        "counted": len(rows),
        "step": spread([float(r["time/step"]) for r in rows]),
        "tokens_per_s": tokens_per_second(rows, s),
        "rollout": med("time/sampling") if staleness else med("time/rollout"),
        "update": med("time/update"),
        "wait": med("time/waiting_for_rollout") if staleness else med("time/rollout"),
        "sync": med("time/weight_sync"),
        "hidden": statistics.median(hidden_share(r) for r in rows),
        "staleness": statistics.mean(float(r.get("rollout/staleness", 0.0)) for r in all_rows),
        "staleness_max": max(float(r.get("rollout/staleness_max", 0.0)) for r in all_rows),
        "wall_s": statistics.median(json.loads((f / "arm.json").read_text())["wall_s"] for f in folders),
        "curves": curves,
    }


def show(out: Path) -> None:
    s = json.loads((out / "settings.json").read_text())
    done = {arm: sorted(out.glob(f"seed*/{arm}/arm.json")) for arm in ARMS}
    figs = [arm_figures([p.parent for p in paths], arm, s) for arm, paths in done.items() if paths]
    print(
        f"{PRESET}: {s['steps']} steps x {s['prompts_per_step']} prompts x G={s['group_size']}, "
        f"{s['max_new_tokens']} new tokens, partial K={s['partial_tokens']}, held-out {s['eval_size']} "
        f"every {s['eval_every']} steps"
    )
    print(
        f"{'arm':<15} {'seeds':>5} {'samples':>8} {'s/step med [min, max]':>24} {'rollout':>8} {'update':>7} "
        f"{'wait':>6} {'sync':>6} {'hidden':>7} {'stale':>6} {'max':>4} {'tok/s':>6} {'wall s':>7}"
    )
    for f in figs:
        if "step" not in f:
            samples = "/".join(map(str, sorted(f["samples"])))
            print(f"{f['arm']:<15} {f['seeds']:>5} {samples:>8}  (no step timed: every one followed an evaluation)")
            continue
        st, samples = f["step"], "/".join(map(str, sorted(f["samples"])))
        step = f"{st['median']:.2f} [{st['min']:.2f}, {st['max']:.2f}]"
        print(
            f"{f['arm']:<15} {f['seeds']:>5} {samples:>8} {step:>24} {f['rollout']:>8.2f} {f['update']:>7.2f} "
            f"{f['wait']:>6.2f} {f['sync']:>6.3f} {100 * f['hidden']:>6.0f}% {f['staleness']:>6.2f} "
            f"{f['staleness_max']:>4.0f} {f['tokens_per_s']:>6.1f} {f['wall_s']:>7.0f}"
        )
    sync = next((f for f in figs if f["arm"] == "sync" and "step" in f), None)
    for f in figs:
        if sync is not None and f is not sync and "step" in f:
            print(
                f"{f['arm']}: {sync['step']['median'] / f['step']['median']:.2f}x sync's speed in seconds per step, "
                f"{f['tokens_per_s'] / sync['tokens_per_s']:.2f}x in completion tokens trained per second"
            )
    print("\nheld-out greedy accuracy (%), mean over seeds, by step (equal samples per step on every arm):")
    steps = sorted({p["step"] for f in figs for c in f.get("curves", []) for p in c})
    print(f"{'step':>5} " + " ".join(f"{f['arm']:>15}" for f in figs))
    for k in steps:
        cells = []
        for f in figs:
            accs = [p["accuracy"] for c in f.get("curves", []) for p in c if p["step"] == k]
            cells.append(f"{100 * statistics.mean(accs):>15.1f}" if accs else f"{'':>15}")
        print(f"{k:>5} " + " ".join(cells))


def measure(out: Path, arms: list[str], seeds: list[int], s: dict) -> None:
    saved = out / "settings.json"
    if saved.exists() and json.loads(saved.read_text()) != s:
        sys.exit(f"{out} holds a measurement with other settings ({saved}); choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(s, indent=1))
    for r, arm in turns(arms, len(seeds)):
        folder = out / f"seed{seeds[r]}" / arm
        if (folder / "arm.json").exists():
            print(f"seed {seeds[r]} {arm}: done before, kept", flush=True)
            continue
        run_arm(folder, arm, seeds[r], s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the measurement's folder (results kept per arm)")
    p.add_argument("--show", action="store_true", help="print the tables from the saved results and stop")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=DEFAULT_ARMS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--steps", type=int, default=None, help="default: the preset's (24)")
    p.add_argument("--eval-every", type=int, default=None, help="default: the preset's (6)")
    p.add_argument("--eval-size", type=int, default=None, help="held-out prompts; default: the preset's (200)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the preset's (48)")
    p.add_argument("--partial-tokens", type=int, default=None, help="K of async2-partial; default ceil(T/2)")
    args = p.parse_args(argv)
    if args.show:
        if not (args.out / "settings.json").exists():
            sys.exit(f"{args.out} holds no measurement (no settings.json)")
        show(args.out)
        return 0
    measure(args.out, args.arms, args.seeds, settings_of(args))
    show(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
