"""The whole path at wiki scale: a generated Confluence site, a cold `evident sync`, a no-change sync, then
`evident serve` answering a steady stream of Slack questions while its own sync cycles pick up edits.

    python benchmarks/wiki_scale.py [--pages 50000] [--spaces 50] [--interval 120] [--cycles 2]
                                    [--share 0.01] [--rate 1.0] [--json out.json]

Processes, as in production: the site (``wiki_site.py``: pages, page trees, tables, lists, macros,
includes, attachments, comments, edit histories; Confluence Cloud REST v2 + v1 CQL) and an OpenAI-compatible
embeddings stand-in (384-d, so the index has the default model's size; the run measures the pipeline, not a
model) each run in a child process; `evident sync` and `evident serve` are the real CLI in subprocesses,
with Slack's HTTP transport against the test suite's fake Slack Web API in this process.

Reports: cold sync wall and requests per page; peak RSS of every process (polled every 0.25 s, with their
children: the index worker); disk; the keyword vocabulary's size; a no-change cycle's requests, bodies and
seconds, between listings and with every space listed; per edit cycle (``--share`` of the pages edited just
before serve's next cycle) requests, bodies and seconds; edit-to-answer latency (three edited pages, each
asked about every 5 s until the answer has the new text, the three staggered); the steady stream's answer
latency (question to answer in Slack) idle against during a sync, and apart from it the edit probes' own
answers (only the sync windows have them) and every question of the sync windows; event-loop stalls (a
``/healthz`` request every 50 ms, the response time over its idle median, which also counts this
process's own loop and the machine's scheduling; and serve's own ``event loop blocked`` warnings, which
name where).

``--reuse --work DIR --edit-seed N`` starts from an earlier run's data (the site on the port that run's
pages were synced from, kept in ``DIR/site.port``: page URLs are part of a page's hash): an incremental sync
instead of the cold one, and with another ``--edit-seed`` than that run's the edit cycles draw other pages
and code words, so every edit is new content to write.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_procs import EmbedServer, Proc, RssSampler, disk_mib, vocabulary_size
from scale_serve import ServeRun
from wiki_site import serve_site


def env_for(site: dict[str, Any], embed_url: str, data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVIDENT_", "CONFLUENCE_", "SLACK_"))}
    env.update({
        "EVIDENT_DATA_DIR": str(data), "CONFLUENCE_URL": site["url"], "CONFLUENCE_USER": site["user"],
        "CONFLUENCE_TOKEN": site["token"], "CONFLUENCE_SPACES": ",".join(site["spaces"]),
        "CONFLUENCE_ATTACHMENTS": "true", "CONFLUENCE_COMMENTS": "true",
        "EVIDENT_EMBEDDER": "openai:fake-embed", "EVIDENT_EMBED_BASE_URL": embed_url,
        "EVIDENT_EMBED_API_KEY": "bench", "EVIDENT_LOG_FORMAT": "text",
    })
    return env


def sync_once(name: str, env: dict[str, str], site_conn: Any, sampler: RssSampler) -> dict[str, Any]:
    """One `evident sync` in a subprocess: wall, exit code, the site's requests and bodies during it."""
    site_conn.send(("stats", None))
    before = site_conn.recv()
    proc = Proc(name, [sys.executable, "-m", "evident", "sync"], env)
    sampler.watch(name, proc.popen.pid)
    rc, wall = proc.wait()
    site_conn.send(("stats", None))
    after = site_conn.recv()
    out = {"rc": rc, "wall_s": round(wall, 1), "tail": proc.tail(6)}
    for key in ("requests", "with bodies"):
        out[key] = after.get(key, 0) - before.get(key, 0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=50_000)
    ap.add_argument("--spaces", type=int, default=50)
    ap.add_argument("--interval", type=int, default=120, help="serve's EVIDENT_SYNC_INTERVAL_S")
    ap.add_argument("--cycles", type=int, default=2, help="edit cycles while serving")
    ap.add_argument("--share", type=float, default=0.01, help="share of the pages edited per cycle")
    ap.add_argument("--rate", type=float, default=1.0, help="questions per second while serving")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--work", type=Path, help="keep the data here (default: a temporary directory)")
    ap.add_argument("--reuse", action="store_true",
                    help="--work already holds a cold sync of this site: an incremental sync instead of a "
                         "cold one (pass another --edit-seed than the last run's)")
    ap.add_argument("--edit-seed", type=int, help="which pages the edit cycles draw (default: --seed)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting for sync and serve (repeatable; the caller's EVIDENT_* are not passed)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if any("=" not in kv for kv in args.env):
        ap.error("--env takes NAME=VALUE")
    if args.reuse and not (args.work and (args.work / "data" / "index").is_dir()):
        ap.error("--reuse needs --work with an index from an earlier run")
    ctx = mp.get_context("spawn")
    site_conn, child_conn = ctx.Pipe()
    # Page URLs name the site's port and are part of a page's content hash: a reused index keeps its
    # pages only if the site comes back on the port it was synced from (kept in the work directory).
    port_file = args.work / "site.port" if args.work else None
    port = int(port_file.read_text()) if args.reuse and port_file and port_file.exists() else 0
    site_proc = ctx.Process(target=serve_site, args=(child_conn, args.pages, args.spaces, args.seed, port))
    t0 = time.monotonic()
    site_proc.start()
    site = site_conn.recv()
    if port_file is not None:
        port_file.parent.mkdir(parents=True, exist_ok=True)
        port_file.write_text(str(site["port"]))
    print(f"site: {args.pages} pages in {args.spaces} spaces, {site['extras']}, "
          f"{site['bodies_bytes'] / 2**20:.0f} MiB of storage format, up in {time.monotonic() - t0:.0f} s",
          flush=True)
    results: dict[str, Any] = {"pages": args.pages, "spaces": args.spaces, "site": site["extras"]}
    with tempfile.TemporaryDirectory() as tmp, EmbedServer(ctx) as embed, RssSampler() as sampler:
        others = {"site": site_proc.pid, "embeddings": embed.proc.pid, "benchmark": os.getpid()}
        for name, pid in others.items():
            if pid is not None:
                sampler.watch(name, pid, tree=False)  # where the CPU goes while serve answers, these included
        work = args.work or Path(tmp)
        env = env_for(site, embed.url, work / "data") | dict(kv.split("=", 1) for kv in args.env)
        results["env"] = args.env
        name = "resync" if args.reuse else "cold"
        cold = sync_once(f"sync ({name})", env, site_conn, sampler)
        cold["requests per page"] = round(cold["requests"] / args.pages, 3)
        print(f"{name} sync:", json.dumps(cold), flush=True)
        results[name] = cold
        results["disk_mib"] = disk_mib(work / "data")
        results["vocabulary"] = vocabulary_size(work / "data")
        print(f"disk {results['disk_mib']} MiB, vocabulary {results['vocabulary']}", flush=True)
        # every space listed, as a cycle does every EVIDENT_SYNC_LISTING_INTERVAL_S (and the cold sync did,
        # longer ago than the interval when it took longer), then a cycle between listings
        listed = sync_once("sync (no change, listed)", env | {"EVIDENT_SYNC_LISTING_INTERVAL_S": "0"},
                           site_conn, sampler)
        print("no-change sync, every space listed:", json.dumps(listed), flush=True)
        results["no_change_listed"] = listed
        quiet = sync_once("sync (no change)", env, site_conn, sampler)
        print("no-change sync:", json.dumps(quiet), flush=True)
        results["no_change"] = quiet
        site_conn.send(("sample", args.seed))
        sample = site_conn.recv()
        serve = ServeRun(env, site_conn, sampler, interval=args.interval, rate=args.rate, share=args.share,
                         seed=args.seed, edit_seed=args.edit_seed)
        results["serve"] = asyncio.run(serve.run(sample, cycles=args.cycles))
        results["serve"]["loop_blocked"] = [line for line in serve.log if "event loop blocked" in line]
        if args.json:  # serve's whole log beside the figures
            args.json.with_suffix(".log").write_text("\n".join(serve.log))
        results["peak_rss_mib"] = sampler.peaks()
        results["peak_anon_mib"] = sampler.peaks(anon=True)
        results["embedding"] = embed.stats()
    site_conn.send(("stop", None))
    site_conn.recv()
    site_proc.join(10)
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def report(r: dict[str, Any]) -> None:
    s = r["serve"]
    print(f"\npeak RSS (MiB): {r['peak_rss_mib']}")
    print(f"peak anonymous RSS (MiB; without the index's mapped files): {r.get('peak_anon_mib')}")
    print(f"answers idle p50/p99 {s['idle']['p50']:.3f}/{s['idle']['p99']:.3f} s (n={s['idle']['n']}), "
          f"during sync {s['sync']['p50']:.3f}/{s['sync']['p99']:.3f} s (n={s['sync']['n']}; p90/p95 "
          f"{s['sync'].get('p90', float('nan')):.3f}/{s['sync'].get('p95', float('nan')):.3f} s, "
          f"{s['sync'].get('over_2x_idle_p99', '?')} over 2x idle p99); "
          f"answered {s['answered']}/{s['asked']}")
    for key, name in (("sync_probes", "the edit probes' own questions"), ("sync_all", "every question")):
        if key in s and s[key]["n"]:
            print(f"  during sync, {name}: p50/p99 {s[key]['p50']:.3f}/{s[key]['p99']:.3f} s "
                  f"(n={s[key]['n']}, {s[key]['over_2x_idle_p99']} over 2x idle p99)")
    print(f"stalls: max {s['stalls']['max_ms']:.0f} ms, over 100 ms: {s['stalls']['over_100ms']} "
          f"of {s['stalls']['probes']} probes; serve's own loop watch (> 100 ms): {len(s['loop_blocked'])}")
    for line in s["loop_blocked"][:20]:
        print(f"  {line}")
    for where, stages in s["stages_ms"].items():  # p50/max of each stage, from the store's turns
        shown = [f"{k} {v['p50']}/{v['max']} ms" for k, v in stages.items() if k != "complete"]
        print(f"inside serve, {where}: {', '.join(shown)}")
    for where, cores in s["cores"].items():
        print(f"cores used, {where}: {json.dumps(cores)}")
    for c in s["cycles"]:
        print(f"edit cycle: {json.dumps(c)}")
    print(f"edit to answer (s): {s['edit_to_answer_s']}")


if __name__ == "__main__":
    main()
