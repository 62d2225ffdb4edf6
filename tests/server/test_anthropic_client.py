"""The official `anthropic` Python client against `pn serve`'s Messages API (demo model,
Qwen3.5 chat template)."""
import json
import os
import urllib.request

import anthropic
import pytest

from conftest import ROOT, Server

TEMPLATE = os.path.join(ROOT, "tests", "data", "chat-template", "qwen3.5_chat_template.jinja")
TOOL = {
    "name": "get_time",
    "description": "Local time in a zone.",
    "input_schema": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]},
}
USER = [{"role": "user", "content": "def fibonacci(n):"}]


@pytest.fixture(scope="module")
def aserver():
    s = Server("--parallel", "1", "--api-key", "test-key", "--chat-template-file", TEMPLATE)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def aclient(aserver):
    return anthropic.Anthropic(base_url=aserver.base, api_key="test-key", max_retries=0, timeout=120)


def test_messages(aclient):
    m = aclient.messages.create(model="m", max_tokens=8, system="You write Python.", messages=USER, extra_body={"temperature": 0}, metadata={"user_id": "u"})
    assert m.type == "message" and m.role == "assistant"
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert all(b.type == "text" for b in m.content)
    assert m.usage.output_tokens <= 8
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 5
    n = aclient.messages.count_tokens(model="m", system="You write Python.", messages=USER)
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_streaming(aclient):
    kw = dict(model="m", max_tokens=10, messages=USER, extra_body={"temperature": 0})
    whole = aclient.messages.create(**kw)
    with aclient.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "".join(b.text for b in whole.content if b.type == "text")
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_thinking_blocks(aclient):
    # The demo model never closes its thinking: all of it is one thinking block.
    m = aclient.messages.create(model="m", max_tokens=12, messages=USER, extra_body={"temperature": 0}, thinking={"type": "enabled", "budget_tokens": 1024})
    assert m.stop_reason == "max_tokens"
    assert m.content[0].type == "thinking"
    assert m.content[0].thinking and m.content[0].signature


def test_tool_use_round_trip(aclient):
    for stream in (False, True):
        kw = dict(model="m", max_tokens=100, messages=USER, tools=[TOOL], tool_choice={"type": "tool", "name": "get_time"}, extra_body={"temperature": 0})
        if stream:
            with aclient.messages.stream(**kw) as s:
                m = s.get_final_message()
        else:
            m = aclient.messages.create(**kw)
        assert m.stop_reason == "tool_use"
        (use,) = [b for b in m.content if b.type == "tool_use"]
        assert use.name == "get_time" and use.id.startswith("toolu_")
        assert use.input["zone"] in ("UTC", "CET")
    history = USER + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "12:00"}]},
    ]
    final = aclient.messages.create(model="m", max_tokens=6, messages=history, tools=[TOOL], extra_body={"temperature": 0})
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > m.usage.input_tokens


def test_errors(aclient, aserver):
    with pytest.raises(anthropic.BadRequestError) as e:
        aclient.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "'image'" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        aclient.messages.create(model="m", max_tokens=4, messages=USER, tools=[TOOL], tool_choice={"type": "tool", "name": "nope"})
    bad = anthropic.Anthropic(base_url=aserver.base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="m", max_tokens=4, messages=USER)
    # Raw: max_tokens is required.
    req = urllib.request.Request(
        aserver.base + "/v1/messages",
        data=json.dumps({"model": "m", "messages": USER}).encode(),
        headers={"x-api-key": "test-key", "anthropic-version": "2023-06-01", "content-type": "application/json"},
    )
    try:
        urllib.request.urlopen(req)
        raise AssertionError("expected a 400")
    except urllib.error.HTTPError as err:
        assert err.code == 400
        body = json.loads(err.read())
        assert body["type"] == "error" and "max_tokens" in body["error"]["message"]
