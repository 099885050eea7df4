"""Settings machinery: one pydantic model per area, owned by the package that uses it, composed into groups.

An **area** (``Area``) declares its settings once: each field's default, its environment variable, its
documentation and its constraints (``Literal`` choices, ``ge``/``le`` ranges, ``SecretStr``, URL and
comma-list types below). A **group** (``SettingsGroup``) is a model whose fields are areas: the pipeline's
(``pipeline.settings.PipelineSettings``), the connectors' on top of it, the whole application's in the CLI.

``SettingsGroup.load`` reads every area once, lowest to highest precedence: defaults, a TOML file, the
environment, explicit overrides. TOML keys and overrides use one flat name per setting: its environment
variable, lower case, without ``EVIDENT_`` (``EVIDENT_FINAL_K`` -> ``final_k``, ``SLACK_BOT_TOKEN`` ->
``slack_bot_token``); a TOML file may also hold a table per area with the area's field names. A wrong value
is a ``ConfigError`` of one line naming the variable. The loader is ours, not pydantic-settings' sources:
those read ``os.environ`` and field names, while evident's settings are read from an explicit environment
(tests, ``evident config``) by variable names that predate the areas.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError
from pydantic.fields import FieldInfo

from pipeline.errors import ConfigError
from pipeline.runtime.redact import mask_url_credentials

__all__ = ["Area", "CommaList", "HttpUrl", "Lower", "OptionalPath", "SecretStr", "SettingsGroup", "UserPath",
           "flat_key", "setting"]


def setting(default: Any, env: str, doc: str, **constraints: Any) -> Any:
    """A field of an area: its default, environment variable, documentation and constraints (``ge``,
    ``le``)."""
    return Field(default, description=doc, json_schema_extra={"env": env}, **constraints)


def _split(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(s.strip() for s in value.split(",") if s.strip())
    if isinstance(value, list | tuple):
        return tuple(str(v).strip() for v in value)
    return value


def _url(value: Any) -> Any:
    if value is None or value == "":
        return None
    parts = urlsplit(str(value))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("is not an http(s) URL; write it with its scheme, e.g. http://localhost:8000")
    return str(value)


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _path(value: Any) -> Any:
    return Path(value).expanduser() if isinstance(value, str | Path) and str(value) else value


CommaList = Annotated[tuple[str, ...], BeforeValidator(_split)]
"""A comma-separated list in the environment (``a, b,,c`` -> ``("a", "b", "c")``), a list in TOML."""
HttpUrl = Annotated[str | None, BeforeValidator(_url)]
"""An http(s) URL with a host, or unset."""
Lower = BeforeValidator(_lower)
"""For ``Annotated[Literal[...], Lower]``: choices match in any case."""
UserPath = Annotated[Path, BeforeValidator(_path)]
OptionalPath = Annotated[Path | None, BeforeValidator(_path)]


def flat_key(env: str) -> str:
    """The name a setting has in TOML files and overrides: its variable, lower case, without ``EVIDENT_``."""
    return env.lower().removeprefix("evident_")


class Area(BaseModel):
    """The settings one package owns. Subclasses declare fields with ``setting(...)``."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
    title: ClassVar[str] = ""  # the heading of the area in docs/configuration.md

    @classmethod
    def env_defaults(cls, env: Mapping[str, str]) -> dict[str, Any]:
        """Defaults computed from the environment (e.g. ``$XDG_DATA_HOME``), by field name."""
        return {}

    @classmethod
    def env_name(cls, field: str) -> str:
        extra = cls.model_fields[field].json_schema_extra
        return str(extra.get("env")) if isinstance(extra, dict) and extra.get("env") else field.upper()

    @classmethod
    def is_secret(cls, field: str) -> bool:
        return cls.model_fields[field].annotation in (SecretStr, SecretStr | None)


