"""What a data source gives, exactly: the split asked for (save_to_disk folders, single files), cells as
written (CSV strings, JSON types), no column replaced by grpokit's own keywords, and settings that would be
dropped (a system prompt without a chat template) refused. Every file is a real one written in tmp_path."""

import json

import pytest

from grpokit.config import ConfigError, DataConfig
from grpokit.data import load_rows, to_prompts
from grpokit.rewards.spec import RESERVED_KEYWORDS


def _dataset_dict(tmp_path):
    """A save_to_disk DatasetDict: 2 train rows tagged T, 1 test row tagged E."""
    import datasets

    path = tmp_path / "dd"
    datasets.DatasetDict(
        train=datasets.Dataset.from_list([{"prompt": "1+1=", "answer": "2", "tag": "T"}] * 2),
        test=datasets.Dataset.from_list([{"prompt": "2+2=", "answer": "4", "tag": "E"}]),
    ).save_to_disk(str(path))
    return str(path)


def test_a_saved_dataset_dict_is_read_at_the_split_asked_for(tmp_path):
    source = _dataset_dict(tmp_path)
    assert [r["tag"] for r in load_rows(source, "train", DataConfig())] == ["T", "T"]
    test = load_rows(source, "test", DataConfig(), "data.eval_split", "test")
    assert [(r["prompt"], r["answer"], r["tag"]) for r in test] == [("2+2=", "4", "E")]  # before: the train rows
    with pytest.raises(ConfigError) as e:
        load_rows(source, "validation", DataConfig(), "data.eval_split", "test")
    assert str(e.value) == (
        f"data.eval_split='validation' is not a split of the saved dataset {source!r}; its splits are: train, test"
    )


def test_a_source_without_splits_refuses_a_split_other_than_the_default(tmp_path):
    import datasets

    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n')
    assert len(load_rows(str(path), "train", DataConfig())) == 1  # data.split's default: the file's one set of rows
    assert len(load_rows(str(path), "test", DataConfig(), "data.eval_split", "test")) == 1  # data.eval_split's
    with pytest.raises(ConfigError) as e:
        load_rows(str(path), "test", DataConfig())
    assert str(e.value) == (
        f"data.split='test' names a split, but {str(path)!r} is a single file with no splits; leave data.split at "
        "'train' for it, or give a save_to_disk folder or hub dataset that has a 'test' split"
    )
    single = tmp_path / "single"
    datasets.Dataset.from_list([{"prompt": "a", "answer": "1"}]).save_to_disk(str(single))
    with pytest.raises(ConfigError, match="is a saved single Dataset with no splits"):
        load_rows(str(single), "validation", DataConfig(), "--split", "test")


def test_csv_cells_are_the_strings_written(tmp_path):
    # datasets' pandas reader made this answer column floats (one decimal: "007" -> 7.0,
    # 12345678901234567891 -> 1.2345678901234567e19) and NA / None / an empty cell None
    path = tmp_path / "d.csv"
    path.write_text('question,answer,n\nq1,12345678901234567891,3\nq2,0.5,3\nq3,007,3\nq4,NA,\nq5,"1,000",None\n')
    rows = load_rows(str(path), "train", DataConfig(prompt_column="question"))
    assert [r["answer"] for r in rows] == ["12345678901234567891", "0.5", "007", "NA", "1,000"]
    assert [r["n"] for r in rows] == ["3", "3", "3", "", "None"]
    assert rows[0] == {"answer": "12345678901234567891", "n": "3", "prompt": "q1"}


