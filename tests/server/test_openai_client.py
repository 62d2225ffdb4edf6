"""The official `openai` Python client against `pn serve`: it must work unchanged."""
import json
import urllib.request

import openai
import pytest

MESSAGES = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "def fibonacci(n):"},
]


def model_id(client):
    return client.models.list().data[0].id


def test_models_list(client):
    models = client.models.list()
    assert len(models.data) == 1
    assert models.data[0].object == "model"
    # The built-in demo (no -m) is named after its folder.
    assert models.data[0].id == "demo-code-model-pn3"


def test_chat_completion_usage(client):
    r = client.chat.completions.create(model=model_id(client), messages=MESSAGES, max_tokens=8, seed=1, temperature=0.8)
    assert r.object == "chat.completion"
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8
    assert r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_chunks_concatenate_to_the_whole_text():
    # A one-slot server: an unrelated prompt before each request empties the slot, so both
    # requests process the whole prompt from the same (empty) state. (A request continuing
    # from a cached prompt may draw other samples for the same seed while MTP speculation is
    # on: the draft/accept path consumes the random stream differently.)
    from conftest import Server

    server = Server("--parallel", "1")
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)
        kw = dict(model="anything", messages=MESSAGES, max_tokens=12, seed=42, temperature=0.9)

        def flush():
            client.completions.create(model="m", prompt="import sys", max_tokens=1)

        flush()
        whole = client.chat.completions.create(**kw)
        flush()
        stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
        text, finish, usage, n_chunks = "", None, None, 0
        for chunk in stream:
            n_chunks += 1
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices:
                delta = chunk.choices[0].delta
                text += delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        assert n_chunks >= 3
        assert text == whole.choices[0].message.content
        assert finish == whole.choices[0].finish_reason
        assert usage.completion_tokens == whole.usage.completion_tokens
        assert usage.prompt_tokens == whole.usage.prompt_tokens
        assert usage.prompt_tokens_details.cached_tokens == 0
    finally:
        server.stop()


def test_completions_and_stop_sequences(client):
    base = dict(model="m", prompt="def fibonacci(n):", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**base)
    text = full.choices[0].text
    assert full.object == "text_completion"
    assert full.usage.completion_tokens == 24
    assert full.choices[0].finish_reason == "length"
    stop = text[4:7]
    cut = client.completions.create(stop=[stop], **base)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **base) if c.choices)
    assert streamed == text


def test_chat_template_kwargs_and_reasoning_fields_are_accepted(client):
    r = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}, "top_k": 20, "min_p": 0.05},
    )
    assert r.choices[0].message.content is not None
    # The demo model does not think: no reasoning_content field.
    assert getattr(r.choices[0].message, "reasoning_content", None) is None


def test_errors_are_openai_errors(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=MESSAGES, temperature=5)
    assert e.value.status_code == 400
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=MESSAGES, extra_body={"bogus": 1})
    assert "Unrecognized request argument supplied: bogus" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="x " * 5000, max_tokens=1)
    assert e.value.code == "context_length_exceeded"
    bad = openai.OpenAI(base_url=server.base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    # Raw: malformed JSON with the right key.
    req = urllib.request.Request(
        server.base + "/v1/chat/completions",
        data=b"{not json",
        headers={"Authorization": "Bearer test-key", "Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(req)
        raise AssertionError("expected a 400")
    except urllib.error.HTTPError as err:
        assert err.code == 400
        body = json.loads(err.read())
        assert body["error"]["type"] == "invalid_request_error"


def test_structured_output_parse(client):
    # `client.beta.chat.completions.parse` sends the pydantic model as a strict
    # response_format json_schema and parses the reply into the model.
    from typing import Literal

    from pydantic import BaseModel, Field

    class Point(BaseModel):
        x: int = Field(ge=0, le=9)
        label: Literal["a", "b"]

    r = client.beta.chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "A point?"}], response_format=Point, max_tokens=48, temperature=0
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Point)
    assert 0 <= parsed.x <= 9 and parsed.label in ("a", "b")
    assert r.choices[0].finish_reason == "stop"


def test_json_object_and_llama_extras(client):
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "config?"}],
        temperature=0,
        response_format={"type": "json_object"},
        extra_body={"cache_prompt": True, "n_predict": 32, "repeat_penalty": 1.0, "id_slot": -1, "top_k": 40, "min_p": 0.05},
    )
    assert r.choices[0].message.content.startswith("{")
    assert r.usage.completion_tokens <= 32  # n_predict
    assert r.choices[0].finish_reason in ("stop", "length")
