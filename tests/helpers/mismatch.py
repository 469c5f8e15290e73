"""A one-step trainer on the default demo and a vLLM stand-in that samples with the trainer's own model
(with a log-probability shift), for the sampler/trainer mismatch tests."""

import torch

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.rollout.hf import generate


def mismatch_trainer(tmp_path, **over):
    from grpokit.train import Trainer

    base = {
        "train.steps": 1,
        "train.prompts_per_step": 2,
        "rollout.group_size": 4,
        "data.eval_size": 4,
        "record.sinks": "[jsonl]",
        "record.report": "false",
        "train.threads": 1,
        "train.out": str(tmp_path / "run"),
    }
    cfg = apply_overrides(Config(), [f"{k}={v}" for k, v in {**base, **over}.items()])
    return Trainer(cfg, quiet=True)


class RecordingLLM:
    """vLLM's ``LLM`` as the colocated engine calls it, sampling with the trainer's own model and
    returning vLLM-shaped outputs whose logprobs are the ones recorded while sampling, plus ``shift``
    nats (a sampler with other numerics). Sleep / wake / weight sync are no-ops."""

    def __init__(self, tr, shift: float):
        self.tr, self.shift = tr, shift

    def generate(self, prompts, sp, use_tqdm=False):
        from types import SimpleNamespace as NS

        ids = [p["prompt_token_ids"] for p in prompts]
        ro = generate(
            self.tr.model,
            ids,
            sp.n,
            self.tr.params,
            eos_token_ids=self.tr.eos,
            pad_token_id=self.tr.tokenizer.pad_token_id,
            generator=torch.Generator().manual_seed(1),
        )
        outs = []
        for i in range(len(ids)):
            rows = range(i * sp.n, (i + 1) * sp.n)
            outs.append(
                NS(
                    outputs=[
                        NS(
                            index=g,
                            token_ids=ro.completion_ids[r],
                            finish_reason="length" if ro.finish_reasons[r] == "length" else "stop",
                            stop_reason=None,
                            logprobs=[
                                {t: NS(logprob=lp + self.shift)}
                                for t, lp in zip(ro.completion_ids[r], ro.sampling_logprobs[r])
                            ],
                        )
                        for g, r in enumerate(rows)
                    ]
                )
            )
        return outs

    def sleep(self, level):
        pass

    def wake_up(self, tags=None):
        pass

    def apply_model(self, fn):
        return None

    def reset_prefix_cache(self):
        pass
