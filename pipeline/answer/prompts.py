"""Prompt templates, rendered in Jinja2's immutable sandbox.

Convention: each ``prompts/<name>.j2`` starts with ``{# version: N #}`` and defines two blocks,
``{% block system %}`` and ``{% block user %}``; each block becomes one ``ChatMessage``. Rendering the
blocks separately (instead of splitting rendered text at a marker line) means page text, which is
untrusted and only ever passed in as a variable, cannot forge the system/user boundary; the sandbox
keeps template authors (a custom ``EVIDENT_PROMPTS_DIR``) away from Python internals.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pipeline.errors import ConfigError
from pipeline.models.chat_tokens import neutralize_special_tokens
from pipeline.types import ChatMessage

OUT_OF_SCOPE = "The desired information cannot be found in the retrieved pool of evidence."
# EVIDENT_ANSWER_STYLE -> the answer template (``prompts/``): the same rules and inputs, three ways of asking.
ANSWER_TEMPLATES = {"plain": "answer", "persona": "answer_persona", "cot": "answer_cot",
                    "draft": "answer_draft"}
_ANSWER_LINE = re.compile(r"^\s*(?:\*\*)?(?:final\s+)?(?:answer|antwort)\s*(?:\*\*)?\s*:\s*(?:\*\*)?\s*",
                          re.IGNORECASE | re.MULTILINE)


_REASONING_START = re.compile(r"^\s*(?:\*\*)?(?:reasoning|überlegung|begründung|thinking|thoughts?|step)\b",
                              re.IGNORECASE)


def answer_stream(sink: Callable[[str], Awaitable[None]]) -> Callable[[str], Awaitable[None]]:
    """For ``cot``: a text sink that shows only the answer as it streams. Text is held back while the reply
    starts with reasoning ("Reasoning: …") and forwarded from its "Answer:" line on; a reply that does not
    start with reasoning (a model that skips it) is forwarded whole, as with the other styles."""
    held: list[str] = []
    state = {"mode": "undecided"}  # undecided -> reasoning -> answer | passthrough

    async def add(text: str) -> None:
        if state["mode"] in ("answer", "passthrough"):
            await sink(text)
            return
        held.append(text)
        buffer = "".join(held)
        if state["mode"] == "undecided":
            if len(buffer.strip()) < 12 and "\n" not in buffer:
                return
            state["mode"] = "reasoning" if _REASONING_START.match(buffer) else "passthrough"
            if state["mode"] == "passthrough":
                held.clear()
                await sink(buffer)
                return
        marks = list(_ANSWER_LINE.finditer(buffer))
        if marks and buffer[marks[-1].end():].strip():
            state["mode"] = "answer"
            held.clear()
            await sink(buffer[marks[-1].end():].lstrip())

    return add


def final_answer(text: str, style: str) -> str:
    """What the user sees of a generation: for ``cot``, the text after the last "Answer:" line (the reasoning
    before it is dropped; a reply without one is kept whole); other styles unchanged."""
    if style != "cot":
        return text
    marks = list(_ANSWER_LINE.finditer(text))
    return text[marks[-1].end():].strip() if marks else text.strip()

_VERSION = re.compile(r"\A\s*\{#-?\s*version:\s*([^\s#]+)\s*-?#\}")
_ROLES = ("system", "user")
# Chat-format control tokens in untrusted text (page text, questions, earlier answers) could forge a
# turn wherever a server parses special tokens in message content: ChatML/Qwen/Llama-3/Phi <|...|>,
# Mistral [INST], Gemma <start_of_turn>, SentencePiece <s>.
def default_prompts_dir() -> Path:
    """The ``prompts/`` folder shipped next to the ``pipeline`` package."""
    return Path(__file__).resolve().parents[2] / "prompts"


class PromptLibrary:
    """Loads ``<name>.j2`` templates from one directory and renders them to chat messages."""

    def __init__(self, prompts_dir: Path | None = None) -> None:
        self.prompts_dir = Path(prompts_dir) if prompts_dir else default_prompts_dir()
        if not self.prompts_dir.is_dir():
            raise ConfigError(f"EVIDENT_PROMPTS_DIR: {self.prompts_dir} is not a directory")
        self._env = ImmutableSandboxedEnvironment(
            loader=jinja2.FileSystemLoader(str(self.prompts_dir)),
            autoescape=False,  # plain-text prompts, not HTML
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=False,
        )
        self._env.globals["out_of_scope"] = OUT_OF_SCOPE

    @staticmethod
    def _file(name: str) -> str:
        return name if name.endswith(".j2") else f"{name}.j2"

    def _template(self, name: str) -> jinja2.Template:
        try:
            return self._env.get_template(self._file(name))
        except jinja2.TemplateNotFound as exc:
            raise ConfigError(
                f"prompt template '{self._file(name)}' not found in {self.prompts_dir}"
            ) from exc
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(
                f"prompt template '{self._file(name)}' line {exc.lineno}: {exc.message}"
            ) from exc

    def check(self, name: str) -> None:
        """Load (and so parse) a template now; a configured name that is missing fails at start-up."""
        self._template(name)

    def version(self, name: str) -> str:
        """The ``{# version: N #}`` header, stored with every turn so answers can be traced to a prompt."""
        path = self.prompts_dir / self._file(name)
        try:
            head = path.read_text(encoding="utf-8")[:200]
        except FileNotFoundError as exc:
            raise ConfigError(f"prompt template '{path.name}' not found in {self.prompts_dir}") from exc
        m = _VERSION.match(head)
        if not m:
            raise ConfigError(f"prompt template '{path.name}' lacks a '{{# version: N #}}' header")
        return m.group(1)

    def render(self, name: str, /, **variables: Any) -> list[ChatMessage]:
        """Render the template's system and user blocks (empty blocks are left out).

        Raises ``ConfigError`` for a missing template or variable, and lets
        ``jinja2.sandbox.SecurityError`` through when a template reaches for unsafe attributes.
        """
        template = self._template(name)
        missing = [b for b in _ROLES if b not in template.blocks]
        if missing:
            raise ConfigError(f"prompt template '{self._file(name)}' lacks block(s): {', '.join(missing)}")
        out: list[ChatMessage] = []
        try:
            ctx = template.new_context(dict(variables))
            for role in _ROLES:
                text = "".join(template.blocks[role](ctx)).strip()
                if text:
                    out.append(ChatMessage(role, text))  # type: ignore[arg-type]
        except jinja2.UndefinedError as exc:
            raise ConfigError(f"prompt template '{self._file(name)}': {exc.message}") from exc
        return out

    def render_raw(self, name: str, messages: Sequence[ChatMessage]) -> str:
        """Render chat messages into one raw prompt string with a chat-format template (``raw_chatml.j2``).

        Teacher-forced scoring goes through ``/v1/completions``, which applies no chat template, so the
        model's own format has to be written out here. Special-token look-alikes are removed from the
        message contents first, since those contents carry untrusted page text.
        """
        template = self._template(name)
        clean = [{"role": m.role, "content": neutralize_special_tokens(m.content)} for m in messages]
        try:
            return template.render(messages=clean)
        except jinja2.UndefinedError as exc:
            raise ConfigError(f"prompt template '{self._file(name)}': {exc.message}") from exc
