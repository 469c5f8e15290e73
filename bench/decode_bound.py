"""What one decode step of a model could cost on this machine: its matmul peak, its memory bandwidth,
and the two lower bounds of a step over ``rows`` rows that follow from them.

    PYTHONPATH=src python bench/decode_bound.py --model smollm2 --rows 16 --threads 2

A decode step reads every weight of the model once (the tied head included: 49,152 x 576 for
SmolLM2) and does 2 FLOPs per weight per row. With few rows the weights' bytes, not the FLOPs,
bound it: ``bytes / bandwidth`` against ``2 * params * rows / peak``. The bandwidth is a STREAM-like
copy and triad over arrays far larger than the last-level cache (torch ops on ``--threads`` threads;
best of ``--reps``), counted as STREAM counts it (copy: read + write; triad: two reads + a write).
The attention over the cache (a few MB at these lengths) and the per-operator overhead are not in
the bound; bench/RESULTS.md sets the measured step beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload import matmul_peak_gflops, smollm2_dir  # noqa: E402


def stream_gbs(mb: int = 512, reps: int = 10) -> dict[str, float]:
    """Best-of-``reps`` GB/s of ``b.copy_(a)`` and ``a = b + s * c`` (triad, in place into ``a``) over
    float32 arrays of ``mb`` MB each."""
    n = mb * 2**20 // 4
    a, b, c = torch.ones(n), torch.ones(n), torch.ones(n)
    kernels = {
        "copy": (lambda: b.copy_(a), 2 * n * 4),
        "triad": (lambda: torch.add(b, c, alpha=3.0, out=a), 3 * n * 4),
    }
    out = {}
    for name, (fn, nbytes) in kernels.items():
        fn()
        best = min(_timed(fn) for _ in range(reps))
        out[name] = nbytes / best / 1e9
    return out


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def linear_params(cfg) -> int:
    """Weights a decode step multiplies by: every layer's projections and the (tied or not) head;
    the embedding is a lookup of ``rows`` rows, the norms are vectors."""
    h, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    d = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    attn = h * d * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)  # q, o; k, v
    return L * (attn + 3 * h * i) + cfg.vocab_size * h


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", help="'smollm2' or a folder with a config.json")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(smollm2_dir() if a.model == "smollm2" else a.model)
    peak = max(matmul_peak_gflops(kernel="torch"), matmul_peak_gflops(kernel="onednn"))
    bw = stream_gbs(reps=a.reps)
    params = linear_params(cfg)
    nbytes = params * 4
    flops = 2 * params * a.rows
    rec = {
        "threads": a.threads,
        "matmul_peak_gflops": round(peak, 1),
        "stream_gbs": {k: round(v, 2) for k, v in bw.items()},
        "linear_params_M": round(params / 1e6, 2),
        "weight_mb_fp32": round(nbytes / 1e6, 1),
        "rows": a.rows,
        "step_gflop": round(flops / 1e9, 3),
        "bound_ms_bandwidth": round(nbytes / max(bw.values()) / 1e6, 1),
        "bound_ms_flops": round(flops / peak / 1e6, 1),
    }
    rec["bound_tok_s"] = round(a.rows / max(rec["bound_ms_bandwidth"], rec["bound_ms_flops"]) * 1e3, 1)
    print(json.dumps(rec))


if __name__ == "__main__":
    main()
