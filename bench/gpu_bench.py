"""The GPU benchmark of bench/gpu.sh: rollout engines alone, then one GRPO step against TRL.

    python bench/gpu_bench.py --json bench/gpu/latest.json            # the acceptance workload
    python bench/gpu_bench.py --stages rollout --shapes qwen2.5-0.5b --T 128   # a quick look
    python bench/gpu_bench.py --merge --from-log LOG --variant ...   # a call cut off by its time limit:
        # the step figures of the sides that finished, from the log's SIDE_JSON lines (the same --variant list)

Models are the Qwen2.5-0.5B and -1.5B shapes with random bf16 weights, drawn on the GPU and saved
under --models (nothing is downloaded). A random 151936-token model almost never samples EOS, so
every completion runs to T tokens: the work is the same for every engine and both trainers.

rollout: grpokit's engines (static with CUDA graphs, static eager, dynamic cache) and HF
``generate`` (prompts repeated G times, as TRL gives them; top_k off, temperature 1) on the same
P x G batch, alternated in one process; tokens/s counts generated tokens, peak memory is
``torch.cuda.max_memory_allocated`` during that engine's call.

step: bench/compare_trl.py (each side in its own process, sides alternated) on the first shape;
TRL runs its defaults plus bf16 (gradient checkpointing on, per_device_train_batch_size --trl-mbs
with gradient accumulation making up P*G, so one optimizer step per generation batch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from alternate import turns  # noqa: E402
from compare_trl import add_variant_args  # noqa: E402
from timing import seconds  # noqa: E402
from workload import build_model_dir, prompts  # noqa: E402

ENGINES = ("grpokit_graphs", "grpokit_static_eager", "grpokit_dynamic", "hf_generate")
# What else could make the decode fast, measured on request (--engines): the static step's attention
# through torch's scaled_dot_product_attention (rollout/static.py ATTENTION="sdpa"), graphed or eager,
# and the step compiled by torch.compile (inductor) and then captured as CUDA graphs.
EXTRA_ENGINES = (
    "grpokit_graphs_sdpa",
    "grpokit_static_eager_sdpa",
    "grpokit_graphs_compiled",
    "grpokit_static_compiled",
)


def rollout_bench(model_dir: Path, G: int, P: int, T: int, rounds: int, engines=ENGINES) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.rollout.hf import SamplingParams, generate

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPE[0]).to(DEVICE[0]).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = [tok(r["prompt"])["input_ids"] for r in prompts(P, seed=1)]
    eos, pad = 1, 0

    def hf_generate():
        width = max(map(len, ids))
        rows = [[pad] * (width - len(p)) + p for p in ids for _ in range(G)]
        x = torch.tensor(rows, device=DEVICE[0])
        out = model.generate(
            input_ids=x,
            attention_mask=(x != pad).long(),
            max_new_tokens=T,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            eos_token_id=eos,
            pad_token_id=pad,
        )[:, width:]
        return sum(r.index(eos) + 1 if eos in r else len(r) for r in out.tolist())

    def ours(engine, graphs):
        gen = torch.Generator(device=DEVICE[0]).manual_seed(0)
        ro = generate(
            model,
            ids,
            G,
            SamplingParams(max_new_tokens=T),
            eos_token_ids={eos},
            pad_token_id=pad,
            generator=gen,
            engine=engine,
            cuda_graphs=graphs,
        )
        return sum(map(len, ro.completion_ids))

    from grpokit.rollout import static

    def variant(graphs, attention="matmul", compiled=False):
        def run():
            plain = static.StaticDecoder._forward
            static.ATTENTION = attention
            if compiled:
                static.StaticDecoder._forward = _compiled(plain)
            try:
                return ours("static", graphs)
            finally:
                static.ATTENTION, static.StaticDecoder._forward = "matmul", plain

        return run

    fns = {
        "grpokit_graphs": lambda: ours("static", True),
        "grpokit_static_eager": lambda: ours("static", False),
        "grpokit_dynamic": lambda: ours("dynamic", False),
        "hf_generate": hf_generate,
        "grpokit_graphs_sdpa": variant(True, "sdpa"),
        "grpokit_static_eager_sdpa": variant(False, "sdpa"),
        "grpokit_graphs_compiled": variant(True, compiled=True),
        "grpokit_static_compiled": variant(False, compiled=True),
    }
    times: dict[str, list[float]] = {e: [] for e in engines}
    tokens, peak = {}, {}
    with torch.no_grad():
        ours("static", True) if "grpokit_graphs" in engines else None  # warm-up: cuBLAS handles, allocator
        failed = {}
        for e in (e for e in engines if e.endswith("_compiled")):  # compile outside the timed runs (first call)
            t = time.perf_counter()
            try:
                fns[e]()
                print(
                    f"  rollout {model_dir.name} {e}: first call (compiles) {time.perf_counter() - t:.1f}s", flush=True
                )
            except Exception as exc:  # an engine that cannot run here is reported, not fatal to the others
                failed[e] = f"{type(exc).__name__}: {str(exc)[:500]}"
                print(f"  rollout {model_dir.name} {e} failed: {failed[e]}", flush=True)
        engines = tuple(e for e in engines if e not in failed)
        for _, e in turns(engines, rounds):
            _cuda("reset_peak_memory_stats")
            dt, tokens[e] = seconds(fns[e], DEVICE[0])
            times[e].append(dt)
            peak[e] = max(peak.get(e, 0.0), (_cuda("max_memory_allocated") or 0) / 2**30)
            print(f"  rollout {model_dir.name} {e}: {dt:.2f}s {tokens[e] / dt:.0f} tok/s", flush=True)
    res = {
        e: {
            "median_s": statistics.median(times[e]),
            "tokens": tokens[e],
            "tok_s": tokens[e] / statistics.median(times[e]),
            "peak_gpu_mem_gb": peak[e],
            "runs_s": times[e],
        }
        for e in engines
    }
    res |= {e: {"failed": why} for e, why in failed.items()}
    if "hf_generate" in res:
        for e in engines:
            res[e]["x_hf_generate"] = res[e]["tok_s"] / res["hf_generate"]["tok_s"]
    _cuda("empty_cache")
    return res


DEVICE, DTYPE = ["cuda"], [torch.bfloat16]  # --tiny: cpu, float32
# bf16 dense tensor-core peak from the vendors' datasheets (FLOP/s): the MFU denominator
SPEC_BF16_PEAK = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L40S": 362e12}


def _cuda(fn: str):
    """``torch.cuda.<fn>()`` on a GPU run, nothing on a --tiny CPU run."""
    return getattr(torch.cuda, fn)() if DEVICE[0] == "cuda" else None


def spec_peak(device_name: str, measured_flops: float) -> float:
    """The datasheet bf16 peak of ``device_name``, or the measured matmul peak for other devices."""
    return next((v for k, v in SPEC_BF16_PEAK.items() if k in device_name), measured_flops)


_COMPILED = {}


def _compiled(plain):
    """The decode step compiled once per process (inductor; shapes marked dynamic after a change)."""
    if plain not in _COMPILED:
        _COMPILED[plain] = torch.compile(plain)
    return _COMPILED[plain]


def step_bench(model_dir: Path, a) -> dict:
    out = Path(a.work) / "compare_trl.json"
    cmd = (
        [
            sys.executable,
            str(HERE / "compare_trl.py"),
            "--device",
            DEVICE[0],
            "--dtype",
            str(DTYPE[0]).split(".")[-1],
            "--model-dir",
            str(model_dir),
            "--G",
            str(a.G),
            "--P",
            str(a.P),
            "--T",
            str(a.T),
            "--trl-mbs",
            str(a.trl_mbs),
            "--reward",
            "even_ids",
            "--rounds",
            str(a.rounds),
            "--steps",
            str(a.steps),
            "--warmup",
            "1",
            "--out",
            str(out),
            "--beta",
            "0",
        ]
        + [f"--variant={v}" for v in a.variant]
        + ["--variant-timeout", str(a.variant_timeout)]
    )
    # streamed line by line (each side's SIDE_JSON line among them), so a call cut off by its time
    # limit still has in its log the sides that finished
    p = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    for line in p.stdout:
        lines.append(line)
        print(line, end="", flush=True)
    if p.wait() != 0:
        raise RuntimeError(f"compare_trl failed ({p.returncode})")
    data = json.loads(out.read_text())
    data["loss_equality"] = loss_lines(lines)
    return data


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", default="rollout,step")
    p.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b", help="rollout shapes; the step uses the first")
    p.add_argument("--G", type=int, default=16)
    p.add_argument("--P", type=int, default=32)
    p.add_argument("--T", type=int, default=512)
    p.add_argument("--rollout-rounds", type=int, default=2)
    p.add_argument(
        "--engines", default=",".join(ENGINES), help=f"rollout engines to alternate; also: {', '.join(EXTRA_ENGINES)}"
    )
    p.add_argument("--rounds", type=int, default=1, help="compare_trl rounds (each: one run per side)")
    p.add_argument("--steps", type=int, default=3, help="measured steps per run after one warm-up step (3: steps 2-4)")
    p.add_argument("--trl-mbs", type=int, default=16)
    add_variant_args(p)  # extra grpokit sides of the step, e.g. 'mbs16:train.micro_batch_size=16'
    p.add_argument("--models", default="/tmp/grpokit-gpu-models")
    p.add_argument("--work", default="/tmp/grpokit-gpu-work")
    p.add_argument("--facts", default="", help="JSON lines of measured facts from tests/project/test_gpu.py to include")
    p.add_argument("--json", default=str(HERE / "gpu" / "latest.json"))
    p.add_argument("--merge", action="store_true", help="keep what --json already holds from other stages (split runs)")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="CPU, float32, a 2-layer model, G2 P2 T8: checks the script runs, measures nothing",
    )
    p.add_argument(
        "--from-log",
        default="",
        metavar="LOG",
        help="rebuild the step stage's figures from a cut-off call's log (its SIDE_JSON lines) instead of running it",
    )
    a = p.parse_args(argv)
    if a.from_log:
        res = json.loads(Path(a.json).read_text()) if a.merge and Path(a.json).exists() else {}
        res.update(rebuild_from_log(Path(a.from_log).read_text(), a.variant))
        if a.facts and Path(a.facts).exists() and Path(a.facts).stat().st_size:
            res["test_facts"] = [json.loads(line) for line in Path(a.facts).read_text().splitlines() if line.strip()]
        Path(a.json).write_text(json.dumps(res, indent=1))
        print(json.dumps(res, indent=1))
        return
    if a.tiny:
        DEVICE[0], DTYPE[0] = "cpu", torch.float32
        a.shapes, a.G, a.P, a.T, a.steps, a.trl_mbs, a.rollout_rounds = "tiny", 2, 2, 8, 1, 0, 1
        a.engines = "grpokit_static_eager,grpokit_dynamic,hf_generate"
    Path(a.work).mkdir(parents=True, exist_ok=True)
    stages, shapes = a.stages.split(","), a.shapes.split(",")
    res = json.loads(Path(a.json).read_text()) if a.merge and Path(a.json).exists() else {}
    res |= device_facts(a, shapes)
    print(json.dumps(res), flush=True)
    dirs = {s: build_model_dir(Path(a.models) / s, shape=s, device=DEVICE[0]) for s in shapes}

    def save():
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1))

    if "rollout" in stages:
        engines = tuple(a.engines.split(","))
        key = "rollout" if set(engines) <= set(ENGINES) else "rollout_engines"  # extra engines: their own entry
        res[key] = {s: rollout_bench(dirs[s], a.G, a.P, a.T, a.rollout_rounds, engines) for s in shapes}
        first = res[key][shapes[0]]
        if key == "rollout":
            best = first.get("grpokit_graphs") or first[engines[0]]
            res["rollout_tokens_per_s"] = best["tok_s"]
            res["rollout_x_hf_generate"] = best.get("x_hf_generate")
        save()
    if "step" in stages:
        res.update(step_summary(step_bench(dirs[shapes[0]], a), res["peak_flops"]))
        save()
    if a.facts and Path(a.facts).exists() and Path(a.facts).stat().st_size:
        res["test_facts"] = [json.loads(line) for line in Path(a.facts).read_text().splitlines() if line.strip()]
    save()
    print(json.dumps(res, indent=1))


def loss_lines(lines: list[str]) -> list[str]:
    """compare_trl's loss-equality lines (``loss_type/bc=... trl grpokit |diff|``) among ``lines``."""
    return [line.rstrip() for line in lines if line.split("/")[0] in ("grpo", "bnpo", "dapo", "dr_grpo")]


