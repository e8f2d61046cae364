#!/usr/bin/env python3
"""The client side of scripts/e2e-llamacpp: chat and load through infergate
with the OpenAI Python SDK, against llama-server replicas.

  chat    URL MODEL                  one non-streaming and one streaming chat
  load    URL MODEL --out FILE ...   N streamed requests at a fixed
                                     concurrency; per-request TTFT, e2e,
                                     replica and outcome, and the replicas'
                                     scraped signals seen in /debug/pools
  report  FILE...                    the routing comparison table

Every check raises SystemExit with a message on failure. Traffic goes only
to the URLs given (the script passes 127.0.0.1 addresses).
"""

import argparse
import asyncio
import inspect
import json
import os
import signal
import statistics
import sys
import time
import urllib.request

from openai import AsyncOpenAI, OpenAI

# The replica a request went to (spec.debug.decisionHeaders: true).
ENDPOINT_HEADER = "x-infergate-endpoint"
# Every candidate's score parts for that pick (scored policy).
SCORES_HEADER = "x-infergate-scores"

# Short, varied questions: requests differ, and llama.cpp's prompt cache
# cannot turn the whole run into cache hits.
TOPICS = [
    "the moon", "rivers", "bread", "volcanoes", "owls", "glass", "trains",
    "coffee", "deserts", "bees", "clocks", "maps", "salt", "whales",
    "bridges", "paper", "thunder", "gardens", "copper", "kites",
]


def prompt(i):
    topic = TOPICS[i % len(TOPICS)]
    return f"Request {i}: write two short sentences about {topic}."


def fail(message):
    raise SystemExit(f"FAIL: {message}")


def cmd_chat(args):
    client = OpenAI(base_url=f"{args.url}/v1", api_key="unused", timeout=120, max_retries=0)
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]

    raw = client.chat.completions.with_raw_response.create(
        model=args.model, messages=messages, max_tokens=32
    )
    completion = raw.parse()
    text = completion.choices[0].message.content or ""
    if not text.strip():
        fail(f"non-streaming chat returned no text: {completion}")
    if not completion.usage or completion.usage.completion_tokens < 1:
        fail(f"non-streaming chat reported no completion tokens: {completion.usage}")
    endpoint = raw.headers.get(ENDPOINT_HEADER)
    if not endpoint:
        fail(f"no {ENDPOINT_HEADER} header on a routed answer")
    print(f"  non-streaming via {endpoint}: {text.strip()!r} "
          f"({completion.usage.completion_tokens} tokens)")

    stream = client.chat.completions.create(
        model=args.model, messages=messages, max_tokens=32, stream=True,
        stream_options={"include_usage": True},
    )
    pieces, chunks, usage = [], 0, None
    for chunk in stream:
        chunks += 1
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    text = "".join(pieces)
    if not text.strip():
        fail("streaming chat returned no text")
    if len(pieces) < 2:
        fail(f"streaming chat came in {len(pieces)} content chunk(s); expected a token stream")
    print(f"  streaming: {text.strip()!r} ({len(pieces)} content chunks, {chunks} events, "
          f"usage {usage.completion_tokens if usage else 'absent'} tokens)")


async def poll_pools(admin, seen, stop):
    """Keep the largest `running`/`waiting` each replica's scrape reported."""
    while not stop.is_set():
        try:
            body = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"{admin}/debug/pools", timeout=2).read()
            )
            for pool in json.loads(body)["pools"]:
                for e in pool["endpoints"]:
                    s = seen.setdefault(e["address"], {"maxRunning": None, "maxWaiting": None,
                                                       "everUnreachable": False})
                    for key, field in (("maxRunning", "running"), ("maxWaiting", "waiting")):
                        if e.get(field) is not None:
                            s[key] = max(s[key] or 0, e[field])
                    if not e.get("reachable", True):
                        s["everUnreachable"] = True
        except OSError:
            pass
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass


