"""Bounded load test on loopback: 32 concurrent streaming clients, several requests each.

Zero failed requests, every response complete (a finish reason, [DONE], usage), and the
server's resident memory back near its baseline afterwards. Prints requests/s and the p50/p99
time to first token."""
import os
import statistics
import threading
import time
import urllib.request

import openai

from conftest import Server

CLIENTS = int(os.environ.get("PN_LOAD_CLIENTS", "32"))
REQUESTS_EACH = int(os.environ.get("PN_LOAD_REQUESTS", "4"))
MAX_TOKENS = 12
PARALLEL = os.environ.get("PN_LOAD_PARALLEL", "4")


def one_client(base, index, results, errors):
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=300)
    for r in range(REQUESTS_EACH):
        t0 = time.perf_counter()
        ttft = None
        text, finish, usage = "", None, None
        try:
            stream = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": f"client {index} request {r}: def f{r}(x):"}],
                max_tokens=MAX_TOKENS,
                seed=index * 100 + r,
                stream=True,
                stream_options={"include_usage": True},
            )
            for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                if chunk.choices:
                    c = chunk.choices[0]
                    if ttft is None and (c.delta.content or c.finish_reason):
                        ttft = time.perf_counter() - t0
                    text += c.delta.content or ""
                    finish = c.finish_reason or finish
            if finish not in ("stop", "length") or usage is None or usage.completion_tokens < 1:
                errors.append(f"client {index} request {r}: incomplete (finish={finish}, usage={usage})")
            elif finish == "length" and usage.completion_tokens != MAX_TOKENS:
                errors.append(f"client {index} request {r}: length with {usage.completion_tokens} tokens")
            else:
                results.append((ttft, time.perf_counter() - t0))
        except Exception as e:  # noqa: BLE001 - every failure is reported
            errors.append(f"client {index} request {r}: {type(e).__name__}: {e}")


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def run_round(server):
    results, errors = [], []
    threads = [threading.Thread(target=one_client, args=(server.base, i, results, errors)) for i in range(CLIENTS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    wall = time.perf_counter() - t0
    assert not any(t.is_alive() for t in threads), "clients still running after 600 s"
    assert errors == [], errors[:5]
    assert len(results) == CLIENTS * REQUESTS_EACH
    return results, wall


def test_32_concurrent_streaming_clients():
    server = Server("--parallel", PARALLEL, "--queue", "64")
    try:
        warm = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0)
        for _ in range(4):
            warm.chat.completions.create(model="m", messages=[{"role": "user", "content": "warm up"}], max_tokens=MAX_TOKENS)
        baseline = server.rss_kib()
        rss = []
        for round_no in range(2):
            results, wall = run_round(server)
            time.sleep(0.5)
            rss.append(server.rss_kib())
            total = len(results)
            ttfts = [r[0] for r in results]
            print(
                f"\nLOAD round {round_no + 1} (--parallel {PARALLEL}): {total} requests from {CLIENTS} streaming clients "
                f"in {wall:.2f} s = {total / wall:.2f} req/s; TTFT p50 {pct(ttfts, 50) * 1e3:.0f} ms, "
                f"p99 {pct(ttfts, 99) * 1e3:.0f} ms, mean {statistics.mean(ttfts) * 1e3:.0f} ms; "
                f"RSS before {baseline / 1024:.1f} MiB, after {rss[-1] / 1024:.1f} MiB"
            )
        # Memory back near the baseline: sessions are allocated at start, requests only add
        # short-lived buffers (allocator slack: 10% + 16 MiB), and a second round of the same
        # load does not grow it further (no per-request leak).
        assert rss[0] <= baseline * 1.10 + 16 * 1024, f"RSS grew from {baseline} KiB to {rss[0]} KiB"
        assert rss[1] <= rss[0] + 4 * 1024, f"RSS kept growing: {rss}"
        metrics = urllib.request.urlopen(server.base + "/metrics").read().decode()
        assert "pn_queue_depth 0\n" in metrics and "pn_slots_busy 0\n" in metrics, metrics
    finally:
        server.stop()
    assert server.proc.returncode == 0