def rebuild_from_log(log: str, variants: list[str]) -> dict:
    """latest.json's step figures from the log of a call cut off by its time limit: the device facts
    (the log's first JSON line), the matmul peak, the loss-equality lines and each side that
    finished (compare_trl's SIDE_JSON lines); sides of ``variants`` with no line are listed as not run."""
    from compare_trl import summarise

    lines = log.splitlines()
    facts = json.loads(next(line for line in lines if line.startswith('{"device"')))
    peak = float(next(line for line in lines if line.startswith("matmul peak:")).split()[2])
    runs: dict[str, list[dict]] = {}
    for line in lines:
        if line.startswith("SIDE_JSON "):
            side, raw = line[len("SIDE_JSON ") :].split(" ", 1)
            runs.setdefault(side, []).append(json.loads(raw))
    row = {side: summarise(v, peak) for side, v in runs.items()}
    wanted = [f"grpokit[{v.split(':', 1)[0]}]" for v in variants]
    row["failed"] = {side: "not run: the call reached its time limit first" for side in wanted if side not in runs}
    row["speedup"] = row["trl"]["median_s"] / row["grpokit"]["median_s"]
    out = facts | step_summary({"results": [row], "loss_equality": loss_lines(lines)}, facts["peak_flops"])
    return out | {"rebuilt_from_log": True}


