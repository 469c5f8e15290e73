"""grpokit eval: pass@k / maj@k / mean@k from scripted completions, against hand-computed values."""

import json

import pytest

from grpokit.cli import eval as eval_cli
from grpokit.data.tasks import get_task
from grpokit.rollout import engine as rollout_engine
from grpokit.types import Rollout
from helpers.reward_columns import spy_reward_columns
from helpers.vision_spy import spy_image_forwards


def test_eval_matches_hand_computed_values(monkeypatch, tmp_path, capsys):
    rows = get_task("arithmetic").held_out_rows(2)
    gold = [r["answer"] for r in rows]
    wrong = [str(int(g) + 1) for g in gold]
    # prompt 0: right, wrong, wrong, right  (c = 2 of n = 4); answers g0 w0 w0 g0
    # prompt 1: wrong x4 (c = 0), all the same wrong answer
    script = [[gold[0], wrong[0], wrong[0], gold[0]], [wrong[1]] * 4]

    def fake_generate(model, prompt_ids, n, params, *, eos_token_ids, pad_token_id, generator=None, decode=None, **kw):
        from grpokit.config import ModelConfig
        from grpokit.train.models import load_tokenizer

        tok = load_tokenizer(ModelConfig())
        texts = [f"<answer>{a}</answer>" for p in range(len(prompt_ids)) for a in script[p]]
        ids = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
        return Rollout(prompt_ids, ids, [[0.0] * len(i) for i in ids], ["eos"] * len(ids), n)

    monkeypatch.setattr(rollout_engine, "generate", fake_generate)
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


