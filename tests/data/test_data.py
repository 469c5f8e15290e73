"""Stage 1: rows from JSONL / CSV / Parquet with column mapping, chat templates, seeded batches."""

import json

import pytest

from grpokit.config import ConfigError, DataConfig
from grpokit.data import PromptSampler, load_rows, render_prompt, to_prompts
from grpokit.types import Prompt


@pytest.fixture
def rows():
    return [{"question": f"{i}+1=", "solution": str(i + 1), "level": i % 3} for i in range(5)]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_files_load_with_column_mapping(tmp_path, rows, fmt):
    path = tmp_path / f"d.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        import pandas as pd

        getattr(pd.DataFrame(rows), f"to_{fmt}")(path, index=False)
    cfg = DataConfig(prompt_column="question", answer_column="solution")
    out = load_rows(str(path), "train", cfg)
    assert [r["prompt"] for r in out] == [r["question"] for r in rows]
    assert [str(r["answer"]) for r in out] == [r["solution"] for r in rows]
    assert [int(r["level"]) for r in out] == [r["level"] for r in rows]  # other columns travel along


def test_missing_file_and_column_are_named(tmp_path, rows):
    with pytest.raises(ConfigError, match="does not exist"):
        load_rows(str(tmp_path / "nope.jsonl"), "train", DataConfig())
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="data.answer_column='answer' is not a column"):
        load_rows(str(path), "train", DataConfig(prompt_column="question"))


def test_chat_template_applied_when_the_tokenizer_has_one():
    from helpers.models import char_tokenizer

    tok = char_tokenizer()
    assert render_prompt("ab", tok, DataConfig()) == "ab"  # no template: raw text
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'][0] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<a>{% endif %}"
    )
    text = render_prompt("ab", tok, DataConfig(system_prompt="hi"))
    assert text == "<s>hi<u>ab<a>"
    assert render_prompt("ab", tok, DataConfig(chat_template="never")) == "ab"
    prompts = to_prompts([{"prompt": [{"role": "user", "content": "cd"}], "answer": "x"}], tok, DataConfig())
    assert prompts[0].text == "<u>cd<a>" and prompts[0].columns == {"answer": "x"}


def test_chat_messages_without_a_template_are_refused_under_auto_and_joined_only_under_never():
    # before: auto joined the contents silently ("you are terse\nsay ab"), the roles and the system turn lost
    from helpers.models import char_tokenizer

    tok = char_tokenizer()  # no chat template
    conversation = [{"role": "system", "content": "be terse"}, {"role": "user", "content": "say ab"}]
    with pytest.raises(ConfigError) as e:
        to_prompts([{"prompt": conversation}], tok, DataConfig())
    assert str(e.value) == (
        "the prompts are chat messages but the tokenizer has no chat template (data.chat_template=auto); give a "
        "model or tokenizer with a chat template (processing_class), plain-text prompts, or set "
        "data.chat_template=never to join each conversation's contents into one text, one message a line, roles "
        "dropped"
    )
    # TRL's conversational mode: the same condition, the same sentence (before: a shorter one of its own)
    with pytest.raises(ConfigError, match=r"no chat template \(data.chat_template=conversational\); give a model"):
        to_prompts([{"prompt": conversation}], tok, DataConfig(chat_template="conversational"))
    assert to_prompts([{"prompt": "say ab"}], tok, DataConfig())[0].text == "say ab"  # plain text: as written
    # asked for: "be terse" + "\n" + "say ab"
    assert render_prompt(conversation, tok, DataConfig(chat_template="never")) == "be terse\nsay ab"


def test_sampler_is_seeded_and_resumable():
    prompts = [Prompt(text=str(i), ids=[i]) for i in range(5)]
    a = PromptSampler(prompts, seed=3)
    first = [p.text for p in a.next_batch(7)]  # crosses an epoch boundary
    assert sorted(first[:5]) == ["0", "1", "2", "3", "4"]
    b = PromptSampler(prompts, seed=3, position=4)
    assert [p.text for p in b.next_batch(3)] == first[4:7]


def test_a_missing_columns_message_stays_on_one_line_whatever_the_header_holds():
    # found by the CSV fuzz test: a quoted CSV header may name a column with a line break, or nothing
    from grpokit.data.prompts import rename_columns

    rows = [{"a": 1, '1,"\n': 2, "": 3, " b": 4, "c d": 5}]
    with pytest.raises(ConfigError) as e:
        rename_columns(rows, DataConfig(), "data.csv")
    assert str(e.value) == (
        "data.prompt_column='prompt' is not a column of 'data.csv'; its columns are: a, '1,\"\\n', '', ' b', c d"
    )
