"""grpokit vs TRL's GRPOTrainer on one GRPO workload, alternated in a single invocation.

    python bench/compare_trl.py --quick                 # main comparison, small + large model
    python bench/compare_trl.py --sweep all             # + G, length, width and mixed-length sweeps
    python bench/compare_trl.py --device cuda --dtype bfloat16 --model-dir PATH/Qwen2-0.5B   # on a GPU
    python bench/compare_trl.py --workload smollm2 --P 2 --T 64 --threads 1   # the real model

``--workload smollm2`` is the real-model workload: SmolLM2-135M-Instruct (the named model, or
``--model-dir`` holding its converted folder), chat prompts through its chat template (a default system
prompt, 49,152-token vocabulary), G=8 and 64-128 new tokens; both sides get the same messages.

Each (config, side, round) runs in its own subprocess (bench/worker.py) so peak RSS is that side's
own; sides alternate (grpokit, trl, trl, grpokit, ...) so machine drift hits both equally. Before
timing, the harness checks that grpokit's policy_loss equals TRL's loss on a fixed batch
(bench/trl_oracle.py) and measures this machine's fp32 matmul peak, the denominator of every
"fraction of peak" figure. FLOPs are counted analytically from the tokens actually generated and
trained on (bench/workload.py: model_flops), so padding work counts for neither side, and a group's
prompt counts once (its G completions share it: the useful work; before 2026-11-30 the training phase
counted it once per completion, which overstated grpokit's fraction, as grpokit computes it once).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from alternate import turns  # noqa: E402
from workload import build_model_dir, matmul_peak_gflops, smollm2_dir  # noqa: E402

PY = sys.executable


def _env(threads):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _json_line(out: str) -> dict:
    for line in out.splitlines()[::-1]:
        if line.startswith("BENCH_JSON "):
            return json.loads(line[len("BENCH_JSON ") :])
    raise RuntimeError("no BENCH_JSON line in worker output:\n" + out[-3000:])


def run_side(side, model_dir, c, a) -> dict:
    trl = side == "trl" or side.startswith("trl[")
    overrides = (list(a.grpokit_set) if not trl else []) + (a.variants[side] if side in a.variants else [])
    cmd = [
        PY,
        str(HERE / "worker.py"),
        "--side",
        "trl" if trl else "grpokit",
        "--model",
        str(model_dir),
        "--G",
        str(c["G"]),
        "--P",
        str(c["P"]),
        "--T",
        str(c["T"]),
        "--steps",
        str(a.steps),
        "--warmup",
        str(a.warmup),
        "--beta",
        str(a.beta),
        "--lr",
        str(a.lr),
        "--device",
        a.device,
        "--dtype",
        a.dtype,
        "--threads",
        str(a.threads),
        "--mbs",
        str(a.grpokit_mbs),
        "--trl-mbs",
        str(a.trl_mbs),
        "--reward",
        a.reward,
    ] + [f"--set={o}" for o in overrides]
    cmd += ["--chat"] if a.workload == "smollm2" else []
    main_side = side in ("grpokit", "trl")
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, env=_env(a.threads), timeout=3600 if main_side else a.variant_timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{side} worker ran past its {exc.timeout:.0f} s (--variant-timeout)") from exc
    if p.returncode != 0:
        raise RuntimeError(f"{side} worker failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return _json_line(p.stdout)


def add_variant_args(p: argparse.ArgumentParser) -> None:
    """--variant (an extra grpokit side, alternated with the others) and --variant-timeout."""
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="an extra grpokit side with these overrides, e.g. 'mkl:model.cpu_matmul=torch' (repeatable)",
    )
    p.add_argument("--variant-timeout", type=int, default=3600, help="seconds an extra side's worker may run")


def summarise(runs: list[dict], peak_gflops: float) -> dict:
    steps = [s for r in runs for s in r["steps"]]
    times = [s["step_s"] for s in steps]
    ph = {}
    for s in steps:
        for k, v in s["phases"].items():
            ph.setdefault(k, []).append(v)
    phases = {k: statistics.median(v) for k, v in ph.items()}
    # an asynchronous side samples outside the step (its phase is the wait, "rollout_wait"): no tokens/s of its own
    sampled = [s["gen_tokens"] / s["phases"]["rollout"] for s in steps if s["phases"].get("rollout", 0) > 0]
    tok_s = statistics.median(sampled) if sampled else None
    background = [s["sampler_tok_s"] for s in steps if s.get("sampler_tok_s")]
    train_fl = statistics.median(s["flops"]["ref"] + s["flops"]["train"] for s in steps)
    train_t = statistics.median(
        sum(v for k, v in s["phases"].items() if k not in ("rollout", "rollout_wait")) for s in steps
    )
    tot_fl = statistics.median(sum(s["flops"].values()) for s in steps)
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "n_steps": len(times),
        "phases": phases,
        "gen_tok_s": tok_s,
        "sampler_tok_s": statistics.median(background) if background else None,
        "mean_len": statistics.median(s["gen_tokens"] / (s["prompts"] or 1) for s in steps),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "peak_gpu_mb": max(r.get("peak_gpu_mb", 0.0) for r in runs),
        "train_frac_peak": train_fl / train_t / 1e9 / peak_gflops,
        "step_frac_peak": tot_fl / statistics.median(times) / 1e9 / peak_gflops,
        "train_flops": train_fl,
        "train_s": train_t,
        "first_step_s": statistics.median(r["first_step_s"] for r in runs)
        if all("first_step_s" in r for r in runs)
        else None,
        "metrics": {
            k: statistics.median(s["metrics"][k] for s in steps if k in s.get("metrics", {}))
            for k in sorted({k for s in steps for k in s.get("metrics", {})})
        },
    }


def compare(name, model_dir, c, a, peak) -> dict:
    sides = ["grpokit", "trl", *a.variants]
    runs, failed = {side: [] for side in sides}, {}
    for _, side in turns(sides, a.rounds):  # the order rotates each round: drift hits every side alike
        try:
            runs[side].append(run_side(side, model_dir, c, a))
            # each side's raw result as it lands: a caller cut off by a time limit keeps the sides done
            print(f"SIDE_JSON {side} {json.dumps(runs[side][-1])}", flush=True)
        except RuntimeError as exc:  # an extra side that fails is reported; the main two must run
            if side in ("grpokit", "trl"):
                raise
            print(f"  {side} failed: {str(exc)[-1500:]}", flush=True)
            failed[side] = str(exc)[-1500:]
    runs = {side: v for side, v in runs.items() if side not in failed}
    res = {side: summarise(v, peak) for side, v in runs.items()}
    res["failed"] = failed
    res["speedup"] = res["trl"]["median_s"] / res["grpokit"]["median_s"]
    res["config"], res["name"] = c, name
    print(_row(res), flush=True)
    for side in (s for s in a.variants if s in res):
        v = res[side]
        print(
            f"|   {side}: {' '.join(a.variants[side])} | | {v['median_s']:.2f} ({v['min_s']:.2f}-{v['max_s']:.2f}) | | "
            f"**{res['trl']['median_s'] / v['median_s']:.2f}x** | {_tok(v)} | {v['train_frac_peak']:.0%} "
            f"| {v['peak_rss_mb']:.0f} |",
            flush=True,
        )
    return res


def _tok(side: dict) -> str:
    """A side's rollout tokens/s in the step, or "async" where it sampled in the background (with its sampler
    thread's tokens/s there, where it had one: worker processes are not timed)."""
    if side["gen_tok_s"] is not None:
        return f"{side['gen_tok_s']:.0f}"
    return "async" if side.get("sampler_tok_s") is None else f"async ({side['sampler_tok_s']:.0f})"