async def one_request(client, args, i, t0, rec, inflight):
    rec.update(i=i, sent=time.monotonic() - t0, endpoint=None, ttft=None, e2e=None,
               ok=False, error=None, tokens=0, ids=[])
    inflight.add(i)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=args.model,
            messages=[{"role": "user", "content": prompt(i)}],
            max_tokens=args.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            # Every answer is max_tokens long, so the policies compare on
            # equal work rather than on where the model chose to stop.
            extra_body={"ignore_eos": True},
        )
        rec["endpoint"] = raw.headers.get(ENDPOINT_HEADER)
        rec["scores"] = raw.headers.get(SCORES_HEADER)
        stream = raw.parse()
        if inspect.isawaitable(stream):
            stream = await stream
        usage = None
        async for chunk in stream:
            if chunk.id not in rec["ids"]:
                rec["ids"].append(chunk.id)
            if chunk.usage:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                if rec["ttft"] is None:
                    rec["ttft"] = time.monotonic() - t0 - rec["sent"]
                rec["tokens"] += 1
        rec["e2e"] = time.monotonic() - t0 - rec["sent"]
        # A stream cut short may end without an error; only the closing usage
        # event says the answer is whole.
        if usage is None:
            rec["error"] = f"stream ended without its usage event after {rec['tokens']} chunks"
        elif usage.completion_tokens != args.max_tokens:
            rec["error"] = f"{usage.completion_tokens} completion tokens, asked for {args.max_tokens}"
        elif len(rec["ids"]) != 1:
            rec["error"] = f"one answer under {len(rec['ids'])} ids: {rec['ids']}"
        else:
            rec["ok"] = True
    except Exception as exc:  # every failure is an outcome to count
        rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        inflight.discard(i)
        rec["done"] = time.monotonic() - t0


async def run_load(args):
    client = AsyncOpenAI(base_url=f"{args.url}/v1", api_key="unused",
                         timeout=args.timeout, max_retries=0)
    records = [{} for _ in range(args.requests)]
    gate = asyncio.Semaphore(args.concurrency)
    inflight = set()
    seen, stop = {}, asyncio.Event()
    poller = asyncio.create_task(poll_pools(args.admin, seen, stop)) if args.admin else None
    t0 = time.monotonic()
    kill = {"at": None}

    async def gated(i):
        async with gate:
            await one_request(client, args, i, t0, records[i], inflight)

    async def killer():
        # Kill once enough requests have started and the victim has streams
        # in flight, so the kill lands mid-load on real work.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            started = sum(1 for r in records if "sent" in r)
            on_victim = sum(1 for j in list(inflight) if records[j].get("endpoint") == args.victim)
            if started >= args.kill_after and on_victim >= 1:
                break
            await asyncio.sleep(0.02)
        os.kill(args.kill_pid, signal.SIGKILL)
        kill["at"] = time.monotonic() - t0
        print(f"  SIGKILL to pid {args.kill_pid} ({args.victim}) at {kill['at']:.2f}s, "
              f"{sum(1 for r in records if 'sent' in r)} requests started, "
              f"{len(inflight)} in flight", flush=True)

    tasks = [asyncio.create_task(gated(i)) for i in range(args.requests)]
    if args.kill_pid:
        tasks.append(asyncio.create_task(killer()))
    await asyncio.wait_for(asyncio.gather(*tasks), args.deadline)
    wall = time.monotonic() - t0
    stop.set()
    if poller:
        await poller
    return {"label": args.label, "requests": records, "wall": wall, "scraped": seen,
            "killAt": kill["at"], "victim": args.victim, "concurrency": args.concurrency,
            "maxTokens": args.max_tokens}


