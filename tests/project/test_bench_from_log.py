"""bench/gpu_bench.py --from-log: a GPU call cut off by its time limit keeps the sides that finished
(compare_trl prints each as a SIDE_JSON line); the step figures are rebuilt from the log alone."""

import json
import sys

from helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gpu_bench  # noqa: E402


def _side(name: str, times: list[float], peak_gpu_mb: float) -> str:
    steps = [
        {
            "step_s": t,
            "phases": {"rollout": t / 2, "policy_fwd": 0.0, "update_rest": t / 2},
            "gen_tokens": 1000,
            "prompts": 4,
            "flops": {"rollout": 1.0, "ref": 0.0, "train": 2.0e12},
            "metrics": {"mismatch/logp_abs_diff_mean": 0.01},
        }
        for t in times
    ]
    run = {"side": name, "steps": steps, "peak_rss_mb": 100.0, "peak_gpu_mb": peak_gpu_mb, "first_step_s": 2 * times[0]}
    return f"SIDE_JSON {name} {json.dumps(run)}"


def test_the_sides_that_finished_make_the_figures_and_the_cut_one_is_named():
    facts = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-27", "peak_flops": 989e12}
    log = "\n".join(
        [
            "GPU 0: NVIDIA H100 80GB HBM3",
            json.dumps(facts),
            "grpo/bc=False -0.34 -0.34 0.0",
            "matmul peak: 782516.5 GFLOP/s bfloat16 (torch 782516.5), threads=16",
            _side("grpokit", [2.0, 4.0, 3.0], 2048.0),  # median 3.0 s
            _side("trl", [9.0, 9.0, 12.0], 1024.0),  # median 9.0 s
            "noise from a worker",
            _side("grpokit[liger]", [1.5, 1.5, 1.5], 1536.0),
        ]
    )
    out = gpu_bench.rebuild_from_log(log, ["liger:model.kernels=liger", "ckpt16:train.micro_batch_size=16"])
    assert out["rebuilt_from_log"] and out["device"] == "NVIDIA H100 80GB HBM3"
    assert out["speedup"] == 3.0 and out["grpokit_s_per_step"] == 3.0 and out["trl_s_per_step"] == 9.0
    assert out["peak_memory_ratio"] == 2.0  # 2048 / 1024 MB
    # update MFU: 2e12 FLOPs in the update's median 1.5 s, over the H100's 989 TFLOP/s
    assert abs(out["update_mfu"] - 2e12 / 1.5 / 989e12) < 1e-12
    assert out["variants"]["grpokit[liger]"]["speedup"] == 6.0
    assert out["variants_failed"] == {"grpokit[ckpt16]": "not run: the call reached its time limit first"}
    assert out["loss_equality"] == ["grpo/bc=False -0.34 -0.34 0.0"]
    assert out["mismatch"] == {"mismatch/logp_abs_diff_mean": 0.01}
