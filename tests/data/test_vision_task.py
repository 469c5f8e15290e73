"""The shapes task's shipped model and its per-question scores (evaluation, summary, report)."""

from __future__ import annotations

from grpokit.data.tasks import shapes
from grpokit.train.task_evaluation import evaluate_shapes
from grpokit.types import Prompt


def test_longer_row_lists_keep_the_shorter_ones_rows():
    # train_rows(n) is the first n rows of one seeded stream: the pre-warm script streams it lazily
    # and must see the same rows a list would hold.
    assert [r["scene"] for r in shapes.train_rows(30, seed=3)] == [
        r["scene"] for r in shapes.train_rows(45, seed=3)[:30]
    ]
    assert not any(shapes.is_held_out(r["scene"]) for r in shapes.train_rows(45, seed=3))
    assert all(shapes.is_held_out(r["scene"]) for r in shapes.held_out_rows(20))


def test_held_out_scores_are_split_by_question_kind():
    from grpokit.train.evaluate import _by_kind

    prompts = [Prompt("a", [1], columns={"kind": k}) for k in ("box", "count", "box", "count")]
    # box: (1.0 + 0.5) / 2 = 0.75; count: (0 + 1) / 2 = 0.5
    assert _by_kind(prompts, [1.0, 0.0, 0.5, 1.0]) == {"reward_box": 0.75, "reward_count": 0.5}
    assert (
        _by_kind([Prompt("a", [1]), Prompt("b", [1], columns={"kind": 3})], [1.0, 0.0]) == {}
    )  # no string kind: no split


def test_report_headline_shows_each_question_before_and_after(tmp_path):
    import json

    from grpokit.record.report import headline_html
    from grpokit.record.report_data import load_run

    (tmp_path / "summary.json").write_text(
        json.dumps(
            {
                "steps": 5,
                "eval_before": {"accuracy": 0.2, "reward_box": 0.125},
                "eval_after": {"accuracy": 0.4, "reward_box": 0.5},
            }
        )
    )
    html = headline_html(load_run(tmp_path))
    assert "eval reward (box)" in html and "0.125 → 0.5" in html


def test_shipped_model_starts_weak_but_not_at_zero_on_both_questions():
    # Greedy decoding on a fixed held-out set is deterministic. A box one cell off scores IoU 0, so a
    # model that ignores the image and always names one of the 16 cells scores 1/16 = 0.0625; the
    # pre-warm stops at box IoU 0.2 on its own held-out set (scripts/make_vision_demo_model.py), so
    # the box question must start clearly above chance and far from solved, and counting (chance
    # 1/4 with a constant answer) must not start saturated.
    model, proc = shapes.load_shapes_model()
    s = evaluate_shapes(model.eval(), proc, shapes.held_out_rows(200))
    assert 0.12 < s["box_iou"] < 0.4
    assert 0.05 < s["count_accuracy"] < 0.9
    assert sum(t.startswith("[") for t in s["texts"]) > 50  # box answers keep their form
