"""Bigger models on one GPU, beside TRL 1.16 on the same shapes: the second command.

    python bench/gpu_big.py                       # on the GPU machine (bench/gpu.sh installs the wheels first)
    python bench/gpu_big.py --tiny                # CPU, a 2-layer model: checks the script runs, measures nothing

Three cases, each 1 warm-up + 2 measured steps (3 steps) per side, sides alternated (grpokit, TRL):

    1.5b-full    Qwen2.5-1.5B shape, full fine-tuning, bf16
    7b-lora      Qwen2.5-7B shape, LoRA r=16 on every linear layer, bf16 base
    7b-qlora     Qwen2.5-7B shape, LoRA r=16 over a 4-bit NF4 base (bitsandbytes)

Random weights are drawn on the GPU from the config and saved once under --models (nothing is
downloaded). Each side runs in its own process (bench/worker.py), so its peak GPU memory is its own.
Results (s/step, rollout tokens/s, peak memory, first step) go to bench/gpu/big.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from compare_trl import _env, _json_line, summarise  # noqa: E402
from workload import build_model_dir  # noqa: E402

CASES = {  # name: (shape, grpokit overrides, TRL worker flags)
    "1.5b-full": ("qwen2.5-1.5b", [], []),
    "7b-lora": ("qwen2.5-7b", ["model.lora_rank=16"], ["--lora", "16"]),
    "7b-qlora": ("qwen2.5-7b", ["model.lora_rank=16", "model.quantization=4bit"], ["--lora", "16", "--qlora"]),
}


def run(side: str, model_dir: Path, flags: list[str], a) -> dict:
    cmd = [
        sys.executable,
        str(HERE / "worker.py"),
        "--side",
        side,
        "--model",
        str(model_dir),
        "--G",
        str(a.G),
        "--P",
        str(a.P),
        "--T",
        str(a.T),
        "--steps",
        "2",
        "--warmup",
        "1",
        "--beta",
        "0",
        "--device",
        a.device,
        "--dtype",
        a.dtype,
        "--reward",
        "even_ids",
        "--trl-mbs",
        str(a.trl_mbs),
    ] + flags
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=_env(0), timeout=a.timeout)
    except subprocess.TimeoutExpired as exc:  # the case is recorded as failed and the next one still runs
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        seen = [ln for ln in err.splitlines() if ln.startswith("worker ")]
        return {"failed": f"the {side} side ran past --timeout {a.timeout} s", "progress": seen[-12:]}
    if p.returncode != 0:
        return {"failed": p.stderr[-2000:]}
    return _json_line(p.stdout)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--P", type=int, default=8)
    p.add_argument("--T", type=int, default=256)
    p.add_argument("--trl-mbs", type=int, default=16)
    p.add_argument("--models", default="/tmp/grpokit-gpu-models")
    p.add_argument("--json", default=str(HERE / "gpu" / "big.json"))
    p.add_argument("--timeout", type=int, default=1800, help="seconds per side of a case (model load included)")
    p.add_argument("--tiny", action="store_true")
    a = p.parse_args(argv)
    a.device, a.dtype = ("cpu", "float32") if a.tiny else ("cuda", "bfloat16")
    if a.tiny:
        a.G, a.P, a.T, a.trl_mbs = 2, 2, 8, 0
    res = {
        "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": date.today().isoformat(),
        "workload": {"G": a.G, "P": a.P, "T": a.T, "beta": 0.0, "steps": "1 warm-up + 2"},
    }
    for name in a.cases.split(","):
        shape, sets, trl_flags = CASES[name]
        if a.tiny and "4bit" in " ".join(sets):
            continue  # bitsandbytes needs CUDA
        t = time.perf_counter()
        model_dir = build_model_dir(
            Path(a.models) / ("tiny" if a.tiny else shape), shape="tiny" if a.tiny else shape, device=a.device
        )
        print(f"{name}: model folder ready in {time.perf_counter() - t:.1f} s", flush=True)
        runs = {
            "grpokit": run("grpokit", model_dir, [f"--set={s}" for s in sets], a),
            "trl": run("trl", model_dir, trl_flags, a),
        }
        out = {}
        for side, r in runs.items():
            out[side] = (
                r
                if "failed" in r
                else {
                    k: v
                    for k, v in summarise([r], 1.0).items()
                    if k in ("median_s", "gen_tok_s", "peak_gpu_mb", "first_step_s", "phases")
                }
            )
        if all("median_s" in v for v in out.values()):
            out["speedup"] = out["trl"]["median_s"] / out["grpokit"]["median_s"]
            out["peak_memory_ratio"] = (
                out["grpokit"]["peak_gpu_mb"] / out["trl"]["peak_gpu_mb"] if out["trl"]["peak_gpu_mb"] else None
            )
        res[name] = out
        print(name, json.dumps(out), flush=True)
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
