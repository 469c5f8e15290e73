"""What the toy models hide, tested on a real one: SmolLM2-135M-Instruct.

Its tokenizer has a chat template that adds a default system prompt, one token that is both EOS and
padding (``<|im_end|>``, id 2), a BOS (``<|im_start|>``) that the template already writes, right padding
by default, and a 49,152-token vocabulary. The tests use tiny batches and few tokens; the ones that
train are marked slow. Each runs torch on one thread (on a shared 2-core machine two threads were
3x slower than one).
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.config.sections import DataConfig
from grpokit.data.prompts import to_prompts
from grpokit.rollout.hf import SamplingParams, generate

QUESTION = [{"role": "user", "content": "What is 2 + 2? Answer with only the number."}]
CHATTY = [{"role": "user", "content": "Say hi."}]  # greedy: "Hello there! I'm here to help ..." (longer than 12 tokens)
EOS = 2  # <|im_end|>: SmolLM2's EOS and its pad token


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(
        smollm2_dir
    )


def test_chat_template_default_system_prompt_and_no_second_bos(smollm2):
    _, tok = smollm2
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (EOS, EOS, 1)
    plain = to_prompts([{"prompt": QUESTION}], tok, DataConfig())[0]
    # the template's own system prompt when the row has none (as TRL renders it), and the template's ids exactly:
    # no BOS added in front of the template's <|im_start|>
    assert plain.text.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    )
    assert plain.ids == tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert plain.ids[0] == 1 and plain.ids[1] != 1 and plain.text.endswith("<|im_start|>assistant\n")
    own = to_prompts([{"prompt": QUESTION}], tok, DataConfig(system_prompt="Be brief."))[0]
    assert (
        own.text.startswith("<|im_start|>system\nBe brief.<|im_end|>") and "SmolLM" not in own.text
    )  # replaced, not added


@pytest.mark.parametrize("engine", ["static", "dynamic", "generate"])
def test_every_engine_stops_on_eos_and_counts_the_token_limit(smollm2, engine):
    model, tok = smollm2
    prompts = [
        tok.apply_chat_template(q, add_generation_prompt=True, tokenize=True, return_dict=False)
        for q in (QUESTION, CHATTY)
    ]
    assert len(prompts[0]) != len(prompts[1])  # padded in one batch: left padding with the EOS id must not leak
    ro = generate(
        model,
        prompts,
        1,
        SamplingParams(max_new_tokens=12, temperature=0.0),
        eos_token_ids={EOS},
        pad_token_id=tok.pad_token_id,
        engine=engine,
    )
    assert ro.finish_reasons == ["eos", "length"]
    assert tok.decode(ro.completion_ids[0]) == "2 + 2 = 4<|im_end|>"  # stops at EOS, the EOS kept, nothing after it
    assert ro.completion_ids[0].count(EOS) == 1 and ro.completion_ids[0][-1] == EOS
    assert len(ro.completion_ids[1]) == 12 and EOS not in ro.completion_ids[1]  # cut at the limit: truncated
    alone = generate(
        model,
        prompts[1:],
        1,
        SamplingParams(max_new_tokens=12, temperature=0.0),
        eos_token_ids={EOS},
        pad_token_id=tok.pad_token_id,
        engine=engine,
    )
    assert alone.completion_ids[0] == ro.completion_ids[1]  # the shorter prompt, padded, decodes as it does alone


def train(model_dir, out, *overrides, quiet=True):
    from grpokit.train import Trainer

    cfg = Config()
    apply_overrides(
        cfg,
        [
            f"model.name_or_path={model_dir}",
            "data.task=",
            "data.dataset=unused.jsonl",
            "reward.functions=[]",
            "rollout.group_size=2",
            "rollout.max_new_tokens=6",
            "rollout.temperature=1.0",
            "train.prompts_per_step=2",
            "train.steps=1",
            "optim.lr=1e-5",
            f"train.out={out}",
            "record.sinks=[]",
            "record.report=false",
            "train.threads=1",
            "train.save_every=0",
            *overrides,
        ],
    )
    cfg.data.dataset = ""
    rows = [{"prompt": QUESTION, "answer": "4"}, {"prompt": CHATTY, "answer": "hi"}]
    tr = Trainer(
        cfg,
        reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]],
        train_rows=rows,
        eval_rows=rows,
        quiet=quiet,
    )
    return tr, tr.train()


@pytest.fixture(scope="module")
def static_run(smollm2_dir, tmp_path_factory):
    """(trainer, run folder, console output) of one run with the static engine, shared by the tests that
    only read it: the static case of the log-prob agreement, and the checkpoint and evaluation checks."""
    out, printed = tmp_path_factory.mktemp("static") / "run", io.StringIO()
    with contextlib.redirect_stdout(printed):
        tr, _ = train(smollm2_dir, out, "rollout.engine=static", quiet=False)
    return tr, out, printed.getvalue()


def _step(out):
    return next(json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"reward"' in line)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["static", "dynamic"])
def test_sampler_and_trainer_logprobs_agree_and_truncation_is_counted(smollm2_dir, tmp_path, engine, request):
    if engine == "static":
        run = request.getfixturevalue("static_run")[1]
    else:
        run = tmp_path / "run"
        train(smollm2_dir, run, f"rollout.engine={engine}")
    m = _step(run)
    # the decode loop's log-probs (a KV cache, one position at a time) against the update's full forward
    # (chunked, 49,152-way softmax), float32: equal to ~1e-5 per token
    assert m["mismatch/logp_abs_diff_max"] < 1e-3 and m["mismatch/k3_kl"] < 1e-6, m
    assert m["mismatch/outside_fraction"] == 0.0
    # 6 new tokens: the chatty prompt's completions all hit the limit (at least half the rows)
    assert 0.5 <= m["completions/clipped_ratio"] <= 1.0


@pytest.mark.slow
def test_generate_engine_has_no_sampling_logprobs_to_compare(smollm2_dir, tmp_path):
    train(smollm2_dir, tmp_path / "run", "rollout.engine=generate")
    m = _step(tmp_path / "run")
    assert not [k for k in m if k.startswith("mismatch/")]  # nothing measured rather than a made-up figure
    assert 0.5 <= m["completions/clipped_ratio"] <= 1.0


@pytest.mark.slow
def test_a_checkpoint_loads_in_transformers_and_evaluation_shows_progress(smollm2_dir, static_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.nn import kernels

    tr, run, out = static_run
    # the held-out evaluation before the first step (and after the last) says what it does and how far it is
    assert "grpokit: held-out evaluation: 2 prompts, greedy, up to 6 new tokens" in out
    assert out.count("grpokit: held-out evaluation: 2/2 prompts, accuracy so far") == 2
    ckpt = next((run / "checkpoints").iterdir()) / "model"
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok.chat_template and (tok.eos_token_id, tok.pad_token_id) == (EOS, EOS)
    assert model.generation_config.eos_token_id == EOS
    ids = torch.tensor(
        [tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True, return_dict=False)]
    )
    saved, own = model.state_dict(), tr.model.state_dict()
    assert saved.keys() == own.keys() and all(torch.equal(saved[k], own[k]) for k in saved)  # the trained weights
    if any(kernels.is_routed(m) for m in tr.model.modules()):  # the same float32 kernels as the trainer's model
        kernels.use_onednn_linears(model)
    with torch.no_grad():
        trained = tr.model.eval()(ids).logits
        assert torch.allclose(model(ids).logits, trained, atol=1e-4)
        start = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()(ids).logits
    assert not torch.allclose(start, trained, atol=1e-6)


@pytest.mark.slow
def test_lora_trains_only_adapters_and_they_load_on_the_base(smollm2_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tr, _ = train(smollm2_dir, tmp_path / "run", "model.lora_rank=4", "model.lora_alpha=8", "optim.lr=1e-2")
    trainable = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ckpt = next((tmp_path / "run" / "checkpoints").iterdir()) / "model"
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, ckpt).eval()
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, tr.model.eval()(ids).logits, atol=1e-4)
        plain = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()(ids).logits
    assert not torch.allclose(plain, loaded(ids).logits, atol=1e-6)  # the adapters moved something