def _row(r) -> str:
    g, t = r["grpokit"], r["trl"]
    c = r["config"]
    return (
        f"| {r['name']} | h{c['width']} L{c['layers']} G{c['G']} P{c['P']} T{c['T']} "
        f"| {g['median_s']:.2f} ({g['min_s']:.2f}-{g['max_s']:.2f}) "
        f"| {t['median_s']:.2f} ({t['min_s']:.2f}-{t['max_s']:.2f}) "
        f"| **{r['speedup']:.2f}x** | {_tok(g)} / {_tok(t)} "
        f"| {g['train_frac_peak']:.0%} / {t['train_frac_peak']:.0%} | {g['peak_rss_mb']:.0f} / {t['peak_rss_mb']:.0f} |"
    )


def _phase_row(r) -> str:
    cells = []
    for side in ("grpokit", "trl", *(k for k in r if k.startswith(("grpokit[", "trl[")))):
        p = r[side]["phases"]
        first = "rollout_wait" if "rollout_wait" in p else "rollout"  # an async side waited for its batch
        cells.append(" ".join(f"{k}={p.get(k, 0):.2f}" for k in (first, "ref_fwd", "policy_fwd", "update_rest")))
    return f"| {r['name']} | " + " | ".join(cells) + " |"


def configs(a) -> list[tuple[str, dict]]:
    base = dict(width=a.width, layers=a.layers, G=a.G, P=a.P, T=a.T)
    large = dict(base, width=512, layers=8)
    if a.workload == "smollm2":  # SmolLM2-135M-Instruct's shape: hidden 576, 30 layers
        return [("smollm2 chat", dict(base, width=576, layers=30))]
    if a.model_dir:  # a given model (e.g. Qwen2-0.5B on a GPU): width/layers in the table are not its shape
        return [("given model", base)]
    out = [("small", base)] + ([("large", large)] if a.device == "cpu" and a.width == 256 else [])
    if a.sweep in ("G", "all"):
        out += [(f"G={g}", dict(base, G=g, P=max(1, 64 // g) if a.fixed_n else 8)) for g in (4, 16, 32)]
    if a.sweep in ("T", "all"):
        out += [(f"T={t}", dict(base, T=t)) for t in (64, 128)]
    if a.sweep in ("width", "all"):
        out += [("T=64 large", dict(large, T=64))]
    if a.sweep in ("mix", "all"):
        out += [("mix T=96", dict(base, T=96))]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 rounds x 2 measured steps, main configs only")
    p.add_argument("--sweep", default="none", choices=["none", "G", "T", "width", "mix", "all"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch threads for both sides (0: torch default)")
    p.add_argument("--grpokit-mbs", type=int, default=0, help="grpokit train.micro_batch_size (0: whole batch)")
    p.add_argument(
        "--grpokit-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="grpokit config override for every grpokit side (repeatable)",
    )
    add_variant_args(p)
    p.add_argument(
        "--trl-variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="an extra TRL side with these GRPOConfig overrides, e.g. 'no-gc:gradient_checkpointing=false'",
    )
    p.add_argument("--G", type=int, default=8, help="completions per prompt of the main configs")
    p.add_argument("--P", type=int, default=8, help="prompts per step of the main configs")
    p.add_argument("--T", type=int, default=32, help="max new tokens of the main configs")
    p.add_argument(
        "--trl-mbs",
        type=int,
        default=0,
        help="TRL per_device_train_batch_size (gradient accumulation makes up P*G; 0: the whole batch)",
    )
    p.add_argument(
        "--reward",
        default="vowels",
        choices=["vowels", "even_ids"],
        help="even_ids for models whose vocabulary the 64-character tokenizer cannot decode",
    )
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--fixed-n", action="store_true", help="G sweep keeps N = P*G = 64")
    p.add_argument("--only", default="", help="comma-separated config names to run (e.g. 'small,G=16,T=128')")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--models", default="/tmp/grpokit-bench-models")
    p.add_argument(
        "--workload",
        default="toy",
        choices=["toy", "smollm2"],
        help="toy: random-init Qwen2 models with a character tokenizer; smollm2: the real SmolLM2-135M-Instruct",
    )
    p.add_argument(
        "--model-dir", default="", help="use this model folder (e.g. Qwen2-0.5B) instead of building random ones"
    )
    p.add_argument("--out", default=str(HERE / "results.json"))
    a = p.parse_args(argv)
    a.variants = {f"grpokit[{v.split(':', 1)[0]}]": v.split(":", 1)[1].split(",") for v in a.variant}
    a.variants.update({f"trl[{v.split(':', 1)[0]}]": v.split(":", 1)[1].split(",") for v in a.trl_variant})
    if a.quick:
        a.rounds, a.steps = 2, 2
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    chk = subprocess.run(
        [
            PY,
            "-c",
            "import trl_oracle as o\n"
            f"for k,(x,y) in o.check_all(device={a.device!r}).items(): print(k, x, y, abs(x-y))",
        ],
        capture_output=True,
        text=True,
        cwd=HERE,
        env=_env(a.threads),
    )
    print("loss equality (loss_type trl grpokit |diff|):\n" + chk.stdout + chk.stderr[-500:], flush=True)
    dt = getattr(torch, a.dtype)
    sizes = (1024, 2048) if a.device == "cpu" else (4096, 8192)
    kernels = ("torch", "onednn") if a.device == "cpu" and torch.backends.mkldnn.is_available() else ("torch",)

    def measure_peaks(peaks=None):  # best so far per kernel: a slow moment of the machine must not lower "peak"
        new = {
            k: max(matmul_peak_gflops(n, reps=5, dtype=dt, device=a.device, kernel=k) for n in sizes) for k in kernels
        }
        return {k: max(v, (peaks or {}).get(k, 0.0)) for k, v in new.items()}

    peaks = measure_peaks()
    peak = max(peaks.values())  # the fastest float32 matmul this machine offers
    print(
        f"matmul peak: {peak:.1f} GFLOP/s {a.dtype} ({', '.join(f'{k} {v:.1f}' for k, v in peaks.items())}), "
        f"threads={torch.get_num_threads()}; load {os.getloadavg()}",
        flush=True,
    )
    print(
        "| config | shape | grpokit s/step med (min-max) | TRL s/step | speed-up | gen tok/s ours/TRL "
        "| train-phase % peak ours/TRL | peak RSS MB ours/TRL |\n|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    results = []
    t0 = time.time()
    wanted = set(filter(None, a.only.split(",")))
    for name, c in [(n, c) for n, c in configs(a) if not wanted or n in wanted]:
        d = (
            a.model_dir
            or (smollm2_dir() if a.workload == "smollm2" else None)
            or build_model_dir(Path(a.models) / f"qwen-h{c['width']}-L{c['layers']}", c["width"], c["layers"])
        )
        results.append(compare(name, d, c, a, peak))
    print("\nphase medians, seconds per step (grpokit | TRL):")
    for r in results:
        print(_phase_row(r))
    print(f"\nwall {time.time() - t0:.0f}s; load after {os.getloadavg()}")
    peaks = measure_peaks(peaks)  # again at the end: the rows above used the start's figure
    if max(peaks.values()) > peak * 1.05:
        peak_end = max(peaks.values())
        print(
            f"matmul peak re-measured at the end: {peak_end:.1f} GFLOP/s, above the {peak:.1f} used in the table: "
            f"its train-phase % overstate by x{peak_end / peak:.2f}; corrected:"
        )
        for r in results:
            for side, v in r.items():
                if isinstance(v, dict) and "train_frac_peak" in v:
                    v["train_frac_peak"] *= peak / peak_end
                    v["step_frac_peak"] *= peak / peak_end
                    print(f"  {r['name']} {side}: train phase {v['train_frac_peak']:.0%} of peak")
        peak = peak_end
    Path(a.out).write_text(
        json.dumps({"peak_gflops": peak, "peaks": peaks, "argv": sys.argv[1:], "results": results}, indent=1)
    )


if __name__ == "__main__":
    main()
