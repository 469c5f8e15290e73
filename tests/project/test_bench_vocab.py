"""bench/vocab_kernels.py's harness on CPU (Triton's interpreter, tiny shapes): it runs both sides of each
measurement and its own agreement checks hold; the timings it prints on CPU mean nothing."""

import json
import os
import sys

import pytest

from helpers.paths import ROOT

pytest.importorskip("triton")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter is on where CUDA is not")
def test_the_tiny_run_measures_both_sides_and_they_agree(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import vocab_kernels

    monkeypatch.setattr(sys, "argv", ["vocab_kernels.py"])
    assert vocab_kernels.main(["--tiny", "--json", str(tmp_path / "v.json")]) == 0
    out = json.loads((tmp_path / "v.json").read_text())
    for part in ("sampling", "head"):
        assert out[part]["torch_ms"] > 0 and out[part]["triton_ms"] > 0
        assert out[part]["speedup"] == pytest.approx(out[part]["torch_ms"] / out[part]["triton_ms"])
    assert out["sampling"]["max_abs_logp_diff"] < 1e-5
    assert out["head"]["max_rel_grad_diff"] < 1e-5
