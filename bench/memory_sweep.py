"""Peak memory of the logprob + loss + backward stage as vocabulary and completion length grow.

    python bench/memory_sweep.py                      # V in {64, 32k, 128k} x T in {32, 128, 512}

Each point runs in its own process. ``grpokit`` is ``completion_logprobs`` (backbone once, the
output layer in chunks, logits recomputed in the backward pass); ``full`` is the plain way, and
TRL's: one (N, T, V) logits tensor, log-softmax, gather. Reported: the rise of the process's peak
RSS (VmHWM, reset after the model is built) over the RSS before the step, in MB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _kb(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def one(impl: str, V: int, T: int, N: int) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpokit.train.logprobs import completion_logprobs
    from grpokit.types import TokenBatch

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=V,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg)
    Lp = 8
    ids = torch.randint(3, V, (N, Lp + T))
    attn = torch.ones_like(ids)
    pos = torch.arange(Lp + T).expand(N, -1)
    batch = TokenBatch(ids, attn, pos, ids[:, Lp:], torch.ones((N, T)))
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS high-water mark
    before = _kb("VmRSS:")
    if impl == "grpokit":
        logp, _ = completion_logprobs(model, batch, with_entropy=True)
    else:
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, Lp - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    logp.mean().backward()
    return {"impl": impl, "V": V, "T": T, "N": N, "peak_rise_mb": (_kb("VmHWM:") - before) / 1024}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--one", nargs=4, metavar=("IMPL", "V", "T", "N"))
    p.add_argument("--vocabs", default="64,32768,131072")
    p.add_argument("--lengths", default="32,128,512")
    p.add_argument("--N", type=int, default=16)
    a = p.parse_args(argv)
    if a.one:
        print("BENCH_JSON " + json.dumps(one(a.one[0], int(a.one[1]), int(a.one[2]), int(a.one[3]))))
        return
    print(
        "| V | T | N | grpokit peak rise MB | full-logits peak rise MB | (N,T,V) fp32 logits MB |\n"
        "|---|---|---|---|---|---|"
    )
    for V in map(int, a.vocabs.split(",")):
        for T in map(int, a.lengths.split(",")):
            row = {}
            for impl in ("grpokit", "full"):
                out = subprocess.run(
                    [sys.executable, __file__, "--one", impl, str(V), str(T), str(a.N)], capture_output=True, text=True
                )
                line = [x for x in out.stdout.splitlines() if x.startswith("BENCH_JSON ")]
                row[impl] = json.loads(line[0][11:])["peak_rise_mb"] if line else float("nan")
            print(
                f"| {V} | {T} | {a.N} | {row['grpokit']:.0f} | {row['full']:.0f} | {a.N * T * V * 4 / 2**20:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
