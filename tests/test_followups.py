"""Suggested next questions: parsing, the offline fallback, and the engine with a real LLM client."""

from __future__ import annotations

from typing import Any

from stub_llm import StubLLMServer

from pipeline.answer.followups import about_cited_pages, parse_suggestions, suggest_followups
from pipeline.answer.prompts import PromptLibrary
from pipeline.models.llm import OpenAILLM
from pipeline.types import Citation

CITED = [Citation(2, "u2", "VPN guide", "IT", ()), Citation(1, "u1", "Remote work", "HR", ()),
         Citation(3, "u3", "VPN guide", "IT", ())]


def test_parse_drops_bullets_numbering_duplicates_and_the_asked_question() -> None:
    text = (
        "1. How do I reset my token?\n- how do i reset my token?\n* Who approves access?\n\nHow do I get "
        "VPN?\n"
        "• Is there a Linux client?\nA fourth one?"
    )
    assert parse_suggestions(text, "How do I get VPN?") == [
        "How do I reset my token?", "Who approves access?", "Is there a Linux client?"]


def test_offline_suggestions_ask_about_the_cited_pages_in_citation_order() -> None:
    assert about_cited_pages(CITED) == ["What else does the wiki say about Remote work?",
                                        "What else does the wiki say about VPN guide?"]
    assert about_cited_pages([]) == []


async def test_llm_suggestions_and_fallback_on_failure() -> None:
    def responder(req: dict[str, Any]) -> str:
        assert "Follow-up questions:" in req["messages"][-1]["content"]
        return "Who approves VPN access?\nIs there a Linux client?"

    async with StubLLMServer(responder=responder) as stub:
        llm = OpenAILLM(base_url=stub.base_url, api_key="k", models={"answer": "m", "completion": "m"},
                        max_retries=0)
        prompts = PromptLibrary()
        got = await suggest_followups(llm, prompts, "How do I get VPN?", "Open the portal [1].", CITED)
        assert got == ["Who approves VPN access?", "Is there a Linux client?"]
        stub.fail_next("500")
        assert await suggest_followups(llm, prompts, "How do I get VPN?", "Open the portal [1].", CITED) == \
            about_cited_pages(CITED)
        await llm.close()
