"""Confluence connector against the local fake Confluence server (real HTTP, real index, real store)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, unquote_plus, urlsplit

import pytest
from helpers import FailingEmbedder, ingest_options

from connectors.confluence.client import ConfluenceClient
from connectors.confluence.clock import measure_zone
from connectors.confluence.cql import pages_cql, parse_utc, quote, since_bound, to_utc_iso
from connectors.confluence.source import ConfluenceSource
from connectors.confluence.sync import SyncReport, sync_confluence
from connectors.confluence.tracker import Tracker
from connectors.factory import make_confluence_source
from evident.settings import Settings
from pipeline.errors import AuthError, IndexError_, NotFoundError, RateLimitedError, UnreachableError
from pipeline.index.edge import EdgeIndex
from pipeline.models.sparse import Bm25Encoder
from pipeline.protocols import SourceConnector
from pipeline.store import Store
from pipeline.types import IndexPoint
from tests.fake_confluence import (
    FakeConfluence,
    FakePage,
    HashEmbedder,
    documents_dir,
    load_pages,
    synthetic_pages,
)
from tests.pdf_maker import minimal_pdf, word_document

pytestmark = pytest.mark.slow

SPACES = ("~cclark", "DC")


class _Wrapped:
    """Forwards everything to a real EdgeIndex; subclasses change one behaviour (not a mock)."""

    def __init__(self, inner: EdgeIndex) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FlakyIndex(_Wrapped):
    """Writes of the given pages fail ``times`` times (a crash mid-ingest)."""

    def __init__(self, inner: EdgeIndex, fail_pages: set[str], times: int = 1) -> None:
        super().__init__(inner)
        self.left = {p: times for p in fail_pages}

    async def replace_page(self, page_id: str, page_hash: str, points: Sequence[IndexPoint]) -> None:
        if self.left.get(page_id, 0) > 0:
            self.left[page_id] -= 1
            raise IndexError_(f"injected write failure for page {page_id}")
        await self.inner.replace_page(page_id, page_hash, points)


def _pages(per_space: int = 10) -> list[FakePage]:
    if not any(documents_dir().glob("*.json")):
        pytest.skip("no ConfQuestions documents and no connectors/sample_space")
    by_space = [load_pages(spaces=[space])[:per_space] for space in SPACES]
    if all(len(ps) == per_space for ps in by_space):
        return [p for ps in by_space for p in ps]
    return synthetic_pages(per_space)  # a small corpus (the sample space): cycle its bodies


def _spaces(fc: FakeConfluence) -> tuple[str, ...]:
    return tuple(sorted({p.space for p in fc.pages.values()}))


@pytest.fixture
async def fake() -> AsyncIterator[FakeConfluence]:
    async with FakeConfluence(_pages(), mode="dc") as fc:
        yield fc


@pytest.fixture(scope="module")
def shared_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeIndex]:
    """One Qdrant Edge index for the module (opening one costs ~1 s); each test starts it empty."""
    idx = EdgeIndex(tmp_path_factory.mktemp("confluence") / "index")
    asyncio.run(idx.open(dense_dim=16, embedder=HashEmbedder.name))
    yield idx
    asyncio.run(idx.close())


@pytest.fixture
async def index(shared_index: EdgeIndex) -> EdgeIndex:
    ids = list(await shared_index.page_hashes())
    if ids:
        await shared_index.delete_pages(ids)
    assert await shared_index.count() == 0
    return shared_index


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = Store(tmp_path / "evident.db")
    yield s
    await s.close()


def _source(fc: FakeConfluence, **kw: Any) -> ConfluenceSource:
    client_kw = {k: kw.pop(k) for k in ("token", "user", "max_retries", "timeout_s") if k in kw}
    token = client_kw.pop("token", fc.token)
    user = client_kw.pop("user", fc.user if fc.mode == "cloud" else None)
    client = ConfluenceClient(fc.url, token=token, user=user, backoff_base_s=0.01, backoff_max_s=0.05,
                              **client_kw)
    kw.setdefault("spaces", _spaces(fc))
    return ConfluenceSource(client, **kw)


async def _sync(src: ConfluenceSource, index: EdgeIndex, store: Store, **kw: Any) -> SyncReport:
    return await sync_confluence(source=src, index=index, embedder=HashEmbedder(), sparse=Bm25Encoder(),
                                 store=store, options=ingest_options(), **kw)


async def _ids(index: EdgeIndex) -> set[str]:
    return set(await index.page_hashes())


def _newest(fc: FakeConfluence, space: str, ids: set[str] | None = None) -> datetime:
    return max(p.when for p in fc.pages.values() if p.space == space and (ids is None or p.id in ids))


# ---------------------------------------------------------------------- CQL


def test_quote_escapes_quotes_and_backslashes() -> None:
    assert quote('a"b\\c') == '"a\\"b\\\\c"'


def test_pages_cql_scope_and_order() -> None:
    cql = pages_cql("ENG", since="2024-01-02 03:04", labels_include=("faq",), labels_exclude=("draft", "old"),
                    ancestor="123")
    assert cql == (
        'space = "ENG" and type = page and ancestor = 123 and label in ("faq") and '
        'label not in ("draft", "old") and lastmodified >= "2024-01-02 03:04" order by lastmodified asc'
    )
    assert pages_cql("ENG", ordered=False) == 'space = "ENG" and type = page'


def test_since_bound_subtracts_overlap_and_floors_to_minute() -> None:
    # a measured zone: an hour earlier still, as daylight saving may have moved it since (ZONE_SHIFT_S)
    assert since_bound("2024-05-01T10:05:59.900Z", 600, 0) == "2024-05-01 08:55"
    assert since_bound("2024-05-01T20:05:00+10:00", 0, 0) == "2024-05-01 09:05"
    assert since_bound("2024-05-01T10:05:00Z", 60, -300) == "2024-05-01 04:04"  # written in the site's zone
    assert since_bound("2024-05-01T10:05:00Z", 60, None) == "2024-04-30 21:04"  # unknown zone: 13 h wider


def test_to_utc_iso_normalises_offsets() -> None:
    assert to_utc_iso("2024-11-15T10:00:00.000+10:00") == "2024-11-15T00:00:00.000Z"
    assert parse_utc("2024-11-15T00:00:00Z") == datetime(2024, 11, 15, tzinfo=UTC)


def test_tracker_holds_checkpoint_at_first_retryable_failure_and_on_unstable_paging() -> None:
    t = Tracker(
        seen=[("1", "2024-01-01T00:00:00Z"), ("2", "2024-01-01T00:05:00Z"), ("3", "2024-01-01T00:09:00Z")]
    )
    assert t.checkpoint(set(), None) == "2024-01-01T00:09:00.000Z"
    assert t.checkpoint({"2"}, None) == "2024-01-01T00:00:00.000Z"
    assert t.checkpoint({"1"}, "2023-12-31T00:00:00.000Z") == "2023-12-31T00:00:00.000Z"
    dup = Tracker(
        seen=[("1", "2024-01-01T00:00:00Z"), ("2", "2024-01-01T00:05:00Z"), ("1", "2024-01-02T00:00:00Z")]
    )
    assert dup.checkpoint(set(), "2023-12-31T00:00:00.000Z") == "2023-12-31T00:00:00.000Z"


# ---------------------------------------------------------------------- client and errors


@pytest.mark.parametrize("mode", ["cloud", "dc"])
async def test_full_sync_indexes_exactly_the_server_pages(
    mode: Literal["cloud", "dc"], index: EdgeIndex, store: Store
) -> None:
    async with FakeConfluence(_pages(), mode=mode) as fc:
        # Cloud without v1's space endpoint and without bodies in v1 search: spaces and bodies come from REST
        # v2
        fc.v1_retired = fc.v1_bodies_retired = mode == "cloud"
        src = _source(fc)
        report = await _sync(src, index, store)
        assert await _ids(index) == fc.visible_ids()
        assert report.added == len(fc.pages) and report.failed == [] and report.deleted == 0
        assert report.api_calls == fc.api_calls
        v2 = [r for r in fc.requests if r.startswith(fc.context + "/api/v2/spaces")]
        assert len(v2) == (len(_spaces(fc)) if mode == "cloud" else 0)
        bodies = [r for r in fc.requests if r.startswith(fc.context + "/api/v2/pages?")]
        assert bool(bodies) is (mode == "cloud") and all("body-format=storage" in r for r in bodies)
        assert all(r.startswith(fc.context + "/rest/api/") for r in fc.requests if r not in v2 + bodies)
        assert any("/rest/api/space/" in r for r in fc.requests) is (mode == "dc")
        if mode == "cloud":  # every page body read once, through v2
            assert sorted(i for r in bodies for i in parse_qs(urlsplit(r).query)["id"][0].split(",")) == \
                sorted(fc.visible_ids())
        for space in _spaces(fc):
            cp = await store.get_checkpoint(src.source_key, space)
            assert cp is not None and parse_utc(cp) == _newest(fc, space)


async def test_pages_carry_metadata_and_follow_pagination(fake: FakeConfluence) -> None:
    space = _spaces(fake)[0]
    a, b = sorted(fake.visible_ids(space))[:2]
    fake.set_parent(b, a)
    fake.set_labels(b, ["howto", "faq"])
    src = _source(fake, page_limit=3)
    pages = [p async for p in src.iter_space(space)]
    assert {p.id for p in pages} == fake.visible_ids(space)
    assert sum("content/search" in r and "start=3" in r for r in fake.requests) >= 1  # followed _links.next
    pb = next(p for p in pages if p.id == b)
    assert pb.ancestors == (fake.pages[a].title,)
    assert pb.labels == ("howto", "faq")
    assert pb.url == f"{fake.url}/spaces/{space}/pages/{b}"
    assert pb.updated == to_utc_iso(fake.pages[b].when.isoformat()) and pb.version == 1
    assert [p.updated for p in pages] == sorted(p.updated or "" for p in pages)  # oldest edit first


async def test_data_center_context_path_and_protocol() -> None:
    async with FakeConfluence(_pages(), mode="dc", context="/confluence") as fc:
        src = _source(fc, page_limit=4, id_limit=5)
        assert isinstance(src, SourceConnector)
        assert {p.id async for p in src.iter_pages()} == await src.list_page_ids() == fc.visible_ids()
        assert all(r.startswith("/confluence/rest/api/") for r in fc.requests)


async def test_wrong_space_key_is_a_clear_not_found(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    with pytest.raises(NotFoundError, match="space 'XYZ' not found or not visible to this token"):
        await _sync(_source(fake, spaces=("XYZ",)), index, store)
    async with FakeConfluence(_pages(2), mode="cloud") as cloud:  # REST v2 answers an empty list
        with pytest.raises(NotFoundError, match="space 'XYZ' not found or not visible to this token"):
            await _source(cloud, spaces=("XYZ",)).check_space("XYZ")


async def test_bad_credentials_raise_auth_error(fake: FakeConfluence) -> None:
    with pytest.raises(AuthError, match="401"):
        await _source(fake, token="wrong").check_space(_spaces(fake)[0])


async def test_cloud_url_without_wiki_suggests_the_suffix() -> None:
    async with FakeConfluence(_pages(2), mode="cloud") as fc:
        client = ConfluenceClient(fc.host_url, token=fc.token, user=fc.user, backoff_base_s=0.01)
        with pytest.raises(UnreachableError, match="/wiki"):
            await client.space(_spaces(fc)[0])
        assert client.api_calls == 1  # a wrong base URL is not retried


async def test_unreachable_host_raises_unreachable_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ConfluenceClient(f"http://127.0.0.1:{port}", token="t", max_retries=1, backoff_base_s=0.01)
    with pytest.raises(UnreachableError, match="cannot reach Confluence"):
        await client.space("ENG")


async def test_429_storm_honours_retry_after(fake: FakeConfluence, index: EdgeIndex, store: Store) -> None:
    fake.fail_next(429, 2, headers={"Retry-After": "1"})
    t0 = time.perf_counter()
    report = await _sync(_source(fake), index, store)
    assert time.perf_counter() - t0 >= 2.0
    assert report.failed == [] and await _ids(index) == fake.visible_ids()


async def test_dc_throttling_403_is_retried_but_plain_403_is_auth(fake: FakeConfluence) -> None:
    src = _source(fake)
    space = _spaces(fake)[0]
    fake.fail_next(403, 1, headers={"X-RateLimit-Remaining": "0", "Retry-After": "0"})
    await src.check_space(space)
    assert src.client.retries == 1
    fake.fail_next(403, 1)
    with pytest.raises(AuthError, match="403"):
        await src.check_space(space)


async def test_rate_limit_gives_up_after_the_retry_cap(fake: FakeConfluence) -> None:
    fake.fail_next(429, 10, headers={"Retry-After": "0"})
    src = _source(fake, max_retries=2)
    with pytest.raises(RateLimitedError) as info:
        await src.check_space(_spaces(fake)[0])
    assert info.value.retry_after_s == 0 and src.client.api_calls == 3


async def test_timeouts_are_retried(fake: FakeConfluence) -> None:
    fake.slow_next(1, 1.5)
    src = _source(fake, timeout_s=1)
    await src.check_space(_spaces(fake)[0])
    assert src.client.retries == 1 and src.client.api_calls == 2


async def test_a_results_page_that_keeps_timing_out_is_asked_for_in_halves(fake: FakeConfluence) -> None:
    space = _spaces(fake)[0]
    want = [p.id async for p in _source(fake, page_limit=4).iter_space(space)]
    src = _source(fake, timeout_s=1, page_limit=4)
    await src.list_space(space)  # the id listing (restrictions) first
    fake.slow_next(2, 1.5)  # then the first results page (4 bodies) times out twice
    calls = fake.api_calls
    got = [p.id async for p in src.iter_space(space)]
    assert got == want  # nothing lost or repeated
    searches = [
        r for r in fake.requests[calls:] if "content/search" in r and "expand=body" in r.replace("%2C", ",")
    ]
    assert "limit=4" in searches[0] and all("limit=2" in r for r in searches[2:])


async def test_timeout_comes_from_the_settings() -> None:
    from connectors.factory import make_confluence_source

    env = {"CONFLUENCE_URL": "http://127.0.0.1:9/wiki", "CONFLUENCE_TOKEN": "t", "CONFLUENCE_TIMEOUT_S": "7"}
    src = make_confluence_source(Settings.load(env=env))
    assert src.client._api.timeout == 7
    src.close()


async def test_intermittent_500s_complete(fake: FakeConfluence, index: EdgeIndex, store: Store) -> None:
    fake.fail_every(3, 500)
    report = await _sync(_source(fake, page_limit=4), index, store)
    assert report.failed == [] and await _ids(index) == fake.visible_ids()
    assert report.api_calls > 6


# ---------------------------------------------------------------------- incremental sync


async def test_edit_reindexes_only_that_page(fake: FakeConfluence, index: EdgeIndex, store: Store) -> None:
    src = _source(fake)
    await _sync(src, index, store)
    before = await index.page_hashes()
    pid = sorted(fake.visible_ids())[3]
    fake.edit(pid, body=fake.pages[pid].body + "<p>A brand new paragraph about sync.</p>")
    report = await _sync(src, index, store, full=True)
    assert (report.updated, report.added, report.unchanged) == (1, 0, len(fake.pages) - 1)
    after = await index.page_hashes()
    assert {k for k in after if after[k] != before[k]} == {pid}
    # incremental: only the overlap window and the edit are re-read, nothing re-embedded
    noop = await _sync(src, index, store)
    assert noop.updated == noop.added == 0 and noop.pages_seen < len(fake.pages)


async def test_incremental_sync_picks_up_edit_without_rereading_everything(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    src = _source(fake)
    await _sync(src, index, store)
    pid = sorted(fake.visible_ids())[0]  # the oldest page: far outside the overlap window
    fake.edit(pid, body="<p>Rewritten.</p><p>The VPN gateway moved to vpn2.example.com.</p>")
    report = await _sync(src, index, store)
    assert report.updated == 1 and report.pages_seen <= 6 < len(fake.pages)
    cp = await store.get_checkpoint(src.source_key, fake.pages[pid].space)
    assert cp is not None and parse_utc(cp) == fake.pages[pid].when.replace(
        microsecond=fake.pages[pid].when.microsecond // 1000 * 1000
    )


async def test_deleted_and_archived_pages_leave_the_index(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    src = _source(fake)
    await _sync(src, index, store)
    gone, archived = sorted(fake.visible_ids())[:2]
    fake.delete(gone)
    fake.archive(archived)
    report = await _sync(src, index, store)
    assert report.deleted == 2
    assert await _ids(index) == fake.visible_ids()


async def test_syncing_one_space_deletes_only_in_that_space(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    src = _source(fake)
    await _sync(src, index, store)
    first, second = _spaces(fake)[:2]
    gone_second = sorted(fake.visible_ids(second))[0]
    gone_first = sorted(fake.visible_ids(first))[0]
    fake.delete(gone_second)
    fake.delete(gone_first)
    calls = fake.api_calls
    report = await _sync(src, index, store, spaces=[first])
    assert report.deleted == 1  # the index says where each page lives: the other space is not touched
    assert await _ids(index) == fake.visible_ids() | {gone_second}
    assert not any("id+in" in r for r in fake.requests[calls:])  # no look-ups needed


async def test_a_page_moved_into_a_space_that_is_not_synced_leaves_the_index(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    src = _source(fake)
    await _sync(src, index, store)
    pid = sorted(fake.visible_ids(_spaces(fake)[0]))[0]
    fake.move(pid, "HRPRIVATE")  # version and lastmodified unchanged, as in Confluence
    report = await _sync(src, index, store)
    assert report.deleted == 1 and pid not in await _ids(index)
    again = await _sync(src, index, store, full=True)  # and --full keeps it out
    assert again.deleted == again.added == 0 and pid not in await _ids(index)


class CountingIndex(_Wrapped):
    """Counts reads of every page's hash (the whole page table: a question's search waits behind each)."""

    def __init__(self, inner: EdgeIndex) -> None:
        super().__init__(inner)
        self.reads = 0

    async def page_hashes(self) -> dict[str, str]:
        self.reads += 1
        return dict(await self.inner.page_hashes())


async def test_a_cycle_reads_the_page_hashes_once_whatever_its_spaces(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    """Per-cycle work grew with the wiki times its spaces: each space's ingest read the hash of every indexed
    page (50 reads of 53,622 in an edit cycle of the 50,000-page benchmark), a request that questions'
    searches queued behind in ``evident serve``."""
    src = _source(fake)
    await _sync(src, index, store)
    spaces = _spaces(fake)
    assert len(spaces) >= 2
    for space in spaces:
        pid = sorted(fake.visible_ids(space))[0]
        fake.edit(pid, body=fake.pages[pid].body + "<p>An edit in every space.</p>")
    counting = CountingIndex(index)
    report = await _sync(src, counting, store)  # type: ignore[arg-type]
    assert report.updated == len(spaces) and report.failed == []
    assert counting.reads == 1
    again = await _sync(src, counting, store)  # type: ignore[arg-type]
    assert again.updated == again.added == 0 and counting.reads <= 2


async def test_a_page_moved_between_synced_spaces_is_reindexed_under_its_new_space(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    src = _source(fake)
    await _sync(src, index, store)
    first, second = _spaces(fake)[:2]
    pid = sorted(fake.visible_ids(first))[0]  # the oldest: outside any overlap window
    fake.move(pid, second)
    report = await _sync(src, index, store)
    assert report.deleted == 0 and report.updated == 1
    assert (await index.page_spaces())[pid] == second
    points = [pt async for pt in index.export_points(page_ids=[pid])]
    assert points and all(
        pt.evidence.space == second and f"/spaces/{second}/" in pt.evidence.url for pt in points
    )
    noop = await _sync(src, index, store)
    assert noop.updated == noop.deleted == 0


async def test_attachments_and_comments_move_with_their_page(fake: FakeConfluence, index: EdgeIndex,
                                                             store: Store) -> None:
    first, second = _spaces(fake)[:2]
    pid = sorted(fake.visible_ids(first))[0]  # the oldest: outside any overlap window
    old = fake.now() - timedelta(days=3650)
    fake.attach(
        "att7001", pid, "notes.md", b"# Notes\n\nRotate keys monthly.\n", media_type="text/markdown", when=old
    )
    fake.comment("7002", pid, "<p>Keys are in the vault.</p>", when=old)
    src = _source(fake, attachments=True, comments=True)
    await _sync(src, index, store)
    assert {"att7001", "7002"} <= await _ids(index)
    fake.move(pid, second)
    await _sync(src, index, store)
    spaces = await index.page_spaces()
    assert spaces[pid] == spaces["att7001"] == spaces["7002"] == second
    for extra in ("att7001", "7002"):
        [pt] = [pt async for pt in index.export_points(page_ids=[extra])]
        assert f"/spaces/{second}/pages/{pid}" in pt.evidence.url
    noop = await _sync(src, index, store)
    assert noop.updated == noop.deleted == 0


async def test_spaces_are_checked_at_most_every_six_hours(fake: FakeConfluence, index: EdgeIndex,
                                                           store: Store) -> None:
    src = _source(fake)
    spaces = _spaces(fake)

    async def checks(**kw: Any) -> int:
        calls = len(fake.requests)
        await _sync(src, index, store, **kw)
        return sum("/rest/api/space/" in r for r in fake.requests[calls:])

    assert await checks() == len(spaces)  # first run: every space
    assert await checks() == 0  # kept for 6 h: 10 fewer calls per cycle on 10 spaces
    assert await checks(full=True) == len(spaces)  # --full checks anyway
    stale = (datetime.now(UTC) - timedelta(hours=7)).isoformat()
    await store.set_checkpoint(src.source_key, f"__space_ok__:{spaces[0]}", stale)
    assert await checks() == 1
    assert not any(row.space.startswith("__") for row in await store.sync_status())


async def test_restricted_pages_are_skipped_counted_and_removed(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    space = _spaces(fake)[0]
    parent, child, other = sorted(fake.visible_ids(space))[:3]
    fake.set_parent(child, parent)
    fake.restrict(parent, users=["alice"])
    src = _source(fake)
    report = await _sync(src, index, store)
    assert report.skipped_restricted == 2  # the page and its child, which inherits the restriction
    assert await _ids(index) == fake.visible_ids() - {parent, child}
    fake.restrict(other, users=(), groups=["hr"])  # restricting an indexed page removes it
    report = await _sync(src, index, store)
    assert report.deleted == 1 and other not in await _ids(index)
    everything = await _sync(_source(fake, include_restricted=True), index, store, full=True)
    assert everything.skipped_restricted == 0 and await _ids(index) == fake.visible_ids()


async def test_label_and_ancestor_scope(fake: FakeConfluence, index: EdgeIndex, store: Store) -> None:
    space = _spaces(fake)[0]
    a, b, c = sorted(fake.visible_ids(space))[:3]
    fake.set_labels(a, ["faq"])
    fake.set_labels(b, ["faq", "draft"])
    pages = [
        p.id async for p in _source(fake, labels_include=["faq"], labels_exclude=["draft"]).iter_space(space)
    ]
    assert pages == [a]
    fake.set_parent(c, a)
    assert [p.id async for p in _source(fake, ancestor=a).iter_space(space)] == [c]


@pytest.mark.parametrize("tz_min", [600, -300, 345, -720, 840])
async def test_the_sites_cql_zone_is_measured(tz_min: int, store: Store) -> None:
    async with FakeConfluence(_pages(), tz_offset_min=tz_min) as fc:
        src = _source(fc)
        assert await measure_zone(src.client, src.scope_cql(_spaces(fc)[0])) == tz_min
        assert src.client.api_calls <= 10


@pytest.mark.parametrize("tz_min", [600, -300])
async def test_an_edit_a_minute_after_the_checkpoint_is_found_in_any_zone(
    tz_min: int, index: EdgeIndex, store: Store
) -> None:
    """The bound is written in the measured zone with a one-minute overlap: east or west, nothing is missed,
    and the zone is measured once, not every cycle."""
    async with FakeConfluence(_pages(), tz_offset_min=tz_min) as fc:
        src = _source(fc, overlap_s=60)
        first = await _sync(src, index, store)
        assert first.cql_zone_min == tz_min
        space = _spaces(fc)[0]
        cp = parse_utc(await store.get_checkpoint(src.source_key, space) or "")
        pid = sorted(fc.visible_ids(space))[0]
        fc.edit(pid, body="<p>Edited one minute after the checkpoint.</p>", when=cp + timedelta(seconds=61))
        calls = fc.api_calls
        report = await _sync(src, index, store)
        assert report.updated == 1 and report.cql_zone_min == tz_min
        bound = since_bound(cp.isoformat(), 60, tz_min)
        queries = [unquote_plus(r) for r in fc.requests[calls:] if "lastmodified" in unquote_plus(r)]
        assert any(f'space = "{space}"' in q and f'lastmodified >= "{bound}"' in q for q in queries)
        assert not any("order by lastmodified desc" in q for q in queries)  # the zone came from the store
        assert [s.space for s in await store.sync_status()] == sorted(_spaces(fc))  # not the zone's row


async def test_an_edit_is_found_when_daylight_saving_moved_the_zone_since_it_was_measured(
    index: EdgeIndex, store: Store
) -> None:
    """Measured at UTC+2; the site then falls back to UTC+1 within the hours the measurement is kept. An edit
    20 minutes after the checkpoint is still found, although a later edit moves the checkpoint past it."""
    async with FakeConfluence(_pages(), tz_offset_min=120) as fc:
        src = _source(fc, overlap_s=60)
        assert (await _sync(src, index, store)).cql_zone_min == 120
        fc.tz = timezone(timedelta(minutes=60))
        space = _spaces(fc)[0]
        cp = parse_utc(await store.get_checkpoint(src.source_key, space) or "")
        first, second = sorted(fc.visible_ids(space))[:2]
        fc.edit(first, body="<p>Edited 20 minutes after the checkpoint.</p>", when=cp + timedelta(minutes=20))
        fc.edit(second, body="<p>Edited 65 minutes after it.</p>", when=cp + timedelta(minutes=65))
        report = await _sync(src, index, store)
        assert report.updated == 2 and report.cql_zone_min == 120  # still the kept measurement


async def test_without_the_zone_probe_the_overlap_is_widened_by_13_hours(
    index: EdgeIndex, store: Store
) -> None:
    """UTC-12, the most western zone: an edit an hour after the checkpoint is still found."""
    async with FakeConfluence(_pages(), tz_offset_min=-720) as fc:
        src = _source(fc, overlap_s=60, zone_probe=False)
        await _sync(src, index, store)
        space = _spaces(fc)[0]
        cp = parse_utc(await store.get_checkpoint(src.source_key, space) or "")
        pid = sorted(fc.visible_ids(space))[0]
        fc.edit(pid, body="<p>Edited an hour after the checkpoint.</p>", when=cp + timedelta(hours=1))
        report = await _sync(src, index, store)
        assert report.updated == 1 and report.cql_zone_min is None


# ---------------------------------------------------------------------- crashes converge


async def test_fetch_crash_mid_sync_keeps_checkpoint_behind_and_rerun_converges(
    fake: FakeConfluence, tmp_path: Path, index: EdgeIndex, store: Store
) -> None:
    space = _spaces(fake)[0]
    ordered = sorted((p for p in fake.pages.values() if p.space == space), key=lambda p: p.when)
    bad = ordered[5]
    fake.fail_search_containing(bad.id)  # every results page holding it answers 500
    src = _source(fake, page_limit=3, max_retries=1)
    report = await _sync(src, index, store)
    assert any(pid == f"space:{space}" for pid, _ in report.failed)
    cp = await store.get_checkpoint(src.source_key, space)
    assert cp is not None and parse_utc(cp) < bad.when
    indexed = await _ids(index)
    assert {p.id for p in ordered[:3]} <= indexed and bad.id not in indexed
    fake.fail_search_containing(bad.id, times=0)
    rerun = await _sync(src, index, store)
    assert rerun.failed == [] and await _ids(index) == fake.visible_ids()
    assert parse_utc(await store.get_checkpoint(src.source_key, space) or "") == _newest(fake, space)
    # no duplicates or half pages: the same points as a clean full sync from scratch
    converged = (await index.count(), await index.page_hashes())
    await index.delete_pages(list(converged[1]))
    clean_store = Store(tmp_path / "clean.db")
    try:
        await _sync(_source(fake), index, clean_store)
    finally:
        await clean_store.close()
    assert (await index.count(), await index.page_hashes()) == converged


async def test_index_write_failure_holds_checkpoint_and_rerun_converges(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    space = _spaces(fake)[0]
    ordered = sorted((p for p in fake.pages.values() if p.space == space), key=lambda p: p.when)
    bad = ordered[4]
    idx = FlakyIndex(index, {bad.id})
    src = _source(fake)
    report = await _sync(src, idx, store)  # type: ignore[arg-type]
    assert [pid for pid, _ in report.failed] == [bad.id]
    assert report.failed[0][1].startswith("index write failed")
    cp = await store.get_checkpoint(src.source_key, space)
    assert cp is not None and parse_utc(cp) == ordered[3].when.replace(
        microsecond=ordered[3].when.microsecond // 1000 * 1000)
    rerun = await _sync(src, idx, store)  # type: ignore[arg-type]
    assert rerun.failed == [] and rerun.added == 1
    assert await _ids(index) == fake.visible_ids()


async def test_cloud_cycles_read_no_body_of_a_page_indexed_at_its_version(
    index: EdgeIndex, store: Store
) -> None:
    async with FakeConfluence(_pages(), mode="cloud") as fc:
        fc.v1_bodies_retired = True
        src = _source(fc)
        first = await _sync(src, index, store)
        assert first.failed == []
        fc.requests.clear()
        # the overlap re-reads each space's newest page: at a known version
        quiet = await _sync(src, index, store)
        assert not [r for r in fc.requests if "/api/v2/pages?" in r]
        assert quiet.unchanged >= len(_spaces(fc)) and quiet.added == quiet.updated == 0
        space = _spaces(fc)[0]
        edited = sorted(fc.visible_ids(space))[3]
        fc.edit(edited, body=fc.pages[edited].body + "<p>An edit.</p>")
        fc.requests.clear()
        report = await _sync(src, index, store)
        v2 = [parse_qs(urlsplit(r).query)["id"][0] for r in fc.requests if "/api/v2/pages?" in r]
        assert v2 == [edited] and report.updated == 1


async def test_a_page_failing_retryably_is_read_again_though_pages_after_it_are_known(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    space = _spaces(fake)[0]
    ordered = sorted((p for p in fake.pages.values() if p.space == space), key=lambda p: p.when)
    idx = FlakyIndex(index, {ordered[4].id})
    src = _source(fake, spaces=(space,))
    await _sync(src, idx, store)  # type: ignore[arg-type]
    rerun = await _sync(src, idx, store)  # type: ignore[arg-type]
    assert rerun.added == 1 and rerun.failed == []
    assert rerun.pages_seen == 1  # the pages after it were indexed at their version: skipped, not re-ingested
    assert await _ids(index) == fake.visible_ids(space)


async def test_pages_that_come_into_scope_without_an_edit_are_indexed(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    space = _spaces(fake)[0]
    secret, labelled = sorted(fake.visible_ids(space))[:2]
    fake.restrict(secret, users=["hr-lead"])
    fake.set_labels(labelled, ["draft"])
    src = _source(fake, spaces=(space,), labels_exclude=["draft"])
    await _sync(src, index, store)
    assert not {secret, labelled} & await _ids(index)
    fake.restrict(secret, users=())  # neither change makes a new version or moves lastmodified
    fake.set_labels(labelled, [])
    report = await _sync(src, index, store)
    assert {secret, labelled} <= await _ids(index) and report.added == 2
    assert await _ids(index) == fake.visible_ids(space)
    assert (await _sync(src, index, store)).pages_seen <= 1  # nothing is fetched by id again


async def test_a_page_that_cannot_be_converted_is_reported_once_per_version(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    space = _spaces(fake)[0]
    empty = sorted(fake.visible_ids(space))[0]
    fake.edit(empty, body="", when=fake.now() - timedelta(hours=1))
    src = _source(fake, spaces=(space,))
    first = await _sync(src, index, store)
    assert [pid for pid, _ in first.failed] == [empty]
    fake.requests.clear()
    again = await _sync(src, index, store)
    assert again.failed == [] and not [r for r in fake.requests if f"id in ({empty})" in unquote_plus(r)]
    fake.edit(empty, body="<p>Now it has text.</p>")
    fixed = await _sync(src, index, store)
    assert fixed.failed == [] and empty in await _ids(index)


# ---------------------------------------------------------------------- settings


@pytest.mark.parametrize("mode", ["cloud", "dc"])
async def test_factory_picks_cloud_or_data_center_auth(mode: Literal["cloud", "dc"]) -> None:
    async with FakeConfluence(_pages(2), mode=mode) as fc:
        settings = Settings.load(env={}, confluence_url=fc.url, confluence_token=fc.token,
                                 confluence_user=fc.user if mode == "cloud" else None,
                                 confluence_spaces=_spaces(fc), sync_overlap_s=42)
        src = make_confluence_source(settings)
        assert src.overlap_s == 42 and src.client.cloud is (mode == "cloud")
        assert await src.list_page_ids() == fc.visible_ids()


# ---------------------------------------------------------------------- view-time macros, blog posts


def _include(name: str, title: str, space: str | None = None) -> str:
    key = f' ri:space-key="{space}"' if space else ""
    return (
        f'<ac:structured-macro ac:name="{name}" ac:schema-version="1"><ac:parameter ac:name="">'
        f'<ac:link><ri:page ri:content-title="{title}"{key}/></ac:link></ac:parameter></ac:structured-macro>'
    )


@pytest.fixture(params=["dc", "cloud"])
async def site(request: pytest.FixtureRequest) -> AsyncIterator[FakeConfluence]:
    """Data Center, or Cloud whose v1 search no longer expands bodies (they come from REST v2)."""
    async with FakeConfluence(_pages(), mode=request.param) as fc:
        fc.v1_bodies_retired = request.param == "cloud"
        yield fc


async def test_include_excerpt_and_children_macros_show_what_a_reader_sees(site: FakeConfluence) -> None:
    fake = site
    space = _spaces(fake)[0]
    host, shared, faq, secret, child1, child2 = sorted(fake.visible_ids(space))[:6]
    fake.edit(shared, title="Shared escalation", body="<p>Escalate to the duty manager after 30 minutes.</p>"
              + _include("include", "Shared escalation"))  # includes itself: once, no loop
    fake.edit(faq, title="FAQ", body='<p>Not in the excerpt.</p><ac:structured-macro ac:name="excerpt">'
              '<ac:rich-text-body><p>VPN access is granted by the platform team.</p></ac:rich-text-body>'
              '</ac:structured-macro>')
    fake.edit(secret, title="Salaries", body="<p>Confidential salary bands.</p>")
    fake.restrict(secret, users=["hr-lead"])
    fake.set_parent(child1, host)
    fake.set_parent(child2, host)
    fake.edit(
        host,
        body="<p>Host page.</p>"
        + _include("include", "Shared escalation")
        + _include("excerpt-include", "FAQ", space)
        + _include("include", "Salaries")
        + _include("include", "No such page")
        + '<ac:structured-macro ac:name="children" ac:schema-version="2"/>',
    )
    src = _source(fake)
    [page] = [p async for p in src.iter_ids(space, [host])]
    body = page.body
    assert body.count("Escalate to the duty manager") == 1
    assert "VPN access is granted by the platform team." in body and "Not in the excerpt" not in body
    assert "Confidential" not in body  # a restricted page's text never reaches channels through another page
    titles = [fake.pages[c].title for c in (child1, child2)]
    assert all(f"<li>{t}</li>" in body for t in titles)
    assert "ac:structured-macro" not in body
    off = _source(fake, resolve_macros=False)
    assert [p.body async for p in off.iter_ids(space, [host])] == [fake.pages[host].body]


async def test_blog_posts_are_indexed_when_asked_for(
    site: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    fake = site
    space = _spaces(fake)[0]
    fake.add(FakePage(id="777001", title="Release party", space=space, body="<p>Friday at five.</p>",
                      when=fake.now(), kind="blogpost"))
    await _sync(_source(fake), index, store)
    assert "777001" not in await _ids(index)
    report = await _sync(_source(fake, blog_posts=True), index, store)
    assert report.added == 1 and "777001" in await _ids(index)
    points = [pt async for pt in index.export_points(page_ids=["777001"])]
    assert points and points[0].evidence.breadcrumb[:1] == ("Blog",)
    assert "Friday at five" in points[0].evidence.text
    assert any("/api/v2/blogposts?" in r for r in fake.requests) is (fake.mode == "cloud")


# ---------------------------------------------------------------------- Cloud: bodies through REST v2


async def test_cloud_bodies_come_from_v2_in_chunks_of_250_following_the_cursor(store: Store) -> None:
    async with FakeConfluence(synthetic_pages(260, spaces=("ENG",)), mode="cloud") as fc:
        fc.v1_bodies_retired = True
        fc.v2_page_cap = 100  # the site answers at most 100 per response: the client follows ``_links.next``
        client = ConfluenceClient(fc.url, token=fc.token, user=fc.user)
        ids = sorted(fc.visible_ids(), key=int)
        bodies = await client.storage_bodies("page", [*ids, "not-a-number"])
        assert bodies == {i: fc.pages[i].body for i in ids}
        v2 = [parse_qs(urlsplit(r).query) for r in fc.requests if "/api/v2/pages" in r]
        assert [len(q["id"][0].split(",")) for q in v2 if "cursor" not in q] == [250, 10]
        assert sum("cursor" in q for q in v2) == 2  # 250 ids answered 100 at a time: two more requests
        client.close()


async def test_cloud_page_deleted_between_search_and_body_read_is_a_warning(
    index: EdgeIndex, store: Store
) -> None:
    async with FakeConfluence(_pages(), mode="cloud") as fc:
        fc.v1_bodies_retired = True
        space = _spaces(fc)[0]
        victim = sorted(fc.visible_ids(space))[0]

        def delete_before_bodies(path_qs: str) -> None:
            if "/api/v2/pages?" in path_qs and victim in fc.pages:
                fc.delete(victim)

        fc.on_request = delete_before_bodies
        report = await _sync(_source(fc, spaces=(space,)), index, store)
        assert victim not in await _ids(index) and report.failed == []
        assert [pid for pid, _ in report.warnings] == [victim]
        assert await _ids(index) == fc.visible_ids(space)


async def test_cloud_without_v2_pages_reads_bodies_through_v1(index: EdgeIndex, store: Store) -> None:
    async with FakeConfluence(_pages(), mode="cloud") as fc:
        fc.v2_pages = False  # an older site (or a proxy) that only passes v2's spaces endpoint
        src = _source(fc)
        report = await _sync(src, index, store)
        assert await _ids(index) == fc.visible_ids() and report.failed == []
        assert src.client.v2_bodies is False
        assert sum("/api/v2/pages" in r for r in fc.requests) == 1  # tried once, then v1 for the rest


async def test_pdf_and_markdown_attachments_are_indexed_with_their_page_and_leave_with_it(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    space = _spaces(fake)[0]
    host, secret = sorted(fake.visible_ids(space))[:2]
    fake.attach("att9001", host, "vpn-guide.pdf", minimal_pdf(["The VPN gateway is vpn2.example.com."]))
    fake.attach("att9002", host, "notes.md", b"# Notes\n\nRotate keys monthly.\n", media_type="text/markdown")
    fake.attach("att9003", host, "huge.pdf", b"%PDF-" + b"x" * 5000)
    fake.attach("att9004", host, "diagram.png", b"\x89PNG", media_type="image/png")  # not a text format
    fake.attach("att9005", secret, "salaries.pdf", minimal_pdf(["Confidential."]))
    fake.restrict(secret, users=["hr-lead"])
    src = _source(fake, attachments=True, max_attachment_bytes=4000)
    report = await _sync(src, index, store)
    ids = await _ids(index)
    assert {"att9001", "att9002"} <= ids and not ids & {"att9003", "att9004", "att9005"}
    assert [pid for pid, _ in report.failed] == ["att9003"]  # too large: one line, the rest proceeds
    [pdf] = [pt async for pt in index.export_points(page_ids=["att9001"])]
    assert "vpn2.example.com" in pdf.evidence.text and pdf.evidence.breadcrumb == (fake.pages[host].title,)
    assert pdf.evidence.url.endswith(f"/pages/{host}")
    del fake.pages["att9002"]  # the attachment is deleted: it leaves the index
    again = await _sync(src, index, store)
    assert again.deleted == 1 and "att9002" not in await _ids(index) and "att9001" in await _ids(index)


async def test_word_attachments_are_indexed_with_their_tables(fake: FakeConfluence, index: EdgeIndex,
                                                              store: Store) -> None:
    host = sorted(fake.visible_ids(_spaces(fake)[0]))[0]
    fake.attach("att9101", host, "oncall.docx", word_document(),
                media_type="application/vnd.openxmlformats-officedocument.wordprocessingml.document")
    report = await _sync(_source(fake, attachments=True), index, store)
    assert report.failed == [] and "att9101" in await _ids(index)
    texts = [pt.evidence.text async for pt in index.export_points(page_ids=["att9101"])]
    assert any("Owner is Alice" in t for t in texts)


async def test_comments_are_indexed_under_their_page_when_asked_for(fake: FakeConfluence, index: EdgeIndex,
                                                                    store: Store) -> None:
    space = _spaces(fake)[0]
    host, secret = sorted(fake.visible_ids(space))[:2]
    fake.comment("9101", host, "<p>The staging VPN moved to <b>vpn3.example.com</b>.</p>")
    fake.comment("9102", host, "<p>Thanks!</p>")
    fake.comment("9103", secret, "<p>Bonus table attached.</p>")
    fake.restrict(secret, users=["hr-lead"])
    off = await _sync(_source(fake), index, store)
    assert off.added and not {"9101", "9102", "9103"} & await _ids(index)  # off by default
    src = _source(fake, comments=True)
    await _sync(src, index, store, full=True)
    ids = await _ids(index)
    assert {"9101", "9102"} <= ids and "9103" not in ids  # a restricted page's comments stay out
    [note] = [pt async for pt in index.export_points(page_ids=["9101"])]
    assert "vpn3.example.com" in note.evidence.text
    assert note.evidence.title == f"Comment on {fake.pages[host].title}"
    assert note.evidence.breadcrumb == (fake.pages[host].title,)
    assert note.evidence.url.endswith(f"/pages/{host}?focusedCommentId=9101#comment-9101")
    fake.edit("9101", body="<p>The staging VPN is back on vpn2.example.com.</p>")
    fake.delete("9102")
    again = await _sync(src, index, store)
    assert again.deleted == 1 and "9102" not in await _ids(index)
    [note] = [pt async for pt in index.export_points(page_ids=["9101"])]
    assert "vpn2.example.com" in note.evidence.text


async def test_an_included_page_edit_reaches_its_includers_at_the_next_sync(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    space = _spaces(fake)[0]
    host, shared, bystander = sorted(fake.visible_ids(space))[:3]
    now = fake.now()
    fake.edit(shared, title="Shared escalation", body="<p>Escalate to the night shift lead.</p>",
              when=now - timedelta(days=2))
    fake.edit(
        host,
        body="<p>How we escalate:</p>" + _include("include", "Shared escalation"),
        when=now - timedelta(days=3),
    )
    # the checkpoint passes them
    fake.edit(bystander, body="<p>Newer than both.</p>", when=now - timedelta(days=2))
    await _sync(_source(fake), index, store)
    [before] = [pt.evidence.text async for pt in index.export_points(page_ids=[host])]
    assert "night shift lead" in before
    calls = len(fake.requests)
    await _sync(_source(fake), index, store)  # the included page is read again (overlap) but did not change
    assert not _fetched_by_id(fake.requests[calls:], host)
    # Only the included page (and a bystander) change: the host's own version and time stay as they were.
    fake.edit(shared, body="<p>Escalate to the on-call manager.</p>", when=now + timedelta(hours=1))
    fake.edit(bystander, body="<p>Unrelated change.</p>", when=now + timedelta(hours=1))
    calls = len(fake.requests)
    await _sync(_source(fake), index, store)
    assert _fetched_by_id(fake.requests[calls:], host) and not _fetched_by_id(
        fake.requests[calls:], bystander
    )
    [after] = [pt.evidence.text async for pt in index.export_points(page_ids=[host])]
    assert "on-call manager" in after and "night shift" not in after
    # The host stops including it; once the checkpoint has moved past that edit, an edit of the formerly
    # included page no longer fetches the host.
    fake.edit(host, body="<p>We no longer include it.</p>", when=now + timedelta(hours=2))
    await _sync(_source(fake), index, store)
    fake.edit(bystander, body="<p>Another change.</p>", when=now + timedelta(hours=4))
    await _sync(_source(fake), index, store)
    fake.edit(shared, body="<p>Escalate to the duty manager.</p>", when=now + timedelta(hours=5))
    calls = len(fake.requests)
    await _sync(_source(fake), index, store)
    assert not _fetched_by_id(fake.requests[calls:], host)


async def test_an_includer_whose_refresh_failed_is_refreshed_later(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    space = _spaces(fake)[0]
    host, shared = sorted(fake.visible_ids(space))[:2]
    now = fake.now()
    fake.edit(shared, title="Shared escalation", body="<p>Escalate to the night shift lead.</p>",
              when=now - timedelta(days=2))
    fake.edit(host, body="<p>How we escalate:</p>" + _include("include", "Shared escalation"),
              when=now - timedelta(days=3))
    embedder = FailingEmbedder(HashEmbedder(), "How we escalate", "on-call manager")

    async def sync() -> SyncReport:
        return await sync_confluence(source=_source(fake), index=index, embedder=embedder,
                                     sparse=Bm25Encoder(), store=store, options=ingest_options())

    await sync()
    fake.edit(shared, body="<p>Escalate to the on-call manager.</p>", when=now + timedelta(hours=1))
    failed = await sync()  # the host is read again for the new text, and its embedding fails
    assert [pid for pid, why in failed.failed if why.startswith("embedding failed")] == [host]
    embedder.armed = False
    await sync()
    [after] = [pt.evidence.text async for pt in index.export_points(page_ids=[host])]
    assert "on-call manager" in after


async def test_an_included_page_edit_in_another_synced_space_reaches_its_includer(
    fake: FakeConfluence, index: EdgeIndex, store: Store
) -> None:
    """Found outside: the includer's space is synced first, so it saw the included page's edit only one cycle
    later. Now the same cycle reads it again once the later space has indexed the edit."""
    first, second = _spaces(fake)[:2]  # synced in this order: the includer's space comes first
    host = sorted(fake.visible_ids(first))[0]
    shared = sorted(fake.visible_ids(second))[0]
    now = fake.now()
    fake.edit(shared, title="Shared escalation", body="<p>Escalate to the night shift lead.</p>",
              when=now - timedelta(days=1))
    fake.edit(host, body="<p>How we escalate:</p>" + _include("include", "Shared escalation", second),
              when=now - timedelta(days=1))
    src = _source(fake, spaces=(first, second))
    await _sync(src, index, store)
    fake.edit(shared, body="<p>Escalate to the on-call manager.</p>", when=now + timedelta(hours=1))
    calls = len(fake.requests)
    await _sync(src, index, store)  # the included page is re-indexed in its own space, after the host's
    assert _fetched_by_id(fake.requests[calls:], host)
    [after] = [pt.evidence.text async for pt in index.export_points(page_ids=[host])]
    assert "on-call manager" in after and "night shift" not in after
    calls = len(fake.requests)
    await _sync(src, index, store)  # and only once
    assert not _fetched_by_id(fake.requests[calls:], host)


def _fetched_by_id(requests: list[str], page_id: str) -> bool:
    return any(f"id in ({page_id})" in unquote_plus(r) for r in requests)


def _jira_macro(param: str, value: str) -> str:
    return (
        '<ac:structured-macro ac:name="jira" ac:schema-version="1"><ac:parameter ac:name="server">System '
        'JIRA'
        f'</ac:parameter><ac:parameter ac:name="{param}">{value}</ac:parameter></ac:structured-macro>'
    )


async def test_jira_macros_show_issue_summaries_when_a_jira_site_is_configured(fake: FakeConfluence) -> None:
    from aiohttp import web

    from connectors.confluence.jira import JiraClient

    issues = {"ENG-1": "Fix the VPN <gateway>", "OPS-22": "Rotate keys"}
    seen: list[tuple[str, str]] = []

    async def search(request: web.Request) -> web.Response:
        seen.append((request.query["jql"], request.headers.get("Authorization", "")))
        keys = request.query["jql"].removeprefix("key in (").removesuffix(")").split(", ")
        return web.json_response(
            {"issues": [{"key": k, "fields": {"summary": issues[k]}} for k in keys if k in issues]}
        )

    app = web.Application()
    app.router.add_get("/rest/api/2/search", search)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        space = _spaces(fake)[0]
        pid = sorted(fake.visible_ids(space))[0]
        fake.edit(
            pid,
            body="<p>Status of "
            + _jira_macro("key", "ENG-1")
            + " and "
            + _jira_macro("key", "OPS-22")
            + " and "
            + _jira_macro("key", "GONE-9")
            + " and "
            + _jira_macro("key", "ENG-1) OR (project = HR")
            + ".</p>"
            + _jira_macro("jqlQuery", "project = HR AND labels = salary"),
        )
        jira = JiraClient(f"http://127.0.0.1:{runner.addresses[0][1]}", token="jira-pat")
        [page] = [p async for p in _source(fake, jira=jira).iter_ids(space, [pid])]
        assert "ENG-1: Fix the VPN &lt;gateway&gt;" in page.body and "OPS-22: Rotate keys" in page.body
        assert "GONE-9" in page.body  # unknown: the macro stays, the parser shows the key
        # one search; no page-chosen JQL
        assert seen == [("key in (ENG-1, GONE-9, OPS-22)", "Bearer jira-pat")]
    finally:
        await runner.cleanup()


async def test_a_jira_outage_costs_the_summaries_only_not_the_pages_includes(fake: FakeConfluence) -> None:
    from connectors.confluence.jira import JiraClient

    space = _spaces(fake)[0]
    host, shared = sorted(fake.visible_ids(space))[:2]
    fake.edit(shared, title="Shared escalation", body="<p>Escalate to the night shift lead.</p>")
    fake.edit(host, body="<p>How we escalate:</p>" + _include("include", "Shared escalation")
              + "<p>Tracked in " + _jira_macro("key", "ENG-1") + ".</p>")
    with socket.socket() as closed:  # a port nothing listens on: Jira is down
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    src = _source(fake, jira=JiraClient(f"http://127.0.0.1:{port}", token="jira-pat"))
    [page] = [p async for p in src.iter_ids(space, [host])]
    assert "night shift lead" in page.body and "ENG-1" in page.body
    assert [k for k, _ in src.stats.warnings] == [f"jira:{host}"]  # not the page's id: it is settled


async def test_responses_are_decoded_off_the_event_loop(fake: FakeConfluence,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of bodies or restrictions is hundreds of kB of JSON: decoding one on the loop blocked serve."""
    import connectors.confluence.client as client_module

    decoded_in: list[str] = []
    original = client_module.decode

    def spy(*args: Any) -> dict[str, Any]:
        decoded_in.append(threading.current_thread().name)
        return original(*args)

    monkeypatch.setattr(client_module, "decode", spy)
    await _source(fake).check_space(_spaces(fake)[0])
    assert decoded_in and threading.main_thread().name not in decoded_in
