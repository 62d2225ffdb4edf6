#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (fuzz/seeds/<target>/), a few KB each.

Every file is built here from the format descriptions (GGUF v3, safetensors, llama.cpp's legacy
imatrix .dat layout), except two slices of files already in tests/data (their README.md give
provenance): the header of tests/data/real-gguf/stock-types.gguf and the tiny model's
tests/data/tiny-qwen35/hf/value-transformed.safetensors. Rerun after changing a target's input
layout: `python3 fuzz/seeds/make_seeds.py` (inputs crashes found later are added by hand).
"""
import json
import os
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(ROOT, "..", "..", "tests", "data")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


# GGUF value types (gguf spec): 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array, 10 u64.
def gguf(meta, tensors, align=32):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for k, ty, payload in meta:
        out += gstr(k) + struct.pack("<I", ty) + payload
    offs, data = [], b""
    for name, gty, dims, raw in tensors:
        pad = (-len(data)) % align
        data += b"\0" * pad
        offs.append(len(data))
        data += raw
    for (name, gty, dims, raw), off in zip(tensors, offs):
        out += gstr(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", gty, off)
    out += b"\0" * ((-len(out)) % align)
    return out + data


f32 = lambda *v: struct.pack("<%df" % len(v), *v)

# gguf_parse
put("gguf_parse", "empty_v3.gguf", gguf([], []))
put("gguf_parse", "meta_and_f32.gguf", gguf(
    [("general.architecture", 8, gstr("qwen35")),
     ("qwen35.block_count", 4, struct.pack("<I", 2)),
     ("qwen35.rope.freq_base", 6, f32(1e7)),
     ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + gstr("a") + gstr("b")),
     ("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 2) + struct.pack("<2i", 1, 3)),
     ("general.alignment", 4, struct.pack("<I", 32))],
    [("w", 0, [4, 2], f32(*range(8))), ("n", 0, [4], f32(1, 2, 3, 4))]))
# Q8_0 (type 8): 32 weights per 34-byte block (f16 scale + 32 int8).
put("gguf_parse", "q8_0.gguf", gguf([], [("q", 8, [32, 2], (b"\x00\x3c" + bytes(range(32))) * 2)]))
with open(os.path.join(DATA, "real-gguf", "stock-types.gguf"), "rb") as f:
    put("gguf_parse", "stock_types_header.gguf", f.read(4096))

# pn_validate: selector byte + rows of 34-byte blocks.
put("pn_validate", "pn3t_zero", b"\x00" + bytes(68))
put("pn_validate", "pn4t_ramp", b"\x01" + bytes((i * 7) & 0xFF for i in range(68)))
put("pn_validate", "pn3t_scale", b"\x02" + (b"\x00\x3c" + bytes(32)) * 2)


def safetensors(tensors, meta=None):
    header, data = {}, b""
    if meta:
        header["__metadata__"] = meta
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


# safetensors: selector byte (bit 0: also the checkpoint reader) + the shard.
st = safetensors([("a", "F32", [2], f32(1, 2)), ("model.norm.weight", "BF16", [2, 2], bytes(8)),
                  ("b", "F16", [1, 3], bytes(6))], {"format": "pt"})
put("safetensors", "three_tensors", b"\x00" + st)
put("safetensors", "three_tensors_ckpt", b"\x01" + st)
with open(os.path.join(DATA, "tiny-qwen35", "hf", "value-transformed.safetensors"), "rb") as f:
    put("safetensors", "tiny_value_transformed_ckpt", b"\x01" + f.read())

# imatrix: the GGUF layout (name.in_sum2 [K, n_mat], name.counts [n_mat]) and the legacy .dat.
put("imatrix", "gguf.imatrix", gguf(
    [("general.type", 8, gstr("imatrix")),
     ("imatrix.datasets", 9, struct.pack("<IQ", 8, 1) + gstr("calib.txt")),
     ("imatrix.chunk_count", 4, struct.pack("<I", 3)),
     ("imatrix.chunk_size", 4, struct.pack("<I", 512))],
    [("blk.0.ffn_down.weight.in_sum2", 0, [4, 1], f32(1, 2, 3, 4)),
     ("blk.0.ffn_down.weight.counts", 0, [1], f32(3))]))


def legacy(entries, trailer=True):
    out = struct.pack("<i", len(entries))
    for name, ncall, vals in entries:
        n = name.encode()
        out += struct.pack("<i", len(n)) + n + struct.pack("<ii", ncall, len(vals)) + f32(*vals)
    if trailer:
        out += struct.pack("<i", 5) + struct.pack("<i", 9) + b"calib.txt"
    return out


put("imatrix", "legacy.dat", legacy([("blk.0.attn_q.weight", 4, [1, 2, 3, 4]),
                                      ("output.weight", 1, [0.5] * 8)]))
put("imatrix", "legacy_no_trailer.dat", legacy([("blk.1.ffn_up.weight", 2, [2, 2])], False))

# tokenizer: text (the target reads it as UTF-8, lossily) and, as u32 ids, the same bytes.
put("tokenizer", "code.txt", "def fibonacci(n):\n    if n < 2:\n        return n\n\treturn fib(n-1)  # x\r\n")
put("tokenizer", "unicode.txt", "你好，世界! Привет 🙂🏽 café cafe\u0301 ﬁ \u00a0\u200b")
put("tokenizer", "markup.txt", "<|im_start|>user\n<think>x</think><|im_end|><|endoftext|>[PAD248100]")
put("tokenizer", "invalid_utf8", b"ok \xff\xfe \xc3 \xe2\x82 end\x00")

# chat_template: selector byte (bit 0: JSON body; bit 1: generation prompt) + messages.
put("chat_template", "plain_turns", b"\x02" + b"\x01hello\x00\x02hi there\x00\x01what is 2+2?")
put("chat_template", "system_tool", b"\x00" + b"\x00be brief\x00\x01q\x00\x82a\x00\x03{\"r\":1}")
put("chat_template", "request.json", b"\x03" + json.dumps({
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "weather?"},
                 {"role": "assistant", "content": "", "reasoning_content": "think",
                  "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": "{\"city\":\"Paris\"}"}}]},
                 {"role": "tool", "content": "sunny"}],
    "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}],
    "enable_thinking": False}).encode())

# server_request: selector byte (0 chat, 1 completions, 2 messages, 3 count_tokens) + body.
put("server_request", "chat.json", b"\x00" + json.dumps({
    "model": "pn", "messages": [{"role": "developer", "content": "d"},
                                {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    "temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "stop": ["\n"], "seed": 1, "stream": True,
    "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2,
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}],
    "tool_choice": "auto", "reasoning_effort": "low"}).encode())
put("server_request", "completion.json", b"\x01" + json.dumps({
    "prompt": "def f(", "max_tokens": 8, "temperature": 0, "n_predict": 4, "top_k": 5}).encode())
put("server_request", "completion_tokens.json", b"\x01" + json.dumps({"prompt": [[1, 2, 3]]}).encode())
msg = {"model": "pn", "max_tokens": 32, "system": "s",
       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2"}]}],
       "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"},
       "thinking": {"type": "enabled", "budget_tokens": 64}, "stop_sequences": ["x"], "top_k": 3}
put("server_request", "messages.json", b"\x02" + json.dumps(msg).encode())
put("server_request", "count_tokens.json", b"\x03" + json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode())
put("server_request", "nested.json", b"\x00" + b"[" * 200 + b"]" * 200)
