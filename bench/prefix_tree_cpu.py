"""Shared-prefix passes (train.packing=prefix_tree) against padded (prompt sharing) and packed passes:
CPU seconds of one micro-batch's forward and backward, best of ``--rounds``, one thread.

    python bench/prefix_tree_cpu.py --hidden 576 --mlp 1536 --heads 9 --kv-heads 3 --layers 4

A random Llama (no download); P prompts x G episodes, each a ``--prompt``-token prompt, a
``--shared``-token first turn common to the prompt's G episodes and ``--own`` tokens of its own.
CPU time (``time.process_time``) is less moved by other processes than wall time; docs/PERFORMANCE.md
has the figures.
"""

from __future__ import annotations

import argparse
import time

import torch


def main(argv=None):
    import transformers

    from grpokit.train.logprobs import completion_logprobs
    from grpokit.train.prefix_tree import tokens_saved
    from grpokit.train.token_batch import make_token_batch
    from grpokit.types import Rollout

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("hidden", 576), ("mlp", 1536), ("heads", 9), ("kv-heads", 3), ("layers", 4)):
        ap.add_argument(f"--{name}", type=int, default=default)
    for name, default in (("P", 2), ("G", 8), ("prompt", 128), ("shared", 96), ("own", 64), ("rounds", 3)):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = transformers.LlamaConfig(
        vocab_size=2000,
        hidden_size=a.hidden,
        intermediate_size=a.mlp,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=2048,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(cfg)
    draw = lambda n: torch.randint(3, 2000, (n,)).tolist()  # noqa: E731
    prompts, shared = [draw(a.prompt) for _ in range(a.P)], [draw(a.shared) for _ in range(a.P)]
    comps = [shared[i // a.G] + draw(a.own) for i in range(a.P * a.G)]
    rollout = Rollout(prompts, comps, [[0.0] * len(c) for c in comps], ["length"] * len(comps), a.G)
    batch = make_token_batch(rollout, 0)
    print(f"real tokens {int(batch.attention_mask.sum())}, shared-prefix tokens saved {tokens_saved(batch)}")
    for mode in ("padded", "packed", "prefix_tree"):
        best = float("inf")
        for _ in range(a.rounds):
            model.zero_grad()
            t = time.process_time()
            lp, _ = completion_logprobs(
                model, batch, packed=mode == "packed", prefix_tree=mode == "prefix_tree", with_entropy=True
            )
            (lp * batch.completion_mask).sum().backward()
            best = min(best, time.process_time() - t)
        print(f"{mode:12s} {best:.3f} CPU s")


if __name__ == "__main__":
    main()
