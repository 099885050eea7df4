"""Teams' streaming protocol in personal chats (informative updates, accumulated text at most once a second,
the final message carrying citations, AI label, feedback and the Explain card), its fallbacks, and follow-up
suggestions as card buttons that ask in the same conversation."""
# ruff: noqa: F811  (the harness fixtures are imported from test_teams and shadowed by parameters)

from __future__ import annotations

from itertools import pairwise
from typing import Any

from fake_slack import FakeEngine
from test_teams import Factory, _injecting_answer, make_harness  # noqa: F401  (the fixture)


def _info(activity: dict[str, Any]) -> dict[str, Any] | None:
    return next((e for e in activity.get("entities") or [] if e.get("type") == "streaminfo"), None)


async def test_a_personal_chat_answer_streams_and_ends_with_the_full_message(make_harness: Factory) -> None:
    h = await make_harness(FakeEngine(delay_s=2.5))  # the answer's words arrive over 2.5 s
    await h.send.send(h.send.personal("How do I get VPN access?"))
    (final,) = await h.answers()
    await h.settle()
    stream = [p for p in h.connector.posted if _info(p.activity) is not None]
    kinds = [_info(p.activity)["streamType"] for p in stream]  # type: ignore[index]
    assert kinds[:2] == ["informative", "informative"] and kinds[-1] == "final" and "streaming" in kinds
    assert stream[0].activity["text"] == "Searching the wiki…" and stream[0].activity["type"] == "typing"
    assert stream[1].activity["text"].startswith("Reading VPN access")  # the pages read
    stream_id = stream[0].id
    assert all(_info(p.activity).get("streamId") == stream_id for p in stream[1:])  # type: ignore[union-attr]
    sequences = [_info(p.activity)["streamSequence"] for p in stream[:-1]]  # type: ignore[index]
    assert sequences == list(range(1, len(sequences) + 1))
    texts = [p.activity["text"] for p in stream
             if _info(p.activity)["streamType"] == "streaming"]  # type: ignore[index]
    assert all(b.startswith(a) for a, b in pairwise(texts))  # each extends the last
    gaps = [b.at - a.at for a, b in pairwise(stream)]
    assert min(gaps) >= 0.9  # at most one request a second
    assert final is stream[-1].activity and final["type"] == "message"
    assert "open the VPN portal [1]" in final["text"] and final["channelData"]["feedbackLoopEnabled"]
    assert any(e.get("additionalType") == ["AIGeneratedContent"] for e in final["entities"])
    assert final["attachments"][0]["content"]["actions"][0]["data"]["action"] == "evident.explain"
    turn = await h.store.turn_by_message(h.engine.asks[0].key, stream_id)
    assert turn is not None  # feedback and reactions on the streamed message find the turn


async def test_a_refused_stream_falls_back_to_the_whole_answer(make_harness: Factory) -> None:
    h = await make_harness()
    h.connector.refuse_streams = "Content stream is not allowed on this conversation."
    await h.send.send(h.send.personal("How do I get VPN access?"))
    (answer,) = await h.answers()
    assert _info(answer) is None and "open the VPN portal [1]" in answer["text"]
    assert any(p.activity["type"] == "typing" and _info(p.activity) is None for p in h.connector.posted)


async def test_a_stream_the_user_stopped_gets_nothing_more(make_harness: Factory) -> None:
    h = await make_harness(FakeEngine(delay_s=2.5))
    h.connector.refuse_streams_after = 2  # the informative updates pass, then "cancelled by user"
    await h.send.send(h.send.personal("How do I get VPN access?"))
    await h.connector.wait_for(lambda: bool(h.engine.asks))
    await h.settle()
    assert not h.connector.messages()  # no final message, no whole answer re-posted


async def test_group_chats_get_the_whole_answer(make_harness: Factory) -> None:
    h = await make_harness()
    await h.send.send(h.send.group_chat("How do I get VPN access?", mention=True))
    (answer,) = await h.answers()
    assert not [p for p in h.connector.posted if _info(p.activity) is not None]
    assert "open the VPN portal [1]" in answer["text"]


async def test_suggestions_are_card_buttons_that_ask_where_they_were_shown(make_harness: Factory) -> None:
    h = await make_harness(followup_suggestions=True)
    chat = "19:group-chat-1@thread.v2"
    await h.send.send(h.send.group_chat("How do I get VPN access?", mention=True))
    (answer,) = await h.answers()
    await h.connector.wait_for(lambda: any(p.method == "PUT" for p in h.connector.posted))
    (update,) = [p for p in h.connector.posted if p.method == "PUT"]
    actions = update.activity["attachments"][0]["content"]["actions"]
    assert [a["data"]["action"] for a in actions] == ["evident.explain", "evident.ask", "evident.ask"]
    assert actions[1]["title"] == "What about Linux?" and update.activity["text"] == answer["text"]
    click = h.send._base("message", {"id": chat, "conversationType": "groupChat", "tenantId": "tenant-1",
                                     "isGroup": True}, user="aad-user-2", replyToId=update.id,
                         value=actions[1]["data"], channelData={"tenant": {"id": "tenant-1"}})
    await h.send.send(click)
    await h.connector.wait_for(lambda: len(h.engine.asks) == 2)
    await h.settle()
    first, second = h.engine.asks
    assert second.question == "What about Linux?" and second.user_id == "aad-user-2"
    assert second.key == first.key and second.scope.spaces == first.scope.spaces


async def test_a_stream_that_breaks_ends_with_the_error_in_the_same_message(make_harness: Factory) -> None:
    engine = FakeEngine(delay_s=2.5)
    engine.stream_fails_after = 6  # the LLM breaks after six words
    h = await make_harness(engine)
    await h.send.send(h.send.personal("How do I get VPN access?"))
    await h.connector.wait_for(lambda: bool(h.connector.messages()))
    await h.settle()
    (posted,) = h.connector.messages()
    final = posted.activity
    assert _info(final) is not None and _info(final)["streamType"] == "final"  # type: ignore[index]
    assert "couldn't reach the language model" in final["text"]


async def test_the_streamed_text_is_escaped_as_the_final_message_is(make_harness: Factory) -> None:
    """Page text in the model's answer streamed as written: a mention, a link and markup rendered in the
    streaming bubble until the final message replaced it."""
    h = await make_harness(FakeEngine(delay_s=2.5, answer_for=_injecting_answer))
    await h.send.send(h.send.personal("who?"))
    (final,) = await h.answers()
    texts = [p.activity["text"] for p in h.connector.posted
             if (_info(p.activity) or {}).get("streamType") == "streaming"]
    assert texts and all("<at>" not in t and "](https://" not in t and "**" not in t for t in texts)
    assert all(b.startswith(a) for a, b in pairwise(texts))  # each still extends the last
    assert texts[-1].replace("\\[1\\]", "[1]") in final["text"]
