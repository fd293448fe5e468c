"""Reference docs generated from the code stay in step with it, and help reads as a reference card."""

from pathlib import Path

import pytest

from tunebench.cli import build_parser
from tunebench.config import EvalConfig, HwConfig, InferConfig, LoadConfig, RunConfig, TrainConfig
from tunebench.config.reference import markdown
from tunebench.config.topics import TOPICS, topics_of

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = (RunConfig, TrainConfig, HwConfig, LoadConfig, InferConfig, EvalConfig)


def test_the_configuration_reference_is_current():
    assert (ROOT / "docs" / "configuration.md").read_text() == markdown(), \
        "docs/configuration.md is stale: python -m tunebench.config.reference > docs/configuration.md"


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_key_says_what_it_does_under_one_topic(cls):
    topics_of(cls)  # raises naming a key without a topic
    for name, field in cls.model_fields.items():
        text = field.description or ""
        assert text.strip(), f"{cls.__name__}.{name} has no description"
        assert len(text) <= 220, f"{cls.__name__}.{name}: a description says what a key does in one or two lines"
    listed = [n for names in TOPICS.values() for n in names]
    assert len(listed) == len(set(listed)), "a key under two topics"


@pytest.mark.parametrize("command", ["run", "train"])
def test_help_fits_two_screens_grouped_by_topic(command, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "120")
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    out = capsys.readouterr().out
    assert "model and method:" in out and "memory:" in out and "several GPUs and nodes:" in out
    assert len(out.splitlines()) <= (120 if command == "run" else 170)