class SettingsGroup(BaseModel):
    """Areas composed: a field per area. ``load`` reads them all once; ``replace`` changes flat keys."""

    model_config = ConfigDict(frozen=True)

    @classmethod
    def areas(cls) -> dict[str, type[Area]]:
        out: dict[str, type[Area]] = {}
        for name, info in cls.model_fields.items():
            if isinstance(info.annotation, type) and issubclass(info.annotation, Area):
                out[name] = info.annotation
        return out

    @classmethod
    def keys(cls) -> dict[str, tuple[str, str]]:
        """Flat key -> (area, field), for every setting of every area."""
        return {
            flat_key(area.env_name(f)): (name, f)
            for name, area in cls.areas().items()
            for f in area.model_fields
        }

    @classmethod
    def load(cls, *, env: Mapping[str, str] | None = None, toml_path: Path | None = None,
             **overrides: Any) -> Self:
        """Defaults < TOML (``toml_path`` or ``$EVIDENT_CONFIG``) < ``env`` (default ``os.environ``) <
        ``overrides`` (flat keys; None means not given)."""
        env = os.environ if env is None else env
        raw: dict[str, dict[str, Any]] = {name: area.env_defaults(env) for name, area in cls.areas().items()}
        path = toml_path or (Path(env["EVIDENT_CONFIG"]) if env.get("EVIDENT_CONFIG") else None)
        if path is not None:
            cls._read_toml(Path(path), raw)
        keys = cls.keys()
        for area, field in keys.values():
            value = env.get(cls.areas()[area].env_name(field))
            if value not in (None, ""):
                raw[area][field] = value
        unknown = sorted(k for k in overrides if k not in keys)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        for key, value in overrides.items():
            if value is not None:
                area, field = keys[key]
                raw[area][field] = value
        return cls(**{name: _validated(area, raw[name]) for name, area in cls.areas().items()})

    @classmethod
    def _read_toml(cls, path: Path, raw: dict[str, dict[str, Any]]) -> None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        data = data.get("evident", data)
        keys, areas, unknown = cls.keys(), cls.areas(), []
        for key, value in data.items():
            if key in keys:
                area, field = keys[key]
                raw[area][field] = value
            elif key in areas and isinstance(value, dict):  # [area] table with the area's field names
                for field, inner in value.items():
                    if field in areas[key].model_fields:
                        raw[key][field] = inner
                    else:
                        unknown.append(f"{key}.{field}")
            else:
                unknown.append(key)
        if unknown:
            raise ConfigError(f"unknown setting(s) in {path}: {', '.join(sorted(unknown))}")

    def replace(self, **changes: Any) -> Self:
        """A copy with flat-key ``changes`` applied and validated (None values are changes too: unset)."""
        keys = self.keys()
        unknown = sorted(k for k in changes if k not in keys)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        by_area: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            area, field = keys[key]
            by_area.setdefault(area, {})[field] = value
        updated = {}
        for area, fields in by_area.items():
            current: Area = getattr(self, area)
            data = {f: getattr(current, f) for f in type(current).model_fields}
            updated[area] = _validated(type(current), {**data, **fields})
        return self.model_copy(update=updated)

    def settings(self) -> Iterator[tuple[str, Area, str, FieldInfo]]:
        """(area name, area, field name, field info) for every setting, in declaration order."""
        for name in self.areas():
            area: Area = getattr(self, name)
            for field, info in type(area).model_fields.items():
                yield name, area, field, info

    def masked(self) -> dict[str, object]:
        """Effective configuration by flat key, secrets masked, for `evident config show`."""
        out: dict[str, object] = {}
        for _name, area, field, _info in self.settings():
            value = getattr(area, field)
            key = flat_key(type(area).env_name(field))
            if isinstance(value, SecretStr):
                out[key] = "***" if value.get_secret_value() else ""
            elif isinstance(value, Path):
                out[key] = str(value)
            elif isinstance(value, str) and "://" in value:
                out[key] = mask_url_credentials(value)
            elif isinstance(value, tuple):
                out[key] = list(value)
            elif isinstance(value, Mapping):
                out[key] = {k: list(s) for k, s in value.items()}
            else:
                out[key] = value
        return out

    def secret_values(self) -> list[str]:
        """Every configured secret, and the credentials written into URL settings (for the redactor)."""
        values: list[str] = []
        for _name, area, field, _info in self.settings():
            value = getattr(area, field)
            if isinstance(value, SecretStr):
                values.append(value.get_secret_value())
            elif isinstance(value, str) and "://" in value:
                parts = urlsplit(value)
                values += [p for p in (parts.username, parts.password) if p]
        return values


def _validated(area: type[Area], data: dict[str, Any]) -> Area:
    try:
        return area.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(area, exc)) from None


def _one_line(area: type[Area], exc: ValidationError) -> str:
    """The first problem, naming the variable: ``EVIDENT_FINAL_K=0 is below its minimum 1``."""
    error = exc.errors(include_url=False)[0]
    field = str(error["loc"][0]) if error["loc"] else ""
    if field not in area.model_fields:
        return f"{area.title or area.__name__}: {error['msg'].removeprefix('Value error, ')}"
    env = area.env_name(field)
    shown = "***" if area.is_secret(field) else mask_url_credentials(repr(error.get("input")))
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "literal_error":
        choices = str(ctx.get("expected", "")).replace(" or ", ", ").replace("'", "")
        return f"{env}={shown} is not one of: {choices}"
    if kind == "greater_than":
        return f"{env}={error.get('input')} must be greater than {ctx.get('gt')}"
    if kind == "greater_than_equal":
        return f"{env}={error.get('input')} is below its minimum {ctx.get('ge')}"
    if kind == "finite_number":
        return f"{env}={error.get('input')} must be a finite number"
    if kind in ("less_than_equal", "less_than"):
        return f"{env}={error.get('input')} is above its maximum {ctx.get('le', ctx.get('lt'))}"
    if kind == "value_error":
        message = error["msg"].removeprefix("Value error, ")
        return f"{env}={shown} {message}" if message.startswith("is ") else f"{env}: {message}"
    return f"{env}: cannot read {shown} ({error['msg']})"
