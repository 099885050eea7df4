"""A local fake of the Slack platform for offline tests and the load benchmark.

* ``FakeSlack``: an aiohttp server on 127.0.0.1 speaking the Web API wire format under ``/api/``
  (form- or JSON-encoded bodies, ``{"ok": ...}`` replies, 429 + Retry-After), recording every call;
  a Socket Mode websocket (``apps.connections.open`` hands out its URL); ``response_url`` endpoints.
* ``EventSender``: signs Events API / slash-command payloads (v0 HMAC-SHA256) and POSTs them to the bot.
* ``FakeEngine`` / ``MemoryStore``: a deterministic engine implementing exactly the interface the bot
  calls (plain classes, no mocks).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import hmac
import inspect
import itertools
import json
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from pipeline.access.people import Account
from pipeline.access.scope import AccessScope
from pipeline.types import Answer, Citation, Evidence, Hit

BOT_USER = "UBOT"
BOT_ID = "BBOT"
TEAM = "T1"
SIGNING_SECRET = "test-signing-secret"


@dataclass
class Call:
    method: str
    args: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


class FakeSlack:
    """Slack Web API + Socket Mode on a random local port. Use ``base_url`` for ``AsyncWebClient``."""

    def __init__(self, *, bot_user: str = BOT_USER, bot_id: str = BOT_ID, team: str = TEAM,
                 replies_page_size: int = 2) -> None:
        self.bot_user, self.bot_id, self.team = bot_user, bot_id, team
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}  # (channel, ts) -> message
        self.replies_page_size = replies_page_size
        self.failures: dict[str, list[tuple[int, dict[str, Any], dict[str, str]]]] = {}
        self.hang_from: dict[str, int] = {}  # method -> calls answered before it stops answering
        self.drops: dict[str, int] = {}  # method -> how many of its next calls lose their connection
        self._closing = asyncio.Event()
        self.auth_error: str | None = None
        # user id -> users.info's user (profile.email, is_restricted…)
        self.users: dict[str, dict[str, Any]] = {}
        # channel id -> conversations.info's channel + "members"
        self.channels: dict[str, dict[str, Any]] = {}
        self.end_streams = False  # Slack ends every open stream (message_not_in_streaming_state from then on)
        self.no_stream_channels: set[str] = set()  # chat.startStream there: channel_type_not_supported
        self.socket_acks: list[dict[str, Any]] = []
        self._ws: web.WebSocketResponse | None = None
        self._ws_ready = asyncio.Event()
        self._ts = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/api/"

    async def start(self) -> FakeSlack:
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)  # the SDK GETs some methods (conversations.replies)
        app.router.add_post("/response/{rid}", self._response_url)
        app.router.add_get("/link", self._socket)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        self._closing.set()
        if self._ws is not None:
            await self._ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # ------------------------------------------------------------------ test helpers

    def fail_next(self, method: str, *, error: str = "internal_error", status: int = 200,
                  headers: dict[str, str] | None = None) -> None:
        """Make the next call of ``method`` fail (Slack style ``ok: false`` or an HTTP status)."""
        self.failures.setdefault(method, []).append((status, {"ok": False, "error": error}, headers or {}))

    def seed_thread(self, channel: str, thread_ts: str, messages: list[dict[str, Any]]) -> None:
        """Put earlier messages into a thread for ``conversations.replies``."""
        for m in messages:
            self.messages[(channel, m["ts"])] = {"channel": channel, "thread_ts": thread_ts, **m}

    def of(self, method: str) -> list[dict[str, Any]]:
        return [c.args for c in self.calls if c.method == method]

    async def wait_for(self, predicate: Callable[[], Any], within_s: float = 5.0) -> Any:
        """Poll ``predicate`` (sync or returning an awaitable) until truthy (no fixed sleeps in tests)."""
        deadline = time.monotonic() + within_s
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; calls so far: {[c.method for c in self.calls]}")
            await asyncio.sleep(0.005)

    async def wait_calls(self, method: str, n: int = 1, within_s: float = 5.0) -> list[dict[str, Any]]:
        return await self.wait_for(lambda: len(self.of(method)) >= n and self.of(method), within_s)

    async def socket_send(self, envelope: dict[str, Any], within_s: float = 5.0) -> None:
        """Push a Socket Mode envelope to the connected client."""
        await asyncio.wait_for(self._ws_ready.wait(), within_s)
        assert self._ws is not None
        await self._ws.send_str(json.dumps(envelope))

    # ------------------------------------------------------------------ handlers

    async def _read_args(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        ctype = request.headers.get("Content-Type", "")
        if ctype.startswith("application/json"):
            args = json.loads(raw or b"{}")
        else:
            args = {k: v for k, v in urllib.parse.parse_qsl(raw.decode())}
        for k in ("blocks", "attachments", "chunks"):
            if isinstance(args.get(k), str):
                args[k] = json.loads(args[k])
        auth = request.headers.get("Authorization", "")
        args["_token"] = auth.removeprefix("Bearer ")
        for k, v in request.query.items():
            args.setdefault(k, v)
        return args

    def _next_ts(self) -> str:
        return f"1700000000.{next(self._ts):06d}"

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args = await self._read_args(request)
        self.calls.append(Call(method, args))
        if self.drops.get(method):  # the network fails: the connection closes, no response
            self.drops[method] -= 1
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        if method in self.hang_from and len(self.of(method)) > self.hang_from[method]:
            await self._closing.wait()  # a Slack that never answers (until the fake stops)
            return web.json_response({"ok": False, "error": "fake_stopped"})
        queued = self.failures.get(method)
        if queued:
            status, body, headers = queued.pop(0)
            return web.json_response(body, status=status, headers=headers)
        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"})
        return web.json_response(handler(args))

    def _m_auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.auth_error:
            return {"ok": False, "error": self.auth_error}
        return {"ok": True, "url": "https://fake.slack.com/", "team": "Fake", "user": "evident",
                "team_id": self.team, "user_id": self.bot_user, "bot_id": self.bot_id}

    def _m_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        if not args.get("channel"):
            return {"ok": False, "error": "channel_not_found"}
        ts = self._next_ts()
        msg = {"type": "message", "user": self.bot_user, "bot_id": self.bot_id, "ts": ts,
               "text": args.get("text", ""), "blocks": args.get("blocks") or []}
        if args.get("thread_ts"):
            msg["thread_ts"] = args["thread_ts"]
        self.messages[(args["channel"], ts)] = {"channel": args["channel"], **msg}
        return {"ok": True, "channel": args["channel"], "ts": ts, "message": msg}

    def _m_chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        key = (args.get("channel", ""), args.get("ts", ""))
        if key not in self.messages:
            return {"ok": False, "error": "message_not_found"}
        self.messages[key].update(text=args.get("text", ""), blocks=args.get("blocks") or [])
        return {"ok": True, "channel": key[0], "ts": key[1], "text": args.get("text", "")}

    def _m_chat_postEphemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "message_ts": self._next_ts()}

    def _m_reactions_add(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    def _m_reactions_remove(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    def _m_assistant_threads_setStatus(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._assistant_thread(args)

    def _m_assistant_threads_setSuggestedPrompts(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._assistant_thread(args)

    def _m_assistant_threads_setTitle(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._assistant_thread(args)

    def _assistant_thread(self, args: dict[str, Any]) -> dict[str, Any]:
        """Slack accepts these only for threads in the assistant container (DMs, ``D…``)."""
        if not str(args.get("channel_id", "")).startswith("D") or not args.get("thread_ts"):
            return {"ok": False, "error": "not_allowed"}
        return {"ok": True}

    def _m_views_publish(self, args: dict[str, Any]) -> dict[str, Any]:
        if not args.get("user_id") or not args.get("view"):
            return {"ok": False, "error": "invalid_arguments"}
        return {"ok": True, "view": {"id": "V1"}}

    def _m_chat_startStream(self, args: dict[str, Any]) -> dict[str, Any]:
        if not args.get("thread_ts"):
            return {"ok": False, "error": "invalid_arguments"}
        if args.get("channel") in self.no_stream_channels:
            return {"ok": False, "error": "channel_type_not_supported"}
        if not str(args.get("channel", "")).startswith("D"):  # channels: streamed to one recipient
            if not args.get("recipient_team_id"):
                return {"ok": False, "error": "missing_recipient_team_id"}
            if not args.get("recipient_user_id"):
                return {"ok": False, "error": "missing_recipient_user_id"}
        ts = self._next_ts()
        self.messages[(args["channel"], ts)] = {
            "channel": args["channel"],
            "type": "message",
            "ts": ts,
            "user": self.bot_user,
            "bot_id": self.bot_id,
            "thread_ts": args["thread_ts"],
            "text": args.get("markdown_text") or "",
            "blocks": [],
            "streaming": True,
            "streamed": args.get("markdown_text") or "",
            "chunks": list(args.get("chunks") or []),
        }
        return {"ok": True, "channel": args["channel"], "ts": ts}

    def _m_chat_getPermalink(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, ts = args.get("channel", ""), args.get("message_ts", "")
        msg = self.messages.get((channel, ts))
        if msg is None:
            return {"ok": False, "error": "message_not_found"}
        link = f"https://fake.slack.com/archives/{channel}/p{ts.replace('.', '')}"
        if msg.get("thread_ts") and msg["thread_ts"] != ts:
            link += f"?thread_ts={msg['thread_ts']}&cid={channel}"
        return {"ok": True, "channel": channel, "permalink": link}

    def _m_chat_delete(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.messages.pop((args.get("channel", ""), args.get("ts", "")), None) is None:
            return {"ok": False, "error": "message_not_found"}
        return {"ok": True}

    def _ended_by_slack(self, msg: dict[str, Any] | None) -> bool:
        """``end_streams``: Slack ends streams on its own (a time limit), later calls find them ended."""
        if msg is not None and self.end_streams:
            msg["streaming"] = False
        return msg is None or not msg.get("streaming")

    def _m_chat_appendStream(self, args: dict[str, Any]) -> dict[str, Any]:
        msg = self.messages.get((args.get("channel", ""), args.get("ts", "")))
        if self._ended_by_slack(msg):
            return {"ok": False, "error": "message_not_in_streaming_state"}
        assert msg is not None
        if not args.get("markdown_text") and not args.get("chunks"):
            return {"ok": False, "error": "invalid_arguments"}
        added = (args.get("markdown_text") or "") + "".join(
            c.get("text", "") for c in args.get("chunks") or [] if c.get("type") == "markdown_text")
        msg["text"] += added
        msg["streamed"] += added  # kept when chat.update replaces the text
        msg["chunks"] = msg.get("chunks", []) + list(args.get("chunks") or [])
        return {"ok": True, "channel": msg["channel"], "ts": msg["ts"]}

    def _m_chat_stopStream(self, args: dict[str, Any]) -> dict[str, Any]:
        msg = self.messages.get((args.get("channel", ""), args.get("ts", "")))
        if self._ended_by_slack(msg):
            return {"ok": False, "error": "message_not_in_streaming_state"}
        assert msg is not None
        added = (args.get("markdown_text") or "") + "".join(
            c.get("text", "") for c in args.get("chunks") or [] if c.get("type") == "markdown_text")
        msg["text"] += added
        msg["streamed"] += added  # kept when chat.update replaces the text
        msg["chunks"] = msg.get("chunks", []) + list(args.get("chunks") or [])
        msg.update(streaming=False, blocks=args.get("blocks") or [])
        return {"ok": True, "channel": msg["channel"], "ts": msg["ts"]}

    def _m_users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        uid = args.get("user", "")
        if uid in self.users:
            return {"ok": True, "user": {"id": uid, **self.users[uid]}}
        return {"ok": True, "user": {"id": uid, "name": uid.lower(), "is_bot": uid == self.bot_user}}

    def _m_conversations_info(self, args: dict[str, Any]) -> dict[str, Any]:
        info = self.channels.get(args.get("channel", ""))
        if info is None:
            return {"ok": False, "error": "channel_not_found"}
        return {"ok": True, "channel": {k: v for k, v in info.items() if k != "members"}}

    def _m_conversations_members(self, args: dict[str, Any]) -> dict[str, Any]:
        members = list((self.channels.get(args.get("channel", "")) or {}).get("members") or [])
        start, size = int(args.get("cursor") or 0), int(args.get("limit") or 100)
        more = start + size < len(members)
        return {"ok": True, "members": members[start:start + size],
                "response_metadata": {"next_cursor": str(start + size) if more else ""}}

    def _m_apps_connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/link"}

    def _m_conversations_replies(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, root = args.get("channel", ""), args.get("ts", "")
        thread = sorted(
            (m for (c, _), m in self.messages.items()
             if c == channel and (m.get("thread_ts") == root or m.get("ts") == root)),
            key=lambda m: float(m["ts"]))
        start = int(args.get("cursor") or 0)
        size = min(int(args.get("limit") or 100), self.replies_page_size)
        page = thread[start:start + size]
        more = start + size < len(thread)
        return {"ok": True, "messages": page, "has_more": more,
                "response_metadata": {"next_cursor": str(start + size) if more else ""}}

    async def _response_url(self, request: web.Request) -> web.Response:
        args = json.loads(await request.read() or b"{}")
        args["_rid"] = request.match_info["rid"]
        self.calls.append(Call("response_url", args))
        return web.Response(text="ok")

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._ws = ws
        await ws.send_str(json.dumps({"type": "hello", "num_connections": 1}))
        self._ws_ready.set()
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                self.socket_acks.append(json.loads(msg.data))
        self._ws_ready.clear()
        return ws


# ---------------------------------------------------------------------- sending events to the bot


def sign(secret: str, timestamp: str, body: str) -> str:
    base = f"v0:{timestamp}:{body}".encode()
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


TEST_EPOCH = 1600000000  # the seconds of the message ts the tests send


class EventSender:
    """POSTs signed Events API payloads and slash commands to the bot's HTTP endpoint."""

    def __init__(self, url: str, secret: str = SIGNING_SECRET, team: str = TEAM, *,
                 epoch: int = TEST_EPOCH) -> None:
        """``epoch``: the seconds of every message ts, and a part of every event id when not the default (a
        benchmark run against a kept data directory must not reuse an earlier run's threads and events)."""
        self.url, self.secret, self.team, self.epoch = url, secret, team, epoch
        self._ids = itertools.count(1)
        self._ts = itertools.count(1)
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EventSender:
        self.session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()

    def _next_id(self) -> str:
        run = "" if self.epoch == TEST_EPOCH else f"{self.epoch}-"
        return f"Ev{run}{next(self._ids):08d}"

    def new_ts(self) -> str:
        return f"{self.epoch}.{next(self._ts):06d}"

    def envelope(self, event: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
        return {"token": "legacy", "team_id": self.team, "api_app_id": "A1", "type": "event_callback",
                "event": event, "event_id": event_id or self._next_id(),
                "event_time": int(time.time()), "authorizations": [{"team_id": self.team, "user_id": BOT_USER,
                                                                    "is_bot": True}]}

    async def post_raw(self, body: str, content_type: str, *, headers: dict[str, str] | None = None,
                       secret: str | None = None) -> tuple[int, str, float]:
        assert self.session is not None
        ts = str(int(time.time()))
        h = {"Content-Type": content_type, "X-Slack-Request-Timestamp": ts,
             "X-Slack-Signature": sign(secret or self.secret, ts, body), **(headers or {})}
        t0 = time.perf_counter()
        async with self.session.post(self.url, data=body.encode(), headers=h) as resp:
            text = await resp.text()
            return resp.status, text, time.perf_counter() - t0

    async def event(self, event: dict[str, Any], *, event_id: str | None = None,
                    headers: dict[str, str] | None = None, secret: str | None = None) -> int:
        body = json.dumps(self.envelope(event, event_id))
        status, _, _ = await self.post_raw(body, "application/json", headers=headers, secret=secret)
        return status

    async def command(self, text: str, *, channel: str = "C1", user: str = "U1",
                      response_url: str = "") -> tuple[int, str]:
        form = {"token": "legacy", "team_id": self.team, "channel_id": channel, "user_id": user,
                "command": "/ask", "text": text, "response_url": response_url,
                "trigger_id": f"trig{next(self._ids)}", "api_app_id": "A1"}
        status, body, _ = await self.post_raw(
            urllib.parse.urlencode(form), "application/x-www-form-urlencoded"
        )
        return status, body

    async def block_action(
        self,
        action_id: str,
        value: str,
        *,
        channel: str = "C1",
        user: str = "U1",
        message_ts: str = "",
        action_type: str = "button",
        thread_ts: str | None = None,
    ) -> int:
        """A click on a button of one of evident's messages, as Slack posts it (form field ``payload``)."""
        payload = {
            "type": "block_actions",
            "team": {"id": self.team},
            "user": {"id": user},
            "api_app_id": "A1",
            "token": "legacy",
            "trigger_id": f"trig{next(self._ids)}",
            "container": {"type": "message", "message_ts": message_ts, "channel_id": channel},
            "channel": {"id": channel},
            "message": {
                "ts": message_ts,
                "type": "message",
                **({"thread_ts": thread_ts} if thread_ts else {}),
            },
            "actions": [
                {
                    "type": action_type,
                    "action_id": action_id,
                    "block_id": "b1",
                    "value": value,
                    "action_ts": str(time.time()),
                }
            ],
        }
        body = urllib.parse.urlencode({"payload": json.dumps(payload)})
        status, _, _ = await self.post_raw(body, "application/x-www-form-urlencoded")
        return status

    # --------------------------------------------------------------- event builders

    def mention(self, text: str, *, channel: str = "C1", user: str = "U1", thread_ts: str | None = None,
                ts: str | None = None) -> dict[str, Any]:
        ev = {"type": "app_mention", "user": user, "text": f"<@{BOT_USER}> {text}", "channel": channel,
              "ts": ts or self.new_ts(), "team": self.team}
        if thread_ts:
            ev["thread_ts"] = thread_ts
        return ev

    def message(self, text: str, *, channel: str = "C1", user: str = "U1", thread_ts: str | None = None,
                channel_type: str = "channel", ts: str | None = None, **extra: Any) -> dict[str, Any]:
        ev = {"type": "message", "user": user, "text": text, "channel": channel, "ts": ts or self.new_ts(),
              "channel_type": channel_type, "team": self.team, **extra}
        if thread_ts:
            ev["thread_ts"] = thread_ts
        return ev

    def reaction(self, name: str, channel: str, ts: str, *, user: str = "U1", added: bool = True,
                 item_user: str = BOT_USER) -> dict[str, Any]:
        return {"type": "reaction_added" if added else "reaction_removed", "user": user, "reaction": name,
                "item_user": item_user, "item": {"type": "message", "channel": channel, "ts": ts},
                "event_ts": self.new_ts()}


# ---------------------------------------------------------------------- a deterministic engine


# The engine's own result types, so the fake cannot drift from what the bot really receives.
from pipeline.answer.engine import ExplainResult, TurnResult  # noqa: E402
from pipeline.attribution import AttributionResult, ClusterAttribution, EvidenceRef  # noqa: E402
from pipeline.turns import Turn, TurnRecord  # noqa: E402


class MemoryStore:
    """The store methods the bot and FakeEngine use, in memory (same semantics as pipeline.store.Store)."""

    def __init__(self) -> None:
        self.turns: dict[int, Turn] = {}
        self.feedback: dict[tuple[int, str], int] = {}
        self.events: set[str] = set()
        self.meta: dict[str, dict[str, Any]] = {}

    async def add_turn(self, record: TurnRecord) -> int:
        turn_id = len(self.turns) + 1
        turn_no = 1 + sum(t.conversation_key == record.conversation_key for t in self.turns.values())
        fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
        self.turns[turn_id] = Turn(id=turn_id, turn_no=turn_no, created_at="", **fields)
        return turn_id

    async def get_feedback(self, turn_id: int) -> dict[str, int]:
        return {u: v for (t, u), v in self.feedback.items() if t == turn_id}

    async def set_message_ref(self, turn_id: int, message_ref: str) -> None:
        self.turns[turn_id] = dataclasses.replace(self.turns[turn_id], message_ref=message_ref)

    async def turn_by_message(self, key_or_channel: str, message_ref: str) -> Turn | None:
        for t in self.turns.values():
            key = t.conversation_key
            if t.message_ref == message_ref and key_or_channel in (key, key.split(":")[1]):
                return t
        return None

    async def conversation_exists(self, key: str) -> bool:
        return any(t.conversation_key == key for t in self.turns.values())

    async def set_feedback(self, turn_id: int, user_id: str, value: int, *, platform: str,
                           comment: str | None = None) -> None:
        self.feedback[(turn_id, user_id)] = value

    async def remove_feedback(self, turn_id: int, user_id: str) -> None:
        self.feedback.pop((turn_id, user_id), None)

    async def mark_event_seen(self, event_id: str) -> bool:
        if event_id in self.events:
            return False
        self.events.add(event_id)
        return True

    async def history(self, conversation_key: str, limit: int) -> list[Turn]:
        return [t for t in self.turns.values() if t.conversation_key == conversation_key][-limit:]

    async def get_turn(self, turn_id: int) -> Turn | None:
        return self.turns.get(turn_id)

    async def conversation_meta(self, key: str) -> dict[str, Any]:
        return dict(self.meta.get(key, {}))

    async def set_conversation_meta(self, key: str, meta: Any) -> None:
        self.meta[key] = dict(meta)

    async def popular_pages(self, limit: int = 20) -> list[tuple[str, str, int, str]]:
        return []

    async def accounts_by_email(self, email: str) -> list[Account]:
        return []

    async def account(self, account: str) -> Account | None:
        return None

    async def recent_questions(self, user_id: str, limit: int = 5) -> list[tuple[int, str, str]]:
        mine = [t for t in self.turns.values() if t.user_id == user_id]
        return [(t.id, t.question, t.created_at) for t in reversed(mine)][:limit]

    async def feedback_summary(self, worst: int = 5) -> Any:
        from pipeline.store.reports import FeedbackSummary

        values = list(self.feedback.values())
        return FeedbackSummary(sum(v > 0 for v in values), sum(v < 0 for v in values), ())

    async def sync_status(self) -> list[Any]:
        return []

    async def last_sync(self) -> Any:
        return None

    async def mark_explained(self, turn_id: int) -> None:
        self.turns[turn_id] = dataclasses.replace(self.turns[turn_id], explained_at="now")


def default_answer(question: str) -> Answer:
    return Answer(
        text=f"To {question.lower()}, open the VPN portal [1] and follow the guide [2].",
        citations=[
            Citation(1, "https://wiki.example.com/pages/1", "VPN access", "IT", ("e1",)),
            Citation(2, "https://wiki.example.com/pages/2", "Remote work guide", "HR", ("e2",)),
        ],
        model="fake",
    )


@dataclass
class AskCall:
    key: str
    question: str
    user_id: str | None
    scope: AccessScope
    history: list[tuple[str, str]] | None

    @property
    def spaces(self) -> tuple[str, ...] | None:
        return self.scope.spaces


LLM_DOWN = "I couldn't reach the language model. Please try again in a moment."


def cited_hits(answer: Answer) -> list[Hit]:
    """The evidence a fake answer would have been written from: one per cited page."""
    return [Hit(Evidence(id=f"e{c.number}", page_id=str(c.number), title=c.title, url=c.url, space=c.space,
                         kind="passage", position=0, text=c.title), 1.0, c.number)
            for c in answer.citations]


class FakeEngine:
    """Deterministic engine: answers with ``answer_for(question)``, optionally slow or failing.

    ``store`` is a real ``pipeline.store.Store`` in the tests (or a ``MemoryStore``); only its public
    async API is used.
    """

    def __init__(self, store: Any | None = None, *, delay_s: float = 0.0,
                 answer_for: Callable[[str], Answer] = default_answer) -> None:
        self.store = store if store is not None else MemoryStore()
        self.delay_s = delay_s
        self.answer_for = answer_for
        self.fail_with: BaseException | None = None
        self.error_text: str | None = None
        self.stream_fails_after: int | None = None  # the LLM breaks after this many streamed words
        self.streams = True  # False: the answer comes whole (as the extractive answerer's)
        self.asks: list[AskCall] = []
        self.explain_computations: list[int] = []
        self.explain_fails_with: BaseException | None = None
        self.explain_scopes: list[AccessScope] = []
        self._explained: dict[int, ExplainResult] = {}

    async def ask(
        self,
        conversation_key: str,
        question: str,
        *,
        scope: AccessScope,
        user_id: str | None = None,
        history: list[tuple[str, str]] | None = None,
        on_text: Callable[[str], Awaitable[None]] | None = None,
        on_retrieved: Callable[[Sequence[Hit]], Awaitable[None]] | None = None,
    ) -> TurnResult:
        self.asks.append(AskCall(conversation_key, question, user_id, scope, history))
        if on_retrieved is not None:  # the engine shows what it read: the answer's cited pages
            await on_retrieved(cited_hits(self.answer_for(question)))
        if on_text is not None and self.streams:  # an LLM streaming: the delay is spread over the words
            words = re.findall(r"\S+\s*", self.answer_for(question).text)
            for i, word in enumerate(words):
                if i == self.stream_fails_after:  # as the engine does: a failed turn, its error for the user
                    turn_id = await self.store.add_turn(TurnRecord(conversation_key=conversation_key,
                                                                   question=question, error=LLM_DOWN))
                    return TurnResult(turn_id, Answer(text=""), question, False, LLM_DOWN)
                await asyncio.sleep(self.delay_s / max(1, len(words)))
                await on_text(word)
        elif self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_with is not None:
            raise self.fail_with
        previous = await self.store.history(conversation_key, 10)
        followup = bool(previous) or bool(history)
        completed = f"{question} (regarding: {previous[-1].question})" if previous else question
        answer = self.answer_for(question)
        turn_id = await self.store.add_turn(
            TurnRecord(
                conversation_key=conversation_key,
                question=question,
                user_id=user_id,
                completed_question=completed,
                answer=answer.text,
                citations=tuple(answer.citations),
                out_of_scope=answer.out_of_scope,
                error=self.error_text,
            )
        )
        return TurnResult(turn_id, answer, completed, followup, self.error_text)

    async def followups(self, result: TurnResult) -> list[str]:
        return [] if result.error else ["What about Linux?", "Who approves VPN requests?"]

    async def evidence_count(self) -> int:
        return 68  # the sample space's evidence

    async def visible(self, evidence_ids: list[str], scope: AccessScope) -> set[str]:
        return set(evidence_ids)  # the fake engine has no index: every evidence is visible

    async def explain(self, turn_id: int, *, scope: AccessScope) -> ExplainResult:
        self.explain_scopes.append(scope)
        if self.explain_fails_with is not None:
            raise self.explain_fails_with
        if turn_id in self._explained:
            r = self._explained[turn_id]
            return ExplainResult(r.turn_id, r.text, cached=True, partial=r.partial, result=r.result)
        self.explain_computations.append(turn_id)
        r = ExplainResult(turn_id, "VPN access 52%, Remote work guide 48%", result=fake_attribution())
        self._explained[turn_id] = r
        return r


def fake_attribution(partial: bool = False) -> AttributionResult:
    """Two clusters: the VPN pages (52 %: three near-copies) and the remote work guide (48 %)."""
    def ref(n: int, title: str, rank: int) -> EvidenceRef:
        return EvidenceRef(f"e{n}", title, f"https://wiki.example.com/pages/{n}", "passage", rank)

    vpn = ClusterAttribution(
        1,
        [ref(1, "VPN access", 1), ref(9, "VPN access (old)", 2), ref(8, "VPN FAQ", 3)],
        0.9,
        52.0,
        ["no answer"],
        [0.1],
    )
    guide = ClusterAttribution(2, [ref(2, "Remote work guide", 4)], 0.8, 48.0, ["no answer"], [0.2])
    return AttributionResult("cfa_clusters", "q", "a", [vpn, guide], partial=partial)


class EventsServer:
    """Bolt behind ``POST /slack/events`` on 127.0.0.1 (a free port), mounted as `evident serve` mounts it."""

    def __init__(self, app: Any) -> None:
        from bot.slack.transports import events_route

        web_app = web.Application()
        events_route(app)(web_app)
        self._runner = web.AppRunner(web_app, access_log=None)
        self.port = 0

    async def start(self) -> EventsServer:
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def close(self) -> None:
        await self._runner.cleanup()


def run_bot(settings: Any, engine: Any, *, client: Any, stop: asyncio.Event | None = None,
            host: str = "127.0.0.1", drain_timeout_s: float | None = None, routes: Any = None,
            checks: dict[str, Any] | None = None, metrics: Any = None) -> Any:
    """Slack alone, as `evident serve` runs it: ``serve_platforms`` with the health routes on the shared
    server
    (``EVIDENT_HTTP_PORT``), draining for ``EVIDENT_SHUTDOWN_TIMEOUT_S`` unless told otherwise."""
    from bot.core.health import add_health_routes
    from bot.slack.platform import SlackPlatform
    from evident.platforms import access_policy
    from evident.serve import serve_platforms
    from pipeline.runtime.metrics import Metrics

    platform = SlackPlatform(
        settings.slack, settings.chat, engine, access_policy(settings, engine), client=client, metrics=metrics
    )
    checks = {} if checks is None else checks
    health = functools.partial(add_health_routes, checks=checks, metrics=metrics or Metrics())
    drain = settings.chat.shutdown_timeout_s if drain_timeout_s is None else drain_timeout_s
    return serve_platforms([platform], stop or asyncio.Event(), port=settings.serve.http_port, host=host,
                           routes=routes or health, checks=checks, drain_timeout_s=drain)