def device_facts(a, shapes) -> dict:
    from workload import matmul_peak_gflops

    gpu = DEVICE[0] == "cuda"
    name = torch.cuda.get_device_name(0) if gpu else "cpu (--tiny: not a measurement)"
    measured = (
        max(
            matmul_peak_gflops(n, reps=10 if gpu else 2, dtype=DTYPE[0], device=DEVICE[0])
            for n in ((4096, 8192) if gpu else (256,))
        )
        * 1e9
    )
    return {
        "device": name,
        "date": date.today().isoformat(),
        "model": f"{shapes[0]} shape, random {str(DTYPE[0]).split('.')[-1]} weights",
        "torch": torch.__version__,
        "gpu_memory_gb": torch.cuda.get_device_properties(0).total_memory / 2**30 if gpu else 0.0,
        "workload": {
            "G": a.G,
            "P": a.P,
            "T": a.T,
            "dtype": str(DTYPE[0]).split(".")[-1],
            "beta": 0.0,
            "measured_steps": a.steps,
            "trl_per_device_train_batch_size": a.trl_mbs,
        },
        "bf16_matmul_peak_tflops": measured / 1e12,
        "peak_flops": spec_peak(name, measured),
    }


def step_summary(cmp: dict, peak_flops: float) -> dict:
    """The headline figures (speedup, update MFU, peak memory ratio) at the top level of latest.json, the
    detail under ``step``."""
    r = cmp["results"][0]
    g, t = r["grpokit"], r["trl"]
    mfu = lambda side: side["train_flops"] / max(side["train_s"], 1e-9) / peak_flops
    return dict(
        speedup=r["speedup"],
        update_mfu=mfu(g),
        trl_update_mfu=mfu(t),
        peak_memory_ratio=g["peak_gpu_mb"] / t["peak_gpu_mb"] if t["peak_gpu_mb"] else None,
        grpokit_s_per_step=g["median_s"],
        trl_s_per_step=t["median_s"],
        first_step_s=g["first_step_s"],
        trl_first_step_s=t["first_step_s"],
        first_step_over_later=(g["first_step_s"] or 0.0) / g["median_s"],
        peak_gpu_mem_gb=g["peak_gpu_mb"] / 1024,
        trl_peak_gpu_mem_gb=t["peak_gpu_mb"] / 1024,
        mismatch={k: v for k, v in g["metrics"].items() if k.startswith("mismatch/")},
        memory_by_phase={k: v for k, v in g["metrics"].items() if k.startswith("gpu/")},
        step={
            side: {
                k: r[side][k]
                for k in (
                    "phases",
                    "gen_tok_s",
                    "train_frac_peak",
                    "step_frac_peak",
                    "peak_gpu_mb",
                    "min_s",
                    "max_s",
                    "first_step_s",
                )
            }
            for side in ("grpokit", "trl")
        },
        loss_equality=cmp["loss_equality"],
        rollout_tokens_per_s_in_step=g["gen_tok_s"],
        variants_failed=r.get("failed", {}),
        variants={
            name: dict(
                s_per_step=v["median_s"],
                speedup=t["median_s"] / v["median_s"],
                update_mfu=mfu(v),
                peak_gpu_mem_gb=v["peak_gpu_mb"] / 1024,
                peak_memory_ratio=v["peak_gpu_mb"] / t["peak_gpu_mb"] if t["peak_gpu_mb"] else None,
                first_step_s=v["first_step_s"],
                phases=v["phases"],
                memory_by_phase={k: x for k, x in v["metrics"].items() if k.startswith("gpu/")},
            )
            for name, v in r.items()
            if name not in ("grpokit", "trl") and isinstance(v, dict) and "median_s" in v
        },
    )


if __name__ == "__main__":
    main()
