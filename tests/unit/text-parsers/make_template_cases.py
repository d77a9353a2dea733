#!/usr/bin/env python3
"""Writes template_cases.json: assistant turns rendered by the real Qwen3 and Qwen3.5 chat
templates with Python Jinja2 (the engine Hugging Face renders templates with), and what an
output parser must recover from them.

Each case is an assistant message (reasoning_content, content, tool_calls). The template
renders it; the text the model would have GENERATED is the rendered assistant turn minus
what the generation prompt already holds ("<|im_start|>assistant\\n" for Qwen3, plus
"<think>\\n" for Qwen3.5) and minus the closing "<|im_end|>\\n". The expected tool calls are
the message's own tool calls (names and argument values, typed): the round trip
message -> template -> parser -> message is the oracle. The expected reasoning/content
strings follow the parser rules in src/text/reasoning_parser.h and tool_parser.h (the text
between the tags verbatim; whitespace next to tool-call blocks dropped).

Usage (from the repository root, after scripts/install-deps.sh):
  python3 tests/unit/text-parsers/make_template_cases.py \
      [--qwen3 third_party/tokenizers/qwen3/tokenizer_config.json] \
      [--qwen35 tests/fixtures/chat_templates/qwen3_5.jinja] \
      [--out tests/unit/text-parsers/template_cases.json]
Needs only jinja2 (pyenv python3 has it).
"""
import argparse
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def hf_environment():
    """The Jinja environment transformers' apply_chat_template uses."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}},
        "required": ["city"]}}}

WRITE_FILE = {"type": "function", "function": {
    "name": "write_file", "description": "Write a file",
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string"},
        "content": {"type": "string"},
        "overwrite": {"type": "boolean"},
        "mode": {"type": ["integer", "null"]}},
        "required": ["path", "content"]}}}

SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search documents",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer"},
        "threshold": {"type": "number"},
        "exact": {"type": "boolean"},
        "filters": {"type": "object"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "cursor": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "weights": {"type": "array"}}}}}

TOOLS = [WEATHER, WRITE_FILE, SEARCH]

PY_CODE = ('def main():\n    print("</tool_call> is just text here")\n    return {"a": [1, 2]}\n\n'
           'if __name__ == "__main__":\n    main()\n')

# (name, reasoning_content, content, tool_calls)
MESSAGES = [
    ("one_call", "The user wants the weather in Paris. I should call get_weather.", "",
     [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("content_then_call", "Need the forecast.", "Let me look that up for you.",
     [("get_weather", {"city": "São Paulo", "days": 3})]),
    ("two_calls", "Two cities, two calls.", "",
     [("get_weather", {"city": "Tokyo"}), ("get_weather", {"city": "Berlin", "unit": "fahrenheit"})]),
    ("typed_arguments", "Search with every kind of argument.", "Searching.",
     [("search", {"query": "mixture of experts", "limit": 10, "threshold": 0.75, "exact": True,
                  "filters": {"year": 2025, "lang": ["en", "de"], "draft": False},
                  "tags": ["moe", "inference"], "cursor": None, "weights": [0.5, 1, -2.25]})]),
    ("integral_float_and_false", "Edge values.", "",
     [("search", {"query": "12345", "threshold": 2.0, "exact": False, "limit": -7, "tags": []})]),
    ("code_value", "Write the script.", "I'll write the file now.",
     [("write_file", {"path": "src/main.py", "content": PY_CODE, "overwrite": True, "mode": None})]),
    ("value_with_format_tags",
     "The file documents the tool format itself.", "",
     [("write_file", {"path": "docs/format.md",
                      "content": "Use </parameter> to close a value.\n<tool_call> and </function> too.",
                      "overwrite": False})]),
    ("newlines_in_value", "Leading and trailing newlines are data.", "",
     [("write_file", {"path": "a.txt", "content": "\nline one\nline two\n"})]),
    ("unicode", "Überlegung: 東京 🚀", "Ответ ниже ✓",
     [("search", {"query": "日本語の検索 — «quotes» \"double\" 'single' \\ backslash", "tags": ["é", "🚀"]})]),
    ("unknown_tool_and_parameter", "Not in the tools list.", "",
     [("launch_rocket", {"target": "moon", "count": 3}), ("get_weather", {"city": "Oslo", "wind": 12})]),
    ("three_calls_mixed", "Several tools.", "Doing three things.",
     [("get_weather", {"city": "Lima"}), ("search", {"query": "x", "limit": 1}),
      ("write_file", {"path": "p", "content": "c"})]),
    ("no_arguments", "A call with no arguments.", "", [("get_weather", {})]),
    ("no_tool_call", "Simple arithmetic.", "2 + 2 = 4.", []),
    ("no_tool_call_multiline", "Think\nin lines.", "First line.\n\nSecond line with <b>markup</b>.\n", []),
]


def schema_type(tool_name, param):
    for tool in TOOLS:
        f = tool["function"]
        if f["name"] == tool_name:
            return f["parameters"]["properties"].get(param)
    return None


def xml_rendered_value(value):
    """What the Qwen3.5 template writes for an argument value."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def expected_xml_arguments(tool_name, args):
    """Undeclared tools/parameters come back as the rendered text (strings)."""
    out = {}
    for k, v in args.items():
        out[k] = v if schema_type(tool_name, k) is not None else xml_rendered_value(v)
    return out


