"""Listings on their own schedule (``connectors.confluence.schedule``), with the settings' defaults: a cycle
with no change asks one request a space; what no edit time shows (deletions, restrictions added without an
edit) waits for the next listing and is seen then; what an edit shows is seen at once, between listings
too."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import pytest
from helpers import FailingEmbedder
from sync_site import SyncSite

from connectors.confluence.cql import parse_utc
from connectors.confluence.source import ConfluenceSource
from connectors.confluence.state import load_known
from connectors.confluence.sync import SyncReport
from connectors.factory import make_confluence_source
from evident.settings import Settings
from pipeline.ingest import page_work
from pipeline.ingest.options import IngestOptions
from pipeline.types import Page
from tests.fake_confluence import BASE_TIME, FakeConfluence, FakePage

pytestmark = pytest.mark.slow


def _pages() -> list[FakePage]:
    pages = [FakePage(str(i), f"Page {i}", space, f"<p>notes {i}</p>", BASE_TIME + timedelta(hours=i))
             for i, space in ((1, "ENG"), (2, "ENG"), (3, "OPS"), (4, "OPS"))]
    locked = FakePage("5", "Locked", "OPS", "<p>secret</p>", BASE_TIME, restricted_users=["alice"])
    child = FakePage("6", "Under locked", "OPS", "<p>also secret</p>", BASE_TIME, parent="5")
    return [*pages, locked, child]


class Site(SyncSite):
    def __init__(self, fc: FakeConfluence, tmp: Path) -> None:
        super().__init__(tmp)
        self.fc = fc

    def source(self, **env: Any) -> ConfluenceSource:
        """Built from the settings as `evident sync` builds it (their defaults unless ``env`` says)."""
        fc = self.fc
        return make_confluence_source(Settings.load(
            env={}, confluence_url=fc.url, confluence_token=fc.token, confluence_user=fc.user,
            confluence_spaces=("ENG", "OPS"),
            **{"confluence_attachments": True, "confluence_comments": True, **env}))

    async def sync(self, src: ConfluenceSource) -> SyncReport:
        return await self.run(src)

    async def age_listings(self, hours: float) -> None:
        """As if every space was last listed ``hours`` ago."""
        for key in ("ENG", "OPS"):
            row = f"__listed__:{key}"
            kept = json.loads(await self.store.get_checkpoint(f"confluence:{self.fc.url}", row) or "{}")
            kept["at"] = (datetime.now(UTC) - timedelta(hours=hours)).isoformat()
            await self.store.set_checkpoint(f"confluence:{self.fc.url}", row, json.dumps(kept))


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    async with FakeConfluence(_pages(), mode="cloud") as fc, Site(fc, tmp_path) as s:
        fc.comment("9101", "1", "<p>a note</p>", when=fc.now())
        yield s


async def test_a_no_change_cycle_between_listings_asks_one_request_a_space(site: Site) -> None:
    src = site.source()
    first = await site.sync(src)
    assert not first.failed and await site.ids() == {"1", "2", "3", "4", "9101"}
    calls = len(site.fc.requests)
    again = await site.sync(src)
    new = [unquote_plus(r) for r in site.fc.requests[calls:]]
    assert first.listed == 2 and again.listed == 0
    assert again.added == again.updated == again.deleted == 0 and not again.failed
    assert len(new) == 2 and all("lastmodified >=" in r for r in new), new
    assert again.unchanged >= 1  # the comment, re-read in the overlap at its indexed version


async def test_what_a_sync_passes_over_costs_no_more_questions(site: Site) -> None:
    src = site.source()
    await site.sync(src)
    later = site.fc.now() + timedelta(minutes=1)  # newer than the checkpoint: inside every later window
    site.fc.attach("att9009", "1", "diagram.png", b"\x89PNG", when=later, media_type="image/png")
    site.fc.add(FakePage("8", "Hidden", "ENG", "<p>for alice</p>", later, restricted_users=["alice"]))
    site.fc.add(FakePage("9", "Under locked", "OPS", "<p>hidden too</p>", later, parent="5"))
    first = await site.sync(src)  # read once (nothing to index), then passed over by the question
    assert first.added == 0 and not first.failed
    calls = len(site.fc.requests)
    again = await site.sync(src)
    assert len(site.fc.requests) - calls == 2 and again.added == again.updated == 0


async def test_what_no_edit_shows_waits_for_the_next_listing(site: Site) -> None:
    src = site.source()
    await site.sync(src)
    site.fc.delete("2")
    site.fc.restrict("3")  # no edit: lastmodified unchanged
    quiet = await site.sync(src)
    assert quiet.deleted == 0 and {"2", "3"} <= await site.ids()  # within the listing interval
    await site.age_listings(2)
    listed = await site.sync(src)
    assert listed.deleted == 2 and await site.ids() == {"1", "4", "9101"}
    calls = len(site.fc.requests)
    await site.sync(src)  # listed just now: one request a space again
    assert len(site.fc.requests) - calls == 2


async def test_every_cycle_lists_when_the_interval_is_zero(site: Site) -> None:
    src = site.source(sync_listing_interval_s=0)
    await site.sync(src)
    site.fc.delete("2")
    assert (await site.sync(src)).deleted == 1 and "2" not in await site.ids()


async def test_edits_between_listings_are_read_at_once(site: Site) -> None:
    src = site.source()
    await site.sync(src)
    later = site.fc.now() + timedelta(minutes=1)
    site.fc.edit("4", body="<p>The rotation code word is zqxv.</p>", when=later)
    site.fc.add(FakePage("7", "New page", "ENG", "<p>fresh</p>", later))
    site.fc.comment("9102", "7", "<p>first note on the new page</p>", when=later)
    site.fc.edit("6", body="<p>still under a restricted page</p>", when=later)
    report = await site.sync(src)
    assert not report.failed, report.failed
    assert await site.ids() == {"1", "2", "3", "4", "7", "9101", "9102"}
    assert report.updated == 1 and report.added == 2
    [point] = [pt async for pt in site.index.export_points(page_ids=["4"])]
    assert "zqxv" in point.evidence.text


async def test_an_edit_that_restricts_a_page_removes_it_and_lists_its_space_next(site: Site) -> None:
    src = site.source()
    await site.sync(src)
    later = site.fc.now() + timedelta(minutes=1)
    site.fc.edit("1", body="<p>now restricted</p>", when=later)
    site.fc.restrict("1")
    site.fc.comment("9103", "1", "<p>a note on the restricted page</p>", when=later)
    report = await site.sync(src)
    assert report.deleted == 1 and await site.ids() == {"2", "3", "4", "9101"}  # its new comment never read
    listed = await site.sync(src)  # the space is listed now: the page's older comment leaves too
    assert listed.deleted == 1 and await site.ids() == {"2", "3", "4"}
    site.fc.restrict("1", users=())  # lifted without an edit: back at the next listing, with its comments
    await site.age_listings(2)
    await site.sync(src)
    assert await site.ids() == {"1", "2", "3", "4", "9101", "9103"}


async def test_a_listing_made_under_other_settings_is_due_at_once(site: Site) -> None:
    await site.sync(site.source())
    site.fc.delete("2")
    narrower = site.source(confluence_comments=False)
    report = await site.sync(narrower)
    assert report.deleted == 2 and await site.ids() == {"1", "3", "4"}  # the page, and the comment now out


async def test_a_failing_question_between_listings_costs_that_space_only(site: Site) -> None:
    src = site.source()
    await site.sync(src)
    site.fc.edit("3", body="<p>OPS changed</p>", when=site.fc.now() + timedelta(minutes=1))
    site.fc.fail_next(403, count=100, path_contains="ENG")  # every ENG search refused (not the credentials)
    report = await site.sync(src)
    assert report.updated == 1 and "space:ENG" in {k for k, _ in report.failed}, report.failed
    assert all(k.endswith(":ENG") for k, _ in report.failed), report.failed


async def test_a_page_back_in_scope_brings_its_older_comments_and_files(site: Site) -> None:
    site.fc.comment("9104", "5", "<p>an old note on the locked page</p>", when=BASE_TIME)
    site.fc.attach("att9010", "5", "notes.md", b"# Notes\n\nThe old runbook.", when=BASE_TIME,
                   media_type="text/markdown")
    src = site.source()
    await site.sync(src)
    assert not {"5", "6", "9104", "att9010"} & await site.ids()
    site.fc.restrict("5", users=())  # lifted without an edit; the note and the file are older than any window
    await site.age_listings(2)
    report = await site.sync(src)
    assert not report.failed and {"5", "6", "9104", "att9010"} <= await site.ids()


async def test_a_page_back_by_an_edit_between_listings_brings_older_items_at_the_next(site: Site) -> None:
    site.fc.comment("9104", "5", "<p>an old note on the locked page</p>", when=BASE_TIME)
    src = site.source()
    await site.sync(src)
    site.fc.restrict("5", users=())
    site.fc.edit("5", body="<p>open now</p>", when=site.fc.now() + timedelta(minutes=1))
    await site.sync(src)  # between listings: the page, read by its edit; its old note is no change
    assert "5" in await site.ids() and "9104" not in await site.ids()
    await site.age_listings(2)
    await site.sync(src)
    assert "9104" in await site.ids()


async def test_a_failed_read_of_returning_items_is_tried_again_at_the_next_listing(site: Site) -> None:
    site.fc.comment("9104", "5", "<p>an old note on the locked page</p>", when=BASE_TIME)
    src = site.source()
    await site.sync(src)
    site.fc.restrict("5", users=())
    await site.age_listings(2)
    site.fc.fail_next(403, count=1, path_contains="9104")  # the by-id read of the note is refused
    report = await site.sync(src)
    assert "5" in await site.ids() and "9104" not in await site.ids()
    assert "comments:OPS" in {k for k, _ in report.failed}
    await site.age_listings(2)
    await site.sync(src)
    assert "9104" in await site.ids()


async def test_what_failed_for_its_content_is_reported_once_not_at_every_listing(site: Site) -> None:
    site.fc.add(FakePage("10", "Empty", "ENG", "", BASE_TIME - timedelta(days=30)))  # past the known horizon
    site.fc.attach("att9011", "5", "huge.md", b"# Big\n\n" + b"x" * 5000, when=BASE_TIME,
                   media_type="text/markdown")
    src = site.source(confluence_max_attachment_bytes=1000)
    first = await site.sync(src)
    assert [pid for pid, _ in first.failed] == ["10"]
    site.fc.restrict("5", users=())  # the page comes back with a file over the size cap
    await site.age_listings(2)
    back = await site.sync(src)
    assert [pid for pid, _ in back.failed] == ["att9011"]
    for _ in range(2):
        await site.age_listings(2)
        again = await site.sync(src)
        assert again.listed == 2 and again.failed == []


async def test_a_refused_comment_listing_keeps_the_pages_back_for_the_next_listing(site: Site) -> None:
    site.fc.comment("9104", "5", "<p>an old note on the locked page</p>", when=BASE_TIME)
    src = site.source()
    await site.sync(src)
    listing = next(r for r in site.fc.requests
                   if 'space = "OPS" and type = comment order by' in unquote_plus(r))
    site.fc.restrict("5", users=())
    await site.age_listings(2)
    site.fc.fail_next(403, count=1, path_contains=listing.split("?", 1)[1].split("&")[0])
    report = await site.sync(src)
    assert "comments:OPS" in {k for k, _ in report.failed} and "9104" not in await site.ids()
    await site.age_listings(2)
    await site.sync(src)
    assert "9104" in await site.ids()


async def test_an_empty_page_fixed_by_an_edit_read_as_restricted_comes_back_with_it(site: Site) -> None:
    site.fc.add(FakePage("10", "Empty", "ENG", "", BASE_TIME - timedelta(days=30)))
    src = site.source()
    assert [pid for pid, _ in (await site.sync(src)).failed] == ["10"]
    site.fc.edit("10", body="<p>Filled in at last.</p>", when=site.fc.now() + timedelta(minutes=1))
    site.fc.restrict("10")
    site.fc.edit("2", body="<p>later</p>", when=site.fc.now() + timedelta(minutes=30))  # moves the window on
    await site.sync(src)  # between listings: read with its restriction, not indexed
    site.fc.restrict("10", users=())
    await site.age_listings(2)
    await site.sync(src)
    assert "10" in await site.ids()


async def test_an_edit_outside_the_configured_labels_costs_no_more_questions(site: Site) -> None:
    for pid in ("1", "2", "3", "4"):
        site.fc.set_labels(pid, ["faq"])
    src = site.source(confluence_labels_include=("faq",))
    await site.sync(src)
    site.fc.edit("2", body="<p>no longer an faq</p>", when=site.fc.now() + timedelta(minutes=1))
    site.fc.set_labels("2", ["draft"])
    site.fc.edit("4", body="<p>faq, edited</p>", when=site.fc.now() + timedelta(minutes=1))
    first = await site.sync(src)
    assert first.updated == 1  # the page still in scope
    calls = len(site.fc.requests)
    again = await site.sync(src)
    assert len(site.fc.requests) - calls == 2 and again.updated == 0


async def test_a_file_that_failed_in_one_space_is_not_recorded_in_the_next(site: Site) -> None:
    src = site.source(confluence_max_attachment_bytes=1000)
    await site.sync(src)
    later = site.fc.now() + timedelta(minutes=1)
    site.fc.attach("att9012", "1", "huge.md", b"# Big\n\n" + b"x" * 5000, when=later,
                   media_type="text/markdown")
    site.fc.edit("3", body="<p>an OPS edit, so OPS is read too</p>", when=later)
    report = await site.sync(src)
    assert report.listed == 0 and [pid for pid, _ in report.failed] == ["att9012"]
    key = f"confluence:{site.fc.url}"
    assert "att9012" in await load_known(site.store, key, "ENG")
    assert "att9012" not in await load_known(site.store, key, "OPS")


async def test_a_damaged_checkpoint_costs_a_full_read_of_its_space_not_the_sync(site: Site) -> None:
    src = site.source()
    await site.sync(src)
    key = f"confluence:{site.fc.url}"
    await site.store.set_checkpoint(key, "ENG", "not a time")
    site.fc.edit("3", body="<p>an OPS edit after the damage</p>", when=site.fc.now() + timedelta(minutes=1))
    report = await site.sync(src)
    assert ("space:ENG", "checkpoint 'not a time' is not a time: read in full") in report.warnings
    assert report.failed == [] and report.checkpoints["OPS"] and report.updated == 1
    assert parse_utc(await site.store.get_checkpoint(key, "ENG") or "") > BASE_TIME  # sound again


async def test_a_page_the_parser_fails_on_is_not_read_again_every_cycle(
        site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    real = page_work.split_page

    def failing(page: Page, options: IngestOptions) -> page_work.PageEvidence:
        if page.id == "2":
            raise RecursionError("maximum recursion depth exceeded")
        return real(page, options)

    src = site.source()
    await site.sync(src)
    monkeypatch.setattr(page_work, "split_page", failing)
    site.fc.edit("2", body="<p>deeply nested now</p>", when=site.fc.now())
    first = await site.sync(src)
    assert [(pid, why.split(" (")[0]) for pid, why in first.failed] == [("2", "too complex to parse")]
    again = await site.sync(src)  # no edit since: the probe alone, nothing parsed or reported again
    assert again.failed == [] and again.api_calls == 2


async def test_a_file_not_fetched_is_not_passed_by_a_later_page_edit(site: Site) -> None:
    src = site.source()
    await site.sync(src)
    now = site.fc.now()
    site.fc.attach("att9013", "1", "notes.md", b"# Runbook\n\nRotate the keys monthly.", when=now,
                   media_type="text/markdown")
    site.fc.edit("2", body="<p>a later edit</p>", when=now + timedelta(minutes=30))
    src.client.max_retries = 0  # a server error that outlasts the client's retries
    site.fc.fail_next(503, count=1, path_contains="/download/attachments/1/notes.md")
    first = await site.sync(src)
    assert [k for k, _ in first.failed] == ["att9013"] and "att9013" not in await site.ids()
    second = await site.sync(src)  # between listings, the checkpoint past the file's time
    assert second.listed == 0 and second.failed == []
    assert "att9013" in await site.ids()
    third = await site.sync(src)  # read: nothing pending any more, the probe alone again
    assert third.api_calls == 2


async def test_a_page_hidden_by_an_edit_while_the_search_paged_is_read_next_cycle(site: Site) -> None:
    src = site.source()
    src.page_limit = 2
    await site.sync(src)
    t = BASE_TIME + timedelta(hours=2)  # page 2's time, ENG's checkpoint
    for n, pid in enumerate(("11", "12", "13"), start=1):
        site.fc.add(FakePage(pid, f"New {pid}", "ENG", f"<p>new page {pid}</p>", t + timedelta(minutes=n)))

    def edit_page_2_before_the_second_results_page(path_qs: str) -> None:
        text = unquote_plus(path_qs)
        if "content/search" in text and '"ENG"' in text and "start=2" in text and site.fc.on_request:
            site.fc.on_request = None
            site.fc.edit("2", body="<p>edited while paging</p>", when=t + timedelta(hours=1))

    site.fc.on_request = edit_page_2_before_the_second_results_page
    await site.sync(src)  # known page 2 skipped on the first results page; a new page slides onto it unseen
    new = {"11", "12", "13"}
    assert site.fc.on_request is None and new - await site.ids()
    await site.sync(src)
    assert new <= await site.ids()


async def test_an_includer_whose_refresh_failed_is_refreshed_between_listings(site: Site) -> None:
    include = ('<ac:structured-macro ac:name="include" ac:schema-version="1"><ac:parameter ac:name="">'
               '<ac:link><ri:page ri:content-title="Page 2"/></ac:link></ac:parameter></ac:structured-macro>')
    site.fc.edit("1", body="<p>Included below:</p>" + include)
    src = site.source()
    await site.sync(src)
    site.embedder = embedder = FailingEmbedder(site.embedder, "Included below", "rotated")
    site.fc.edit("2", body="<p>The keys are rotated weekly.</p>", when=site.fc.now() + timedelta(minutes=1))
    failed = await site.sync(src)
    assert failed.listed == 0 and [pid for pid, _ in failed.failed] == ["1"], failed.failed
    embedder.armed = False
    again = await site.sync(src)  # nothing was edited since: the stale includer alone makes ENG read
    assert again.listed == 0 and again.failed == []
    [after] = [pt.evidence.text async for pt in site.index.export_points(page_ids=["1"])]
    assert "rotated weekly" in after


async def test_a_comment_on_a_page_moved_between_listings_is_read_at_the_next_listing(site: Site) -> None:
    src = site.source()
    await site.sync(src)
    site.fc.move("1", "OPS")  # no edit: lastmodified unchanged
    site.fc.comment("9105", "1", "<p>a note after the move</p>", when=site.fc.now())
    site.fc.edit("3", body="<p>a later OPS edit</p>", when=site.fc.now() + timedelta(hours=3))
    await site.sync(src)  # between listings: the comment's page is indexed under ENG, not OPS
    await site.sync(src)
    await site.age_listings(2)
    report = await site.sync(src)
    assert report.listed == 2 and "9105" in await site.ids()


async def test_an_includer_deleted_before_its_included_page_changed_costs_no_more_questions(
        site: Site) -> None:
    include = ('<ac:structured-macro ac:name="include" ac:schema-version="1"><ac:parameter ac:name="">'
               '<ac:link><ri:page ri:content-title="Page 1"/></ac:link></ac:parameter></ac:structured-macro>')
    site.fc.edit("2", body="<p>Included below:</p>" + include)
    src = site.source()
    await site.sync(src)
    site.fc.delete("2")
    await site.age_listings(2)
    await site.sync(src)  # the listing removes the includer
    site.fc.edit("1", body="<p>The keys are rotated weekly.</p>", when=site.fc.now() + timedelta(minutes=1))
    await site.sync(src)
    quiet = await site.sync(src)
    assert "2" not in await site.ids() and quiet.listed == 0 and quiet.api_calls == 2



async def test_a_file_refused_for_good_is_reported_once_and_costs_only_itself(site: Site) -> None:
    src = site.source()
    await site.sync(src)
    now = site.fc.now()
    for att, name in (("att9014", "gone.md"), ("att9015", "fine.md")):
        site.fc.attach(att, "1", name, b"# Notes\n\nSome text.", when=now, media_type="text/markdown")
    site.fc.fail_next(404, count=1, path_contains="/download/attachments/1/gone.md")
    first = await site.sync(src)
    assert [k for k, _ in first.failed] == ["att9014"] and "att9015" in await site.ids()
    again = await site.sync(src)
    assert again.failed == [] and again.api_calls == 2


async def test_files_failing_for_a_day_are_left_until_edited(site: Site) -> None:
    src = site.source()
    await site.sync(src)
    src.client.max_retries = 0
    site.fc.attach("att9016", "1", "flaky.md", b"# Notes", when=site.fc.now(), media_type="text/markdown")
    site.fc.fail_next(503, count=1, path_contains="/download/attachments/1/flaky.md")
    await site.sync(src)
    key, row = f"confluence:{site.fc.url}", "__extras_from__:ENG"
    kept = json.loads(await site.store.get_checkpoint(key, row) or "{}")
    kept["first"] = (datetime.now(UTC) - timedelta(hours=25)).isoformat()
    await site.store.set_checkpoint(key, row, json.dumps(kept))
    site.fc.fail_next(503, count=1, path_contains="/download/attachments/1/flaky.md")
    report = await site.sync(src)
    assert [k for k, _ in report.failed] == ["att9016"]
    assert any(k == "space:ENG" and "24 h" in w for k, w in report.warnings)
    assert json.loads(await site.store.get_checkpoint(key, row) or "{}") == {}
    site.fc.fail_next(503, count=1, path_contains="/download/attachments/1/flaky.md")
    again = await site.sync(src)  # settled at its version: neither downloaded nor reported again
    assert again.failed == [] and again.api_calls == 2


async def test_a_comment_whose_body_is_gone_costs_only_itself(site: Site) -> None:
    src = site.source()
    await site.sync(src)
    now = site.fc.now()
    site.fc.comment("9106", "1", "<p>gone by the time its body is read</p>", when=now)
    site.fc.comment("9107", "2", "<p>a note that stays</p>", when=now)
    site.fc.fail_next(404, count=2, path_contains="-comments/9106")  # footer, then inline
    report = await site.sync(src)
    assert [k for k, _ in report.warnings] == ["comment:9106"] and report.failed == []
    assert "9107" in await site.ids() and "9106" not in await site.ids()
    again = await site.sync(src)  # settled at that version: not asked for again while the search lags
    assert again.warnings == [] and again.api_calls == 2