def pct(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    # Nearest rank: the value below which q of the sample lies.
    k = max(0, min(len(values) - 1, int(round(q * len(values) + 0.5)) - 1))
    return values[k]


def summary(run, names):
    ok = [r for r in run["requests"] if r.get("ok")]
    share = {}
    for r in ok:
        name = names.get(r["endpoint"], r["endpoint"])
        share[name] = share.get(name, 0) + 1
    return {
        "label": run["label"],
        "requests": len(run["requests"]),
        "errors": len(run["requests"]) - len(ok),
        "ttft_p50": pct([r["ttft"] for r in ok], 0.50),
        "ttft_p95": pct([r["ttft"] for r in ok], 0.95),
        "e2e_p50": pct([r["e2e"] for r in ok], 0.50),
        "e2e_p95": pct([r["e2e"] for r in ok], 0.95),
        "wall": run["wall"],
        "share": share,
    }


def parse_names(text):
    return dict(pair.split("=", 1) for pair in text.split(",")) if text else {}


def check_kill(run, names, admin):
    """Every request completes, those streaming from the killed replica
    included: their streams go on from another replica (continuation)."""
    victim = run["victim"]
    kill_at = run["killAt"]
    if kill_at is None:
        fail("the replica was never killed")
    before = [r for r in run["requests"] if r["sent"] < kill_at]
    after = [r for r in run["requests"] if r["sent"] >= kill_at]
    failed = [r for r in run["requests"] if not r["ok"]]
    # The response head names the replica that started the answer.
    moved = [r for r in before if r.get("endpoint") == victim and r["done"] > kill_at]
    on_victim_after = [r for r in after if r.get("endpoint") == victim]
    print(f"  started before the kill: {len(before)}, {len(moved)} of them streaming from the "
          f"killed replica when it died")
    print(f"  started after the kill: {len(after)} ({len(on_victim_after)} sent to the killed replica)")
    for r in failed:
        print(f"    request {r['i']}: sent {r['sent']:.2f}s via "
              f"{names.get(r.get('endpoint'), r.get('endpoint'))}: {r['error']}")
    if admin:
        with urllib.request.urlopen(f"{admin}/metrics", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("infergate_migrations_total"):
                    print(f"  {line}")
    if failed:
        fail(f"{len(failed)} request(s) did not complete whole")
    if not moved:
        fail("no stream was on the killed replica when it died; raise --requests")
    if on_victim_after:
        fail(f"{len(on_victim_after)} request(s) started after the kill were answered "
             f"by the killed replica")
    survivors = {}
    for r in after:
        name = names.get(r["endpoint"], r["endpoint"])
        survivors[name] = survivors.get(name, 0) + 1
    print(f"  after the kill, answered by: {survivors}")


def cmd_load(args):
    run = asyncio.run(run_load(args))
    with open(args.out, "w") as f:
        json.dump(run, f, indent=1)
    names = parse_names(args.names)
    s = summary(run, names)
    print(f"  {s['label']}: {s['requests']} requests in {s['wall']:.1f}s, {s['errors']} errors; "
          f"TTFT p50 {s['ttft_p50']:.3f}s p95 {s['ttft_p95']:.3f}s; e2e p50 {s['e2e_p50']:.3f}s; "
          f"share {s['share']}")
    for addr, seen in sorted(run["scraped"].items()):
        print(f"  scraped {names.get(addr, addr)}: max running {seen['maxRunning']}, "
              f"max waiting {seen['maxWaiting']}")
    if args.kill_pid:
        check_kill(run, names, args.admin)
    elif s["errors"]:
        for r in run["requests"]:
            if not r.get("ok"):
                print(f"    request {r['i']}: {r['error']}")
        fail(f"{s['errors']} request(s) failed")
    if args.expect_scraped:
        running = [v["maxRunning"] for v in run["scraped"].values() if v["maxRunning"]]
        if not running:
            fail("no replica's scrape ever showed a running request: the dialect read nothing live")
        print(f"  live llama.cpp signals read: requests_processing up to {max(running)}")


def cmd_report(args):
    names = parse_names(args.names)
    rows = [summary(json.load(open(path)), names) for path in args.files]
    replicas = sorted({n for r in rows for n in r["share"]})
    head = ("| policy | requests | errors | TTFT p50 (s) | TTFT p95 (s) | e2e p50 (s) "
            "| e2e p95 (s) | wall (s) | " + " | ".join(replicas) + " |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        share = " | ".join(f"{100 * r['share'].get(n, 0) / max(1, r['requests'] - r['errors']):.0f} %"
                           for n in replicas)
        print(f"| {r['label']} | {r['requests']} | {r['errors']} | {r['ttft_p50']:.3f} | "
              f"{r['ttft_p95']:.3f} | {r['e2e_p50']:.3f} | {r['e2e_p95']:.3f} | {r['wall']:.1f} | {share} |")
    if len(rows) == 2:
        a, b = rows
        print()
        for key in ("ttft_p50", "ttft_p95", "e2e_p50", "e2e_p95"):
            print(f"{b['label']} / {a['label']} {key}: {b[key] / a[key]:.2f}")
    if any(r["errors"] for r in rows):
        fail("the comparison had errors")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("chat")
    c.add_argument("url")
    c.add_argument("model")
    c.set_defaults(fn=cmd_chat)
    lo = sub.add_parser("load")
    lo.add_argument("url")
    lo.add_argument("model")
    lo.add_argument("--out", required=True)
    lo.add_argument("--label", default="run")
    lo.add_argument("--requests", type=int, default=60)
    lo.add_argument("--concurrency", type=int, default=6)
    lo.add_argument("--max-tokens", type=int, default=32)
    lo.add_argument("--timeout", type=float, default=120, help="per request, seconds")
    lo.add_argument("--deadline", type=float, default=600, help="whole run, seconds")
    lo.add_argument("--admin", help="admin listener URL, to record the scraped signals")
    lo.add_argument("--expect-scraped", action="store_true",
                    help="fail unless some replica's scrape showed a running request")
    lo.add_argument("--names", default="", help="ADDR=NAME,... for the report")
    lo.add_argument("--kill-pid", type=int, help="SIGKILL this replica mid-load")
    lo.add_argument("--victim", help="its host:port")
    lo.add_argument("--kill-after", type=int, default=20,
                    help="kill once this many requests have started")
    lo.set_defaults(fn=cmd_load)
    r = sub.add_parser("report")
    r.add_argument("files", nargs="+")
    r.add_argument("--names", default="")
    r.set_defaults(fn=cmd_report)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
