"""Settings: precedence, coercion, errors that name the setting, secrets that never print."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.runtime.settings import Secret, Settings


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "evident.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_env_or_file(tmp_path: Path) -> None:
    s = Settings.load(env={"XDG_DATA_HOME": str(tmp_path)})
    assert s.retrieval_mode == "hybrid"
    assert s.final_k == 10
    assert s.channel_spaces == {}
    assert s.llm_base_url is None


def test_env_beats_toml_and_overrides_beat_env(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[evident]\nfinal_k = 5\nllm_model = "from-toml"\nlexical_k = 7\n')
    env = {"EVIDENT_FINAL_K": "12", "EVIDENT_LLM_MODEL": "from-env"}
    s = Settings.load(env=env, toml_path=path)
    assert s.final_k == 12  # env over TOML
    assert s.llm_model == "from-env"
    assert s.lexical_k == 7  # TOML over default
    s2 = Settings.load(env=env, toml_path=path, final_k=3, llm_model=None)
    assert s2.final_k == 3  # override over env
    assert s2.llm_model == "from-env"  # a None override means "not given"


def test_toml_path_from_evident_config_env(tmp_path: Path) -> None:
    path = _toml(tmp_path, "dense_k = 4\n")  # top-level keys work as well as an [evident] table
    assert Settings.load(env={"EVIDENT_CONFIG": str(path)}).dense_k == 4


def test_empty_env_value_counts_as_unset(tmp_path: Path) -> None:
    path = _toml(tmp_path, "final_k = 5\n")
    assert Settings.load(env={"EVIDENT_FINAL_K": ""}, toml_path=path).final_k == 5


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
    s = Settings.load(env={"EVIDENT_CHANNEL_SPACES": "19:abc@thread.tacv2=ENG;C1=HR", "EVIDENT_DEFAULT_SPACES": "none"})
    assert s.channel_spaces == {"19:abc@thread.tacv2": ("ENG",), "C1": ("HR",)}
    assert s.default_spaces == ("none",)


def test_coercion_of_types() -> None:
    s = Settings.load(env={
        "EVIDENT_LLM_TIMEOUT_S": "2.5", "EVIDENT_ASK_EPHEMERAL": "yes", "EVIDENT_IGNORE_BOTS": "off",
        "EVIDENT_CONTEXT_ITEMS": "title, heading ,,breadcrumb", "EVIDENT_DATA_DIR": "~/evident-data",
    })
    assert s.llm_timeout_s == 2.5
    assert s.ask_ephemeral is True
    assert s.ignore_bots is False
    assert s.context_items == ("title", "heading", "breadcrumb")
    assert s.data_dir == Path("~/evident-data").expanduser()
    assert s.resolved_store_path == s.data_dir / "evident.db"
    assert s.resolved_index_dir == s.data_dir / "index"


def test_channel_spaces_parsing(tmp_path: Path) -> None:
    s = Settings.load(env={"EVIDENT_CHANNEL_SPACES": " C123=ENG, OPS ;C456=HR;; "})
    assert s.channel_spaces == {"C123": ("ENG", "OPS"), "C456": ("HR",)}
    path = _toml(tmp_path, '[evident.channel_spaces]\nC1 = ["ENG"]\nC2 = "HR,OPS"\n')
    s2 = Settings.load(env={}, toml_path=path)
    assert s2.channel_spaces == {"C1": ("ENG",), "C2": ("HR", "OPS")}


def test_secrets_never_print(caplog: pytest.LogCaptureFixture) -> None:
    token = "xoxb-very-secret-123"
    s = Settings.load(env={"SLACK_BOT_TOKEN": token, "EVIDENT_LLM_API_KEY": "sk-abc-999"})
    assert isinstance(s.slack_bot_token, Secret)
    assert s.slack_bot_token.reveal() == token
    renderings = [repr(s), str(s), f"{s}", f"{s.slack_bot_token}", f"{s.slack_bot_token!r}",
                  "%s" % s.slack_bot_token, "{}".format(s.slack_bot_token),  # noqa: UP031, UP032 - on purpose
                  str(s.masked()), repr(s.masked())]
    for text in renderings:
        assert token not in text
        assert "sk-abc-999" not in text
    masked = s.masked()
    assert masked["slack_bot_token"] == "***"
    assert masked["slack_app_token"] == ""  # unset secrets stay visibly unset
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("settings: %s token=%s", s, s.slack_bot_token)
    assert token not in caplog.text


def test_secret_from_toml_is_wrapped(tmp_path: Path) -> None:
    s = Settings.load(env={}, toml_path=_toml(tmp_path, 'confluence_token = "pat-42"\n'))
    assert isinstance(s.confluence_token, Secret)
    assert "pat-42" not in repr(s)
    assert s.confluence_token.reveal() == "pat-42"


def test_model_for_role_falls_back_to_default() -> None:
    s = Settings.load(env={"EVIDENT_LLM_MODEL": "base", "EVIDENT_LLM_MODEL_JUDGE": "judge"})
    assert s.model_for("judge") == "judge"
    assert s.model_for("answer") == "base"


def test_settings_are_frozen() -> None:
    s = Settings.load(env={})
    with pytest.raises(AttributeError):
        s.final_k = 1  # type: ignore[misc]
    assert s.replace(final_k=1).final_k == 1


def test_engine_options_reject_an_explain_method_that_cannot_run(tmp_path: Path) -> None:
    from pipeline.factory import engine_options

    with pytest.raises(ConfigError, match="EVIDENT_ATTRIBUTION_METHOD='bogus' is not one of"):  # now at load
        engine_options(Settings.load(env={"EVIDENT_ATTRIBUTION_METHOD": "bogus"}, data_dir=tmp_path))
    with pytest.raises(ConfigError, match="EVIDENT_LLM_PROMPT_LOGPROBS"):
        engine_options(Settings.load(env={"EVIDENT_ATTRIBUTION_METHOD": "logprob",
                                          "EVIDENT_LLM_BASE_URL": "http://127.0.0.1:9/v1"}, data_dir=tmp_path))
    ok = engine_options(Settings.load(env={"EVIDENT_ATTRIBUTION_METHOD": "logprob", "EVIDENT_LLM_PROMPT_LOGPROBS": "1",
                                           "EVIDENT_LLM_BASE_URL": "http://127.0.0.1:9/v1"}, data_dir=tmp_path))
    assert ok.attribution_method == "logprob" and ok.prompt_logprobs is True
    with pytest.raises(ConfigError, match=r"raw_chatlm\.j2' not found"):
        engine_options(Settings.load(env={"EVIDENT_LLM_PROMPT_LOGPROBS": "1", "EVIDENT_LLM_RAW_TEMPLATE": "raw_chatlm",
                                          "EVIDENT_LLM_BASE_URL": "http://127.0.0.1:9/v1"}, data_dir=tmp_path))


@pytest.mark.parametrize(("env", "fragment"), [
    ({"EVIDENT_FINAL_K": "-3"}, "EVIDENT_FINAL_K=-3 is below its minimum 1"),
    ({"EVIDENT_LLM_BASE_URL": "localhost:8000"}, "EVIDENT_LLM_BASE_URL='localhost:8000' is not an http(s) URL"),
    ({"QDRANT_URL": "http://user:pw@"}, "QDRANT_URL='http://***@' is not an http(s) URL"),
    ({"EVIDENT_RETRIEVAL_MODE": "fancy"}, "EVIDENT_RETRIEVAL_MODE='fancy' is not one of: lexical, dense, hybrid"),
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
    assert s.final_k == 1 and s.validate() is s


def test_secret_is_not_a_string() -> None:
    secret = Secret("tok-123")
    assert not isinstance(secret, str)
    for attempt in (lambda: json.dumps({"k": secret}), lambda: "".join([secret]),  # type: ignore[list-item]
                    lambda: secret[0:3], lambda: "Bearer " + secret):  # type: ignore[index,operator]
        with pytest.raises(TypeError):
            attempt()
    assert f"{secret}" == "***" and secret == Secret("tok-123") and secret != "tok-123" and bool(Secret("")) is False


def test_attribution_methods_in_settings_match_the_pipeline() -> None:
    from pipeline.attribution import METHODS
    from pipeline.runtime.settings import ATTRIBUTION_METHODS

    assert tuple(METHODS) == ATTRIBUTION_METHODS
