"""grpokit eval: pass@k / maj@k / mean@k from scripted completions, against hand-computed values."""

import json

import pytest

from grpokit import eval_cli
from grpokit.tasks import get_task
from grpokit.types import Rollout


def test_eval_matches_hand_computed_values(monkeypatch, tmp_path, capsys):
    rows = get_task("arithmetic").held_out_rows(2)
    gold = [r["answer"] for r in rows]
    wrong = [str(int(g) + 1) for g in gold]
    # prompt 0: right, wrong, wrong, right  (c = 2 of n = 4); answers g0 w0 w0 g0
    # prompt 1: wrong x4 (c = 0), all the same wrong answer
    script = [[gold[0], wrong[0], wrong[0], gold[0]], [wrong[1]] * 4]

    def fake_generate(model, prompt_ids, n, params, *, eos_token_ids, pad_token_id, generator=None, decode=None):
        from grpokit.models import load_tokenizer
        from grpokit.config import ModelConfig

        tok = load_tokenizer(ModelConfig())
        texts = [f"<answer>{a}</answer>" for p in range(len(prompt_ids)) for a in script[p]]
        ids = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
        return Rollout(prompt_ids, ids, [[0.0] * len(i) for i in ids], ["eos"] * len(ids), n)

    monkeypatch.setattr(eval_cli, "generate", fake_generate)
    out = tmp_path / "eval.json"
    assert eval_cli.main(["--limit", "2", "--k", "1,2,4", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    # pass@1 = mean(c/n) = (2/4 + 0)/2 = 0.25
    # pass@2: prompt 0 -> 1 - C(2,2)/C(4,2) = 1 - 1/6 = 0.83333; prompt 1 -> 0; mean 0.41667
    # pass@4: prompt 0 -> 1; prompt 1 -> 0; mean 0.5
    assert res["pass@1"] == pytest.approx(0.25)
    assert res["pass@2"] == pytest.approx(0.41667, abs=1e-4)
    assert res["pass@4"] == pytest.approx(0.5)
    # maj@1: first answers g0 (right), w1 (wrong) -> 0.5
    # maj@4: prompt 0 tie g0:2 w0:2, first seen (g0) wins -> right; prompt 1 wrong -> 0.5
    # mean@2: prompt 0 (1 + 0)/2 = 0.5, prompt 1 0 -> 0.25
    assert res["maj@1"] == pytest.approx(0.5) and res["maj@4"] == pytest.approx(0.5)
    assert res["mean@2"] == pytest.approx(0.25)
    assert "pass@k" in capsys.readouterr().out


def test_eval_rejects_bad_k():
    from grpokit.config import ConfigError

    with pytest.raises(ConfigError, match="--samples 2 is smaller than the largest k"):
        eval_cli.run_eval(eval_cli.parse_args(["--k", "1,4", "--samples", "2"]))
