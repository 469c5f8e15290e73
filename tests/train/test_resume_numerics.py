"""Each checkpoint keeps what its sums depended on (torch, threads, the CPU's instruction sets, the float32
linears' kernels: train/numerics.py); a resume that computes differently says so once. A job preempted on
one node type and resumed on another continues the same experiment but not bit for bit, and before this
nothing said so (this project's own VM moved from a Zen 3 to a Zen 5, which changes grpokit.nn.kernels' rule)."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from grpokit.nn import kernels
from grpokit.train import Trainer
from grpokit.train.checkpoint import manifest
from grpokit.train.numerics import differences, matmul_precision, numerics
from helpers.runs import ROWS, likes_a, tiny_cfg


def test_the_record_names_torch_threads_device_and_kernels(tiny_model):
    rec = numerics(tiny_model)
    assert rec["torch"] == torch.__version__ and rec["threads"] == torch.get_num_threads()
    assert rec["device"].startswith("cpu") and rec["float32_linears"] == "torch"  # not routed yet
    assert rec["float32_matmul_precision"] == matmul_precision(torch.device("cpu"))
    if kernels.onednn_available():
        kernels.use_onednn_linears(tiny_model)
        routed = numerics(tiny_model)["float32_linears"]
        assert routed == kernels.rule() and routed.startswith(f"oneDNN from {kernels.MIN_ROWS} rows")


def test_the_record_reads_each_backends_precision_where_torchs_global_getter_raises():
    # grpokit.trl sets TRL's tf32 through the legacy switches; a script that also called the new API would make
    # torch.get_float32_matmul_precision() raise at every checkpoint save (a fresh process: the state is global)
    code = (
        "import torch\n"
        "from grpokit.train.numerics import numerics\n"
        "torch.set_float32_matmul_precision('high')\n"
        "torch.backends.cuda.matmul.allow_tf32 = False\n"
        "try:\n"
        "    torch.get_float32_matmul_precision()\n"
        "    raise SystemExit('the global getter no longer raises here: the test stands for nothing')\n"
        "except RuntimeError:\n"
        "    pass\n"
        "print(numerics(torch.nn.Linear(2, 2))['float32_matmul_precision'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("matmul tf32" if hasattr(torch.backends.mkldnn, "matmul") else "default")


def test_the_sentence_names_each_difference_and_nothing_else():
    then = {"torch": "2.13.0", "threads": 2, "device": "cpu AuthenticAMD avx2 fma", "float32_linears": "torch"}
    assert differences(then, dict(then)) is None
    assert differences(None, then) is None  # a checkpoint from before the record
    now = {**then, "device": "cpu AuthenticAMD avx2 fma avx512f", "threads": 4}
    assert differences(then, now) == (
        "it was written by a process that computed differently (device 'cpu AuthenticAMD avx2 fma' then, "
        "'cpu AuthenticAMD avx2 fma avx512f' now; threads 2 then, 4 now), so the resumed run continues the same "
        "experiment but its sums round differently: it will not match the uninterrupted run bit for bit"
    )


def test_a_resume_on_other_kernels_warns_once_and_on_the_same_says_nothing(tiny_model_dir, tmp_path, capsys):
    def trainer(steps, resume=None):
        cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{"train.steps": steps, "train.save_every": 1})
        cfg.data.dataset = ""
        return Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], resume=resume)

    trainer(2).train()
    state_file = tmp_path / "run" / "checkpoints" / "step-000002" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["numerics"]["torch"] == torch.__version__ and state["numerics"]["threads"] == 1  # train.threads=1
    capsys.readouterr()
    trainer(3, resume=tmp_path / "run").train()
    assert "computed differently" not in capsys.readouterr().out  # the same machine and settings
    ckpt = tmp_path / "run" / "checkpoints" / "step-000003"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state["numerics"]["device"] = "cpu OtherVendor avx2"  # as if written on another node type
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    (ckpt / "manifest.json").write_text(json.dumps({**manifest(ckpt), "model_only": False}, indent=1))  # checksums true
    trainer(4, resume=tmp_path / "run").train()
    out = capsys.readouterr().out
    assert out.count("computed differently") == 1
    assert "grpokit: warning: resuming from " in out and "device 'cpu OtherVendor avx2' then" in out


def test_a_resume_with_an_async_worker_taking_threads_says_nothing(tiny_model_dir, tmp_path, capsys):
    # the worker takes some of the trainer's threads when the engine starts: the record is taken after that, on
    # both sides of the resume (before, a resume compared the full count with the saved split one and warned)
    def trainer(steps, resume=None):
        over = {"train.steps": steps, "train.save_every": 1, "train.threads": 2}
        cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **over, **{"rollout.async_staleness": 1})
        cfg.rollout.async_workers, cfg.data.dataset = 1, ""
        return Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], resume=resume)

    trainer(2).train()
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert saved["numerics"]["threads"] == 1  # the trainer's share of the 2
    capsys.readouterr()
    trainer(3, resume=tmp_path / "run").train()
    assert "computed differently" not in capsys.readouterr().out
