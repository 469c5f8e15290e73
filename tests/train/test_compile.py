"""model.compile (TRL's torch_compile): the log-probability passes run the backbone through torch.compile
with the same values as eager; sampling and the reference stay eager."""

import pytest
import torch

import grpokit.train.hidden_states as hidden_states
from grpokit.config import ConfigError
from helpers.runs import make

GRAPHS = []


def _counting_backend(gm, example_inputs):
    """A torch.compile backend that records each graph it is given and runs it as it is."""
    GRAPHS.append(len(gm.graph.nodes))
    return gm.forward


torch._dynamo.register_backend(name="grpokit_test_counting")(_counting_backend)


def test_compiled_log_probability_passes_equal_eager(tiny_model_dir, tmp_path):
    over = {"train.steps": 2, "algo.num_iterations": 2}  # num_iterations 2: the old-log-prob pass runs too
    eager = make(tiny_model_dir, tmp_path / "eager", **over)
    compiled = make(
        tiny_model_dir,
        tmp_path / "compiled",
        **over,
        **{"model.compile": True, "model.compile_backend": "grpokit_test_counting"},
    )
    assert compiled.model in hidden_states._COMPILED and eager.model not in hidden_states._COMPILED
    assert compiled.ref_model is None or compiled.ref_model not in hidden_states._COMPILED  # the reference stays eager
    GRAPHS.clear()
    a, b = [eager.train_step() for _ in range(2)], [compiled.train_step() for _ in range(2)]
    assert GRAPHS  # dynamo traced the backbone: the passes went through the compiled module
    for x, y in zip(a, b):
        for key in ("loss", "grad_norm", "kl", "ratio/mean", "reward"):
            if key in x:
                assert y[key] == pytest.approx(x[key], rel=1e-5, abs=1e-7), key
    for (n, p), q in zip(eager.model.named_parameters(), compiled.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6), n
    assert "_orig_mod" not in "".join(compiled.model.state_dict())  # checkpoints hold the plain model


def test_compiled_models_keep_plain_linears(tiny_model_dir, tmp_path):
    # oneDNN-routed linears (model.cpu_matmul auto on AMD CPUs) stopped inductor with a LoweringException on the
    # demo model (bench/compile_cost.py); under model.compile every nn.Linear keeps its own forward
    tr = make(
        tiny_model_dir, tmp_path / "c", **{"model.compile": True, "model.compile_backend": "grpokit_test_counting"}
    )
    linears = [m for m in tr.model.modules() if type(m) is torch.nn.Linear]
    assert linears and all("forward" not in m.__dict__ for m in linears)
    with pytest.raises(ConfigError, match=r"^model.compile=true cannot trace model.cpu_matmul='onednn' linears"):
        make(tiny_model_dir, tmp_path / "d", **{"model.compile": True, "model.cpu_matmul": "onednn"})


def test_compile_settings_are_checked(tiny_model_dir, tmp_path):
    with pytest.raises(
        ConfigError, match=r"^model.compile_backend='nope' is not a torch.compile backend; use one of: .*inductor"
    ):
        make(tiny_model_dir, tmp_path / "a", **{"model.compile": True, "model.compile_backend": "nope"})
    with pytest.raises(ConfigError, match=r"^model.compile_mode='fast' is not valid"):
        make(tiny_model_dir, tmp_path / "b", **{"model.compile_mode": "fast"})


def test_trl_torch_compile_arguments_map_as_transformers():
    from grpokit.trl import GRPOConfig
    from grpokit.trl.mapping import to_config

    m = to_config(GRPOConfig("o"), num_rows=8).model
    assert (m.compile, m.compile_backend, m.compile_mode) == (False, "inductor", "default")
    m = to_config(GRPOConfig("o", torch_compile=True), num_rows=8).model
    assert (m.compile, m.compile_backend, m.compile_mode) == (True, "inductor", "default")
    m = to_config(
        GRPOConfig("o", torch_compile_backend="aot_eager", torch_compile_mode="reduce-overhead"), num_rows=8
    ).model
    assert (m.compile, m.compile_backend, m.compile_mode) == (
        True,
        "aot_eager",
        "reduce-overhead",
    )  # a backend turns it on