def expected_split(template, reasoning, content, calls):
    # Both templates write "<think>\n" + reasoning + "\n</think>\n\n" + content; Qwen3
    # strips the reasoning of newlines and the content of leading newlines, Qwen3.5 trims
    # both. The Qwen3.5 prompt already holds "<think>\n"; a Qwen3 model writes it.
    if template == "qwen3":
        r = reasoning.strip("\n")
        c = content.lstrip("\n")
        exp_reasoning = "\n" + r + "\n"
    else:
        r = reasoning.strip()
        c = content.strip()
        exp_reasoning = r + "\n"
    body = "\n\n" + c
    if calls:
        # whitespace that only separates the content from the first block is dropped
        exp_content = body.rstrip(" \t\n\r") if body.strip(" \t\n\r") else ""
    else:
        exp_content = body
    return exp_reasoning, exp_content


def render_assistant(env, template_text, tools, reasoning, content, calls):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Please help."},
        {"role": "assistant", "reasoning_content": reasoning, "content": content,
         "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]},
    ]
    text = env.from_string(template_text).render(messages=messages, tools=tools, add_generation_prompt=False)
    start = text.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    assert text.endswith("<|im_end|>\n"), text[-40:]
    return text[start:-len("<|im_end|>\n")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3", default=os.path.join(ROOT, "third_party/tokenizers/qwen3/tokenizer_config.json"))
    ap.add_argument("--qwen35", default=os.path.join(ROOT, "tests/fixtures/chat_templates/qwen3_5.jinja"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "template_cases.json"))
    args = ap.parse_args()

    with open(args.qwen3, encoding="utf-8") as f:
        qwen3_template = json.load(f)["chat_template"]
    with open(args.qwen35, encoding="utf-8") as f:
        qwen35_template = f.read()

    env = hf_environment()
    cases = []
    for template, template_text in (("qwen3", qwen3_template), ("qwen3_5", qwen35_template)):
        for name, reasoning, content, calls in MESSAGES:
            turn = render_assistant(env, template_text, TOOLS, reasoning, content, calls)
            if template == "qwen3_5":
                assert turn.startswith("<think>\n"), turn[:20]
                generated, in_think = turn[len("<think>\n"):], True
                expected_calls = [{"name": n, "arguments": expected_xml_arguments(n, a)} for n, a in calls]
            else:
                generated, in_think = turn, False
                expected_calls = [{"name": n, "arguments": a} for n, a in calls]
            exp_reasoning, exp_content = expected_split(template, reasoning, content, calls)
            cases.append({
                "name": f"{template}/{name}",
                "template": template,
                "prompt_ends_in_think": in_think,
                "generated": generated,
                "expected": {"reasoning_content": exp_reasoning, "content": exp_content, "tool_calls": expected_calls},
            })
    out = {"generator": "tests/unit/text-parsers/make_template_cases.py", "jinja2": jinja2.__version__,
           "tools": TOOLS, "cases": cases}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
