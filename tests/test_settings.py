"""Settings: precedence, coercion, errors that name the setting, secrets that never print."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from pydantic import SecretStr as Secret

from evident.settings import Settings
from pipeline.errors import ConfigError


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "evident.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_env_or_file(tmp_path: Path) -> None:
    s = Settings.load(env={"XDG_DATA_HOME": str(tmp_path)})
    assert s.retrieval.mode == "hybrid"
    assert s.retrieval.final_k == 10
    assert s.chat.channel_spaces == {}
    assert s.llm.base_url is None


def test_env_beats_toml_and_overrides_beat_env(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[evident]\nfinal_k = 5\nllm_model = "from-toml"\nlexical_k = 7\n')
    env = {"EVIDENT_FINAL_K": "12", "EVIDENT_LLM_MODEL": "from-env"}
    s = Settings.load(env=env, toml_path=path)
    assert s.retrieval.final_k == 12  # env over TOML
    assert s.llm.model == "from-env"
    assert s.retrieval.lexical_k == 7  # TOML over default
    s2 = Settings.load(env=env, toml_path=path, final_k=3, llm_model=None)
    assert s2.retrieval.final_k == 3  # override over env
    assert s2.llm.model == "from-env"  # a None override means "not given"


def test_toml_path_from_evident_config_env(tmp_path: Path) -> None:
    path = _toml(tmp_path, "dense_k = 4\n")  # top-level keys work as well as an [evident] table
    assert Settings.load(env={"EVIDENT_CONFIG": str(path)}).retrieval.dense_k == 4


def test_empty_env_value_counts_as_unset(tmp_path: Path) -> None:
    path = _toml(tmp_path, "final_k = 5\n")
    assert Settings.load(env={"EVIDENT_FINAL_K": ""}, toml_path=path).retrieval.final_k == 5


def test_unknown_toml_key_is_an_error(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[evident]\nfinal_kk = 5\n")
    with pytest.raises(ConfigError, match=r"unknown setting.*final_kk"):
        Settings.load(env={}, toml_path=path)


def test_missing_and_invalid_toml_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        Settings.load(env={}, toml_path=tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Settings.load(env={}, toml_path=_toml(tmp_path, "final_k = = 1"))


@pytest.mark.parametrize(("var", "value"), [
    ("EVIDENT_FINAL_K", "ten"),
    ("EVIDENT_LLM_TIMEOUT_S", "soon"),
    ("EVIDENT_ASK_EPHEMERAL", "maybe"),
    ("EVIDENT_CHANNEL_SPACES", "C123"),
])
def test_coercion_errors_name_the_env_var(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=var):
        Settings.load(env={var: value})


@pytest.mark.parametrize(("env", "message"), [
    ({"EVIDENT_CHANNEL_SPACES": "*=ENG"}, "names and wildcards are not supported"),
    ({"EVIDENT_CHANNEL_SPACES": "#eng=ENG"}, "is not a channel id"),
    ({"EVIDENT_DEFAULT_SPACES": "none,ENG"}, "stands alone"),
])
def test_channel_names_wildcards_and_mixed_defaults_are_rejected(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.load(env=env)


def test_teams_channel_ids_and_default_scope_are_read() -> None:
    s = Settings.load(
        env={"EVIDENT_CHANNEL_SPACES": "19:abc@thread.tacv2=ENG;C1=HR", "EVIDENT_DEFAULT_SPACES": "none"}
    )
    assert s.chat.channel_spaces == {"19:abc@thread.tacv2": ("ENG",), "C1": ("HR",)}
    assert s.chat.default_spaces == ("none",)


def test_coercion_of_types() -> None:
    s = Settings.load(env={
        "EVIDENT_LLM_TIMEOUT_S": "2.5", "EVIDENT_ASK_EPHEMERAL": "yes", "EVIDENT_IGNORE_BOTS": "off",
        "EVIDENT_CONTEXT_ITEMS": "title, heading ,,breadcrumb", "EVIDENT_DATA_DIR": "~/evident-data",
    })
    assert s.llm.timeout_s == 2.5
    assert s.slack.ask_ephemeral is True
    assert s.slack.ignore_bots is False
    assert s.ingest.context_items == ("title", "heading", "breadcrumb")
    assert s.core.data_dir == Path("~/evident-data").expanduser()
    assert s.core.resolved_store_path == s.core.data_dir / "evident.db"
    assert s.core.resolved_index_dir == s.core.data_dir / "index"


def test_channel_spaces_parsing(tmp_path: Path) -> None:
    s = Settings.load(env={"EVIDENT_CHANNEL_SPACES": " C123=ENG, OPS ;C456=HR;; "})
    assert s.chat.channel_spaces == {"C123": ("ENG", "OPS"), "C456": ("HR",)}
    path = _toml(tmp_path, '[evident.channel_spaces]\nC1 = ["ENG"]\nC2 = "HR,OPS"\n')
    s2 = Settings.load(env={}, toml_path=path)
    assert s2.chat.channel_spaces == {"C1": ("ENG",), "C2": ("HR", "OPS")}


def test_secrets_never_print(caplog: pytest.LogCaptureFixture) -> None:
    token = "xoxb-very-secret-123"
    s = Settings.load(env={"SLACK_BOT_TOKEN": token, "EVIDENT_LLM_API_KEY": "sk-abc-999"})
    assert isinstance(s.slack.bot_token, Secret)
    assert s.slack.bot_token.get_secret_value() == token
    renderings = [repr(s), str(s), f"{s}", f"{s.slack.bot_token}", f"{s.slack.bot_token!r}",
                  "%s" % s.slack.bot_token, "{}".format(s.slack.bot_token),  # noqa: UP031, UP032 - on purpose
                  str(s.masked()), repr(s.masked())]
    for text in renderings:
        assert token not in text
        assert "sk-abc-999" not in text
    masked = s.masked()
    assert masked["slack_bot_token"] == "***"
    assert masked["slack_app_token"] == ""  # unset secrets stay visibly unset
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("settings: %s token=%s", s, s.slack.bot_token)
    assert token not in caplog.text


def test_secret_from_toml_is_wrapped(tmp_path: Path) -> None:
    s = Settings.load(env={}, toml_path=_toml(tmp_path, 'confluence_token = "pat-42"\n'))
    assert isinstance(s.confluence.token, Secret)
    assert "pat-42" not in repr(s)
    assert s.confluence.token.get_secret_value() == "pat-42"


def test_model_for_role_falls_back_to_default() -> None:
    s = Settings.load(env={"EVIDENT_LLM_MODEL": "base", "EVIDENT_LLM_MODEL_JUDGE": "judge"})
    assert s.llm.model_for("judge") == "judge"
    assert s.llm.model_for("answer") == "base"


def test_settings_are_frozen() -> None:
    s = Settings.load(env={})
    with pytest.raises(ValueError, match="frozen"):
        s.retrieval.final_k = 1  # type: ignore[misc]
    assert s.replace(final_k=1).retrieval.final_k == 1 and s.retrieval.final_k == 10
    with pytest.raises(ConfigError, match="EVIDENT_FINAL_K=0 is below"):
        s.replace(final_k=0)  # changes are validated too


def test_engine_options_reject_an_explain_method_that_cannot_run(tmp_path: Path) -> None:
    from pipeline.factory import engine_options

    with pytest.raises(ConfigError, match="EVIDENT_ATTRIBUTION_METHOD='bogus' is not one of"):  # now at load
        engine_options(Settings.load(env={"EVIDENT_ATTRIBUTION_METHOD": "bogus"}, data_dir=tmp_path))
    with pytest.raises(ConfigError, match="EVIDENT_LLM_PROMPT_LOGPROBS"):
        engine_options(
            Settings.load(
                env={
                    "EVIDENT_ATTRIBUTION_METHOD": "logprob",
                    "EVIDENT_LLM_BASE_URL": "http://127.0.0.1:9/v1",
                },
                data_dir=tmp_path,
            )
        )
    ok = engine_options(
        Settings.load(
            env={
                "EVIDENT_ATTRIBUTION_METHOD": "logprob",
                "EVIDENT_LLM_PROMPT_LOGPROBS": "1",
                "EVIDENT_LLM_BASE_URL": "http://127.0.0.1:9/v1",
            },
            data_dir=tmp_path,
        )
    )
    assert ok.attribution_method == "logprob" and ok.prompt_logprobs is True
    with pytest.raises(ConfigError, match=r"raw_chatlm\.j2' not found"):
        engine_options(
            Settings.load(
                env={
                    "EVIDENT_LLM_PROMPT_LOGPROBS": "1",
                    "EVIDENT_LLM_RAW_TEMPLATE": "raw_chatlm",
                    "EVIDENT_LLM_BASE_URL": "http://127.0.0.1:9/v1",
                },
                data_dir=tmp_path,
            )
        )


@pytest.mark.parametrize(("env", "fragment"), [
    ({"EVIDENT_FINAL_K": "-3"}, "EVIDENT_FINAL_K=-3 is below its minimum 1"),
    ({"EVIDENT_LLM_BASE_URL": "localhost:8000"},
     "EVIDENT_LLM_BASE_URL='localhost:8000' is not an http(s) URL"),
    ({"QDRANT_URL": "http://user:pw@"}, "QDRANT_URL='http://***@' is not an http(s) URL"),
    ({"EVIDENT_RETRIEVAL_MODE": "fancy"},
     "EVIDENT_RETRIEVAL_MODE='fancy' is not one of: lexical, dense, hybrid"),
    ({"EVIDENT_HTTP_PORT": "70000"}, "EVIDENT_HTTP_PORT=70000 is above its maximum 65535"),
    ({"EVIDENT_MIN_TEXT_COVERAGE": "1.5"}, "EVIDENT_MIN_TEXT_COVERAGE=1.5 is above its maximum 1"),
    ({"EVIDENT_ATTRIBUTION_METHOD": "bogus"}, "EVIDENT_ATTRIBUTION_METHOD='bogus' is not one of: naive"),
    ({"EVIDENT_EMBED_PROCESS": "sometimes"}, "EVIDENT_EMBED_PROCESS='sometimes' is not one of"),
])
def test_bad_values_fail_at_load_naming_the_variable(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings.load(env=env)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert "pw" not in str(err.value)


def test_good_values_pass_validation() -> None:
    s = Settings.load(env={"EVIDENT_LOG_LEVEL": "debug", "EVIDENT_LLM_BASE_URL": "https://api.openai.com/v1",
                           "QDRANT_URL": "http://qdrant:6333", "EVIDENT_FINAL_K": "1"})
    assert s.retrieval.final_k == 1 and s.core.log_level == "DEBUG"
    assert s.index.qdrant_url == "http://qdrant:6333"


def test_secret_is_not_a_string() -> None:
    secret = Secret("tok-123")
    assert not isinstance(secret, str)
    for attempt in (lambda: json.dumps({"k": secret}), lambda: "".join([secret]),  # type: ignore[list-item]
                    lambda: secret[0:3], lambda: "Bearer " + secret):  # type: ignore[index,operator]
        with pytest.raises(TypeError):
            attempt()
    assert "tok" not in f"{secret}" and secret == Secret("tok-123") and secret != "tok-123"
    assert bool(Secret("")) is False


def test_attribution_methods_in_settings_match_the_pipeline() -> None:
    from typing import get_args

    from pipeline.attribution import METHODS
    from pipeline.attribution.settings import MethodName

    assert tuple(METHODS) == get_args(MethodName)


def test_a_toml_table_per_area_with_its_field_names(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[retrieval]\nfinal_k = 4\n[slack]\ntransport = "http"\n')
    s = Settings.load(env={}, toml_path=path)
    assert s.retrieval.final_k == 4 and s.slack.transport == "http"
    with pytest.raises(ConfigError, match=r"unknown setting.*retrieval\.final_kk"):
        Settings.load(env={}, toml_path=_toml(tmp_path, "[retrieval]\nfinal_kk = 4\n"))


def test_every_setting_has_one_flat_key_and_one_owner() -> None:
    """Each area is declared in the package that uses it; no two settings share a variable or a key."""
    envs = [area.env_name(f) for area in Settings.areas().values() for f in area.model_fields]
    assert len(envs) == len(set(envs)) == len(Settings.keys())
    owners = {name: area.__module__ for name, area in Settings.areas().items()}
    assert owners["slack"] == "bot.slack.settings" and owners["teams"] == "bot.teams.settings"
    assert (
        owners["retrieval"] == "pipeline.answer.settings"
        and owners["confluence"] == "connectors.confluence.settings"
    )


def test_the_options_tests_build_by_default_are_productions() -> None:
    """Engine and retrieval options have no defaults of their own: what the tests' engine runs with is what
    `evident serve` runs with."""
    from helpers import options

    from pipeline.answer.settings import RetrievalSettings
    from pipeline.factory import engine_options

    production = Settings.load(env={})
    assert options() == engine_options(production)
    assert RetrievalSettings() == production.retrieval  # the area's defaults are the one declaration
    assert production.retrieval.lexical_k == 30 and production.retrieval.fusion == "dbsf"
    assert options().query_strategy == "prev_questions" and options().answer_style == "draft"
