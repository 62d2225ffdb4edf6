"""Tool calls through the official `openai` client against `pn serve` (demo model, Qwen3.5
chat template).

The demo model cannot call tools on its own. Two seams make it: scripted output (a request
`guided_grammar` that allows exactly one text, so the real model emits that text through the
real tokenizer and the parser and stream assembler see a real token stream), and `tool_choice`
required / named, which constrains decoding so the model itself produces a call."""
import json
import os

import openai
import pytest

from conftest import ROOT, Server

TEMPLATE = os.path.join(ROOT, "tests", "data", "chat-template", "qwen3.5_chat_template.jinja")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "enum": ["Paris", "Oslo", "Rome"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time.",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]},
        },
    },
]

USER = [{"role": "user", "content": "What is the weather in Oslo?"}]
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
SECOND = "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>"


def script(text):
    """Extra body that forces the model's output to be exactly `text`."""
    return {"guided_grammar": "start: " + json.dumps(text), "chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def tclient():
    s = Server("--parallel", "1", "--chat-template-file", TEMPLATE)
    yield openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=120)
    s.stop()


def ask(client, messages=USER, **kw):
    kw.setdefault("max_tokens", 200)
    return client.chat.completions.create(model="m", messages=messages, tools=TOOLS, temperature=0, **kw)


def test_tool_round_trip(tclient):
    r = ask(tclient, extra_body=script("Checking.\n\n" + CALL))
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content == "Checking."
    (call,) = c.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo", "days": 2}
    # The call and its result go back through the template; the final answer follows.
    history = USER + [
        c.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 3}'},
    ]
    final = ask(tclient, messages=history, extra_body=script("It is 3 °C in Oslo."))
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == "It is 3 °C in Oslo."
    assert final.choices[0].message.tool_calls is None
    # The history (call + result) is part of the prompt.
    assert final.usage.prompt_tokens > r.usage.prompt_tokens + 20


def test_streamed_calls_assemble_with_the_client_helper(tclient):
    body = script(CALL + "\n" + SECOND)
    with tclient.chat.completions.stream(model="m", messages=USER, tools=TOOLS, temperature=0, max_tokens=200, extra_body=body) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[1].function.arguments) == {"zone": "CET"}
    assert final.choices[0].finish_reason == "tool_calls"
    # Raw chunks: the first delta of each call carries id, type and name.
    firsts = {}
    for chunk in ask(tclient, stream=True, extra_body=body):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            firsts.setdefault(tc.index, tc)
    assert sorted(firsts) == [0, 1]
    assert all(f.id and f.type == "function" and f.function.name for f in firsts.values())


def test_parallel_calls_and_parallel_false(tclient):
    both = ask(tclient, extra_body=script(CALL + "\n" + SECOND))
    assert len(both.choices[0].message.tool_calls) == 2
    one = ask(tclient, parallel_tool_calls=False, extra_body=script(CALL + "\n" + SECOND))
    assert [c.function.name for c in one.choices[0].message.tool_calls] == ["get_weather"]


def test_tool_choice_required_named_none(tclient):
    kw = dict(extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    r = ask(tclient, tool_choice="required", parallel_tool_calls=False, **kw)
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert args["city"] in ("Paris", "Oslo", "Rome") and 1 <= args["days"] <= 7
    else:
        assert call.function.name == "get_time" and args["zone"] in ("UTC", "CET")
    named = ask(tclient, tool_choice={"type": "function", "function": {"name": "get_weather"}}, **kw)
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city", "days"}
    # none: not parsed, the text stays content.
    none = ask(tclient, tool_choice="none", extra_body=script(CALL))
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content == CALL
    with pytest.raises(openai.BadRequestError) as e:
        ask(tclient, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"
