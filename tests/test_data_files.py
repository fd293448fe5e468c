"""Damaged data never trains as text: every unreadable file says why, every damaged row is dropped and counted
by its reason (or refused, with strict_data, naming the file, the row and the reason), and too many damaged
rows refuse the data. The library is called directly where it can; the CLI for its exit code and its line."""

import json
import os
from pathlib import Path

import pytest

from tunebench.config import TrainConfig
from tunebench.data.dataset import read
from tunebench.errors import UserError

GOOD_PAIR = {"prompt": "one two", "completion": " three four"}


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _read(path: Path, tmp_path: Path, **cfg):
    c = TrainConfig(model="unused", data=str(path), **cfg)
    return read(c, str(path), "data", tmp_path / "sources")


def _refusal(path: Path, tmp_path: Path, **cfg) -> str:
    with pytest.raises(UserError) as err:
        _read(path, tmp_path, **cfg)
    text = str(err.value)
    assert len(text.splitlines()) == 1 and text.startswith(f"invalid data={path}: ")
    return text[len(f"invalid data={path}: "):]


def _fifo(p: Path) -> Path:
    os.mkfifo(p)
    return p


def _loop(p: Path) -> Path:
    os.symlink(p, p)
    return p


def _dangling(p: Path) -> Path:
    os.symlink(p.with_name("gone.jsonl"), p)
    return p


def _fifo_in_folder(p: Path) -> Path:
    p.mkdir()
    _jsonl(p / "a.jsonl", [GOOD_PAIR])
    os.mkfifo(p / "b.jsonl")
    return p


