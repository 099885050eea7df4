"""Attachments and comments in sync cycles (faults found outside): comments through REST v2 on Cloud, a
failing
listing or fetch costs those items only, a no-change cycle downloads and reads nothing, a file over the size
cap
is reported once per version."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pdf_maker import minimal_pdf
from sync_site import SyncSite

from connectors.confluence.client import ConfluenceClient
from connectors.confluence.source import ConfluenceSource
from connectors.confluence.sync import SyncReport
from tests.fake_confluence import BASE_TIME, FakeConfluence, FakePage

pytestmark = pytest.mark.slow


def _pages() -> list[FakePage]:
    return [FakePage(str(i), f"Page {i}", space, f"<p>notes {i}</p>", BASE_TIME + timedelta(hours=i))
            for i, space in ((1, "ENG"), (2, "ENG"), (3, "OPS"))]


class Harness(SyncSite):
    def __init__(self, fc: FakeConfluence, tmp: Path) -> None:
        super().__init__(tmp)
        self.fc = fc

    def source(self, **kw: Any) -> ConfluenceSource:
        fc = self.fc
        client = ConfluenceClient(fc.url, token=fc.token, user=fc.user if fc.mode == "cloud" else None,
                                  backoff_base_s=0.01, backoff_max_s=0.02, max_retries=1)
        return ConfluenceSource(client, spaces=("ENG", "OPS"), **kw)

    async def sync(self, src: ConfluenceSource) -> SyncReport:
        return await self.run(src)


@pytest.fixture
async def cloud(tmp_path: Path) -> AsyncIterator[Harness]:
    async with FakeConfluence(_pages(), mode="cloud") as fc, Harness(fc, tmp_path) as h:
        yield h


async def test_cloud_comments_come_through_rest_v2_when_v1_refuses_bodies(cloud: Harness) -> None:
    cloud.fc.v1_bodies_retired = True  # v1 search answers 400 to expand=body.storage
    cloud.fc.comment("9101", "1", "<p>The staging VPN moved to vpn3.example.com.</p>")
    report = await cloud.sync(cloud.source(comments=True))
    assert not report.failed and {"1", "2", "3", "9101"} <= await cloud.ids()
    [note] = [pt async for pt in cloud.index.export_points(page_ids=["9101"])]
    assert "vpn3.example.com" in note.evidence.text
    assert any("/api/v2/footer-comments/9101" in r for r in cloud.fc.requests)


async def test_a_failing_comment_listing_costs_the_comments_only(cloud: Harness) -> None:
    cloud.fc.comment("9101", "1", "<p>first note</p>")
    src = cloud.source(comments=True)
    await cloud.sync(src)
    assert "9101" in await cloud.ids()
    cloud.fc.fail_next(400, count=10, path_contains="type+%3D+comment")  # every comment query refused
    cloud.fc.edit("3", body="<p>notes 3 edited</p>")
    report = await cloud.sync(src)
    assert report.updated == 1  # the other space's page edit still arrives
    assert [where for where, _ in report.failed] == ["comments:ENG", "comments:OPS"]
    assert "9101" in await cloud.ids()  # kept while its listing is refused, not deleted


async def test_a_no_change_cycle_downloads_and_reads_nothing(cloud: Harness) -> None:
    now = cloud.fc.now()  # newer than every page: the page checkpoint cannot rule them out
    cloud.fc.attach("att9001", "1", "guide.pdf", minimal_pdf(["The gateway is vpn2."]), when=now)
    cloud.fc.comment("9101", "2", "<p>a note</p>", when=now)
    src = cloud.source(attachments=True, comments=True)
    first = await cloud.sync(src)
    assert {"att9001", "9101"} <= await cloud.ids() and not first.failed
    calls = len(cloud.fc.requests)
    again = await cloud.sync(src)
    new = cloud.fc.requests[calls:]
    assert again.added == again.updated == 0 and not again.failed
    assert not [r for r in new if "/download/" in r or "footer-comments" in r], new


async def test_a_file_over_the_size_cap_is_reported_once_per_version(cloud: Harness) -> None:
    cloud.fc.attach("att9003", "1", "huge.pdf", b"%PDF-" + b"x" * 5000, when=cloud.fc.now())
    src = cloud.source(attachments=True, max_attachment_bytes=4000)
    first = await cloud.sync(src)
    assert [pid for pid, _ in first.failed] == ["att9003"]
    again = await cloud.sync(src)
    assert again.failed == []  # the same version: not reported (nor failing the sync) again
    cloud.fc.attach("att9003", "1", "huge.pdf", b"%PDF-" + b"y" * 6000, when=cloud.fc.now() + timedelta(1))
    third = await cloud.sync(src)
    assert [pid for pid, _ in third.failed] == ["att9003"]  # a new version is looked at again
