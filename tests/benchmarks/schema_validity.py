"""Benchmark (not a test): how many sampled replies under a schema are valid, through a real `speccli serve`
of a pair at chat's defaults (T 0.8, top-k 40, top-p 0.95, min-p 0.05) with its default drafting.

    flock /tmp/ggml.lock .venv/bin/python tests/benchmarks/schema_validity.py PAIR [--replies 500]

Requests cycle through SCHEMAS (short ones, so that a thousand replies take minutes) and a tool call
(`tool_choice: "required"`), each with its own seed. A reply that stops is checked with jsonschema (a
call's arguments against its parameters); one cut by max_tokens is counted apart, as `length`.
Prints the counts and the time taken."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import jsonschema
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.benchmarks.serve_workload import ROOT, Server, free_port  # noqa: E402

SCHEMAS = [
    ("mood", "Her train was cancelled twice today. Her mood as JSON.",
     {"type": "object", "properties": {"mood": {"enum": ["grumpy", "cheerful", "anxious", "relaxed"]},
                                       "intensity": {"type": "integer", "minimum": 1, "maximum": 5}},
      "required": ["mood", "intensity"], "additionalProperties": False}),
    ("city", "Name a European capital and its country, as JSON.",
     {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}, "country": {"type": "string", "maxLength": 24}},
      "required": ["city", "country"], "additionalProperties": False}),
    ("tags", "Give up to three one-word tags for a blog post about sourdough bread, as JSON.",
     {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 3}},
      "required": ["tags"], "additionalProperties": False}),
    ("score", "Rate the sentence 'the soup was fine' from 0 to 1 for positivity, as JSON.",
     {"type": "object", "properties": {"positive": {"type": "number", "minimum": 0, "maximum": 1}, "sure": {"type": "boolean"}},
      "required": ["positive", "sure"], "additionalProperties": False}),
]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pair")
    parser.add_argument("--replies", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    port = free_port()
    argv = [str(ROOT / ".venv/bin/speccli"), "serve", args.pair, "--port", str(port), "--threads", str(os.cpu_count())]
    counts: Counter[str] = Counter()
    with Server(argv, port):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        started = time.perf_counter()
        for i in range(args.replies):
            kind = i % (len(SCHEMAS) + 1)
            extra = {"top_k": 40, "min_p": 0.05}
            if kind == len(SCHEMAS):
                reply = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "What is the weather in Oslo?"}], tools=[TOOL],
                    tool_choice="required", temperature=0.8, top_p=0.95, seed=i, max_tokens=args.max_tokens, extra_body=extra)
                name, checks = "tool", [(json.loads(c.function.arguments), WEATHER) for c in reply.choices[0].message.tool_calls or ()]
            else:
                name, prompt, schema = SCHEMAS[kind]
                reply = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": prompt}], temperature=0.8, top_p=0.95, seed=i,
                    max_tokens=args.max_tokens, extra_body=extra,
                    response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}})
                checks = [(json.loads(reply.choices[0].message.content), schema)] if reply.choices[0].finish_reason == "stop" else []
            finish = reply.choices[0].finish_reason
            if finish == "length":
                counts["length"] += 1
                continue
            try:
                assert checks and finish in ("stop", "tool_calls"), finish
                for value, schema in checks:
                    jsonschema.validate(value, schema)
                counts["valid"] += 1
            except (AssertionError, jsonschema.ValidationError, ValueError) as error:
                counts["invalid"] += 1
                print(f"invalid ({name}, seed {i}): {error}\n{reply.choices[0].message}", file=sys.stderr)
            if (i + 1) % 50 == 0:
                print(f"{i + 1} replies: {dict(counts)}", file=sys.stderr, flush=True)
        seconds = time.perf_counter() - started
    print(f"{args.pair}: {args.replies} replies at T 0.8 ({len(SCHEMAS)} schemas and a required tool call, "
          f"max_tokens {args.max_tokens}): valid {counts['valid']}, invalid {counts['invalid']}, "
          f"cut by max_tokens {counts['length']}; {seconds:.0f} s")


if __name__ == "__main__":
    main()
