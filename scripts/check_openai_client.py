#!/usr/bin/env python3
"""`qwen3 serve` through the official `openai` Python client: what an application sees.

    pip install openai
    python3 scripts/check_openai_client.py --qwen3 target/release/qwen3 --model models/tiny.bin

Starts the server on a free loopback port (with an API key), then checks with the client:
listing models, a completion, a chat answer, both streamed with usage, `n`, stop strings,
structured output (`chat.completions.parse` with a Pydantic model, JSON mode, a forced strict tool
call), and that bad requests raise the client's own error classes (BadRequestError,
NotFoundError, AuthenticationError). With --vision-model (an export of
fixtures/models/tiny-qwen3_5-vl-f32) a second server checks images: `image_url` parts with data
URLs (and `detail`), the image's tokens counted as transformers' processor counts them, another
image another answer, and an image that is no image, an http URL and SVG raising BadRequestError.
Prints one line per check and exits non-zero on the first failure. Without
the `openai` package it says so and exits 0 (CI may not have it).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import serverkit  # noqa: E402 - scripts/lib/serverkit.py: the server and the check lines

try:
    import openai
except ImportError:
    print("check_openai_client: the openai package is not installed; skipped")
    sys.exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3", default="target/release/qwen3")
    ap.add_argument("--model", default="models/tiny.bin")
    ap.add_argument("--vision-model", help="an export of fixtures/models/tiny-qwen3_5-vl-f32")
    args = ap.parse_args()
    serve(args.qwen3, args.model, run)
    if args.vision_model:
        serve(args.qwen3, args.vision_model, lambda client, url: vision(client))
    check.finish()


def serve(qwen3, model, checks):
    key = "test-key"
    server = serverkit.Server(qwen3, model, "--api-key", key, "--model-name", "tiny")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=key)
        checks(client, server.url)
    finally:
        code = server.stop()
    if code != 0:
        raise SystemExit(f"the server exited with {code} on SIGTERM")
    print("server: exited 0 on SIGTERM")


# One line per check; the first failure ends the run (later checks build on earlier ones).
check = serverkit.Checks("openai-client")


def vision(client):
    import base64
    import json
    from pathlib import Path
    fixture = Path(__file__).resolve().parent.parent / "fixtures/models/tiny-qwen3_5-vl-f32"
    case = json.loads((fixture / "images-reference.json").read_text())["cases"][3]
    text = case["messages"][0]["content"][1]["text"]

    def url(name, media="image/png"):
        return f"data:{media};base64," + base64.b64encode((fixture / "images" / name).read_bytes()).decode()

    def ask(image_url, detail="auto"):
        content = [{"type": "image_url", "image_url": {"url": image_url, "detail": detail}},
                   {"type": "text", "text": text}]
        return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}],
                                              max_tokens=4, temperature=0)

    r = ask(url(case["images"][0]))
    check("an image_url data URL counts the image's tokens as transformers does",
          r.usage.prompt_tokens == len(case["input_ids"]) and r.usage.completion_tokens == 4)
    said = lambda m: (getattr(m, "reasoning_content", None) or "") + (m.content or "")
    low = ask(url(case["images"][0]), detail="low")
    check("detail is accepted and changes nothing", said(low.choices[0].message) == said(r.choices[0].message))
    other = ask(url("rgba-96x64.png"))
    check("another image gives another answer", said(other.choices[0].message) != said(r.choices[0].message))
    for name, bad in [("an image that is no image", "data:image/png;base64," + base64.b64encode(b"nope").decode()),
                      ("an http URL", "https://example.com/cat.png"),
                      ("an SVG image", "data:image/svg+xml;base64," + base64.b64encode(b"<svg/>").decode())]:
        try:
            ask(bad)
            check(f"{name} raises BadRequestError", False)
        except openai.BadRequestError as e:
            check(f"{name} raises BadRequestError ({e.status_code})", e.status_code == 400)


def run(client, url):
    models = client.models.list()
    check("models.list names the model", [m.id for m in models.data] == ["tiny"])

    c = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8,
                                  temperature=0)
    check("completions.create", c.object == "text_completion" and c.usage.completion_tokens == 8
          and c.choices[0].finish_reason == "length" and len(c.choices[0].text) > 0)

    stream = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    check("completions stream equals the whole answer", text == c.choices[0].text)
    check("completions stream ends with usage", chunks[-1].usage.completion_tokens == 8)

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    check("chat.completions.create", r.object == "chat.completion"
          and r.choices[0].message.role == "assistant" and r.usage.completion_tokens > 0)
    s = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0,
                                       stream=True,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    streamed = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
    check("chat stream equals the whole answer", streamed == r.choices[0].message.content)

    lp = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0,
                                        logprobs=True, top_logprobs=2,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    entries = lp.choices[0].logprobs.content
    check("chat logprobs parse as the client's types", len(entries) == 4
          and all(len(e.top_logprobs) == 2 and e.logprob <= 0 and e.top_logprobs[0].token == e.token
                  for e in entries))
    clp = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=4,
                                    temperature=0, logprobs=3)
    check("completion logprobs parse as the client's types",
          len(clp.choices[0].logprobs.token_logprobs) == 4
          and all(len(t) == 3 for t in clp.choices[0].logprobs.top_logprobs))

    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]
    t = client.chat.completions.create(model="tiny", messages=history, tools=tools,
                                       tool_choice="auto", max_tokens=4, temperature=0)
    check("tools and a tool-call history are accepted", t.choices[0].message.role == "assistant"
          and t.usage.prompt_tokens > 100)

    n = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, n=3, temperature=0)
    check("n=3 gives three choices", sorted(ch.index for ch in n.choices) == [0, 1, 2])

    full = c.choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    if stop:
        cut = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8,
                                        temperature=0, stop=[stop])
        check("stop string cuts the answer", cut.choices[0].text == full[:full.find(stop)]
              and cut.choices[0].finish_reason == "stop")

    structured(client)

    def raises(name, cls, f):
        try:
            f()
        except cls as e:
            check(f"{name} raises {cls.__name__} ({e.status_code})", True)
            return
        except Exception as e:  # noqa: BLE001
            check(f"{name} raises {cls.__name__}, not {type(e).__name__}: {e}", False)
        check(f"{name} raises {cls.__name__}", False)

    raises("an unknown model", openai.NotFoundError,
           lambda: client.completions.create(model="gpt-4", prompt="hi", max_tokens=2))
    raises("temperature 5", openai.BadRequestError,
           lambda: client.completions.create(model="tiny", prompt="hi", temperature=5))
    raises("an unknown role", openai.BadRequestError,
           lambda: client.chat.completions.create(model="tiny",
                                                  messages=[{"role": "wizard", "content": "hi"}]))
    raises("a schema that does not compile", openai.BadRequestError,
           lambda: client.chat.completions.create(
               model="tiny", messages=msgs, response_format={
                   "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}))
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong")
    raises("a wrong API key", openai.AuthenticationError, lambda: bad.models.list())


def structured(client):
    """Structured output as applications use it. The fixture's random weights never write JSON on
    their own, so a parsed answer is the grammar's doing; the fields are bounded so answers end."""
    import json
    from typing import Literal, Optional

    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=8)
        age: int = Field(ge=0, le=120)
        tags: list[Literal["red", "green"]] = Field(max_length=3)
        nickname: Optional[str] = Field(max_length=5)

    off = {"chat_template_kwargs": {"enable_thinking": False}}
    msgs = [{"role": "user", "content": "Describe a person."}]
    parsed = []
    for seed in range(4):
        p = client.chat.completions.parse(model="tiny", messages=msgs, response_format=Person,
                                          temperature=1.0, seed=seed, max_tokens=600,
                                          extra_body=off)
        if p.choices[0].finish_reason == "stop":
            parsed.append(p.choices[0].message.parsed)
    check("chat.completions.parse with a Pydantic model gives instances",
          len(parsed) >= 3 and all(isinstance(x, Person) for x in parsed))

    j = client.chat.completions.create(model="tiny", messages=msgs, temperature=1.0, seed=1,
                                       max_tokens=40, response_format={"type": "json_object"},
                                       extra_body=off)
    text = j.choices[0].message.content
    check("json_object mode starts an object (and is one if it stopped)", text.startswith("{") and (
        j.choices[0].finish_reason != "stop" or isinstance(json.loads(text), dict)))

    tool = {"type": "function", "function": {
        "name": "get_weather", "strict": True, "parameters": {
            "type": "object", "additionalProperties": False, "required": ["city", "unit"],
            "properties": {"city": {"type": "string", "maxLength": 10},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
    calls = []
    for seed in range(4):
        t = client.chat.completions.create(model="tiny", messages=msgs, tools=[tool],
                                           tool_choice="required", temperature=1.0, seed=seed,
                                           max_tokens=200, extra_body=off)
        if t.choices[0].finish_reason == "tool_calls":
            calls += t.choices[0].message.tool_calls
    check("tool_choice required gives calls whose arguments follow the schema",
          len(calls) >= 3 and all(c.function.name == "get_weather"
                                  and json.loads(c.function.arguments)["unit"] in ("celsius", "fahrenheit")
                                  for c in calls))


if __name__ == "__main__":
    main()
