"""Soak test (issue #21): a mix of streaming and whole requests, cancelled streams and bad
requests against one `pn serve` for PN_SOAK_SECONDS (60 in CI; 600 for the long run, outside
CI), with the server's resident memory sampled every half second.

Passes when there is no 5xx, no good request failed, every bad request got its 4xx, and the
RSS at the end is within PN_SOAK_RSS_TOL_KIB (16 MiB) of the RSS after warm-up (the first
quarter of the run, at most 60 s: the allocator's arenas and the prompt cache fill up then).
Prints one summary line with the figures."""
import http.client
import json
import os
import random
import threading
import time

from conftest import Server

SECONDS = float(os.environ.get("PN_SOAK_SECONDS", "60"))
WORKERS = int(os.environ.get("PN_SOAK_WORKERS", "8"))
RSS_TOL_KIB = int(os.environ.get("PN_SOAK_RSS_TOL_KIB", str(16 << 10)))

BAD = [
    (b'{"messages": [', 400),
    (b'{"messages":[{"role":"user","content":"x"}],"temperature":-1}', 400),
    (b'{"messages":[{"role":"user","content":"x"}],"top_p":NaN}', 400),
    (b'{"messages":[{"role":"user","content":"\xff"}]}', 400),
    (b"[" * 5000, 400),
]


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {"good": 0, "stream": 0, "cancelled": 0, "bad": 0}
        self.failures = []
        self.status_5xx = 0

    def add(self, kind):
        with self.lock:
            self.counts[kind] += 1

    def fail(self, what, status=None):
        with self.lock:
            self.failures.append(what)
            if status is not None and status >= 500:
                self.status_5xx += 1


def post(conn, path, body):
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    return conn.getresponse()


def one_round(host, port, rng, tally, index):
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        action = rng.random()
        if action < 0.35:
            body = json.dumps({"messages": [{"role": "user", "content": f"soak {index}: def f(x):"}],
                               "max_tokens": rng.randint(1, 12), "seed": index})
            r = post(conn, "/v1/chat/completions", body)
            data = r.read()
            if r.status != 200:
                return tally.fail(f"chat {r.status}: {data[:200]!r}", r.status)
            v = json.loads(data)
            if v["choices"][0]["finish_reason"] not in ("stop", "length"):
                return tally.fail(f"chat finish {v['choices'][0]['finish_reason']}")
            tally.add("good")
        elif action < 0.65:
            body = json.dumps({"prompt": f"soak {index}: class A", "max_tokens": rng.randint(1, 16),
                               "stream": True, "seed": index})
            r = post(conn, "/v1/completions", body)
            data = r.read()
            if r.status != 200:
                return tally.fail(f"stream {r.status}: {data[:200]!r}", r.status)
            if not data.rstrip().endswith(b"data: [DONE]"):
                return tally.fail(f"stream incomplete: {data[-200:]!r}")
            tally.add("stream")
        elif action < 0.85:
            # A stream dropped after its first bytes (or before any).
            body = json.dumps({"prompt": "def g():", "max_tokens": 2000, "ignore_eos": True, "stream": True})
            r = post(conn, "/v1/completions", body)
            if r.status >= 500:
                return tally.fail(f"cancelled stream got {r.status}", r.status)
            if rng.random() < 0.5:
                r.read(rng.randint(1, 400))
            conn.close()
            tally.add("cancelled")
        else:
            body, want = rng.choice(BAD)
            path = rng.choice(["/v1/chat/completions", "/v1/messages"])
            r = post(conn, path, body)
            data = r.read()
            if r.status != want:
                return tally.fail(f"bad request to {path} got {r.status}: {data[:200]!r}", r.status)
            tally.add("bad")
    except Exception as e:  # noqa: BLE001 - every failure is reported
        tally.fail(f"{type(e).__name__}: {e}")
    finally:
        conn.close()


def test_soak():
    server = Server("--parallel", "2")
    host, port = server.base.removeprefix("http://").rsplit(":", 1)
    port = int(port)
    tally = Tally()
    rss = [(0.0, server.rss_kib())]
    t0 = time.monotonic()
    deadline = t0 + SECONDS
    stop = threading.Event()

    def sample():
        while not stop.wait(0.5):
            rss.append((time.monotonic() - t0, server.rss_kib()))

    def worker(w):
        rng = random.Random(w)
        i = 0
        while time.monotonic() < deadline:
            one_round(host, port, rng, tally, w * 1_000_000 + i)
            i += 1

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Cancelled generations finish cancelling; then the last sample.
    time.sleep(1.0)
    stop.set()
    sampler.join()
    rss.append((time.monotonic() - t0, server.rss_kib()))
    with urllib_open(server.base + "/health") as h:
        health = json.load(h)
    server.stop()

    warm = min(SECONDS / 4, 60.0)
    after_warm = next(v for t, v in rss if t >= warm)
    end = rss[-1][1]
    peak = max(v for _, v in rss)
    total = sum(tally.counts.values())
    print(
        f"\nsoak {SECONDS:.0f} s, {WORKERS} clients: {total} requests ({tally.counts}), "
        f"{len(tally.failures)} failures, {tally.status_5xx} 5xx; RSS KiB start {rss[0][1]}, "
        f"after {warm:.0f} s warm-up {after_warm}, end {end}, peak {peak} "
        f"(tolerance {RSS_TOL_KIB}); health at end {health}"
    )
    assert tally.status_5xx == 0, tally.failures[:10]
    assert not tally.failures, tally.failures[:10]
    assert min(tally.counts.values()) > 0, tally.counts
    assert health["slots_busy"] == 0 and health["queue"] == 0, health
    assert end - after_warm <= RSS_TOL_KIB, f"RSS grew {end - after_warm} KiB after warm-up"
    assert server.proc.returncode == 0


def urllib_open(url):
    import urllib.request

    return urllib.request.urlopen(url, timeout=30)
