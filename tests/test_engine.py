"""The conversation engine end to end: real Edge index, real store, real prompts, real OpenAI client
against the local stub LLM server."""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    DEPLOY_URL,
    ONCALL_URL,
    RAG_MEETING_URL,
    EngineParts,
    HashEmbedder,
    ingest_folder,
    make_engine,
    make_llm,
    open_copy,
    sample_index_fixture,  # noqa: F401
)
from helpers import (
    options as engine_options_for,
)
from stub_llm import StubLLMServer

from pipeline.access.scope import EVERYTHING, AccessScope
from pipeline.answer.options import EngineOptions
from pipeline.answer.prompts import OUT_OF_SCOPE
from pipeline.answer.query_builder import MAX_QUESTION_CHARS
from pipeline.answer.settings import RetrievalSettings

REPHRASED = "Who is the primary on-call engineer in weeks 5 to 6?"
DRAFT_LINE = "Draft answer (quoted from the sources): "


def _system(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"])


def _user(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


def _is_rephrase(body: dict[str, Any]) -> bool:
    return "rewrite the last message" in _system(body)


def _answers(stub: StubLLMServer) -> list[dict[str, Any]]:
    return [r for r in stub.requests if not _is_rephrase(r)]


Make = Callable[..., Awaitable[EngineParts]]


@pytest.fixture
async def make(sample_index_template: Path, tmp_path: Path) -> AsyncIterator[Make]:
    """Engines over private copies of the sample index; all share one store file per test."""
    made: list[EngineParts] = []

    async def factory(*, llm_url: str | None = None, options: EngineOptions | None = None,
                      retrieval: RetrievalSettings | None = None, max_retries: int = 2) -> EngineParts:
        index, embedder = await open_copy(sample_index_template, tmp_path / f"index{len(made)}")
        llm = make_llm(llm_url, max_retries=max_retries) if llm_url else None
        parts = make_engine(
            index, embedder, tmp_path / "evident.db", llm=llm, options=options, retrieval=retrieval
        )
        made.append(parts)
        return parts

    yield factory
    for p in made:
        await p.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- question completion


async def test_turn1_is_kept_and_followups_are_rephrased_with_history(make: Make) -> None:
    def respond(body: dict[str, Any]) -> str:
        return REPHRASED if _is_rephrase(body) else "Farah Haddad [Source 1]."

    async with StubLLMServer(responder=respond) as stub:
        p = await make(llm_url=stub.base_url)
        first = await p.engine.ask("t:1", "Who is primary on call in weeks 3 to 4?", scope=EVERYTHING)
        assert first.error is None and not first.is_followup
        assert first.completed_question == "Who is primary on call in weeks 3 to 4?"
        assert not any(_is_rephrase(r) for r in stub.requests)  # turn 1: no completion call
        assert len(stub.requests) == 1

        second = await p.engine.ask("t:1", "And weeks 5 to 6?", scope=EVERYTHING)
        rephrase = [r for r in stub.requests if _is_rephrase(r)]
        assert len(rephrase) == 1
        assert "User: Who is primary on call in weeks 3 to 4?" in _user(rephrase[0])
        assert "Assistant: Farah Haddad [1]." in _user(rephrase[0])
        assert "User's last statement: And weeks 5 to 6?" in _user(rephrase[0])
        assert second.is_followup and second.completed_question == REPHRASED
        builder = "And weeks 5 to 6? Who is primary on call in weeks 3 to 4?"
        assert second.retrieval is not None and second.retrieval.query == builder  # retrieved without the LLM
        assert f"Question: {REPHRASED}" in _user(_answers(stub)[-1])
        turns = await p.store.history("t:1")
        assert [t.completed_question for t in turns] == ["Who is primary on call in weeks 3 to 4?", REPHRASED]
        assert turns[1].retrieval_query == builder and turns[1].question == "And weeks 5 to 6?"
        assert turns[1].citations[0].url == ONCALL_URL


async def test_failed_completion_falls_back_to_the_query_builder(make: Make) -> None:
    async with StubLLMServer(default_reply="Erik Larsen [Source 1].") as stub:
        p = await make(llm_url=stub.base_url, max_retries=0)
        await p.engine.ask("t:fb", "Who is primary on call in weeks 3 to 4?", scope=EVERYTHING)
        stub.fail_next("500")  # the completion call fails; the answer call succeeds
        r = await p.engine.ask("t:fb", "And weeks 5 to 6?", scope=EVERYTHING)
        assert r.error is None and r.completed_question == "And weeks 5 to 6?"
        assert r.retrieval is not None and "weeks 3 to 4" in r.retrieval.query


@pytest.mark.parametrize("mode", ["builder", "fused", "completed"])
async def test_a_follow_up_the_llm_completes_badly_is_still_retrieved_with_the_thread_query(
    make: Make, mode: str
) -> None:
    """A wrong completion cannot lose the evidence the thread asks for where the no-LLM thread query retrieves
    (``builder``, the default) or is fused with it (``fused``); alone (``completed``) it decides what is
    found. (The previous page's continuity boost is off here, so only the queries decide.)"""
    wrong = "What does the cafeteria serve for lunch in weeks 5 and 6?"  # keeps the message's words: used

    def respond(body: dict[str, Any]) -> str:
        return wrong if _is_rephrase(body) else "Farah Haddad [Source 1]."

    async with StubLLMServer(responder=respond) as stub:
        p = await make(llm_url=stub.base_url, options=engine_options_for(followup_retrieval=mode),
                       retrieval=RetrievalSettings(continuity_boost=0, final_k=5))
        await p.engine.ask("t:f", "Who is primary on call in weeks 3 to 4?", scope=EVERYTHING)
        r = await p.engine.ask("t:f", "And weeks 5 to 6?", scope=EVERYTHING)
        assert r.completed_question == wrong  # answered as completed
        assert r.retrieval is not None
        if mode == "completed":
            assert r.retrieval.query == wrong  # the completion alone decides what is found
        else:
            found = any("Weeks is 5 to 6" in h.evidence.text for h in r.retrieval.hits)
            assert found and "weeks 3 to 4" in r.retrieval.query, [h.evidence.text[:50]
                                                                   for h in r.retrieval.hits]


@pytest.mark.parametrize("mode", ["builder", "completed"])
async def test_a_completion_that_drops_the_messages_words_is_not_used(make: Make, mode: str) -> None:
    """Qwen2.5-0.5B rewrote follow-ups into an earlier turn's question; such a "completion" is not answered
    nor retrieved with: the message is answered as asked, retrieved with the thread query."""
    def respond(body: dict[str, Any]) -> str:
        return "Who is primary on call?" if _is_rephrase(body) else "Farah Haddad [Source 1]."

    async with StubLLMServer(responder=respond) as stub:
        p = await make(llm_url=stub.base_url, options=engine_options_for(followup_retrieval=mode),
                       retrieval=RetrievalSettings(continuity_boost=0, final_k=5))
        await p.engine.ask("t:d", "Who is primary on call in weeks 3 to 4?", scope=EVERYTHING)
        r = await p.engine.ask("t:d", "And the weeks 5 to 6?", scope=EVERYTHING)
        assert r.error is None and r.completed_question == "And the weeks 5 to 6?"
        assert r.retrieval is not None and "weeks 3 to 4" in r.retrieval.query
        assert any("Weeks is 5 to 6" in h.evidence.text for h in r.retrieval.hits)
        assert "Question: And the weeks 5 to 6?" in _user(_answers(stub)[-1])


# ---------------------------------------------------------------- offline (no LLM)


async def test_no_llm_answers_extractively_and_builds_followup_queries(make: Make) -> None:
    p = await make()
    r = await p.engine.ask("t:x", "What is Alice's todo from the RAG meeting in October?", scope=EVERYTHING)
    assert r.error is None and r.answer.extractive and r.answer.model == "extractive"
    assert "Prepare the evaluation todo list" in r.answer.text
    assert r.answer.citations[0].url == RAG_MEETING_URL  # production's retrieval may add a second source
    assert "[1]" in r.answer.text
    follow = await p.engine.ask("t:x", "And Bruno?", scope=EVERYTHING)
    assert follow.is_followup and follow.completed_question == "And Bruno?"
    assert follow.retrieval is not None
    assert follow.retrieval.query != "And Bruno?" and "RAG meeting" in follow.retrieval.query
    assert "Collect 50 real questions" in follow.answer.text
    stored = await p.store.history("t:x")
    assert stored[1].retrieval_query == follow.retrieval.query and stored[1].extractive is True


# ---------------------------------------------------------------- citations and scope


async def test_source_markers_become_page_links_and_bogus_ones_are_dropped(make: Make) -> None:
    reply = "Alice prepares the evaluation todo list [Source 2]. It was agreed in October [Source 9]."
    async with StubLLMServer(default_reply=reply) as stub:
        p = await make(llm_url=stub.base_url, retrieval=RetrievalSettings(final_k=5))
        r = await p.engine.ask(
            "t:c", "What is Alice's todo from the RAG meeting in October?", scope=EVERYTHING
        )
    assert r.error is None and not r.answer.out_of_scope
    assert len(r.answer.evidence) == 5
    assert r.answer.text == "Alice prepares the evaluation todo list [1]. It was agreed in October."
    (c,) = r.answer.citations
    assert c.number == 1 and c.url == r.answer.evidence[1].evidence.url == RAG_MEETING_URL
    assert c.evidence_ids == (r.answer.evidence[1].evidence.id,)
    assert r.answer.trace.raw_answer == reply


async def test_streamed_answer_shows_the_markers_of_the_final_answer_as_it_is_generated(make: Make) -> None:
    reply = "Alice prepares the evaluation todo list [Source 2]. It was agreed in October [Source 9]."
    pieces: list[str] = []

    async def sink(text: str) -> None:
        pieces.append(text)

    async with StubLLMServer(default_reply=reply) as stub:
        stub.fail_next("429", retry_after=0.01)  # retried: nothing was shown yet
        p = await make(llm_url=stub.base_url, retrieval=RetrievalSettings(final_k=5))
        r = await p.engine.ask(
            "t:s", "What is Alice's todo from the RAG meeting in October?", on_text=sink, scope=EVERYTHING
        )
        assert stub.requests[-1]["stream"] is True
    # [Source 2] streams as [1], [Source 9] never
    assert len(pieces) > 5 and "".join(pieces).strip() == r.answer.text
    assert r.answer.text == "Alice prepares the evaluation todo list [1]. It was agreed in October."
    assert r.answer.citations[0].url == RAG_MEETING_URL and r.answer.trace.raw_answer == reply


@pytest.mark.parametrize("style", ["persona", "cot"])
async def test_answer_styles_pick_their_prompt_and_cot_shows_only_the_answer(make: Make, style: str) -> None:
    reasoning = "Reasoning: Source 2 is the October meeting's task table; Alice's row names the list.\n"
    reply = (
        reasoning if style == "cot" else ""
    ) + "Answer: Alice prepares the evaluation todo list [Source 2]."
    pieces: list[str] = []

    async def sink(text: str) -> None:
        pieces.append(text)

    async with StubLLMServer(default_reply=reply) as stub:
        p = await make(llm_url=stub.base_url, retrieval=RetrievalSettings(final_k=5),
                       options=engine_options_for(answer_style=style))
        r = await p.engine.ask(
            "t:style", "What is Alice's todo from the RAG meeting in October?", on_text=sink, scope=EVERYTHING
        )
        explained = await p.engine.explain(r.turn_id, scope=EVERYTHING)
        system = _system(_answers(stub)[0])
    if style == "cot":
        assert "Reasoning:" in system  # only the answer streams into the chat, never the reasoning
        assert "".join(pieces) == "Alice prepares the evaluation todo list [1]."
        assert r.answer.text == "Alice prepares the evaluation todo list [1]."
        assert r.answer.trace.raw_answer == "Alice prepares the evaluation todo list [Source 2]."
        assert _answers(stub)[-1]["max_tokens"] > 200  # counterfactuals have room to reason first
    else:
        assert "You are Evie" in system and "".join(pieces) == reply.replace("[Source 2]", "[1]")
        assert r.answer.text.startswith("Answer: Alice prepares")  # persona answers are shown as written
    assert r.answer.citations[0].url == RAG_MEETING_URL and explained.error is None


async def test_the_draft_style_hands_the_model_the_extractive_quote_to_rewrite(make: Make) -> None:
    question = "What is Alice's todo from the RAG meeting in October?"
    async with StubLLMServer(default_reply="Alice prepares the evaluation todo list [Source 1].") as stub:
        p = await make(llm_url=stub.base_url, retrieval=RetrievalSettings(final_k=5),
                       options=engine_options_for(answer_style="draft"))
        r = await p.engine.ask("t:draft", question, scope=EVERYTHING)
        explained = await p.engine.explain(r.turn_id, scope=EVERYTHING)
        prompts = [_user(body) for body in _answers(stub)]
    offline = await make(retrieval=RetrievalSettings(final_k=5))  # the same evidence, no LLM: what it quotes
    quoted = await offline.engine.ask("t:x", question, scope=EVERYTHING)
    draft = prompts[0].split("Draft answer (quoted from the sources): ", 1)[1].split("\n", 1)[0]
    assert "[Source " in draft and "[1]" not in draft  # cited as the model is asked to cite
    assert re.sub(r" ?\[Source \d+\]", "", draft) == re.sub(r" ?\[\d+\]", "", quoted.answer.text)
    assert r.answer.text == "Alice prepares the evaluation todo list [1]."  # the model's rewrite is shown
    assert r.answer.trace.draft == draft  # kept for the trace and `eval answers --output`
    assert explained.error is None and len(prompts) > 1  # counterfactuals get a draft of their own subset
    assert all("Draft answer (quoted from the sources):" in u for u in prompts)


@pytest.mark.parametrize("quotes", [True, False])
async def test_a_rewrite_gets_the_quoted_units_it_leaves_out_beneath_it(make: Make, quotes: bool) -> None:
    from pipeline.answer.draft_guard import draft_units

    question = "What is Alice's todo from the RAG meeting in October?"

    def answering_unit_only(body: dict[str, Any]) -> str:  # the quote's last unit, word for word
        return draft_units(_user(body).split(DRAFT_LINE, 1)[1].split("\n")[0])[-1]

    async with StubLLMServer(responder=answering_unit_only) as stub:
        p = await make(llm_url=stub.base_url,
                       options=engine_options_for(answer_style="draft", answer_quotes=quotes))
        r = await p.engine.ask("t:quotes", question, scope=EVERYTHING)
        draft = _user(_answers(stub)[0]).split(DRAFT_LINE, 1)[1].split("\n")[0]
        counterfactual = await p.engine.generator.generate_from(question, r.answer.evidence, 1, 80)
        explained = await p.engine.explain(r.turn_id, scope=EVERYTHING)
        stored = await p.store.get_turn(r.turn_id)
    assert explained.error is None and stored is not None
    first, last = draft_units(draft)
    text, marker = re.fullmatch(r"(.*?) (\[Source \d+\])\.?", first).groups()  # type: ignore[union-attr]
    assert text.startswith("Row 1 in Table 1: Member is Alice")
    if not quotes:
        assert r.answer.trace.raw_answer == last and counterfactual == [last]
        assert r.answer.trace.quoted_beneath == 0 and r.answer.trace.model_reply is None
        assert stored.explained_answer == ""  # the whole answer is explained
        assert explained.result is not None and explained.result.answer == last
        return
    said, beneath = r.answer.text.split("\n\n")
    assert "Alice" not in said and said.endswith("[1]")
    assert beneath == f"\u201c{text}\u201d [2]"  # the unit the rewrite left out, cited as the answer cites
    assert r.answer.trace.quoted_beneath == 1 and r.answer.trace.model_reply == last
    assert r.answer.trace.raw_answer == f"{last}\n\n\u201c{text}\u201d {marker}"
    assert len(r.answer.citations) == 2 and r.answer.citations[1].url == RAG_MEETING_URL
    # explanations are of the model's own words: counterfactuals regenerate those, not the quotes beneath
    assert counterfactual == [last] and stored.explained_answer == last
    assert explained.result is not None and explained.result.answer == last  # what was explained
    assert stored.raw_answer == r.answer.trace.raw_answer


@pytest.mark.parametrize(("question", "reply", "why"), [
    ("What is Alice's todo from the RAG meeting in October?", OUT_OF_SCOPE, "the model's answer said less"),
    ("What is Alice's todo from the RAG meeting in October?", "", "the language model returned an empty"),
    ("Was ist Alices Aufgabe aus dem RAG-Meeting im Oktober?",  # the question, restated
     "Alices Aufgabe aus dem RAG-Meeting im Oktober.", "the model's answer said less"),
    ("What is Alice's todo from the RAG meeting in October?",  # the quoted unit left out
     "Alice has to send the slides.", "the model's answer said less"),
])
async def test_a_draft_rewrite_that_drops_the_quote_gives_way_to_the_quote(
    make: Make, question: str, reply: str, why: str
) -> None:
    async with StubLLMServer(default_reply=reply) as stub:
        p = await make(llm_url=stub.base_url, retrieval=RetrievalSettings(final_k=5),
                       options=engine_options_for(answer_style="draft"))
        r = await p.engine.ask("t:guard", question, scope=EVERYTHING)
        prompt = _user(_answers(stub)[0])
        draft = prompt.split("Draft answer (quoted from the sources): ", 1)[1].split("\n")[0]
        # counterfactuals answer the same way: without the top source, that subset's own quote
        without_top = await p.engine.generator.generate_from(question, r.answer.evidence[1:], 2, 80)
    assert "[Source " in draft
    # the quote, its sources cited as shown (numbered in citation order)
    assert re.sub(r" ?\[\d+\]", "", r.answer.text) == re.sub(r" ?\[Source \d+\]", "", draft)
    assert not r.answer.out_of_scope and r.answer.citations
    warning = str(r.answer.trace.warning)
    assert warning.startswith(why) and warning.endswith("; the quoted draft is shown")
    assert r.answer.trace.model_reply == reply.strip()  # the model's own answer kept for the trace
    assert len(without_top) == 2 and all(a != reply for a in without_top)


def test_the_draft_guard_keeps_every_rewrite_that_says_something() -> None:
    from pipeline.answer.draft_guard import keeps_draft

    draft = "Alice prepares the evaluation todo list [Source 1]."
    question = "What is Alice's todo?"
    assert not keeps_draft("Alice prepares the evaluation list [Source 1].", question, draft)
    assert not keeps_draft("Bob owns the budget review [Source 2].", question, draft)  # a correction
    assert keeps_draft("Alice's todo [Source 1].", question, draft)
    assert not keeps_draft("12 [Source 1].", "How many nodes does the cluster have?",
                           "The cluster has 9 nodes in Frankfurt [Source 2].")  # a short answer stands
    # a choice answered with one of the question's words from another source, and a restatement citing
    # another source: both stand
    assert not keeps_draft("Frankfurt [Source 2].", "Is the staging cluster in Frankfurt or Berlin?",
                           "The production cluster runs in Berlin [Source 1].")
    assert not keeps_draft("The VPN is required for the staging cluster [Source 2].",
                           "Is the VPN required for the staging cluster?",
                           "The VPN is required for the production cluster [Source 1].")
    assert keeps_draft("", question, draft)
    assert keeps_draft(OUT_OF_SCOPE, question, draft)  # the quote shares "alice" and "todo"
    # a quote that shares one word with a question the wiki does not answer: "not found" stands
    assert not keeps_draft(OUT_OF_SCOPE, "What is on the canteen menu on Friday?",
                           "Deployments are frozen on Friday [Source 3].")
    # a quote in another language than the question shares no word: chosen by meaning, it is shown
    assert keeps_draft(OUT_OF_SCOPE, "Und wenn ich nur die Regeln löschen möchte?",
                       "Row 8 in Table 1: RPC Name is clear_rules, and Description is Deletes all the rules "
                       "of the table [Source 4].")
    assert not keeps_draft("The desired information cannot be found in the retrieved pool of evidence.",
                           question, "")  # no quote: the model's reply stands


def test_the_draft_guard_shows_the_quote_where_a_rewrite_leaves_out_the_answering_unit() -> None:
    from pipeline.answer.draft_guard import keeps_draft

    question = "What does the board vote on?"
    draft = ("The board votes to accept or reject a proposed feature [Source 1]. Voting is done with yay, "
             "nay or abstain by each member [Source 2].")
    # the unit sharing the most of the question's words is kept: the other may be condensed away
    assert not keeps_draft("The board votes to accept or reject proposed features.", question, draft)
    assert not keeps_draft("Proposed features [Source 1].", question, draft)  # a word of it is enough
    # it is left out, uncited or citing the quote's own sources: the quote is shown
    assert keeps_draft("Each member votes yay, nay or abstain [Source 2].", question, draft)
    assert keeps_draft("The board decides by majority.", question, draft)
    # a correction from a source the quote does not cite, and an answer in another language: both stand
    assert not keeps_draft("The board votes on the budget [Source 3].", question, draft)
    assert not keeps_draft("Der Vorstand stimmt über neue Funktionen ab, und jedes Mitglied hat eine Stimme "
                           "[Source 1].", "Worüber stimmt der Vorstand ab?", draft)
    # yes or no, and one of the question's options that the quote names: both stand
    vpn = "The VPN is required for staging and production [Source 1]."
    assert not keeps_draft("Yes, it is required [Source 1].", "Is the VPN required for staging?", vpn)
    assert not keeps_draft("No, it is not required for development.", "Is the VPN required for development?",
                           vpn)
    assert not keeps_draft("Production [Source 1].", "Is the VPN required for staging or production?", vpn)
    # "not found" to a German question over an English quote, which shares none of its words, gives way to
    # the quote: chosen by meaning, it is what quoting shows (it stood until the 0.5B said "not found" over
    # a quoted row holding the answer, the one turn where its answers contained the gold less often than
    # quoting on unseen dev conversations); in one language, a quote sharing none of the words does not
    assert keeps_draft(OUT_OF_SCOPE, "Worüber stimmt der Vorstand bei den Treffen ab?", draft)
    assert not keeps_draft(OUT_OF_SCOPE, "What is on the canteen menu?", draft)


def test_the_draft_guard_compares_numbers_and_table_cells() -> None:
    from pipeline.answer.draft_guard import keeps_draft

    # a unit with one to three numbers is kept where the answer has them all, whatever else it leaves out
    mle = "Which of these is responsible for MLE?"
    pcr = "PCR18 - Trusted OS start-up code (MLE) [Source 1]"
    assert not keeps_draft("PCR18 [Source 1].", mle, pcr)
    assert keeps_draft("The Trusted OS start-up code is responsible for MLE [Source 1].", mle, pcr)
    ram = "How much RAM does the build host have?"
    assert not keeps_draft("1GB [Source 1].", ram, "The build host has 1 GB of RAM [Source 1].")
    assert not keeps_draft("10000 requests [Source 1].", "How many requests a day?",
                           "The API serves 10,000 requests a day [Source 1].")
    # a number the sources have and the quote does not: a correction from the same source stands
    phone = "What is the on-call phone number?"
    old = "The old on-call phone number was 555-0100 [Source 1]."
    new = "The current on-call number is 555-0199 [Source 1]."
    assert not keeps_draft(new, phone, old, ["The old number was 555-0100. The current number is 555-0199."])
    assert keeps_draft(new, phone, old, ["The old number was 555-0100."])  # not in the sources: the quote
    # a citation marker is no number, and a date without its year keeps the unit
    assert keeps_draft("The host has plenty of memory [Source 1].", ram,
                       "The host has 1 GB of RAM [Source 1].")
    assert not keeps_draft("On 12 November [Source 1].", "When is the next meeting?",
                           "The next meeting is on 12 November 2024 [Source 1].")
    # a number the question gives need not be repeated
    uefi = "In 8.0, the host UEFI case only supports SRTM [Source 1]."
    assert not keeps_draft("It only supports SRTM.", "What does the host UEFI case support in 8.0?", uefi)
    assert keeps_draft("It only supports SRTM.", "What does the host UEFI case support?", uefi)
    # a number elsewhere in the sources, in a sentence sharing no word with the question, is no correction
    assert keeps_draft(new, phone, old, ["The old number was 555-0100. Room 555-0199 has a printer."])
    # nor is a number the question gives: repeating it corrects nothing, the unit left out shows
    reset = "How long do I hold the reset button on release 4.2?"
    assert keeps_draft("On release 4.2 you press it firmly [Source 1].", reset,
                       "Hold the reset button for 30 seconds [Source 1].",
                       ["Hold the reset button for 30 seconds. Release 4.2 changed the reset button."])
    # a bracketed number copied from a source is no citation of another source: the unit left out shows
    regs = "The flag lives in regs[\u20600] [Source 1]."
    sources = ["The flag lives in regs[0]. See note [3] of the manual."]
    assert keeps_draft("See note [3].", "Where does the flag live?", regs, sources)
    assert not keeps_draft("See note [3].", "Where does the flag live?", regs)  # "[3]" read as a citation
    # a table row's cell values count, not its numbering or headers
    step = "Which step refers to the synchronizer UI?"
    row = "Row 9 in Table 1: Step is syncui, and Description is OpenXT synchronizer UI [Source 1]"
    assert not keeps_draft("syncui, the OpenXT synchronizer UI [Source 1].", step, row)
    assert keeps_draft("It is the synchronizer UI [Source 1].", step, row)
    # words the quote lacks, all from one sentence of the sources about the question: a correction stands
    selinux = "What is the SELinux policy language based on?"
    other = "In both situations the SELinux policy is already in effect, so we use restorecon [Source 1]."
    te = "It is based on Type Enforcement (TE) [Source 1]."
    written = "Firstly the SELinux policy is written in a language based on Type Enforcement (TE)."
    assert not keeps_draft(te, selinux, other, [other, written])
    assert keeps_draft(te, selinux, other, [other])  # not in the sources: the quote
    assert keeps_draft(te, selinux, other, ["Type Enforcement (TE) is a MAC model."])  # not about it
    assert keeps_draft("It is based on Type Enforcement and Lisp.", selinux, other, [written])  # only some
    # a word from a sentence that shares no more of the question than the quote: the page's topic is no proof
    based = "The SELinux policy language is based on Type Enforcement [Source 1]."
    page = [based, "In both situations the SELinux policy is in effect. The SELinux kernel module loads it."]
    for reply in ("It is based on the kernel [Source 1].", "It is used [Source 1].",
                  "The SELinux policy language is based on restorecon [Source 1]."):
        assert keeps_draft(reply, selinux, based, page), reply
    # a reply with no content words says nothing of the quote; a footnote mark is no number to repeat
    tls = "Syncui listens on port 8080 over TLS [Source 1]."
    assert keeps_draft("It is. [Source 1]", "Which port does syncui use?", tls)
    assert not keeps_draft("It listens over TLS [Source 1].", "Which port does syncui use?",
                           "Syncui listens over TLS, see note [\u20603] [Source 1].")


async def test_answer_stream_holds_the_reasoning_back_and_streams_the_answer() -> None:
    from pipeline.answer.prompts import answer_stream

    async def run(pieces: list[str]) -> str:
        shown: list[str] = []

        async def sink(text: str) -> None:
            shown.append(text)

        add = answer_stream(sink)
        for piece in pieces:
            await add(piece)
        return "".join(shown)

    assert (
        await run(["Reason", "ing: source 1 says", " so.\nAns", "wer: Ja", " [Source 1]."])
        == "Ja [Source 1]."
    )
    assert await run(["Alice prepares", " the list [Source 2]."]) == "Alice prepares the list [Source 2]."
    assert await run(["Reasoning: nothing else follows."]) == ""  # no answer line: posted whole at the end


def test_final_answer_takes_the_text_after_the_last_answer_line() -> None:
    from pipeline.answer.prompts import final_answer

    assert final_answer("Reasoning: x says y.\nAnswer: Yes [Source 1].", "cot") == "Yes [Source 1]."
    assert final_answer("Reasoning: ...\n**Final answer:** 42", "cot") == "42"
    assert final_answer("Überlegung: ...\nAntwort: Ja [Source 1].", "cot") == "Ja [Source 1]."
    assert final_answer("No marker at all", "cot") == "No marker at all"
    assert final_answer("Answer: kept as is", "plain") == "Answer: kept as is"


async def test_out_of_scope_sentence_is_flagged(make: Make) -> None:
    async with StubLLMServer(default_reply=OUT_OF_SCOPE) as stub:
        p = await make(llm_url=stub.base_url)
        r = await p.engine.ask("t:o", "What is the canteen menu on Friday?", scope=EVERYTHING)
    assert r.error is None and r.answer.out_of_scope and r.answer.citations == []


async def test_empty_llm_answer_is_out_of_scope_with_a_warning(make: Make) -> None:
    async with StubLLMServer(default_reply="") as stub:  # (the draft style shows its quote instead: above)
        p = await make(llm_url=stub.base_url, options=engine_options_for(answer_style="plain"))
        r = await p.engine.ask("t:e", "How do I roll back a deployment?", scope=EVERYTHING)
    assert r.error is None and r.answer.out_of_scope and r.answer.text == OUT_OF_SCOPE
    assert "empty" in str(r.answer.trace.warning)


async def test_nothing_retrieved_is_out_of_scope_without_calling_the_llm(make: Make) -> None:
    async with StubLLMServer(default_reply="should not be used") as stub:
        p = await make(llm_url=stub.base_url)
        r = await p.engine.ask(
            "t:n", "How do I roll back a deployment?", scope=AccessScope.space_only(("NO-SUCH-SPACE",))
        )
        assert stub.calls == 0
    assert r.error is None and r.answer.out_of_scope and r.answer.text == OUT_OF_SCOPE
    assert r.retrieval is not None and r.retrieval.hits == []


# ---------------------------------------------------------------- LLM failures


async def test_llm_unreachable_gives_a_human_error_and_stores_the_turn(make: Make) -> None:
    p = await make(llm_url=f"http://127.0.0.1:{_closed_port()}/v1", max_retries=1)
    r = await p.engine.ask("t:down", "How do I roll back a deployment?", scope=EVERYTHING)
    assert r.error == "I couldn't reach the language model, please try again."
    turn = await p.store.get_turn(r.turn_id)
    assert turn is not None and turn.error == r.error and turn.question == "How do I roll back a deployment?"


async def test_llm_stopped_mid_conversation(make: Make) -> None:
    stub = await StubLLMServer(default_reply="Use kestrel rollback [Source 1].").start()
    p = await make(llm_url=stub.base_url, max_retries=0)
    ok = await p.engine.ask("t:stop", "How do I roll back a deployment?", scope=EVERYTHING)
    assert ok.error is None and ok.answer.citations[0].url == DEPLOY_URL
    await stub.close()
    r = await p.engine.ask("t:stop", "How long does the rollback take?", scope=EVERYTHING)
    assert r.error == "I couldn't reach the language model, please try again."
    turns = await p.store.history("t:stop")
    assert [t.error for t in turns] == [None, r.error]


async def test_429_with_retry_after_then_success_is_answered(make: Make) -> None:
    async with StubLLMServer(default_reply="Run kestrel rollback [Source 1].") as stub:
        stub.fail_next("429", retry_after=0.05)
        p = await make(llm_url=stub.base_url)
        r = await p.engine.ask("t:429", "How do I roll back a deployment?", scope=EVERYTHING)
        assert stub.calls == 2
    # the model's answer first (the quoted units it leaves out follow beneath it)
    assert r.error is None and r.answer.text.split("\n\n")[0] == "Run kestrel rollback [1]."


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("question", ["", "   \n\t "])
async def test_empty_question_is_a_polite_error_and_stored(make: Make, question: str) -> None:
    p = await make()
    r = await p.engine.ask("t:empty", question, scope=EVERYTHING)
    assert r.error is not None and r.error.startswith("Please ask a question")
    turn = await p.store.get_turn(r.turn_id)
    assert turn is not None and turn.error == r.error


async def test_very_long_question_is_truncated_with_a_notice(make: Make) -> None:
    p = await make()
    question = "How do I roll back a deployment? " + "x" * 40_000
    r = await p.engine.ask("t:long", question, scope=EVERYTHING)
    assert r.error is None and r.notice is not None and str(MAX_QUESTION_CHARS) in r.notice
    turn = await p.store.get_turn(r.turn_id)
    assert turn is not None and len(turn.question) == MAX_QUESTION_CHARS
    assert turn.notice == r.notice


async def test_lone_surrogates_do_not_break_storage(make: Make) -> None:
    p = await make()
    r = await p.engine.ask("t:utf", "caf\udce9 deployment rollback?", scope=EVERYTHING)
    turn = await p.store.get_turn(r.turn_id)
    assert turn is not None and turn.question.startswith("caf") and "deployment rollback?" in turn.question
    assert turn.question.encode("utf-8")  # valid UTF-8 now
    assert r.error is None


# ---------------------------------------------------------------- context budget


def _giant_table_page(rows: int) -> str:
    cells = "".join(
        f"<tr><td><p>host-{i:03d}</p></td><td><p>owner {i} of the giant fleet</p></td><td><p>rack "
        f"R{i % 9}</p></td></tr>"
        for i in range(1, rows + 1)
    )
    return ('[{"id": "900001", "title": "Giant fleet table", "space": "ACME", '
            '"url": "https://acme.example/wiki/spaces/ACME/pages/900001/Giant", '
            '"content": "<p>Every host of the giant fleet and its owner.</p><table><tbody>'
            '<tr><th><p>Host</p></th><th><p>Owner</p></th><th><p>Rack</p></th></tr>' + cells
            + '</tbody></table>"}]')


async def test_budget_never_splits_a_table_row_and_records_dropped_evidence(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "giant.json").write_text(_giant_table_page(300), encoding="utf-8")
    index, embedder, report = await ingest_folder(tmp_path / "index", folder)
    assert report.added == 1
    async with StubLLMServer(default_reply="host-001 belongs to owner 1 [Source 1].") as stub:
        llm = make_llm(stub.base_url)
        p = make_engine(index, embedder, tmp_path / "s.db", llm=llm,
                        options=engine_options_for(llm_context_tokens=900, answer_max_tokens=100))
        try:
            r = await p.engine.ask(
                "t:b", "Which giant fleet table lists the owner of every host?", scope=EVERYTHING
            )
        finally:
            await p.close()
        prompt = _user(stub.requests[-1])
    assert r.error is None
    rows = [line for line in prompt.splitlines() if line.startswith("Row ")]
    assert rows, "the prompt should contain table rows"
    for line in rows:
        n = int(line.split()[1])
        assert (
            line == f"Row {n} in Table 1: Host is host-{n:03d}, and Owner is owner {n} of the giant fleet, "
            f"and Rack is rack R{n % 9}"
        )
    dropped = r.answer.trace.dropped_for_budget
    assert isinstance(dropped, list) and dropped
    assert r.retrieval is not None and len(r.answer.evidence) + len(dropped) == len(r.retrieval.hits)
    assert not set(dropped) & {h.evidence.id for h in r.answer.evidence}


# ---------------------------------------------------------------- explain


def _meeting_responder(body: dict[str, Any]) -> str:
    """Knows the date only when the passage that states it is among the sources."""
    if "12 November 2024" in _user(body):
        return "The next RAG meeting is on 12 November 2024 [Source 1]."
    return "The sources do not say when the next meeting is."


async def test_explain_puts_the_causal_page_first_and_caches(make: Make) -> None:
    async with StubLLMServer(responder=_meeting_responder) as stub:
        p = await make(llm_url=stub.base_url)
        r = await p.engine.ask("t:ex", "When is the next RAG meeting in November?", scope=EVERYTHING)
        assert r.error is None and "12 November 2024" in r.answer.text
        ex = await p.engine.explain(r.turn_id, scope=EVERYTHING)
        assert not ex.cached and ex.error is None and ex.result is not None and ex.result.clusters
        clusters = ex.result.clusters
        assert clusters[0].members[0].url == RAG_MEETING_URL
        assert clusters[0].percent == max(c.percent for c in clusters)
        assert clusters[0].percent > 50
        assert "RAG meeting October" in ex.text
        calls = stub.calls
        again = await p.engine.explain(r.turn_id, scope=EVERYTHING)
        assert again.cached and stub.calls == calls
        assert again.result is not None
        assert [c.percent for c in again.result.clusters] == [c.percent for c in clusters]


async def test_explain_offline_uses_the_extractive_generator(make: Make) -> None:
    p = await make()
    r = await p.engine.ask("t:exo", "When is the next RAG meeting?", scope=EVERYTHING)
    ex = await p.engine.explain(r.turn_id, scope=EVERYTHING)
    assert ex.error is None and ex.result is not None and ex.result.clusters and ex.text
    assert abs(sum(c.percent for c in ex.result.clusters) - 100) < 1.0


async def test_explain_of_a_failed_turn_says_so(make: Make) -> None:
    p = await make()
    r = await p.engine.ask("t:exf", "  ", scope=EVERYTHING)
    ex = await p.engine.explain(r.turn_id, scope=EVERYTHING)
    assert ex.error == "no answer" and ex.result is None


# ---------------------------------------------------------------- persistence


async def test_store_survives_a_restart(sample_index_template: Path, tmp_path: Path) -> None:
    index, embedder = await open_copy(sample_index_template, tmp_path / "index")
    first = make_engine(index, embedder, tmp_path / "evident.db")
    r1 = await first.engine.ask(
        "t:r", "What is Alice's todo from the RAG meeting in October?", scope=EVERYTHING
    )
    await first.close()
    index, embedder = await open_copy(tmp_path / "index", tmp_path / "index2", HashEmbedder())
    second = make_engine(index, embedder, tmp_path / "evident.db")
    try:
        history = await second.store.history("t:r")
        assert [t.id for t in history] == [r1.turn_id]
        r2 = await second.engine.ask("t:r", "And Bruno?", scope=EVERYTHING)
        assert r2.is_followup and r2.retrieval is not None and "RAG meeting" in r2.retrieval.query
        assert [t.turn_no for t in await second.store.history("t:r")] == [1, 2]
    finally:
        await second.close()
