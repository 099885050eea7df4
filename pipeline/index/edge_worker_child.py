"""The index worker's side of ``ProcessEdgeIndex`` (``pipeline.index.edge_worker``): one ``EdgeIndex`` in
a child process, started as ``python -m pipeline.index.edge_worker_child <fd>``.

Requests arrive as ``(id, op, args, kwargs)`` and are answered as ``(id, reply)``, each by its own task: a
question's search runs between the steps of a page's write (``EdgeIndex`` keeps its writes in order and lets
reads through, as it does in one process). ``open``, ``snapshot`` and ``restore`` run alone (after the
requests in flight, before the next); ``close`` and ``drop`` too, and are the last.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pipeline.errors import EvidentError

_OPS = frozenset(
    {
        "open",
        "close",
        "optimize",
        "drop",
        "replace_page",
        "delete_pages",
        "set_access",
        "missing_access",
        "search",
        "search_many",
        "page_hashes",
        "page_spaces",
        "get",
        "count",
        "stats",
        "export_page",
        "snapshot",
        "restore",
    }
)


# what runs alone: opening, closing, and what swaps the shard's files (a search beside it would find it shut)
_ALONE = frozenset({"open", "close", "drop", "snapshot", "restore"})
GONE_WAIT_S = 600.0  # the longest the requests in flight get once the parent has gone


async def _handle(index: Any, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if op == "export_page":
        page_id, batch = args
        return [p async for p in index.export_points(batch, page_ids=[page_id])]
    return await getattr(index, op)(*args, **kwargs)


def _serve(conn: Connection) -> None:  # pragma: no cover - runs in the child
    """The child: one ``EdgeIndex``, answering requests until told to close or the parent goes away."""
    import signal

    from pipeline.index.edge import EdgeIndex

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and SIGTERM are the parent's; it closes us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    path, wait_s, command, layout = conn.recv()
    index = EdgeIndex(Path(path), wait_s=wait_s, command=command, layout=layout)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_answer_requests(conn, index))
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(index.close())
        loop.close()


async def _answer_requests(conn: Connection, index: Any) -> None:  # pragma: no cover - runs in the child
    """Each request as its own task (a search between the steps of a write); ``close`` and ``drop`` once
    the requests in flight are answered, and then no more."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[Any, ...] | None] = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except Exception:  # noqa: BLE001 - the parent went away (or sent garbage): the worker ends
                message = None
            with contextlib.suppress(RuntimeError):  # the loop has ended
                loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message is None:
                return

    threading.Thread(target=read, daemon=True, name="index-requests").start()
    running: set[asyncio.Task[None]] = set()
    while (message := await inbox.get()) is not None:
        rid, op, args, kwargs = message
        if op in _ALONE:  # after what is in flight, and nothing beside it
            if running:
                await asyncio.wait(running)
            await _answer(conn, index, rid, op, args, kwargs)
            if op in ("close", "drop"):
                return
            continue
        task = asyncio.create_task(_answer(conn, index, rid, op, args, kwargs))
        running.add(task)
        task.add_done_callback(running.discard)
    if running:  # the parent went away: what it asked is finished before the index is closed
        await asyncio.wait(running, timeout=GONE_WAIT_S)


async def _answer(conn: Connection, index: Any, rid: int, op: str, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> None:  # pragma: no cover - runs in the child
    if op not in _OPS:
        reply: tuple[Any, ...] = ("error", "IndexError_", f"unknown index operation {op!r}")
    else:
        try:
            started, cpu = time.monotonic(), time.process_time()
            result = await _handle(index, op, args, kwargs)
            reply = ("ok", result, time.monotonic() - started, time.process_time() - cpu)
        except EvidentError as exc:
            reply = ("error", type(exc).__name__, str(exc))
        except Exception as exc:  # noqa: BLE001 - one failed call; the worker lives on
            reply = ("error", "IndexError_", f"{type(exc).__name__}: {exc}")
    try:
        conn.send((rid, reply))
    except OSError:
        return  # the parent went away
    except Exception as exc:  # noqa: BLE001 - a result that cannot be pickled fails its call alone
        conn.send((rid, ("error", "IndexError_", f"the index worker could not send its reply: {exc}")))


if __name__ == "__main__":  # pragma: no cover - the child process
    _serve(Connection(int(sys.argv[1])))
