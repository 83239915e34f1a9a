#!/usr/bin/env python3
"""tests/router/test_openai.py: kvlingo-router's OpenAI-compatible HTTP API, end to end.

kvld (qwen3-a, qwen3-b) + kvlingo-router (cascade policy, http_listen) on loopback:
  1. the official `openai` package (tests/router/openai_driver.py, run with the interpreter that
     has it: $KVL_PYTHON or build/venv) drives models, chat completions (plain, streamed with
     usage, with a stop sequence) and completions (plain, streamed);
  2. a 6-turn conversation sent as stateless requests, alternating pinned models, continues one
     session: every switch is served by translation (x-kvlingo-switch), the old part comes from
     cache (usage.prompt_tokens_details.cached_tokens), and the greedy replies and the final
     ledger equal the same conversation sent through gRPC Send (chat turns, token deltas); the
     same conversation with model "auto" lets the cascade policy switch;
  3. `curl -N` sees well-formed server-sent events ending with data: [DONE];
  4. bad input (malformed JSON, unknown model, wrong roles, empty messages, oversize body, n: 2,
     logit_bias, tools, wrong method, unknown URL, a session header the conversation does not
     extend) gets OpenAI's error body and status; the router keeps serving;
  5. nodes hold at most 6 sessions: the router drops the least recently used idle one to make
     room (its ledger stays), and every check above still holds.
usage: test_openai.py --build BUILD_DIR --work WORK_DIR
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rtest  # noqa: E402
from rtest import check  # noqa: E402

SRC = rtest.SRC


def openai_python():
    for cand in (os.environ.get("KVL_PYTHON"), os.path.join(SRC, "build", "venv", "bin", "python")):
        if cand and os.path.exists(cand) and subprocess.run(
                [cand, "-c", "import openai"], capture_output=True).returncode == 0:
            return cand
    return None


def request(port, method, path, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data, method=method,
                                 headers=dict({"Content-Type": "application/json"}, **(headers or {})))
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def expect_error(port, status, param, words, body=None, raw=None, method="POST",
                 path="/v1/chat/completions", headers=None):
    st, _, b = request(port, method, path, body, headers, raw)
    check(st == status, "%s %s: expected HTTP %d, got %d: %r" % (method, path, status, st, b[:300]))
    e = json.loads(b)["error"]
    check(set(e) == {"message", "type", "param", "code"}, "OpenAI error keys: %r" % e)
    check(e["param"] == param, "param %r, expected %r (%s)" % (e["param"], param, e["message"]))
    for w in words:
        check(w in e["message"], "error %r should mention %r" % (e["message"], w))
    print("  ok: %d %s: %s" % (st, e["code"] or e["type"], e["message"]))
    return e


def cancels_logged(log_path):
    with open(log_path, errors="replace") as f:
        return f.read().count("turn cancelled by the client")


def post_and_leave(port, body, after_s):
    """POST body to /v1/chat/completions on a raw socket and close it after_s later."""
    sk = socket.create_connection(("127.0.0.1", port), timeout=20)
    raw = json.dumps(body).encode()
    sk.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
    time.sleep(after_s)
    sk.close()


def chatml(messages):
    return "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"]) for m in messages) + \
        "<|im_start|>assistant\n"


def tokenize(build, work, text):
    path = os.path.join(work, "prompt.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    out = subprocess.run([os.path.join(build, "kvlingo"), "tokenize", "--model",
                          os.path.join(SRC, "models", "qwen3-a"), "--text-file", path, "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["ids"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    py = openai_python()
    if not py:
        print("SKIP: the openai package is not installed (scripts/test.sh installs it into build/venv; "
              "or set KVL_PYTHON to an interpreter that has it)")
        return 77
    if not shutil.which("curl"):
        print("SKIP: curl is not installed")
        return 77
    shutil.rmtree(a.work, ignore_errors=True)
    port = rtest.free_port()
    fleet = rtest.Fleet(a.build, a.work,
                        policy={"name": "cascade", "models": ["qwen3-a", "qwen3-b"],
                                "entropy_threshold": 0.001, "calm_turns": 100},
                        guardrail={"shadow_fraction": 1.0, "kl_budget": 100},
                        extra_top={"http_listen": "127.0.0.1:%d" % port, "http_max_body_bytes": 65536},
                        # stateless clients never close their sessions: a small session table
                        # makes the router free places on a full node (least recently used)
                        kvld_args=["--max-sessions", "6"])
    try:
        users = [rtest.corpus_text(1000 + 137 * i, 80) for i in range(6)]
        tj = os.path.join(a.work, "turns.json")
        with open(tj, "w") as f:
            json.dump(users, f)
        # 1. the openai package
        p = subprocess.run([py, os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_driver.py"),
                            "--base-url", "http://127.0.0.1:%d/v1" % port, "--turns-json", tj],
                           capture_output=True, text=True, timeout=500)
        check(p.returncode == 0, "openai_driver failed:\n" + p.stderr[-3000:])
        d = json.loads(p.stdout)
        print("openai %s" % d["openai_version"])
        check(set(d["models"]) == {"qwen3-a", "qwen3-b", "auto"}, "models %r" % d["models"])
        ch, cs = d["chat"], d["chat_stream"]
        print("chat: %r finish=%s usage=%s headers=%s" % (ch["content"], ch["finish"], ch["usage"], ch["headers"]))
        check(ch["object"] == "chat.completion" and ch["role"] == "assistant" and ch["model"] == "qwen3-b",
              "chat completion shape")
        check(ch["content"] and "<|" not in ch["content"], "no special tokens in the text")
        check(ch["usage"]["prompt_tokens"] > 10 and 1 <= ch["usage"]["completion_tokens"] <= 12, "usage")
        check(ch["headers"]["x-kvlingo-model"] == "qwen3-b" and ch["headers"]["x-kvlingo-session"], "headers")
        check(cs["content"] == ch["content"], "streamed %r != plain %r" % (cs["content"], ch["content"]))
        check(cs["first_role"] == "assistant" and cs["finish"] == [ch["finish"]], "stream role/finish")
        check(cs["objects"] == ["chat.completion.chunk"], "chunk objects %r" % cs["objects"])
        check(cs["usage"] and cs["usage"]["completion_tokens"] == ch["usage"]["completion_tokens"] and
              cs["usage"]["prompt_tokens"] == ch["usage"]["prompt_tokens"], "stream usage %r" % cs["usage"])
        if "chat_stop" in d:
            st = d["chat_stop"]
            cut = ch["content"][:ch["content"].find(st["stop"])]
            print("stop %r: %r" % (st["stop"], st["content"]))
            check(st["content"] == cut and st["finish"] == "stop", "stop sequence: %r vs %r" % (st["content"], cut))
        co = d["completion"]
        print("completion: %r %s" % (co["text"], co["usage"]))
        check(co["object"] == "text_completion" and co["text"] and co["usage"]["completion_tokens"] >= 1,
              "completion")
        check(d["completion_stream"]["text"] == co["text"], "streamed completion")
        se = d["sdk_errors"]
        check(se.get("unknown_model", {}).get("status") == 404, "SDK: unknown model -> NotFoundError")
        check(se.get("n2", {}).get("status") == 400, "SDK: n=2 -> BadRequestError")

        # 2. the 6-turn conversations
        c = fleet.client()
        for label in ("pinned", "auto"):
            turns = d["conv_" + label]
            sids = set(t["headers"]["x-kvlingo-session"] for t in turns)
            for i, t in enumerate(turns):
                print("%s turn %d: model=%s switch=%s cached=%d/%d finish=%s %r" % (
                    label, i, t["headers"]["x-kvlingo-model"], t["headers"]["x-kvlingo-switch"],
                    t["usage"]["prompt_tokens_details"]["cached_tokens"], t["usage"]["prompt_tokens"],
                    t["finish"], t["content"]))
            check(len(sids) == 1, "%s: one session across the stateless requests, got %s" % (label, sids))
            sid = sids.pop()
            prev = None
            for i, t in enumerate(turns):
                h, u = t["headers"], t["usage"]
                check(h["x-kvlingo-model"] == t["model"], "model header")
                check(int(h["x-kvlingo-cached-tokens"]) == u["prompt_tokens_details"]["cached_tokens"], "cached header")
                if i > 0:
                    # everything before this turn's new user message came from cache
                    check(u["prompt_tokens_details"]["cached_tokens"] >= turns[i - 1]["usage"]["total_tokens"] - 1,
                          "%s turn %d: cached %d < previous context %d" % (
                              label, i, u["prompt_tokens_details"]["cached_tokens"], turns[i - 1]["usage"]["total_tokens"]))
                    want = "translate" if h["x-kvlingo-model"] != prev else "none"
                    check(h["x-kvlingo-switch"] == want, "%s turn %d: switch %s, expected %s" % (
                        label, i, h["x-kvlingo-switch"], want))
                prev = h["x-kvlingo-model"]
            if label == "pinned":
                check([t["model"] for t in turns] == ["qwen3-a", "qwen3-b"] * 3, "pinned models")
                # the same conversation through gRPC Send: token deltas, chat turns, greedy
                gs = c.create_session()
                for i, t in enumerate(turns):
                    ids = tokenize(a.build, a.work, chatml(t["messages"]))
                    led = list(c.get_session(gs, include_tokens=True).tokens)
                    check(ids[:len(led)] == led, "turn %d: the rendered prompt extends the gRPC ledger" % i)
                    _, text, s = c.send_all(gs, tokens=ids[len(led):], model=t["model"], max_tokens=8,
                                            temperature=0, chat=True, ignore_eos=False)
                    mode = c.pb.SwitchMode.Name(s.switch_mode)
                    check(text == t["content"], "turn %d: gRPC %r != HTTP %r" % (i, text, t["content"]))
                    check(i == 0 or mode == "SWITCH_MODE_TRANSLATE", "gRPC turn %d: %s" % (i, mode))
                http_led = list(c.get_session(sid, include_tokens=True).tokens)
                grpc_led = list(c.get_session(gs, include_tokens=True).tokens)
                check(http_led == grpc_led, "ledgers differ (%d vs %d tokens)" % (len(http_led), len(grpc_led)))
                print("  ok: gRPC Send gives the same replies and the same %d-token ledger" % len(grpc_led))
            else:
                check(len(set(t["model"] for t in turns)) == 2, "auto: the cascade policy switched models")

        # 3. curl -N: well-formed server-sent events
        body = {"model": "qwen3-a", "messages": [{"role": "user", "content": "Tell me a story."}],
                "max_tokens": 6, "temperature": 0, "stream": True}
        cp = subprocess.run(["curl", "-sN", "-D", "-", "-H", "Content-Type: application/json", "-d", json.dumps(body),
                             "http://127.0.0.1:%d/v1/chat/completions" % port], capture_output=True, timeout=60)
        head, _, sse = cp.stdout.decode().partition("\r\n\r\n")
        check("text/event-stream" in head and "x-kvlingo-session" in head, "SSE headers: %r" % head)
        events = sse.split("\n\n")
        check(events[-1] == "" and events[-2] == "data: [DONE]", "SSE ends with data: [DONE]: %r" % sse[-80:])
        for ev in events[:-2]:
            check(ev.startswith("data: ") and "\n" not in ev, "one data line per event: %r" % ev)
            j = json.loads(ev[6:])
            check(j["object"] == "chat.completion.chunk" and len(j["choices"]) == 1, "chunk %r" % j)
        check(json.loads(events[-3][6:])["choices"][0]["finish_reason"] in ("stop", "length"), "last chunk")
        print("  ok: curl -N: %d events, then data: [DONE]" % (len(events) - 2))

        # kvlingo chat in chat mode: roles through the same template, one session across turns,
        # the same greedy replies as the HTTP API
        lines = ["Once upon a time there was a king", "What did he do next?"]
        cp = subprocess.run([os.path.join(a.build, "kvlingo"), "chat", "--router", fleet.addr] + fleet.cli_security() + ["--tokenizer",
                             os.path.join(SRC, "models", "qwen3-a"), "--system", "You tell stories.",
                             "--interactive", "--model", "qwen3-a", "--max-tokens", "8"],
                            input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120)
        check(cp.returncode == 0, "kvlingo chat --interactive: %s" % cp.stderr)
        parts = re.split(r"\n\[session (\S+) turn (\d+): ([^\]]*)\]\n", cp.stdout)
        check(len(parts) == 9 and parts[1] == parts[5] and parts[2] == "0" and parts[6] == "1" and
              parts[8] == "", "two turns, one session: %r" % cp.stdout)
        cli_replies = [parts[0], parts[4]]
        conv = [{"role": "system", "content": "You tell stories."}]
        for i, line in enumerate(lines):
            conv.append({"role": "user", "content": line})
            st, _, b = request(port, "POST", "/v1/chat/completions",
                               {"model": "qwen3-a", "messages": conv, "max_tokens": 8, "temperature": 0})
            j = json.loads(b)
            reply = j["choices"][0]["message"]["content"]
            check(reply == cli_replies[i], "kvlingo chat turn %d %r != HTTP %r" % (i, cli_replies[i], reply))
            conv.append({"role": "assistant", "content": reply})
        span = int(re.search(r"\((\d+) span tokens\)", parts[7]).group(1))
        check(span < j["usage"]["prompt_tokens"] // 2, "turn 1 prefilled %d of %d tokens: the session's cache "
              "served the rest" % (span, j["usage"]["prompt_tokens"]))
        print("  ok: kvlingo chat --interactive: session %s, replies equal the HTTP API's" % parts[1])

        # 4. bad input, the router stays up
        good = {"model": "qwen3-a", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2}
        expect_error(port, 400, None, ["parse the JSON"], raw=b'{"model": "qwen3-a", "messages": [')
        expect_error(port, 404, "model", ["does not exist"], dict(good, model="gpt-4o"))
        expect_error(port, 400, "messages[0].role", ["'robot' is invalid"],
                     dict(good, messages=[{"role": "robot", "content": "x"}]))
        expect_error(port, 400, "messages[1].role", ["tool"],
                     dict(good, messages=[{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]))
        expect_error(port, 400, "messages", ["must not be empty"], dict(good, messages=[]))
        expect_error(port, 400, "messages", ["required"], {"model": "qwen3-a"})
        expect_error(port, 400, "n", ["'n' must be 1"], dict(good, n=2))
        expect_error(port, 400, "logit_bias", ["logit_bias"], dict(good, logit_bias={"42": 5}))
        expect_error(port, 400, "tools", ["tool"], dict(good, tools=[{"type": "function", "function": {"name": "f"}}]))
        expect_error(port, 400, "frobnicate", ["Unrecognized request argument"], dict(good, frobnicate=1))
        expect_error(port, 400, "max_tokens", ["max_new_tokens"], dict(good, max_tokens=10 ** 6))
        expect_error(port, 413, None, ["at most 65536"], raw=json.dumps(dict(good, pad="x" * 100000)).encode())
        cp = subprocess.run(["curl", "-s", "-H", "Transfer-Encoding: chunked", "-H", "Content-Type: application/json",
                             "--data-binary", "@-", "-w", "\n%{http_code}", "http://127.0.0.1:%d/v1/chat/completions" % port],
                            input=json.dumps(dict(good, pad="x" * 100000)).encode(), capture_output=True, timeout=60)
        b, _, code = cp.stdout.decode().rpartition("\n")
        check(code == "413" and "request_too_large" in b, "chunked oversize body: %s %r" % (code, b[:200]))
        print("  ok: 413 for a chunked body past the bound")
        # an endless chunked body (on a probe too): cut off after twice the bound, not read for ever
        for path in ("/v1/chat/completions", "/health"):
            sk = socket.create_connection(("127.0.0.1", port), timeout=20)
            sent, cut = 0, False
            try:
                sk.sendall(("%s %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: "
                            "application/json\r\n\r\n" % ("POST" if path.startswith("/v1") else "GET", path)).encode())
                chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
                while sent < (16 << 20):
                    sk.sendall(chunk)
                    sent += 0x4000
            except OSError:
                cut = True
            finally:
                sk.close()
            check(cut and sent < (8 << 20), "endless chunked body to %s: cut=%s after %d bytes" % (path, cut, sent))
        check(request(port, "GET", "/health")[0] == 200, "health after the endless bodies")
        print("  ok: an endless chunked body is cut off (POST and a probe), the server keeps serving")
        expect_error(port, 405, None, ["not allowed"], method="GET")
        expect_error(port, 404, None, ["Unknown request URL"], method="GET", path="/v1/engines")
        expect_error(port, 400, "prompt", ["required"], {"model": "qwen3-a"}, path="/v1/completions")
        # a session named by the client: created on first use, refused when the history differs
        st, h, _ = request(port, "POST", "/v1/chat/completions", good, {"x-kvlingo-session": "client-s1"})
        check(st == 200 and h.get("x-kvlingo-session") == "client-s1", "named session")
        expect_error(port, 400, "x-kvlingo-session", ["not a prefix"],
                     dict(good, messages=[{"role": "user", "content": "Something else entirely"}]),
                     headers={"x-kvlingo-session": "client-s1"})
        # CloseSession of an id one past the 64-character limit closes nothing (it used to be cut
        # to 64 characters first, and closed the session those name)
        long_sid = "L" * 64
        st, h, _ = request(port, "POST", "/v1/chat/completions", good, {"x-kvlingo-session": long_sid})
        check(st == 200 and h.get("x-kvlingo-session") == long_sid, "a session named with 64 characters")
        cl = fleet.client()
        try:
            cl.close_session(long_sid + "x")
            code = "OK"
        except Exception as e:  # grpc.RpcError
            code = e.code().name
        check(code == "INVALID_ARGUMENT" and cl.get_session(long_sid).state == "open",
              "CloseSession of a 65-character id: %s, the 64-character session stays open" % code)
        # a long streamed reply does not hold up other requests (a thread per connection)
        hc = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        hc.request("POST", "/v1/completions", json.dumps({"model": "qwen3-b", "prompt": "Once", "max_tokens": 300,
                                                          "ignore_eos": True, "stream": True}),
                   {"Content-Type": "application/json"})
        resp = hc.getresponse()
        first = resp.readline()
        check(resp.status == 200 and first.startswith(b"data: "), "long stream started: %d %r %r" % (
            resp.status, first[:300], resp.read(600) if resp.status != 200 else b""))
        t0 = time.time()
        st, _, _ = request(port, "GET", "/health")
        st2, _, b = request(port, "POST", "/v1/chat/completions", dict(good, model="qwen3-a"))
        t_other = time.time() - t0
        rest = resp.read().decode()
        t_long = time.time() - t0
        check(st == 200 and st2 == 200 and rest.rstrip().endswith("data: [DONE]"), "concurrent requests")
        check(t_other * 2 < t_long, "the short requests (%.3f s) finished before the long stream (%.3f s)" % (
            t_other, t_long))
        hc.close()
        print("  ok: /health and a chat completion took %.1f ms while a 300-token stream ran %.1f ms" % (
            t_other * 1e3, t_long * 1e3))
        # a streaming client that goes away mid-reply: its turn is cancelled, nothing else
        hc = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        hc.request("POST", "/v1/chat/completions", json.dumps(dict(good, max_tokens=1000, ignore_eos=True,
                                                                   stream=True)), {"Content-Type": "application/json"})
        resp = hc.getresponse()
        check(resp.status == 200 and resp.readline().startswith(b"data: "), "stream started")
        hc.close()
        for _ in range(100):
            with open(fleet.router.log_path, errors="replace") as f:
                if "turn cancelled by the client" in f.read():
                    break
            time.sleep(0.1)
        else:
            raise AssertionError("the router did not cancel the turn of a client that went away")
        print("  ok: a streaming client that disconnects cancels its turn")
        # the same for a client waiting for a whole reply (no stream)
        before = cancels_logged(fleet.router.log_path)
        post_and_leave(port, dict(good, max_tokens=1000, ignore_eos=True), 0.3)
        for _ in range(100):
            if cancels_logged(fleet.router.log_path) > before:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the router did not cancel the turn of a non-streaming client that went away")
        print("  ok: a client waiting for a whole reply that disconnects cancels its turn")
        # a client that goes away before the first token (its node frozen mid-prefill): the
        # router ends the turn at once, streaming or not, rather than at its first token
        node = fleet.nodes["qwen3-a"]
        for streamed in (True, False):
            before = cancels_logged(fleet.router.log_path)
            rtest.freeze(node.proc)
            try:
                post_and_leave(port, dict(good, max_tokens=50, stream=streamed), 0.3)
                t0, seen = time.time(), False
                while time.time() - t0 < 2.5 and not seen:
                    seen = cancels_logged(fleet.router.log_path) > before
                    time.sleep(0.05)
            finally:
                node.proc.send_signal(signal.SIGCONT)
            check(seen, "the router did not end the turn of a %s client gone before its first token "
                  "within 2.5 s (node frozen)" % ("streaming" if streamed else "non-streaming"))
            print("  ok: a %s client gone before the first token ends its turn at once (node frozen)"
                  % ("streaming" if streamed else "non-streaming"))
        st, _, b = request(port, "POST", "/v1/chat/completions", good)
        check(st == 200 and json.loads(b)["choices"][0]["message"]["role"] == "assistant", "follow-up succeeds")
        st, _, b = request(port, "GET", "/ready")
        check(st == 200 and json.loads(b)["nodes_healthy"] == 2, "ready")
        check(fleet.router.alive(), "router alive")
        wanted = (('kvlingo_router_http_requests_total{endpoint="chat_completions",status="200"}', 20),
                  ('kvlingo_router_http_requests_total{endpoint="chat_completions",status="400"}', 8),
                  ('kvlingo_router_http_requests_total{endpoint="chat_completions",status="413"}', 2),
                  ('kvlingo_router_http_requests_total{endpoint="models",status="200"}', 1),
                  ('kvlingo_router_http_requests_total{endpoint="ready",status="200"}', 1))
        # a request is counted when its connection completes, a moment after the client has
        # the reply: give the last one (/ready) up to 2 s to land
        until = time.time() + 2.0
        while True:
            m = fleet.metrics()
            got = [re.search("^" + re.escape(series) + r" (\S+)$", m, re.M) for series, _ in wanted]
            if all(g and float(g.group(1)) >= least for g, (_, least) in zip(got, wanted)) or time.time() > until:
                break
            time.sleep(0.05)
        for g, (series, least) in zip(got, wanted):
            check(g and float(g.group(1)) >= least, "%s >= %d: %s" % (series, least, g and g.group(1)))
        print("  ok: kvlingo_router_http_requests_total counts the requests")
        with open(fleet.router.log_path, errors="replace") as f:
            evicted = f.read().count("is full: dropped idle session")
        check(evicted > 0, "the router made room on a full node")
        print("  ok: %d idle sessions dropped from full nodes" % evicted)
        print("  ok: the router kept serving")
    finally:
        fleet.stop()
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
