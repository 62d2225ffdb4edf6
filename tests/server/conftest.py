"""Starts `pn serve` (the binary named by $PN_BIN, else target/release/pn) on a free loopback
port with the demo model for the tests in this folder."""
import os
import re
import subprocess
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pn_binary():
    path = os.environ.get("PN_BIN") or os.path.join(ROOT, "target", "release", "pn")
    if not os.path.exists(path):
        pytest.fail(f"pn binary not found at {path}: build it (cargo build --release -p pn-runtime --bin pn) or set PN_BIN")
    return path


class Server:
    def __init__(self, *extra):
        self.proc = subprocess.Popen(
            [pn_binary(), "serve", "--port", "0", "-t", "2", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()
        m = re.search(r"http://(\S+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"pn serve printed {line!r}")
        self.base = f"http://{m.group(1)}"
        # Keep draining stdout so the server never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture(scope="module")
def server():
    s = Server("--parallel", "2", "--api-key", "test-key")
    yield s
    s.stop()
    assert s.proc.returncode == 0, f"server exited with {s.proc.returncode}"


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base + "/v1", api_key="test-key", max_retries=0, timeout=120)