def test_eval_reads_the_split_asked_for_and_leaves_ungraded_prompts_out(monkeypatch, tmp_path, capsys):
    """--dataset FOLDER --split test reads the test rows (before: the train rows, whatever the split), and a
    prompt whose gold does not parse (math_accuracy answers None) is left out, not scored wrong."""
    import datasets

    datasets.DatasetDict(
        train=datasets.Dataset.from_list([{"prompt": "0+1=", "answer": "1"}]),
        test=datasets.Dataset.from_list(
            [{"prompt": p, "answer": a} for p, a in (("2+3=", "5"), ("9+9=", "???"), ("3+4=", "7"))]
        ),
    ).save_to_disk(str(tmp_path / "dd"))
    script = [["5", "6"], ["5", "5"], ["7", "7"]]  # per test prompt, its two samples' answers
    seen = []

    def fake_generate(model, prompt_ids, n, params, *, eos_token_ids, pad_token_id, generator=None, decode=None, **kw):
        from grpokit.config import ModelConfig
        from grpokit.train.models import load_tokenizer

        tok = load_tokenizer(ModelConfig())
        seen.extend(tok.decode(p) for p in prompt_ids)
        texts = [f"<answer>{a}</answer>" for p in range(len(prompt_ids)) for a in script[p]]
        ids = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
        return Rollout(prompt_ids, ids, [[0.0] * len(i) for i in ids], ["eos"] * len(ids), n)

    monkeypatch.setattr(rollout_engine, "generate", fake_generate)
    argv = ["--task", "", "--dataset", str(tmp_path / "dd"), "--reward", "math_accuracy", "--k", "1", "--json"]
    assert eval_cli.main([*argv, "--split", "test", "--samples", "2"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert seen == ["2+3=", "9+9=", "3+4="] and (res["prompts"], res["ungraded"]) == (3, 1)
    # graded: 2+3= (1 of 2 right) and 3+4= (2 of 2): pass@1 = (0.5 + 1) / 2 = 0.75; before, 9+9= counted 0: 0.5
    assert res["pass@1"] == pytest.approx(0.75)
    with pytest.raises(eval_cli.ConfigError, match="--split='dev' is not a split of the saved dataset"):
        eval_cli.main([*argv, "--split", "dev"])


def test_eval_rejects_bad_k():
    from grpokit.config import ConfigError

    with pytest.raises(ConfigError, match="--samples 2 is smaller than the largest k"):
        eval_cli.run_eval(eval_cli.parse_args(["--k", "1,4", "--samples", "2"]))


def test_eval_refuses_to_write_over_a_runs_own_files_before_any_work(tmp_path):
    from grpokit.config import ConfigError

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("rollout: {}\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    for name in ("metrics.jsonl", "summary.json", "report.html"):
        with pytest.raises(ConfigError, match=f"is the run's own {name}, which the evaluation would overwrite"):
            eval_cli.run_eval(eval_cli.parse_args(["--model", "no-such-model", "--out", str(run / name)]))
    with pytest.raises(ConfigError, match="is a folder; name a file"):
        eval_cli.run_eval(eval_cli.parse_args(["--model", "no-such-model", "--out", str(run)]))
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_table_on_stdout_json_to_a_file_or_behind_a_flag(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(
        eval_cli,
        "run_eval",
        lambda args: {
            "model": "m",
            "task": "arithmetic",
            "dataset": None,
            "split": None,
            "reward": "task",
            "prompts": 2,
            "samples_per_prompt": 2,
            "temperature": 1.0,
            "top_p": 1.0,
            "max_new_tokens": 16,
            "pass@1": 0.5,
            "maj@1": 0.5,
            "mean@1": 0.5,
        },
    )
    assert eval_cli.main(["--out", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "pass@k" in out and "{" not in out  # the table, no JSON mixed in
    assert "m on task arithmetic (its held-out rows), graded by task: 2 prompts x 2 samples, temperature 1.0" in out
    assert json.loads((tmp_path / "r.json").read_text())["pass@1"] == 0.5
    assert eval_cli.main(["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["maj@1"] == 0.5  # stdout is exactly the JSON


def test_a_grader_without_one_answer_has_no_maj_and_the_line_says_why(monkeypatch, capsys):
    result = {
        **dict(model="m", task=None, dataset="c.jsonl", split=None, reward="code_all_pass", prompts=1),
        **dict(samples_per_prompt=2, temperature=1.0, top_p=1.0, max_new_tokens=16),
        **{"pass@2": 0.5, "maj@2": None, "mean@2": 0.5, "maj_votes_on": "none: code_all_pass grades no one answer"},
    }
    monkeypatch.setattr(eval_cli, "run_eval", lambda args: result)
    assert eval_cli.main([]) == 0
    out = capsys.readouterr().out
    assert "│ 2 │  0.500 │     - │  0.500 │" in out.replace("┃", "│")  # maj@k: "-"
    assert out.rstrip().endswith("; maj@k votes on none: code_all_pass grades no one answer")


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory):
    """One step of LoRA training on the demo model, saved as an adapter and (same seed) merged."""
    from grpokit.config import Config
    from grpokit.config.io import apply_overrides
    from grpokit.train import Trainer

    runs = {}
    for mode in ("adapter", "merged"):
        out = tmp_path_factory.mktemp("lora") / mode
        cfg = apply_overrides(
            Config(),
            [
                "model.lora_rank=4",
                f"model.lora_save={mode}",
                "optim.lr=0.05",
                "train.steps=1",
                "train.prompts_per_step=2",
                "rollout.group_size=4",
                "data.eval_size=0",
                "record.sinks=[]",
                "record.report=false",
                f"train.out={out}",
            ],
        )
        Trainer(cfg, quiet=True).train()
        runs[mode] = out
    return runs


def test_eval_reads_lora_checkpoints(lora_runs, tmp_path, capsys):
    import torch
    from safetensors.torch import load_file

    from grpokit.config import ModelConfig
    from grpokit.data.tasks import demo_model_path

    ckpt = lora_runs["adapter"] / "checkpoints" / "step-000001"
    assert (ckpt / "model" / "adapter_config.json").exists() and not (ckpt / "model" / "config.json").exists()
    # a run folder, a checkpoint folder and its model/ folder all mean the adapter of step 1
    for name in (lora_runs["adapter"], ckpt, ckpt / "model"):
        assert eval_cli.resolve_model(str(name))[1] == ckpt / "model"
    model_dir, adapter, _ = eval_cli.resolve_model(str(lora_runs["adapter"]))
    model, _ = eval_cli.load_eval_model(ModelConfig(name_or_path=model_dir), adapter, torch.device("cpu"))
    # the adapter merged into its base equals the merged checkpoint of the same run (same seed)
    merged = load_file(str(lora_runs["merged"] / "checkpoints" / "step-000001" / "model" / "model.safetensors"))
    ours = model.state_dict()
    assert merged.keys() <= ours.keys()
    base = load_file(str(demo_model_path() / "model.safetensors"))
    assert any(not torch.equal(merged[k], base[k]) for k in merged)  # the step moved the adapters off B = 0
    for k in merged:
        torch.testing.assert_close(ours[k], merged[k], rtol=1e-5, atol=1e-6)
    for run in ("adapter", "merged"):
        out = tmp_path / f"{run}.json"
        assert (
            eval_cli.main(
                [
                    "--model",
                    str(lora_runs[run]),
                    "--limit",
                    "4",
                    "--k",
                    "1,2",
                    "--max-new-tokens",
                    "4",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        assert json.loads(out.read_text())["prompts"] == 4
    capsys.readouterr()


def test_an_adapter_for_a_missing_base_is_one_sentence(tmp_path):
    from grpokit.config import ConfigError

    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    with pytest.raises(ConfigError, match=r"is a LoRA adapter for the base model .*gone', which does not exist here"):
        eval_cli.resolve_model(str(tmp_path))


def test_eval_of_the_shipped_vision_model_sends_the_images(tmp_path, monkeypatch):
    """``grpokit eval --model <shapes-vl-model> --task shapes``: the rows' images reach the model through
    its processor (before: "the data has an image column but the model has no image processor"), and
    greedy pass@1 is the share of completions with full reward that train/task_evaluation.py's greedy
    shapes evaluation finds on the same held-out rows (accuracy: reward >= 1)."""
    from transformers import Qwen2VLForConditionalGeneration as C

    from grpokit.data.tasks import shapes
    from grpokit.train.task_evaluation import evaluate_shapes

    seen = spy_image_forwards(monkeypatch, C)
    out = tmp_path / "eval.json"
    argv = ["--model", str(shapes.shapes_model_path()), "--task", "shapes", "--limit", "12"]
    assert eval_cli.main([*argv, "--samples", "1", "--k", "1", "--temperature", "0", "--out", str(out)]) == 0
    # the prefill: 12 prompts x 16 image tokens, each image 64 patches before the 2x2 merge (4 per token)
    assert seen[0] == (12 * 16, 12 * 64)
    model, processor = shapes.load_shapes_model()
    expected = evaluate_shapes(model.eval(), processor, shapes.held_out_rows()[:12])["accuracy"]
    assert 0 < expected < 1 and json.loads(out.read_text())["pass@1"] == pytest.approx(expected)


def test_maj_votes_read_no_answer_from_a_blank_or_placeholder_box_or_tag():
    # the vote is math_accuracy's final answer (answers.final_answer, the one rule for blank slots): the last
    # real box, never a blank one; a completion whose every tag or box is blank casts no vote
    from grpokit.cli.eval_votes import vote_keys, votes_of
    from grpokit.rewards.math import math_accuracy

    texts = [
        "x \\boxed{5}. I used \\boxed{}",
        "<answer>7</answer> in the form <answer> answer here </answer>",
        "\\boxed{3} \\boxed{5}",  # real answers: the last
        "6*7 = 42\n<answer></answer>",  # the slot was left empty: no vote (before PR: "6*7 = 42" was voted for)
        "so 42\n\\boxed{}",
        "so 42",  # no tag or box at all: the last line, as the grader reads it (math-verify finds 42)
    ]
    keys = vote_keys(votes_of(math_accuracy), texts, [None] * 6, [False] * 6)
    assert keys == [("wrong", f"number {v}") if v else None for v in (5, 7, 5, None, None, 42)]


def test_eval_votes_on_the_graders_answer_end_to_end(monkeypatch, tmp_path, capsys):
    """--reward math_accuracy on a file: three right \\boxed{\\frac{1}{2}} after one wrong \\boxed{3} win maj@4
    (before: the nested box was not read, every sample voted with its whole text, and sample 1 won: 0.0)."""
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "Half of 1?", "answer": "\\frac{1}{2}"}) + "\n")
    script = ["Guess: \\boxed{3}", *["so \\boxed{\\frac{1}{2}}"] * 3]
    load = eval_cli.load_eval_model

    def load_with_script(mcfg, adapter, device):  # the demo tokenizer spells digits only: ids 1000+ are the script's
        model, tok = load(mcfg, adapter, device)
        plain = tok.decode
        tok.decode = lambda ids, **kw: script[ids[0] - 1000] if ids and ids[0] >= 1000 else plain(ids, **kw)
        return model, tok

    def fake_generate(model, prompt_ids, n, params, *, eos_token_ids, pad_token_id, generator=None, decode=None, **kw):
        ids = [[1000 + j] for j in range(len(script))]
        return Rollout(prompt_ids, ids, [[0.0]] * len(ids), ["eos"] * len(ids), n)

    monkeypatch.setattr(eval_cli, "load_eval_model", load_with_script)
    monkeypatch.setattr(rollout_engine, "generate", fake_generate)
    argv = ["--dataset", str(tmp_path / "d.jsonl"), "--reward", "math_accuracy", "--k", "1,4", "--json"]
    assert eval_cli.main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    # maj@1: sample 1 (3, wrong) -> 0.0; maj@4: 1/2 (3 votes) beats 3 (1 vote) -> 1.0; mean@4 = 3/4
    assert (res["maj@1"], res["maj@4"], res["mean@4"]) == (0.0, 1.0, 0.75)
    assert res["maj_votes_on"].startswith("math_accuracy's final answer, equal values pooled")


def test_eval_refuses_a_prompt_without_room_for_its_completion(tmp_path):
    """A GPT-2 of 64 learned positions: before, an internal fault (IndexError) in the first generation."""
    from helpers.trl_models import make_gpt2_chat_model

    model = make_gpt2_chat_model(tmp_path / "gpt2", n_positions=64)
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "a" * 60, "answer": "1"}) + "\n")  # 60 tokens
    argv = ["--model", str(model), "--task", "", "--dataset", str(tmp_path / "d.jsonl"), "--reward", "math_accuracy"]
    argv += ["--k", "1", "--samples", "1", "--max-new-tokens", "16", "data.chat_template=never"]
    with pytest.raises(eval_cli.ConfigError) as e:
        eval_cli.run_eval(eval_cli.parse_args(argv))
    assert str(e.value) == (  # 60 + 16 = 76 > 64; eval cuts no prompt, so no truncation is offered
        "the longest evaluation prompt (row 0, 60 tokens) and --max-new-tokens 16 make 76 tokens, more than the "
        "model's context of 64, whose positions are a learned table with no row past it; shorten the prompts or "
        "lower --max-new-tokens"
    )


def test_eval_hands_its_grader_no_prompt_column(monkeypatch):
    """grpokit eval grades with a plain RewardRunner, which passes the column "prompt" (rewards/inputs.py
    row_prompts) to no function: only a TRL _calculate_rewards override reads it, in training
    (trl/contract/stages.py TrlRewards). Before, eval built it for every chunk under reward.convention=trl."""
    from grpokit.cli.eval_votes import votes_of
    from grpokit.config.sections import RewardConfig
    from grpokit.types import Prompt

    seen = spy_reward_columns(monkeypatch)

    class Episodes:  # one turn, 2 samples of the one prompt
        parse_message = None  # no response parsing (env/responses.py)

        def run(self, sample, chunk, n, params):
            return Rollout([[1]], [[2], [3]], [[0.0], [0.0]], ["eos", "eos"], n)

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return {2: "7", 3: "8"}[ids[0]]

    def right(completions, answer, **kw):  # TRL's convention: one assistant message per completion
        return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]

    chunk = [Prompt(text="q", ids=[1], columns={"answer": "7"}, raw=[{"role": "user", "content": "q"}])]
    grading = (right, votes_of(right))
    _, correct = eval_cli._sample_and_grade(
        chunk, Episodes(), None, Tok(), grading, None, 2, RewardConfig(convention="trl")
    )
    assert correct == [[True, False]] and seen == [{"answer": ["7", "7"]}]  # before: a "prompt" column beside it
