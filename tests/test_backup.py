"""Backup/restore round trips with a real SQLite store (written to concurrently) and a real directory tree."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from pipeline.backup import MANIFEST, Manifest, backup, restore
from pipeline.errors import IndexError_, InputError, StoreError


def _make_store(path: Path, rows: int = 50) -> None:
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE turns (id INTEGER PRIMARY KEY, question TEXT NOT NULL)")
    con.executemany("INSERT INTO turns (question) VALUES (?)", [(f"q{i}",) for i in range(rows)])
    con.commit()
    con.close()


def _make_index(path: Path) -> None:
    (path / "segments" / "0").mkdir(parents=True)
    (path / "segments" / "0" / "vectors.bin").write_bytes(bytes(range(256)) * 64)
    (path / "segments" / "0" / "payload.json").write_text('{"page": "123"}')
    (path / "config.json").write_text('{"dim": 384}')


def _tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _rows(path: Path) -> list[str]:
    con = sqlite3.connect(path)
    try:
        return [r[0] for r in con.execute("SELECT question FROM turns ORDER BY id")]
    finally:
        con.close()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    store, index = tmp_path / "live" / "evident.db", tmp_path / "live" / "index"
    store.parent.mkdir()
    _make_store(store)
    _make_index(index)
    yield store, index


def test_round_trip_restores_store_and_index(tmp_path: Path, live: tuple[Path, Path]) -> None:
    store, index = live
    manifest = backup(tmp_path / "bk", store_path=store, index_dir=index)
    assert (tmp_path / "bk" / MANIFEST).is_file()
    assert manifest.store.bytes > 0
    assert {e.path for e in manifest.index} == {
        "config.json",
        "segments/0/vectors.bin",
        "segments/0/payload.json",
    }
    assert manifest.total_bytes == manifest.store.bytes + sum(e.bytes for e in manifest.index)
    assert Manifest.read(tmp_path / "bk" / MANIFEST) == manifest

    new_store, new_index = tmp_path / "new" / "evident.db", tmp_path / "new" / "index"
    restored = restore(tmp_path / "bk", store_path=new_store, index_dir=new_index)
    assert restored == manifest
    assert _rows(new_store) == [f"q{i}" for i in range(50)]
    assert _tree(new_index) == _tree(index)


def test_backup_is_consistent_while_rows_are_written(tmp_path: Path, live: tuple[Path, Path]) -> None:
    store, _ = live
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        con = sqlite3.connect(store, timeout=10)
        while not stop.is_set():
            with con:  # one transaction per row: a consistent copy holds a gap-free prefix
                con.execute("INSERT INTO turns (question) VALUES (?)", (f"w{written[0]}",))
            written[0] += 1
        con.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while written[0] < 20:
            threading.Event().wait(0.005)
        backup(tmp_path / "bk", store_path=store, index_dir=None)
    finally:
        stop.set()
        thread.join()
    rows = _rows(tmp_path / "bk" / "evident.db")
    extra = rows[50:]
    assert rows[:50] == [f"q{i}" for i in range(50)]
    assert extra == [f"w{i}" for i in range(len(extra))]
    assert 20 <= len(extra) <= written[0]
    con = sqlite3.connect(tmp_path / "bk" / "evident.db")
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()


def test_restore_refuses_non_empty_targets_without_force(tmp_path: Path, live: tuple[Path, Path]) -> None:
    store, index = live
    backup(tmp_path / "bk", store_path=store, index_dir=index)
    con = sqlite3.connect(store)
    with con:
        con.execute("DELETE FROM turns")
    con.close()
    (index / "config.json").write_text("changed")
    with pytest.raises(InputError, match="refusing to overwrite"):
        restore(tmp_path / "bk", store_path=store, index_dir=index)
    assert _rows(store) == []  # untouched

    restore(tmp_path / "bk", store_path=store, index_dir=index, force=True)
    assert len(_rows(store)) == 50
    assert (index / "config.json").read_text() == '{"dim": 384}'
    assert not (index.parent / "index.old").exists()
    assert not (index.parent / "index.restoring").exists()


def test_restore_removes_a_stale_wal(tmp_path: Path, live: tuple[Path, Path]) -> None:
    store, _ = live
    backup(tmp_path / "bk", store_path=store)
    # Leave writes in the WAL that were never checkpointed (a crashed bot); they must not be replayed.
    holder = sqlite3.connect(store)
    holder.execute("PRAGMA wal_autocheckpoint=0")
    with holder:
        holder.execute("INSERT INTO turns (question) VALUES ('after-backup')")
    wal = store.with_name(store.name + "-wal")
    assert wal.exists() and wal.stat().st_size > 0
    stale = wal.read_bytes()
    holder.close()
    wal.write_bytes(stale)  # close() checkpointed and removed it; put the stale WAL back
    restore(tmp_path / "bk", store_path=store, force=True)
    assert "after-backup" not in _rows(store)
    assert len(_rows(store)) == 50


def test_backup_refuses_non_empty_destination_and_missing_inputs(
    tmp_path: Path, live: tuple[Path, Path]
) -> None:
    store, index = live
    dest = tmp_path / "bk"
    dest.mkdir()
    (dest / "something").write_text("x")
    with pytest.raises(InputError, match="not empty"):
        backup(dest, store_path=store, index_dir=index)
    with pytest.raises(StoreError, match="store not found"):
        backup(tmp_path / "bk2", store_path=tmp_path / "missing.db")
    with pytest.raises(IndexError_, match="index directory not found"):
        backup(tmp_path / "bk3", store_path=store, index_dir=tmp_path / "no-index")


def test_restore_detects_corruption_and_non_backups(tmp_path: Path, live: tuple[Path, Path]) -> None:
    store, index = live
    backup(tmp_path / "bk", store_path=store, index_dir=index)
    (tmp_path / "bk" / "index" / "config.json").write_text('{"dim": 385}')
    with pytest.raises(InputError, match=r"corrupt: config\.json"):
        restore(tmp_path / "bk", store_path=tmp_path / "n" / "s.db", index_dir=tmp_path / "n" / "i")
    assert not (tmp_path / "n" / "s.db").exists()
    with pytest.raises(InputError, match="not a backup"):
        restore(tmp_path, store_path=tmp_path / "n" / "s.db")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / MANIFEST).write_text("{}")
    with pytest.raises(InputError, match="not a valid backup manifest"):
        restore(tmp_path / "bad", store_path=tmp_path / "n" / "s.db")


async def test_server_snapshot_is_recorded(tmp_path: Path, live: tuple[Path, Path]) -> None:
    """A real qdrant-client against a local stub speaking Qdrant's REST snapshot API."""
    import asyncio

    qdrant_client = pytest.importorskip("qdrant_client")
    seen: list[str] = []

    async def create(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        return web.json_response(
            {
                "result": {
                    "name": "evident-2025.snapshot",
                    "creation_time": "2025-01-01T00:00:00",
                    "size": 4096,
                    "checksum": "abc123",
                },
                "status": "ok",
                "time": 0.01,
            }
        )

    app = web.Application()
    app.router.add_post("/collections/{name}/snapshots", create)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        client = qdrant_client.QdrantClient(url=f"http://127.0.0.1:{port}", check_compatibility=False)
        store, _ = live
        manifest = await asyncio.to_thread(backup, tmp_path / "bk", store_path=store, qdrant=client,
                                           collection="evident")
        client.close()
    finally:
        await runner.cleanup()
    assert seen == ["POST /collections/evident/snapshots"]
    assert manifest.qdrant_snapshot == {
        "collection": "evident",
        "name": "evident-2025.snapshot",
        "size": 4096,
        "checksum": "abc123",
    }
    on_disk = json.loads((tmp_path / "bk" / MANIFEST).read_text())
    assert on_disk["qdrant_snapshot"]["name"] == "evident-2025.snapshot"
