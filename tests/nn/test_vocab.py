"""nn/vocab.py: the Triton passes over (rows, vocabulary) logits, run on CPU by Triton's interpreter
(TRITON_INTERPRET=1) against torch's ops, and compiled for the cards they run on."""

import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")  # a dev dependency (pyproject's dev extra)

import grpokit.train.head as H  # noqa: E402
from grpokit.config.sections import ConfigError  # noqa: E402
from grpokit.nn import vocab  # noqa: E402


@pytest.fixture
def interpret(monkeypatch):
    """The kernels under Triton's interpreter, which runs them on CPU tensors (conftest.py turns it on
    before triton is imported); a small block so that every row takes several blocks (the running
    sums' rescaling is exercised)."""
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter runs on CPU-only machines; on a card tests/project/test_gpu.py runs the kernels")
    monkeypatch.setattr(vocab, "BLOCK", 16)
    sys.modules.pop("grpokit.nn.vocab_kernels", None)
    vocab._kernels.cache_clear()
    yield
    monkeypatch.undo()  # a test's own patches of vocab first
    sys.modules.pop("grpokit.nn.vocab_kernels", None)
    vocab._kernels.cache_clear()
    vocab.probe.cache_clear()


def test_draws_follow_softmax_at_the_temperature_and_log_probabilities_are_exact(interpret, monkeypatch):
    # x / T = (ln 9, 0 x 9, -inf x 3) at T = 1/4: p = (9, 1 x 9, 0 x 3) / 18. Wrong draws give other
    # frequencies for token 0: ~0.74 with the noise's sign flipped (argmax x - g), 9^(1/4) / (9^(1/4) + 9)
    # = 0.16 without the temperature. One block of 16 a row: the interpreter takes ~8 ms a block.
    monkeypatch.setattr(vocab, "BLOCK", 16)
    x = torch.full((400, 13), float("-inf"))
    x[:, :10] = 0.0
    x[:, 0] = math.log(9) / 4
    tok, logp = vocab.sample(x, 0.25, torch.Generator().manual_seed(0))
    freq = torch.bincount(tok, minlength=13) / 400
    # a frequency's standard deviation is at most sqrt(1/4 / 400) = 0.025: 0.08 is ~3.2 of them
    assert freq[0].item() == pytest.approx(0.5, abs=0.08)
    assert freq[1:10].tolist() == pytest.approx([1 / 18] * 9, abs=0.04)  # sd 0.011 each
    assert freq[10:].sum() == 0
    want = torch.tensor([math.log(0.5)] + [math.log(1 / 18)] * 12)[tok]
    assert torch.allclose(logp, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_log_probabilities_equal_torch_on_random_logits(interpret, dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(6, 50, generator=g) * 4).to(dtype)
    x[0, 5] = float("-inf")
    tok, logp = vocab.sample(x, 0.7, torch.Generator().manual_seed(2))
    want = torch.log_softmax(x.float() / 0.7, dim=-1).gather(1, tok[:, None])[:, 0]
    assert tok.dtype == torch.int64 and logp.dtype == torch.float32
    assert torch.allclose(logp, want, atol=1e-5, rtol=0)
    assert tok[0] != 5


def test_one_generator_state_gives_one_set_of_tokens_and_a_nan_row_a_nan(interpret):
    x = torch.randn(8, 40, generator=torch.Generator().manual_seed(3))
    draw = lambda seed: vocab.sample(x, 1.0, torch.Generator().manual_seed(seed))
    assert torch.equal(draw(4)[0], draw(4)[0])
    assert not torch.equal(draw(4)[0], draw(5)[0])  # 8 rows of 40 tokens: equal by chance ~ never
    # the same row in another row's place draws from its own Philox key: rows are not copies
    same = vocab.sample(x[:1].repeat(8, 1), 1.0, torch.Generator().manual_seed(4))[0]
    assert len(set(same.tolist())) > 1
    x[2, 7] = float("nan")
    logp = vocab.sample(x, 1.0, torch.Generator().manual_seed(4))[1]
    assert math.isnan(logp[2]) and not logp[[0, 1, 3]].isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logsumexp_logp_and_entropy_equal_torch(interpret, dtype, temperature):
    g = torch.Generator().manual_seed(5)
    z = (torch.randn(5, 45, generator=g) * 3).to(dtype)
    z[1, :30] = float("-inf")  # a row whose first blocks are all -inf
    t = torch.randint(30, 45, (5,), generator=g)
    lse, logp, ent = vocab.logsumexp(z, t, temperature, with_entropy=True)
    zf = z.float() / temperature
    lsm = torch.log_softmax(zf, dim=-1)
    assert torch.allclose(lse, torch.logsumexp(zf, -1), atol=1e-5, rtol=0)
    assert torch.allclose(logp, lsm.gather(1, t[:, None])[:, 0], atol=1e-5, rtol=0)
    want_ent = -(lsm.exp() * lsm.nan_to_num(neginf=0.0)).sum(-1)
    assert torch.allclose(ent, want_ent, atol=1e-5, rtol=0)
    assert vocab.logsumexp(z, t, temperature, with_entropy=False)[2] is None


def test_hand_example_of_the_logit_gradient(interpret):
    # z = (ln 3, 0), T = 1: p = (3/4, 1/4), target 0, g = 2: dz = 2 (1 - 3/4, -1/4) = (1/2, -1/2)
    z = torch.tensor([[math.log(3.0), 0.0]])
    t, g = torch.tensor([0]), torch.tensor([2.0])
    lse, _, _ = vocab.logsumexp(z, t, 1.0, with_entropy=False)
    assert lse.item() == pytest.approx(math.log(4.0), abs=1e-6)
    assert vocab.logit_grad_(z, t, lse, g, 1.0)[0].tolist() == pytest.approx([0.5, -0.5], abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logit_gradient_equals_autograd(interpret, dtype):
    g = torch.Generator().manual_seed(6)
    z = (torch.randn(4, 40, generator=g) * 3).to(dtype)
    t = torch.randint(0, 40, (4,), generator=g)
    up = torch.randn(4, generator=g)
    lse, _, _ = vocab.logsumexp(z, t, 0.8, with_entropy=False)
    ours = vocab.logit_grad_(z.clone(), t, lse, up, 0.8)
    zr = z.float().requires_grad_()
    (torch.log_softmax(zr / 0.8, -1).gather(1, t[:, None])[:, 0] * up).sum().backward()
    assert ours.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 2e-2  # the gradient is written in the logits' dtype
    assert torch.allclose(ours.float(), zr.grad, atol=tol, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_the_marked_head_equals_its_torch_path(interpret, monkeypatch, dtype, bias):
    monkeypatch.setattr(H, "FUSED_DEVICES", ("cpu",))
    g = torch.Generator().manual_seed(7)
    K, D, V = 9, 6, 37
    head = torch.nn.Linear(D, V, bias=bias).to(dtype)
    h0 = torch.randn(K, D, generator=g).to(dtype)
    t = torch.randint(0, V, (K,), generator=g)
    up = torch.randn(K, generator=g)
    runs = []
    for on in (False, True):
        setattr(head, vocab.MARK, on)
        head.zero_grad()
        h = h0.clone().requires_grad_()
        lp, ent = H.head_logprobs(head, h, t, chunk=4, temperature=0.9, with_entropy=True)
        (lp * up).sum().backward()
        runs.append([lp, ent, h.grad, *(p.grad for p in head.parameters())])
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for a, b in zip(*runs):
        assert torch.allclose(a.float(), b.float(), atol=tol, rtol=tol)


def test_a_marked_model_samples_with_the_kernel_and_the_trainer_agrees(interpret, tiny_model, monkeypatch):
    from grpokit.rollout.hf import SamplingParams, generate
    from grpokit.train.logprobs import completion_logprobs
    from grpokit.train.token_batch import make_token_batch

    drawn = []
    real = vocab.sample
    monkeypatch.setattr(vocab, "sample", lambda *a: drawn.append(1) or real(*a))
    vocab.mark(tiny_model, True)
    prompts = [[1, 2, 3], [4, 5]]
    r = generate(
        tiny_model,
        prompts,
        3,
        SamplingParams(max_new_tokens=5, temperature=0.8),
        eos_token_ids=set(),
        pad_token_id=0,
        generator=torch.Generator().manual_seed(0),
    )
    assert len(drawn) == 5  # every step drew with the kernel
    batch = make_token_batch(r, pad_token_id=0)
    with torch.no_grad():
        lp = completion_logprobs(tiny_model, batch, temperature=0.8)[0]
    sampled = torch.tensor(r.sampling_logprobs)
    assert torch.allclose(lp, sampled, atol=1e-5, rtol=0)


def test_model_vocab_kernels_resolves_and_refuses_with_the_reason():
    cpu = torch.device("cpu")
    assert vocab.wanted("auto", cpu) is False and vocab.wanted("torch", cpu) is False
    with pytest.raises(ConfigError, match=r"model.vocab_kernels='triton' needs a CUDA device.*device is cpu"):
        vocab.wanted("triton", cpu)
    model = torch.nn.Module()
    assert not vocab.marked(model)  # no output layer: nothing to mark


def test_kernels_that_fail_to_build_leave_auto_on_torch_and_refuse_triton(interpret, monkeypatch, capsys):
    cpu = torch.device("cpu")
    vocab.probe.cache_clear()
    assert vocab.probe(cpu) is None  # the real kernels build and run (here in the interpreter)

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("PassManager::run failed")

            return launch

    monkeypatch.setattr(vocab, "_kernels", lambda: types.SimpleNamespace(sample=Broken(), logsumexp=Broken()))
    vocab.probe.cache_clear()
    why = vocab.probe(cpu)
    assert why == "Triton could not build or run grpokit's kernels (RuntimeError: PassManager::run failed)"
    cuda = torch.device("cuda")  # as a card would see it: Triton imports, the probe fails
    monkeypatch.setattr(vocab, "usable_for", lambda dtype, device: True)
    monkeypatch.setattr(vocab, "probe", lambda device: why)
    assert vocab.wanted("auto", cuda) is False
    assert capsys.readouterr().out == f"grpokit: model.vocab_kernels=auto: {why}; torch's ops run\n"
    with pytest.raises(ConfigError, match=r"PassManager::run failed\); set model.vocab_kernels=auto or torch"):
        vocab.wanted("triton", cuda)


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from grpokit.nn import vocab, vocab_kernels as vk

common = {"stride": "i32", "V": "i32", "inv_t": "fp32", "BLOCK": "constexpr", "WITH_ENT": "constexpr"}
for cap in (80, 90):
    for dt in ("bf16", "fp16", "fp32"):
        kernels = [
            (vk.sample_kernel, {"x_ptr": "*" + dt, "seed_ptr": "*i64", "tok_ptr": "*i64", "logp_ptr": "*fp32"}, {}),
            (vk.logit_grad_kernel, {"z_ptr": "*" + dt, "tgt_ptr": "*i64", "lse_ptr": "*fp32", "g_ptr": "*fp32"}, {}),
        ] + [
            (
                vk.logsumexp_kernel,
                {"z_ptr": "*" + dt, "tgt_ptr": "*i64", "lse_ptr": "*fp32", "logp_ptr": "*fp32", "ent_ptr": "*fp32"},
                {"WITH_ENT": ent},
            )
            for ent in (False, True)
        ]
        for fn, ptrs, consts in kernels:
            sig = {n: {**ptrs, **common}[n] for n in fn.arg_names}
            src = ASTSource(fn=fn, signature=sig, constexprs={"BLOCK": vocab.BLOCK, **consts})
            assert triton.compile(src, target=GPUTarget("cuda", cap, 32)).asm["cubin"]
        print("compiled", cap, dt)
"""


def test_the_kernels_compile_for_ampere_and_hopper():
    """Triton compiles to a cubin without a GPU when given the target: the kernels' types hold in the
    compiler, not only in the interpreter (which is lenient about them). Its own process: the
    interpreter, on in this one, replaces the functions the compiler inlines."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    paths = [str(Path(vocab.__file__).parents[2]), str(Path(triton.__file__).parents[1])]  # src, triton's site
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    out = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:-1] == [f"compiled {c} {d}" for c in (80, 90) for d in ("bf16", "fp16", "fp32")]