def test_json_values_keep_their_json_types(tmp_path):
    # datasets' pyarrow reader unified a column: 7 became 7.0 beside 1.5, and "007" became 7 beside an int
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"prompt": "a", "answer": 7}\n{"prompt": "b", "answer": 1.5}\n\n'
        '{"prompt": "c", "answer": 12345678901234567891}\n{"prompt": "d", "answer": "007", "extra": true}\n'
    )
    rows = load_rows(str(path), "train", DataConfig())
    assert [r["answer"] for r in rows] == [7, 1.5, 12345678901234567891, "007"]
    assert [r["extra"] for r in rows] == [None, None, None, True]  # a column a row lacks is None there
    columns = tmp_path / "c.json"
    columns.write_text(json.dumps({"prompt": ["a", "b"], "answer": ["007", 2]}))
    assert [(r["prompt"], r["answer"]) for r in load_rows(str(columns), "train", DataConfig())] == [
        ("a", "007"),
        ("b", 2),
    ]
    columns.write_text(json.dumps({"prompt": ["a", "b"], "answer": ["1"]}))
    with pytest.raises(ConfigError, match=r"columns of different lengths \(prompt: 2, answer: 1\)"):
        load_rows(str(columns), "train", DataConfig())


@pytest.mark.parametrize("name", RESERVED_KEYWORDS)
def test_a_column_named_like_a_reward_keyword_is_refused(tmp_path, name):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "a", "answer": "1", name: "x"}) + "\n")
    with pytest.raises(ConfigError) as e:
        load_rows(str(path), "train", DataConfig())
    assert str(e.value).startswith(f"{str(path)!r} has a column named {name!r}, a keyword grpokit passes reward")


def test_rows_passed_in_are_checked_for_reserved_columns_too():
    from helpers.models import char_tokenizer

    with pytest.raises(ConfigError, match="'the data' has a column named 'group_size'"):
        to_prompts([{"prompt": "a", "group_size": 3}], char_tokenizer(), DataConfig())


def test_the_answer_or_prompt_column_does_not_replace_a_column_of_that_name(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"problem": "1+1=", "solution": "so 2", "answer": "2", "prompt": "p"}) + "\n")
    with pytest.raises(ConfigError) as e:
        load_rows(str(path), "train", DataConfig(prompt_column="problem", answer_column="solution"))
    assert str(e.value) == (
        f"{str(path)!r} has a column 'prompt' besides data.prompt_column='problem', which grpokit passes on as "
        "'prompt' and so would replace it; rename the dataset's 'prompt' column or set data.prompt_column=prompt"
    )
    with pytest.raises(ConfigError, match="has a column 'answer' besides data.answer_column='solution'"):
        load_rows(str(path), "train", DataConfig(prompt_column="prompt", answer_column="solution"))
    rows = load_rows(str(path), "train", DataConfig(prompt_column="prompt", answer_column=""))  # nothing replaced
    assert rows == [{"problem": "1+1=", "solution": "so 2", "answer": "2", "prompt": "p"}]


def test_a_system_prompt_that_no_template_would_carry_is_refused():
    from helpers.models import char_tokenizer

    tok = char_tokenizer()  # no chat template
    with pytest.raises(ConfigError) as e:
        to_prompts([{"prompt": "ab"}], tok, DataConfig(system_prompt="hi"))
    assert str(e.value) == (
        "data.system_prompt is set but the tokenizer has no chat template, so it would never reach the model; give "
        "a tokenizer (model) with a chat template, write it into the prompts, or leave data.system_prompt empty"
    )
    with pytest.raises(ConfigError, match="data.chat_template_kwargs is set but the tokenizer has no chat template"):
        to_prompts([{"prompt": "ab"}], tok, DataConfig(chat_template_kwargs={"enable_thinking": False}))
    tok.chat_template = "{% for m in messages %}<{{ m['role'][0] }}>{{ m['content'] }}{% endfor %}"
    with pytest.raises(ConfigError, match="is set but data.chat_template=never, so"):
        to_prompts([{"prompt": "ab"}], tok, DataConfig(system_prompt="hi", chat_template="never"))
    plain = DataConfig(system_prompt="hi", chat_template="conversational")
    with pytest.raises(ConfigError, match="the prompt of row 2 is plain text, which data.chat_template=conversational"):
        to_prompts([{"prompt": [{"role": "user", "content": "a"}]}, {"prompt": "b"}], tok, plain)
    assert to_prompts([{"prompt": "ab"}], tok, DataConfig(system_prompt="hi"))[0].text == "<s>hi<u>ab"


