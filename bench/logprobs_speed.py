"""The training-side forward (and forward + backward) of one rollout's batch, with and without
length buckets, alternated in one process.

    python bench/logprobs_speed.py --model DIR --G 8 --P 8 --T 32 --rounds 3

``plain`` is one forward over the whole padded batch with full logits (what a naive trainer does),
``buckets=1`` is grpokit's chunked head without bucketing, ``auto`` is the default (buckets chosen by
cost, prompts shared by their G rows), ``auto, no sharing`` the default with prompt sharing off.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload import micro_bench_setup  # noqa: E402


def main(argv=None):
    a, model, tok, ids = micro_bench_setup(argv)
    from grpokit.rollout.hf import SamplingParams, generate
    from grpokit.train.logprobs import completion_logprobs, make_token_batch

    ro = generate(
        model.eval(),
        ids,
        a.G,
        SamplingParams(max_new_tokens=a.T),
        eos_token_ids={tok.eos_token_id},
        pad_token_id=tok.pad_token_id,
        generator=torch.Generator().manual_seed(0),
    )
    batch = make_token_batch(ro, tok.pad_token_id)
    m = batch.completion_mask

    def plain(grad):
        with torch.set_grad_enabled(grad):
            T = batch.width
            logits = model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                logits_to_keep=T + 1,
            ).logits[:, :-1]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, batch.completion_ids[..., None])[..., 0]
            if grad:
                (lp * m).sum().backward()

    import grpokit.train.logprobs as L

    sharing = L.PROMPT_SHARING_TYPES

    def ours(buckets, share=True):
        def run(grad):
            L.PROMPT_SHARING_TYPES = sharing if share else ()
            with torch.set_grad_enabled(grad):
                lp, _ = completion_logprobs(model, batch, buckets=buckets, with_entropy=grad)
                if grad:
                    (lp * m).sum().backward()

        return run

    variants = {"plain": plain, "buckets=1": ours(1), "auto": ours(None), "auto, no sharing": ours(None, share=False)}
    res = {}
    for grad in (False, True):
        model.train(grad)
        for f in variants.values():
            f(grad)
        times = {k: [] for k in variants}
        for _ in range(a.rounds):
            for k, f in variants.items():
                model.zero_grad(set_to_none=True)
                t = time.perf_counter()
                f(grad)
                times[k].append(time.perf_counter() - t)
        res["fwd_bwd" if grad else "fwd_nograd"] = {k: statistics.median(v) for k, v in times.items()}
    lengths = [len(c) for c in ro.completion_ids]
    print("BENCH_JSON " + json.dumps({"G": a.G, "P": a.P, "T": a.T, "mean_len": sum(lengths) / len(lengths), **res}))


if __name__ == "__main__":
    main()
