"""One process of the two-node test (tests/train/test_multinode.py), started by torchrun.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR; the Trainer joins the gloo group
itself (distributed.setup), runs the scripted steps of test_distributed.py, and global rank 0
saves the trained weights to argv[3].
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, so that helpers imports
from helpers.distributed import OVER, run  # noqa: E402


def main(model_dir: str, out: str, result: str) -> None:
    torch.set_num_threads(1)
    tr, weights = run(model_dir, out, {**OVER, "train.steps": 1})
    if tr.dist.rank == 0:
        torch.save(weights, result)
    assert tr.dist.world_size == 4, tr.dist.world_size
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
