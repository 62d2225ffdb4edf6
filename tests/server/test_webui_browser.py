"""The built-in chat page (`GET /`) in headless Chromium, driven over the Chrome DevTools
Protocol (the `websocket-client` package; Debian's `chromium`): the page loads, takes the API
key in its settings, sends a prompt to the demo model, shows the streamed answer with its
tokens/s line, keeps the conversation in localStorage, and a screenshot is written to
target/webui-chat.png. A missing browser fails the test (CI installs it)."""
import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

from conftest import ROOT


def chromium_binary():
    path = os.environ.get("PN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("chromium not found: apt-get install -y chromium (or set PN_CHROMIUM)")
    return path


class Browser:
    """One headless Chromium with one page, spoken to over its DevTools websocket."""

    def __init__(self):
        self.ws = None
        try:
            self._start()
        except BaseException:
            # A browser that started but could not be driven must not outlive the test.
            self.close()
            raise

    def _start(self):
        import websocket

        self.profile = tempfile.mkdtemp(prefix="pn-webui-")
        self.proc = subprocess.Popen(
            [
                chromium_binary(),
                "--headless=new",
                "--no-sandbox",  # CI runs as root
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--window-size=1000,800",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.time() + 30
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.time() > deadline or self.proc.poll() is not None:
                pytest.fail("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(p for p in pages if p.get("type") == "page")
        # No Origin header: Chromium rejects DevTools connections from origins it was not told of.
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self.ids = itertools.count(1)

    def call(self, method, **params):
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expression, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            # `!!`: a DOM node comes back by value as an empty (falsy) dict.
            if self.eval(f"!!({expression})"):
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; page: {self.eval('document.body.innerText')!r}")

    def close(self):
        if self.ws is not None:
            self.ws.close()
        proc = getattr(self, "proc", None)
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if getattr(self, "profile", None):
            shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture
def browser():
    b = Browser()
    yield b
    b.close()


def test_chat_page_streams_an_answer(server, browser):
    b = browser
    b.call("Page.enable")
    b.call("Page.navigate", url=server.base + "/")
    b.wait("document.readyState === 'complete' && !!document.getElementById('send')", "the page")
    # The server wants a key: the page says so until one is typed into its settings.
    b.wait("document.getElementById('model').textContent.includes('API key')", "the key hint")
    b.eval(
        """(() => {
        const k = document.getElementById('api-key');
        k.value = 'test-key';
        k.dispatchEvent(new Event('change'));
        document.getElementById('temperature').value = '0';
        document.getElementById('max-tokens').value = '24';
        document.getElementById('prompt').value = 'def fibonacci(n):';
        document.getElementById('send').click();
    })()"""
    )
    b.wait("document.getElementById('model').textContent.startsWith('demo')", "the model id")
    done = "document.querySelector('.msg.assistant.done')"
    b.wait(done, "the streamed answer", timeout=90)
    answer = b.eval(f"{done}.querySelector('.content').textContent + {done}.querySelector('.reasoning').textContent")
    assert answer.strip(), "the answer is shown"
    stats = b.eval(f"{done}.querySelector('.stats').textContent")
    assert "tok/s" in stats and "tokens" in stats, stats
    assert b.eval("document.querySelectorAll('.msg.error').length") == 0
    # The conversation is kept in the browser: a reload shows it again.
    saved = json.loads(b.eval("localStorage.getItem('pn-chat')"))
    assert [m["role"] for m in saved["conversation"]] == ["user", "assistant"]
    b.call("Page.reload")
    b.wait("document.querySelectorAll('.msg.assistant').length === 1", "the restored conversation")
    shot = base64.b64decode(b.call("Page.captureScreenshot", format="png")["data"])
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 1000
    out = os.path.join(ROOT, "target", "webui-chat.png")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "wb") as f:
        f.write(shot)
    assert os.path.getsize(out) == len(shot)


def cancelled_total(server):
    req = urllib.request.Request(server.base + "/metrics", headers={"Authorization": "Bearer test-key"})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    line = next(l for l in text.splitlines() if l.startswith("pn_requests_cancelled_total "))
    return float(line.split()[1])


def test_stop_button_cancels_the_generation(server, browser):
    b = browser
    before = cancelled_total(server)
    # The sampled demo reply sometimes ends by itself (end of text) before the click lands; that
    # says nothing about the stop button, so such a reply is sent again (at most 8 tries).
    for _ in range(8):
        b.call("Page.navigate", url=server.base + "/")
        b.wait("document.readyState === 'complete' && !!document.getElementById('send')", "the page")
        b.eval(
            """(() => {
            localStorage.clear();
            const k = document.getElementById('api-key');
            k.value = 'test-key';
            document.getElementById('max-tokens').value = '4000';
            document.getElementById('prompt').value = 'def long_function():';
            document.getElementById('send').click();
        })()"""
        )
        b.wait("document.querySelector('.msg.assistant .content').textContent.length > 0", "the first tokens")
        b.eval("document.getElementById('stop').click()")
        b.wait("document.querySelector('.msg.assistant.done')", "the stopped reply")
        if "(stopped)" in b.eval("document.querySelector('.msg.assistant .stats').textContent"):
            break
    assert "(stopped)" in b.eval("document.querySelector('.msg.assistant .stats').textContent")
    assert b.eval("document.getElementById('send').disabled") is False
    # The closed connection cancelled the generation on the server.
    deadline = time.time() + 30
    while cancelled_total(server) <= before:
        assert time.time() < deadline, "the server did not cancel the stopped generation"
        time.sleep(0.1)
