"""One rank of a 2-process ``torchrun`` run of TRL's or grpokit.trl's GRPOTrainer (one step on CPU, gloo), for
tests/trl/test_trl_processes.py: writes ``rank<N>.json`` into OUT with the process group's timeout and the
warnings logged about a timeout.

    python -m torch.distributed.run --standalone --nproc_per_node 2 ddp_timeout_worker.py LIB MODEL OUT DDP USE_CPU

DDP: ddp_timeout in seconds, or "-" for transformers' default; USE_CPU: 1 or 0 (then bf16=False, TRL's default
bf16 needs a GPU)."""

import importlib
import json
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(lib: str, model: str, out: str, ddp: str, use_cpu: str) -> None:
    from datasets import Dataset

    from helpers.trl_models import small_args
    from helpers.trl_runs import PROMPTS

    torch.set_num_threads(1)
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    trl = importlib.import_module(lib)
    kw = {} if ddp == "-" else {"ddp_timeout": int(ddp)}
    kw.update({} if use_cpu == "1" else {"bf16": False})
    args = small_args(
        trl.GRPOConfig,
        Path(out) / "run",
        max_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=use_cpu == "1",
        **kw,
    )
    reward = lambda completions, **k: [float(len(c[0]["content"])) for c in completions]  # noqa: E731
    trl.GRPOTrainer(model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(PROMPTS)).train()
    group = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    seen = {"timeout_s": group.options._timeout.total_seconds(), "warnings": [s for s in said if "timeout" in s]}
    (Path(out) / f"rank{dist.get_rank()}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:6])
