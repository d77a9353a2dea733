#!/usr/bin/env python3
"""Writes python_literal_cases.json: for each input text, what Python's own
ast.literal_eval + json.dumps make of it (the reference for parse_python_literal in
src/text/tool_parser_python_literal.h), or null when Python rejects it or the value has no
JSON form (sets, bytes, complex numbers).

Cases where moeserve deliberately differs (JSON's true/false/null accepted, integers wider
than 64 bits, \\N{...} escapes, nesting deeper than 64) are tested by hand in
test_value_conversion.cpp and are not listed here.

Usage: python3 tests/unit/text-parsers/make_python_literal_cases.py [--out FILE]
"""
import argparse
import ast
import json
import math
import os

INPUTS = [
    # scalars
    "0", "42", "-7", "+3", "1_000_000", "0x1F", "0o17", "0b101", "-0x10", "9223372036854775807",
    "-9223372036854775808", "18446744073709551615",
    "3.14", "-0.5", "1e3", "1E-3", ".5", "5.", "1_0.2_5", "2.0", "1e308",
    "True", "False", "None",
    "'single'", '"double"', "'it\\'s'", '"say \\"hi\\""', "'tab\\there'", "'nl\\nhere'",
    "'\\x41\\u00e9\\U0001F680'", "'octal \\101\\0'", "'unknown \\q escape'", "'back\\\\slash'",
    "'''triple\nline'''", '"""triple "quoted" """', "r'raw\\n'", "R'raw \\' quote'", "u'unicode'",
    "'adjacent' \"strings\"", "'日本語 🚀'", "'line\\\ncontinued'",
    "  42  ", "\t'x'\n",
    # containers
    "[]", "()", "{}", "[1, 2, 3]", "[1, 'a', None, True, 2.5]", "(1,)", "(1)", "(1, 2)", "((1, 2), [3])",
    "[1, 2,]", "{'a': 1, 'b': [True, False], 'c': {'d': None}}", "{'a': 1, 'a': 2, 'b': 3}",
    "{1: 'int key', None: 'none key', 2.5: 'float key'}", "{True: 'bool key', False: 0}",
    "{'k': (1, 2)}", "{\n  'multi': 'line',\n  'dict': [\n    1,\n    2\n  ]\n}",
    "[[[[[[1]]]]]]", "{'nested': {'deep': {'deeper': ['x', {'y': -1.5e-3}]}}}",
    "[-1, +2, -3.5]",
    # not literals, or no JSON form
    "", "   ", "abc", "[1, 2", "{'a' 1}", "{'a': }", "[1 2]", "1 2", "'unterminated", "'a\nb'",
    "{1, 2}", "b'bytes'", "1j", "1+2j", "--1", "inf", "nan", "1e999", "0x", "1__0", "1_", "01",
    "{(1, 2): 'tuple key'}", "[1,,2]", "print(1)", "x = 1", "'\\N{BULLET}' if False else 1",
    "{**{}}", "[*()]", "'''unterminated", "f'x'", "'a' + 'b'",
]


def reference(text):
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None  # sets, bytes, complex, non-finite floats, container keys
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return encoded


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "python_literal_cases.json"))
    args = ap.parse_args()
    cases = [{"input": t, "json": reference(t)} for t in INPUTS]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/unit/text-parsers/make_python_literal_cases.py", "cases": cases}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