UNREADABLE = {
    "not UTF-8": (lambda p: (p.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n'), p)[1],
                  "not UTF-8 text: byte 28 (0xe9, line 2) is not UTF-8"),
    "not UTF-8 CSV": (lambda p: (p.with_suffix(".csv").write_bytes(b"text\nok\n\xff\n"), p.with_suffix(".csv"))[1],
                      "not UTF-8 text: byte 8 (0xff, line 3)"),
    "malformed JSON line": (lambda p: (p.write_text('{"text": "a"}\n{"text": "b"\n{"text": "c"}\n'), p)[1],
                            "malformed JSON on line 2 (column 1: Expecting ',' delimiter)"),
    "malformed JSON array": (lambda p: (p.with_suffix(".json").write_text('[{"text": "a"},\n {"text": }]'),
                                        p.with_suffix(".json"))[1], "malformed JSON on line 2 (column 11"),
    "malformed CSV": (lambda p: (p.with_suffix(".csv").write_text('text\nok\n"a"b\n'), p.with_suffix(".csv"))[1],
                      "malformed CSV on line 3 (',' expected after '\"')"),
    "not Parquet": (lambda p: (p.with_suffix(".parquet").write_text("text\nhello\n"), p.with_suffix(".parquet"))[1],
                    "not a Parquet file"),
    "a FIFO": (_fifo, "not a regular file: a FIFO"),
    "a FIFO in a folder": (_fifo_in_folder, "b.jsonl: not a regular file: a FIFO"),
    "a symlink loop": (_loop, "a symlink loop"),
    "a dangling symlink": (_dangling, "gone.jsonl, which does not exist"),
    "a device": (lambda p: Path("/dev/null"), "not a regular file: a character device"),
    "empty": (lambda p: (p.write_text(""), p)[1], "the file is empty"),
    "blank lines only": (lambda p: (p.write_text("\n \n"), p)[1], "holds no rows"),
    "one JSON string": (lambda p: (p.with_suffix(".json").write_text('"text"'), p.with_suffix(".json"))[1],
                        "holds one JSON value, not rows"),
    "a line nested past Python's limit": (lambda p: (p.write_text('{"text": "a"}\n{"text": ' + "[" * 100_000 +
                                                                  "]" * 100_000 + "}\n"), p)[1],
                                          "line 2 nests its JSON too deeply to be read"),
    "an array nested past Python's limit": (lambda p: (p.with_suffix(".json").write_text("[" * 100_000 + "]" * 100_000),
                                                       p.with_suffix(".json"))[1], "nests its JSON too deeply"),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_an_unreadable_file_says_why(tmp_path, case):
    make, needle = UNREADABLE[case]
    path = make(tmp_path / "data.jsonl")
    assert needle in _refusal(path, tmp_path)


def test_datasets_alone_says_less(tmp_path):
    """Why the files are read here: datasets names no line and no offset (see files.py)."""
    import datasets

    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(Exception) as err:  # (datasets 5.2 reads the file, and fails when a row is read)
        datasets.load_dataset("json", data_files=[str(path)], split="train", cache_dir=str(tmp_path / "hf"))[:]
    assert "line 2" not in str(err.value) and "28" not in str(err.value)


BAD_PAIRS = [
    ({"prompt": "one"}, "missing field 'completion'"),
    ({"completion": "one"}, "missing field 'prompt'"),
    ({"prompt": "one", "completion": None}, "field 'completion' is null"),
    ({"prompt": 5, "completion": "x"}, "field 'prompt' is a number"),
    ({"prompt": "one", "completion": ["a"]}, "field 'completion' is a list"),
    ({"prompt": "one", "completion": {"text": "a"}}, "field 'completion' is an object"),
    ({"prompt": "one", "completion": True}, "field 'completion' is true/false"),
    (["one", "two"], "the row is a list, not an object"),
]


def test_damaged_pairs_are_dropped_and_counted(tmp_path):
    rows = [GOOD_PAIR] * 3 + [r for r, _ in BAD_PAIRS] + [BAD_PAIRS[0][0]]
    c = _read(_jsonl(tmp_path / "d.jsonl", rows), tmp_path, max_bad_rows=1.0)
    want = {reason: 1 for _, reason in BAD_PAIRS}
    want["missing field 'completion'"] = 2
    assert c.shape == "pairs" and c.tally.read == len(rows) and dict(c.tally.bad) == want
    assert c.tally.first["missing field 'completion'"] == "line 4" and c.tally.first["field 'prompt' is a number"] == "line 7"
    assert c.ds["prompt"] == ["one two"] * 3 and c.ds["_row"] == ["line 1", "line 2", "line 3"]  # nothing as "None"


def _msg(role, content, **kw):
    return {"role": role, "content": content, **kw}


CALL = {"type": "function", "function": {"name": "clock", "arguments": {}}}
BAD_CHATS = [
    ({"text": "no messages here"}, "missing field 'messages'"),
    ({"messages": None}, "field 'messages' is null"),
    ({"messages": "user: hi"}, "field 'messages' is a string"),
    ({"messages": []}, "no messages"),
    ({"messages": ["hi"]}, "a message is a string, not an object"),
    ({"messages": [{"content": "hi"}]}, "a message has no role"),
    ({"messages": [_msg("wizard", "hi")]}, "unknown role 'wizard'"),
    ({"messages": [{"role": 3, "content": "hi"}]}, "a message's role is a number"),
    ({"messages": [{"role": "user"}]}, "a message has no content"),
    ({"messages": [_msg("user", "hi"), _msg("assistant", None)]}, "a message's content is null"),
    ({"messages": [_msg("user", [{"type": "text", "text": "hi"}])]}, "a message's content is a list"),
    ({"messages": [_msg("user", None, tool_calls=[CALL])]}, "a message's content is null"),  # only an assistant's
    ({"messages": [_msg("user", "hi"), _msg("assistant", None, tool_calls="clock()")]}, "a message's tool_calls is a string"),
    ({"messages": [_msg("user", "hi")], "tools": "clock"}, "field 'tools' is a string"),
]


def test_damaged_chats_are_dropped_and_counted(tmp_path):
    good = {"messages": [_msg("user", "hi"), _msg("assistant", "hello")]}
    tool = {"messages": [_msg("user", "time?"), _msg("assistant", None, tool_calls=[CALL]), _msg("tool", "noon"),
                         _msg("assistant", "noon")], "tools": [{"type": "function", "function": {"name": "clock"}}]}
    rows = [good, tool] + [r for r, _ in BAD_CHATS]
    c = _read(_jsonl(tmp_path / "d.jsonl", rows), tmp_path, max_bad_rows=1.0)
    want = {}
    for _, reason in BAD_CHATS:
        want[reason] = want.get(reason, 0) + 1
    assert c.shape == "chat" and dict(c.tally.bad) == want
    kept = [json.loads(m) for m in c.ds["messages"]]
    # an assistant message with tool calls and null content is kept: content "" and its calls, for the template
    assert kept[0] == good["messages"] and kept[1][1] == {"role": "assistant", "content": "", "tool_calls": [CALL]}
    assert json.loads(c.ds["tools"][1]) == tool["tools"] and c.ds["tools"][0] == ""


def test_csv_cells_stay_text_and_text_files_are_lines(tmp_path):
    (tmp_path / "d.csv").write_text('prompt,completion\n1,2\n"a, b","line one\nline two"\nshort\n')
    c = _read(tmp_path / "d.csv", tmp_path, max_bad_rows=0.5)
    assert c.ds["prompt"] == ["1", "a, b"] and c.ds["completion"] == ["2", "line one\nline two"]  # "2", not 2.0
    assert dict(c.tally.bad) == {"missing field 'completion'": 1} and c.tally.first["missing field 'completion'"] == "line 5"
    (tmp_path / "t.txt").write_text("first\r\nsecond\n\nfourth")
    t = _read(tmp_path / "t.txt", tmp_path)
    assert t.ds["text"] == ["first", "second", "", "fourth"] and t.tally.read == 4


def test_parquet_and_saved_datasets_are_checked_too(tmp_path):
    import datasets

    rows = {"prompt": ["one", "two", None, "four"], "completion": [" a", None, " c", " d"]}
    datasets.Dataset.from_dict(rows).to_parquet(tmp_path / "d.parquet")
    c = _read(tmp_path / "d.parquet", tmp_path, max_bad_rows=0.5)
    assert c.ds["prompt"] == ["one", "four"] and c.tally.first == {"field 'completion' is null": "row 2",
                                                                   "field 'prompt' is null": "row 3"}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(tmp_path / "saved")
    s = _read(tmp_path / "saved", tmp_path, max_bad_rows=0.5)
    assert s.ds["prompt"] == ["one", "four"] and s.tally.damaged == 2


def test_a_column_of_mixed_types_is_read(tmp_path):
    """A field null in some rows and an object in others (which datasets' type inference turns into an untyped
    column, or refuses under older versions): the rows keep only the fields they train on."""
    rows = [{**GOOD_PAIR, "meta": None}, {**GOOD_PAIR, "meta": {"id": 1}}, {**GOOD_PAIR, "meta": [1, "x"]}]
    c = _read(_jsonl(tmp_path / "d.jsonl", rows), tmp_path)
    assert len(c.ds) == 3 and not c.tally.bad and c.ds.column_names == ["prompt", "completion", "_row"]


def test_strict_data_names_the_file_the_row_and_the_reason(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [GOOD_PAIR] * 20 + [{"prompt": "x", "completion": None}, {"prompt": "y"}])
    assert _refusal(path, tmp_path, strict_data=True) == ("line 21: field 'completion' is null (strict_data refuses "
                                                          "damaged rows)")
    folder = tmp_path / "folder"
    folder.mkdir()
    _jsonl(folder / "a.jsonl", [GOOD_PAIR] * 3)
    _jsonl(folder / "b.jsonl", [GOOD_PAIR, {"prompt": 1, "completion": "z"}])
    assert _refusal(folder, tmp_path, strict_data=True, data_format="pairs") == \
        "b.jsonl line 2: field 'prompt' is a number (strict_data refuses damaged rows)"
    assert _read(path, tmp_path).tally.damaged == 2  # without strict_data: dropped, counted (2 of 22 is under 10%)


def test_too_many_damaged_rows_refuse_the_data(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [GOOD_PAIR] * 8 + [{"prompt": "x"}, {"prompt": "y", "completion": 3}])
    assert _refusal(path, tmp_path) == ("2 of 10 rows are damaged (20.0%, more than max_bad_rows=0.1): missing "
                                        "field 'completion' 1, field 'completion' is a number 1; the first at line 9")
    assert _read(path, tmp_path, max_bad_rows=0.2).tally.damaged == 2  # at the threshold: kept
    everything = _jsonl(tmp_path / "all.jsonl", [{"prompt": "x", "completion": None}] * 3)
    assert "every one of its 3 rows is damaged" in _refusal(everything, tmp_path, max_bad_rows=1.0)


def test_the_fingerprint_is_the_content(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [GOOD_PAIR] * 3)
    first, again = _read(path, tmp_path), _read(path, tmp_path / "elsewhere")
    assert first.ds._fingerprint == again.ds._fingerprint
    os.utime(path, (1, 1))  # touched, not changed: the same rows
    assert _read(path, tmp_path).ds._fingerprint == first.ds._fingerprint
    _jsonl(path, [GOOD_PAIR] * 2 + [{"prompt": "one two", "completion": " three five"}])
    changed = _read(path, tmp_path)
    assert changed.ds._fingerprint != first.ds._fingerprint and changed.ds["completion"][2] == " three five"


# --- the CLI: exit code 2 and one line; the counts in the record and in the data line ------------------------

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny Llama with a byte-level BPE tokenizer (no chat template)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("files") / "model"
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer, t.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    t.train_from_iterator(["one two three four five six"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "</s>", "<unk>"]))
    PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            unk_token="<unk>").save_pretrained(root)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    ).save_pretrained(root)
    return root


