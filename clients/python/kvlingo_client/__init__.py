"""kvlingo_client: the Python gRPC client of kvlingo-router (kvlingo.v1.Router).

    from kvlingo_client import RouterClient
    c = RouterClient("127.0.0.1:7000", tls_ca="ca.pem", api_key="sk-...")   # or insecure=True (plaintext); key default $KVL_API_KEY
    sid = c.create_session()
    ids, text, summary = c.send_all(sid, "Once upon a time", max_tokens=16)
    c.close_session(sid)

Every call raises grpc.RpcError with the router's status and message on failure (unknown
session: NOT_FOUND; empty or malformed input: INVALID_ARGUMENT; too long: OUT_OF_RANGE;
session busy: ABORTED; no healthy node: UNAVAILABLE; no or an unknown API key:
UNAUTHENTICATED; a quota used up: RESOURCE_EXHAUSTED).  UNAVAILABLE and ABORTED can pass: retry
the turn with the same request_id, which send_all(..., retries=N) does.  `kvlingo-client --help`
is the command line.
"""
import argparse
import os
import sys
import time
import uuid

import grpc

from kvlingo.v1 import router_pb2 as pb
from kvlingo.v1 import router_pb2_grpc as pb_grpc

__all__ = ["RouterClient", "channel", "new_request_id", "pb", "main", "RETRYABLE", "MODES", "summary_line"]

# What the router answers when a retry of the same turn (same request_id) can succeed: no
# healthy node or ledger down, a replica going away (UNAVAILABLE), the session driven by
# another replica or still busy with a turn just abandoned (ABORTED).
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)


def new_request_id():
    """A fresh SendRequest.request_id (the router accepts 1-64 of A-Za-z0-9._:-)."""
    return "py-" + uuid.uuid4().hex

# A server-streaming call (Send) is read on the caller's thread, not handed over from a thread
# of the channel's: one thread wake-up less before each token (~0.07 ms a turn).  grpc's
# experimental package is imported by name (grpcio does not load it with grpc).
try:
    from grpc.experimental import ChannelOptions as _ChannelOptions
    _STREAM_ON_CALLER = [(_ChannelOptions.SingleThreadedUnaryStream, 1)]
except (ImportError, AttributeError):   # a grpcio without the option: the default threading
    _STREAM_ON_CALLER = []

# summary.switch_mode (an enum number) as the name the CLI prints
MODES = {pb.SWITCH_MODE_NONE: "none", pb.SWITCH_MODE_TRANSLATE: "translate",
         pb.SWITCH_MODE_REPREFILL: "re-prefill"}


def summary_line(sid, s):
    """A turn summary as `kvlingo chat` prints it: "[session S turn N: MODEL on NODE, switch MODE
    [from MODEL] (N span tokens), TTFT x ms, N tokens, x tok/s[, N tokens pushed ahead]
    [, fallback: ...][, failover from MODEL (reason)]]"."""
    text = "[session %s turn %d: %s on %s, switch %s" % (sid, s.turn, s.model, s.node,
                                                          MODES.get(s.switch_mode, "?"))
    if s.from_model:
        text += " from " + s.from_model
    text += " (%d span tokens), TTFT %.2f ms, %d tokens, %.1f tok/s" % (
        s.span_tokens, s.ttft_seconds * 1e3, s.n_generated, s.tokens_per_second)
    if s.pushed_ahead_tokens:
        text += ", %d tokens pushed ahead" % s.pushed_ahead_tokens
    if s.fallback_reason:
        text += ", fallback: " + s.fallback_reason
    if s.failover_from:
        text += ", failover from %s (%s)" % (s.failover_from, s.policy_reason)
    return text + "]"


def channel(address, tls_ca=None, insecure=False):
    """A gRPC channel to the router: TLS verified with the CA file `tls_ca` (PEM: the CA that
    signed the router's certificate), or plaintext when insecure=True.  One is required.
    Server-streaming calls on it (Send) are read on the thread that iterates them
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream): iterate a stream on one
    thread, and do not use its Future methods (result(), exception()) while it runs."""
    if tls_ca and insecure:
        raise ValueError("tls_ca and insecure exclude each other")
    opts = _STREAM_ON_CALLER
    if tls_ca:
        with open(tls_ca, "rb") as f:
            return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=f.read()), options=opts)
    if insecure:
        return grpc.insecure_channel(address, options=opts)
    raise ValueError("pass tls_ca=PATH (the CA that signed the router's certificate) or insecure=True "
                     "(plaintext, for a router started with --insecure)")


