"""One rollout of the real-model workload (SmolLM2-135M-Instruct, chat prompts, P x G rows, T new
tokens) on grpokit's static engine, as the trainer runs it (oneDNN linears on AMD CPUs): wall time
of the prefill, of each decode step and of the sampling, against bench/decode_bound.py's bound, and
torch.profiler's operators over a window of decode steps (record_shapes: the head's matmul apart
from the layers').

    PYTHONPATH=src python bench/decode_profile.py --P 2 --G 8 --T 64 --threads 2 --rounds 3

``--no-eos`` decodes all T steps on every row (a fixed amount of work per rollout, for comparing
two versions of the step); without it rows end at EOS as in training. ``--set NAME=VALUE`` sets a
module attribute of grpokit before the rollouts (e.g. ``grpokit.rollout.hf.COMPACT_FRACTION=0.5``),
and ``--ab NAME=VALUE[;NAME=VALUE]`` adds a side with those settings, its rounds alternated with the
default's (bench/alternate.py) in one process: e.g. ``--ab grpokit.nn.kernels.RMS_NORMS=[]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternate import turns  # noqa: E402
from decode_bound import linear_params  # noqa: E402
from workload import chat_prompts, smollm2_dir  # noqa: E402


class Spans:
    """Seconds and calls per wrapped function."""

    def __init__(self):
        self.s, self.n = {}, {}

    def wrap(self, owner, name: str, label: str):
        inner = getattr(owner, name)

        def timed(*args, **kw):
            t = time.perf_counter()
            with torch.profiler.record_function(label):
                out = inner(*args, **kw)
            self.s[label] = self.s.get(label, 0.0) + time.perf_counter() - t
            self.n[label] = self.n.get(label, 0) + 1
            return out

        setattr(owner, name, timed)


def load(threads: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.nn import kernels

    torch.set_num_threads(threads)
    path = smollm2_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if kernels.wants_onednn("auto", torch.device("cpu")):
        kernels.use_onednn_linears(model)
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok


def prompt_ids(tok, P: int) -> list[list[int]]:
    rows = chat_prompts()[:P]
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _setting(spec: str) -> None:
    name, value = spec.split("=", 1)
    mod, attr = name.rsplit(".", 1)
    setattr(importlib.import_module(mod), attr, json.loads(value) if value[:1] in '0123456789-[{tf"' else value)


def _current(spec: str) -> str:
    """``NAME=current value`` for a ``NAME=VALUE`` setting."""
    name = spec.split("=", 1)[0]
    mod, attr = name.rsplit(".", 1)
    return f"{name}={json.dumps(getattr(importlib.import_module(mod), attr))}"


def _summary(rounds: list[dict]) -> dict:
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    return {
        "median": med,
        "tok_s": [round(r["tok_s"], 1) for r in rounds],
        "decode_step_ms": round(1e3 * med["decode_step"] / max(med["steps"], 1), 2),
        "sample_ms": round(1e3 * med["sample"] / (med["steps"] + 1), 2),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("P", 2), ("G", 8), ("T", 64), ("threads", 2), ("rounds", 3), ("profile_steps", 8)):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    p.add_argument("--no-eos", action="store_true")
    p.add_argument("--rows", type=int, default=30, help="profiler table rows")
    p.add_argument("--set", action="append", default=[])
    p.add_argument(
        "--ab",
        action="append",
        default=[],
        help="NAME=VALUE[;NAME=VALUE]: one more side with these settings, rounds alternated (repeatable)",
    )
    a = p.parse_args(argv)
    for s in a.set:
        _setting(s)
    from grpokit.rollout import hf, static
    from grpokit.rollout.sampling import SamplingParams

    model, tok = load(a.threads)
    ids = prompt_ids(tok, a.P)
    spans = Spans()
    spans.wrap(hf, "_prefill", "prefill")
    spans.wrap(static.StaticDecoder, "step", "decode_step")
    spans.wrap(hf, "sample_tokens", "sample")
    spans.wrap(hf, "_record", "record")
    params = SamplingParams(max_new_tokens=a.T)
    eos = set() if a.no_eos else {tok.eos_token_id}

    def rollout(seed):
        gen = torch.Generator().manual_seed(seed)
        return hf.generate(model, ids, a.G, params, eos_token_ids=eos, pad_token_id=tok.pad_token_id, generator=gen)

    rollout(0)  # warm-up: oneDNN kernels for each row count
    sides = {"default": []} | {f"ab {x}": x.split(";") for x in a.ab}
    settings = [x for side in sides.values() for x in side]
    defaults = {x: _current(x) for x in settings}
    rounds = {k: [] for k in sides}
    for r, side in turns(list(sides), a.rounds):
        for x in settings:
            _setting(defaults[x])
        for x in sides[side]:
            _setting(x)
        spans.s, spans.n = {}, {}
        t = time.perf_counter()
        ro = rollout(100 + r)
        dt = time.perf_counter() - t
        toks = sum(len(c) for c in ro.completion_ids)
        rounds[side].append({"s": dt, "tokens": toks, "tok_s": toks / dt, **spans.s, "steps": spans.n["decode_step"]})
    rec = {
        "P": a.P,
        "G": a.G,
        "T": a.T,
        "threads": torch.get_num_threads(),
        "no_eos": a.no_eos,
        "load": os.getloadavg(),
        "prompt_lens": [len(x) for x in ids],
        "step_gflop": round(2 * linear_params(model.config) * a.P * a.G / 1e9, 3),
        "sides": {k: _summary(v) for k, v in rounds.items()},
    }
    print("BENCH_JSON " + json.dumps(rec), flush=True)
    for x in settings:
        _setting(defaults[x])
    if a.profile_steps:
        profile(model, rollout, a)


def profile(model, rollout, a) -> None:
    """The operators of ``--profile-steps`` decode steps (with their sampling) a quarter into a rollout."""
    from grpokit.rollout import static

    inner = static.StaticDecoder.step
    state = {"i": 0, "prof": None}
    first = max(1, a.T // 4)

    def step(self, tok, pos):
        state["i"] += 1
        if state["i"] == first:
            state["prof"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
            state["prof"].__enter__()
        elif state["i"] == first + a.profile_steps and state["prof"] is not None:
            state["prof"].__exit__(None, None, None)
        return inner(self, tok, pos)

    static.StaticDecoder.step = step
    rollout(7)
    static.StaticDecoder.step = inner
    avg = state["prof"].key_averages(group_by_input_shape=True)
    print(f"== {a.profile_steps} decode steps with their sampling, by operator and input shapes")
    print(avg.table(sort_by="self_cpu_time_total", row_limit=a.rows, max_name_column_width=40))
    print(state["prof"].key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