def _train(tb, model, data: Path, tmp_path: Path, *extra: str):
    return tb("train", "--model", str(model), "--data", str(data), "--seq-len", "32", "--batch-size", "2",
              "--max-steps", "2", "--warmup", "1", "--device", "cpu", "--precision", "fp32", "--output-dir",
              str(tmp_path / "out"), "--no-store", *extra)


@pytest.mark.parametrize("extra,needle", [
    ((), "2 of 10 rows are damaged (20.0%, more than max_bad_rows=0.1): missing field 'completion' 1, field "
         "'completion' is null 1; the first at line 9"),
    (("--strict-data",), "line 9: missing field 'completion' (strict_data refuses damaged rows)"),
    (("--max-bad-rows", "0.15"), "more than max_bad_rows=0.15"),
])
def test_the_cli_refuses_in_one_line(tb, model, tmp_path, monkeypatch, extra, needle):
    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))
    data = _jsonl(tmp_path / "d.jsonl", [GOOD_PAIR] * 8 + [{"prompt": "x"}, {"prompt": "y", "completion": None}])
    code, out, err = _train(tb, model, data, tmp_path, *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err and f"invalid data={data}: " in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("cache", ["/proc/no-such-place", "/dev/null"])
def test_a_cache_that_cannot_be_made_is_named(tb, model, tmp_path, monkeypatch, cache):
    monkeypatch.setenv("TUNEBENCH_CACHE", cache)
    code, _, err = _train(tb, model, _jsonl(tmp_path / "d.jsonl", [GOOD_PAIR] * 8), tmp_path)
    assert code == 2 and f"invalid TUNEBENCH_CACHE={cache}: cannot write there" in err, err
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_a_fifo_without_waiting(tb, model, tmp_path):
    code, _, err = _train(tb, model, _fifo(tmp_path / "d.jsonl"), tmp_path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not a regular file: a FIFO" in err


def test_the_counts_are_printed_and_recorded(tb, model, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))
    data = _jsonl(tmp_path / "d.jsonl", [GOOD_PAIR] * 8 + [{"prompt": "x"}, {"prompt": "y", "completion": None}])
    code, out, err = _train(tb, model, data, tmp_path, "--max-bad-rows", "0.2", "--json")
    assert code == 0, err
    d = json.loads(out)["metrics"]["job"]["data"]
    assert d["rows_read"] == 10 and d["examples"] == 8
    assert d["bad_rows"] == {"missing field 'completion'": 1, "field 'completion' is null": 1}
    assert d["bad_rows_first"] == {"missing field 'completion'": "line 9", "field 'completion' is null": "line 10"}
    [line] = [x for x in err.splitlines() if x.startswith("data: ")]
    assert "; 2 of 10 rows damaged, skipped (missing field 'completion' 1, field 'completion' is null 1)" in line
    code, _, err = _train(tb, model, data, tmp_path, "--strict-data", "--overwrite")
    assert code == 2 and "line 9: missing field 'completion'" in err


def test_the_docs_commands_parse():
    """docs/data.md's commands: tunebench's parser takes them, and their config is valid."""
    import re
    import shlex

    from tunebench.cli import build_parser
    from tunebench.flags import config_from

    text = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    lines = [ln for block in re.findall(r"```bash\n(.*?)```", text, re.S) for ln in block.splitlines()
             if ln.startswith("tunebench ")]
    assert len(lines) >= 4
    for line in lines:
        cfg = config_from(build_parser().parse_args(shlex.split(line)[1:]), TrainConfig)
        assert cfg.data and (cfg.strict_data or cfg.max_bad_rows <= 0.1)