class RouterClient:
    """A connection to kvlingo-router; `pb` is the generated router_pb2 module."""

    def __init__(self, address, timeout=120.0, tls_ca=None, insecure=False, api_key=None):
        self.pb = pb
        self.timeout = timeout
        # the router's API key (its tenant's sessions only): the argument, else $KVL_API_KEY
        api_key = api_key if api_key is not None else os.environ.get("KVL_API_KEY", "")
        self.metadata = (("authorization", "Bearer " + api_key),) if api_key else None
        self.channel = channel(address, tls_ca, insecure)
        self.stub = pb_grpc.RouterStub(self.channel)

    def create_session(self, *, model="", session_id=""):
        """A new session; its id.  Keywords only: `model` pins it to a model ("": the router's
        policy chooses), `session_id` names it ("": the router makes one)."""
        return self.stub.CreateSession(pb.CreateSessionRequest(model=model, session_id=session_id),
                                       timeout=self.timeout, metadata=self.metadata).session_id

    def send(self, session_id, text=None, tokens=None, **params):
        """Yield (text_piece, None) per token, then ("", TurnSummary).  params: any SendRequest
        field (max_tokens, temperature, model, escalate, ignore_eos, chat, request_id, ...).
        Not retried: after an error, send the turn again with the same request_id (a turn
        already committed streams its stored tokens again from the first), or use
        send_all(retries=N).  The client's timeout bounds the whole stream."""
        req = pb.SendRequest(session_id=session_id, text=text or "", tokens=tokens or [], **params)
        for m in self.stub.Send(req, timeout=self.timeout, metadata=self.metadata):
            if m.HasField("summary"):
                yield "", m.summary
            else:
                yield m.text, None

    def send_all(self, session_id, text=None, tokens=None, retries=0, **params):
        """Run one turn; returns (token ids, text, summary).

        retries=N: on UNAVAILABLE or ABORTED (RETRYABLE) send the turn again, up to N more
        times (0.1 s back-off doubling to 2 s), with the same request_id: params' request_id,
        or one made here (new_request_id()) when retries > 0.  A turn the router already
        committed is answered from its ledger (summary.policy_reason starts with "replayed"),
        never run twice; one the router saw its client leave mid-stream (a dropped connection)
        was committed as cancelled and is answered so: no tokens, summary.finish_reason
        "cancelled", its input kept in the session (continue with the next turn).  Each attempt
        has the client's timeout."""
        if retries > 0 and not params.get("request_id"):
            params["request_id"] = new_request_id()
        req = pb.SendRequest(session_id=session_id, text=text or "", tokens=tokens or [], **params)
        delay = 0.1
        for attempt in range(retries + 1):
            ids, pieces, summary = [], [], None
            try:
                for m in self.stub.Send(req, timeout=self.timeout, metadata=self.metadata):
                    if m.HasField("summary"):
                        summary = m.summary
                    else:
                        ids.append(m.token)
                        pieces.append(m.text)
                return ids, "".join(pieces), summary
            except grpc.RpcError as e:
                if attempt == retries or e.code() not in RETRYABLE:
                    raise
            time.sleep(delay)
            delay = min(2 * delay, 2.0)

    def get_session(self, session_id, include_tokens=False):
        return self.stub.GetSession(pb.GetSessionRequest(session_id=session_id,
                                                         include_tokens=include_tokens),
                                    timeout=self.timeout, metadata=self.metadata)

    def close_session(self, session_id):
        return self.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id),
                                      timeout=self.timeout, metadata=self.metadata).closed

    def list_nodes(self):
        return self.stub.ListNodes(pb.ListNodesRequest(), timeout=self.timeout, metadata=self.metadata)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(prog="kvlingo-client", description="kvlingo-router gRPC client")
    ap.add_argument("--router", required=True, help="router address host:port")
    ap.add_argument("--tls-ca", help="CA (PEM) that signed the router's certificate (TLS)")
    ap.add_argument("--insecure", action="store_true", help="plaintext (a router run with --insecure)")
    ap.add_argument("--session", default="", help="continue this session (default: a new one)")
    ap.add_argument("--model", default="", help="ask for this model")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--escalate", action="store_true", help="cascade: use the larger model now")
    ap.add_argument("--prefetch-model", default="",
                    help="after this turn, ship the span to this model ahead of the next switch")
    ap.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS")
    ap.add_argument("--special-text", action="store_true", help="show special tokens' text")
    ap.add_argument("--list-nodes", action="store_true")
    ap.add_argument("--api-key", default=None, help="the router's API key (default: $KVL_API_KEY)")
    ap.add_argument("text", nargs="?", default="")
    a = ap.parse_args(argv)
    if bool(a.tls_ca) == a.insecure:
        ap.error("one of --tls-ca FILE or --insecure is required")
    c = RouterClient(a.router, tls_ca=a.tls_ca, insecure=a.insecure, api_key=a.api_key)
    sid, done = "", False
    try:
        if a.list_nodes:
            print(c.list_nodes())
            return 0
        if not a.text:
            ap.error("TEXT is required (or --list-nodes)")
        sid = a.session or c.create_session()
        for piece, s in c.send(sid, a.text, max_tokens=a.max_tokens, model=a.model, escalate=a.escalate,
                               prefetch_model=a.prefetch_model, ignore_eos=a.ignore_eos,
                               special_text=a.special_text):
            if s is None:
                sys.stdout.write(piece)
                sys.stdout.flush()
            else:
                print("\n" + summary_line(sid, s))
                done = True
    except grpc.RpcError as e:
        print("error: %s: %s" % (e.code().name, e.details()), file=sys.stderr)
        if sid and not done:
            print("session %s (continue with --session %s)" % (sid, sid), file=sys.stderr)
        return 1
    return 0
