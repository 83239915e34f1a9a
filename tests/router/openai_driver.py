#!/usr/bin/env python3
"""tests/router/openai_driver.py: the official `openai` Python package against kvlingo-router's
HTTP API; run by test_openai.py with the interpreter that has the package (build/venv).  It
prints one JSON object with what the server answered; test_openai.py checks it.

usage: openai_driver.py --base-url http://127.0.0.1:PORT/v1 --turns-json FILE
"""
import argparse
import json
import sys

import openai


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--turns-json", required=True, help="user texts of the 6-turn conversation")
    a = ap.parse_args()
    users = json.load(open(a.turns_json))
    c = openai.OpenAI(base_url=a.base_url, api_key="unused", max_retries=0, timeout=120)
    out = {"openai_version": openai.__version__}

    out["models"] = [m.id for m in c.models.list().data]

    msgs = [{"role": "system", "content": "You tell stories."},
            {"role": "user", "content": "Once upon a time, in a small village by the sea,"}]
    raw = c.chat.completions.with_raw_response.create(model="qwen3-b", messages=msgs, max_tokens=12,
                                                      temperature=0)
    r = raw.parse()
    out["chat"] = {"content": r.choices[0].message.content, "role": r.choices[0].message.role,
                   "finish": r.choices[0].finish_reason, "object": r.object, "model": r.model,
                   "usage": r.usage.model_dump(), "headers": {k: v for k, v in raw.headers.items()
                                                             if k.startswith("x-kvlingo")}}

    chunks = list(c.chat.completions.create(model="qwen3-b", messages=msgs, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    out["chat_stream"] = {
        "content": "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices),
        "first_role": chunks[0].choices[0].delta.role if chunks and chunks[0].choices else None,
        "finish": [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason],
        "objects": sorted(set(ch.object for ch in chunks)),
        "usage": chunks[-1].usage.model_dump() if chunks and chunks[-1].usage else None,
        "n_chunks": len(chunks)}

    # a stop sequence taken from the greedy reply: the text ends before it
    words = out["chat"]["content"].split()
    stop = " " + words[2] if len(words) > 3 else None
    if stop:
        r = c.chat.completions.create(model="qwen3-b", messages=msgs, max_tokens=12, temperature=0,
                                      stop=[stop, "\u00a7never"])
        out["chat_stop"] = {"stop": stop, "content": r.choices[0].message.content,
                            "finish": r.choices[0].finish_reason}

    r = c.completions.create(model="qwen3-a", prompt="The old man walked to the", max_tokens=8,
                             temperature=0)
    out["completion"] = {"text": r.choices[0].text, "finish": r.choices[0].finish_reason,
                         "object": r.object, "usage": r.usage.model_dump()}
    chunks = list(c.completions.create(model="qwen3-a", prompt="The old man walked to the", max_tokens=8,
                                       temperature=0, stream=True))
    out["completion_stream"] = {"text": "".join(ch.choices[0].text for ch in chunks if ch.choices)}

    # the 6-turn conversation: stateless requests, each with the whole history
    for label, models in (("pinned", ["qwen3-a", "qwen3-b"] * 3), ("auto", ["auto"] * 6)):
        conv = [{"role": "system", "content": "You are a storyteller (%s)." % label}]
        turns = []
        for i, (u, m) in enumerate(zip(users, models)):
            conv.append({"role": "user", "content": u})
            raw = c.chat.completions.with_raw_response.create(model=m, messages=conv, max_tokens=8,
                                                              temperature=0)
            r = raw.parse()
            content = r.choices[0].message.content
            turns.append({"model": r.model, "content": content, "finish": r.choices[0].finish_reason,
                          "usage": r.usage.model_dump(),
                          "headers": {k: v for k, v in raw.headers.items() if k.startswith("x-kvlingo")},
                          "messages": list(conv)})
            conv.append({"role": "assistant", "content": content})
        out["conv_" + label] = turns

    errors = {}
    try:
        c.chat.completions.create(model="no-such-model", messages=msgs)
    except openai.NotFoundError as e:
        errors["unknown_model"] = {"status": e.status_code, "body": e.body}
    try:
        c.chat.completions.create(model="qwen3-a", messages=msgs, n=2)
    except openai.BadRequestError as e:
        errors["n2"] = {"status": e.status_code, "body": e.body}
    out["sdk_errors"] = errors
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