FORMS = "a text, or a list of chat messages such as [{'role': 'user', 'content': '...'}]"


@pytest.mark.parametrize(
    "value, said",
    [
        (5, "has a prompt of type int (5) in column 'q'"),
        (["a", "b"], "has a prompt (column 'q') that is a list holding 'a', which is not a chat message"),
        ({"role": "user", "content": "a"}, "has a prompt of type dict"),
        ([], "has an empty prompt (column 'q'); give every row a prompt"),
    ],
)
def test_a_prompt_that_is_neither_text_nor_messages_is_refused_naming_its_row(tmp_path, value, said):
    """Before, such a value was trained as its str(): "5", "['a', 'b']"."""
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"q": "fine"}) + "\n" + json.dumps({"q": value}) + "\n")
    with pytest.raises(ConfigError) as e:
        load_rows(str(path), "train", DataConfig(prompt_column="q", answer_column=""))
    assert str(e.value).startswith(f"row 2 of {str(path)!r} {said}")
    if value:
        assert str(e.value).endswith(f"a prompt is {FORMS}")


def test_rows_passed_in_have_their_prompts_checked_and_render_prompt_never_stringifies():
    from grpokit.data import render_prompt
    from helpers.models import char_tokenizer

    with pytest.raises(ConfigError) as e:
        to_prompts([{"prompt": "a"}, {"prompt": None}], char_tokenizer(), DataConfig(), source="the rows")
    assert (
        str(e.value)
        == f"row 2 of the rows has no value in the prompt column 'prompt'; give every row a prompt: {FORMS}"
    )
    with pytest.raises(ConfigError, match="row 1 of the data has no value in the prompt column"):
        to_prompts([{"question": "a"}], char_tokenizer(), DataConfig())  # before: a KeyError
    with pytest.raises(
        ConfigError, match=r"a prompt is a text, or a list of chat messages .*, not a NoneType \(None\)"
    ):
        render_prompt(None, char_tokenizer(), DataConfig())  # before: the text "None"


def test_a_system_prompt_beside_rows_with_their_own_system_message_is_refused():
    from grpokit.data import render_prompt
    from helpers.models import char_tokenizer

    tok = char_tokenizer()
    tok.chat_template = "{% for m in messages %}<{{ m['role'][0] }}>{{ m['content'] }}{% endfor %}"
    own = [{"role": "system", "content": "be"}, {"role": "user", "content": "ab"}]
    rows = [{"prompt": own}, {"prompt": "cd"}, {"prompt": own}]
    cfg = DataConfig(system_prompt="hi")
    with pytest.raises(ConfigError) as e:  # before: rows 1 and 3 kept only "be", row 2 got "hi"
        to_prompts(rows, tok, cfg, source="'d.jsonl'")
    assert str(e.value) == (
        "data.system_prompt is set but rows 1, 3 of 'd.jsonl' carry a system message already, and a conversation "
        "has only one, so one of the two texts would be dropped; leave data.system_prompt empty, or remove the "
        "system messages from the rows (writing data.system_prompt's text into them where both are wanted)"
    )
    with pytest.raises(ConfigError, match=r"^data.system_prompt is set but the prompt carries a system message"):
        render_prompt(own, tok, cfg)
    # either one alone: the row's own system message, or data.system_prompt before every row
    assert [p.text for p in to_prompts(rows, tok, DataConfig())] == ["<s>be<u>ab", "<u>cd", "<s>be<u>ab"]
    assert [p.text for p in to_prompts(rows[1:2] * 2, tok, cfg)] == ["<s>hi<u>cd"] * 2
    # more than five rows: the first five named and the count
    with pytest.raises(ConfigError, match=r"but rows 1, 2, 3, 4, 5 \.\.\. \(7 of 8\) of the data carry"):
        to_prompts([{"prompt": own}] * 7 + [{"prompt": "cd"}], tok, cfg)
