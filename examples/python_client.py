#!/usr/bin/env python3
"""examples/python_client.py: a documented Python client for kvlingo-router.

Needs Debian's python3-grpcio and python3-grpc-tools (apt-get install python3-grpcio
python3-grpc-tools).  The gRPC stubs are generated from proto/ at start (into a cache folder,
$XDG_CACHE_HOME/kvlingo-stubs/<hash of the protos> or ~/.cache/...), so the client always matches the
.proto files of the checkout it runs from.

Command line:

    python3 examples/python_client.py --router 127.0.0.1:7000 --tls-ca ca.pem "Once upon a time"
    python3 examples/python_client.py --router 127.0.0.1:7000 --tls-ca ca.pem --session s-1 --model qwen3-b "..."
    python3 examples/python_client.py --router 127.0.0.1:7000 --insecure --list-nodes   # plaintext router

As a library:

    from python_client import RouterClient
    c = RouterClient("127.0.0.1:7000", tls_ca="ca.pem", api_key="sk-...")   # or insecure=True (plaintext); key default $KVL_API_KEY
    sid = c.create_session()
    for piece, summary in c.send(sid, "Once upon a time", max_tokens=16):
        if summary is None:
            print(piece, end="", flush=True)     # a text piece as it is generated
        else:
            print("\\n", summary.model, summary.switch_mode, summary.ttft_seconds)
    c.close_session(sid)

Every call raises grpc.RpcError with the router's status and message on failure (unknown
session: NOT_FOUND; empty or malformed input: INVALID_ARGUMENT; too long: OUT_OF_RANGE;
session busy: ABORTED; no healthy node: UNAVAILABLE; no or an unknown API key:
UNAUTHENTICATED; a quota used up: RESOURCE_EXHAUSTED).
"""
import argparse
import hashlib
import importlib
import os
import sys

SRC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (grpc/health is left out: a generated package named "grpc" would shadow grpcio)
PROTOS = ["kvlingo/v1/span.proto", "kvlingo/v1/node.proto", "kvlingo/v1/router.proto"]


def load_stubs(proto_dir=None, out_dir=None):
    """Generate (if needed) and import the Python stubs; returns (router_pb2, router_pb2_grpc)."""
    from grpc_tools import protoc
    import grpc_tools
    proto_dir = proto_dir or os.path.join(SRC_DIR, "proto")
    # the stubs are keyed by the protos' contents: checkouts with different protos (branches,
    # worktrees) sharing one cache never import each other's stubs
    h = hashlib.sha256()
    for f in PROTOS:
        with open(os.path.join(proto_dir, f), "rb") as fh:
            h.update(f.encode() + b"\0" + fh.read())
    digest = h.hexdigest()
    if out_dir is None:
        cache = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
        out_dir = os.path.join(cache, "kvlingo-stubs", digest[:16])
    os.makedirs(out_dir, exist_ok=True)
    stamp = os.path.join(out_dir, ".stamp")
    have = open(stamp).read() if os.path.exists(stamp) else ""
    if have != digest:
        inc = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        args = ["protoc", "-I" + proto_dir, "-I" + inc, "--python_out=" + out_dir,
                "--grpc_python_out=" + out_dir] + [os.path.join(proto_dir, f) for f in PROTOS]
        if protoc.main(args) != 0:
            raise RuntimeError("grpc_tools.protoc failed on " + proto_dir)
        for pkg in ["kvlingo", "kvlingo/v1"]:
            open(os.path.join(out_dir, pkg, "__init__.py"), "a").close()
        with open(stamp, "w") as fh:
            fh.write(digest)
    if out_dir not in sys.path:
        sys.path.insert(0, out_dir)
    return (importlib.import_module("kvlingo.v1.router_pb2"),
            importlib.import_module("kvlingo.v1.router_pb2_grpc"))


MODES = {0: "none", 1: "translate", 2: "re-prefill"}


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


class RouterClient:
    """Thin wrapper over the generated Router stub."""

    def __init__(self, address, timeout=120.0, proto_dir=None, stub_dir=None, tls_ca=None,
                 insecure=False, api_key=None):
        """TLS verified with tls_ca (PEM: the CA that signed the router's certificate), or
        plaintext with insecure=True (a router started with --insecure); one is required.
        api_key: the router's API key (its tenant's sessions only); default $KVL_API_KEY."""
        import grpc
        self.pb, self.pb_grpc = load_stubs(proto_dir, stub_dir)
        if bool(tls_ca) == bool(insecure):
            raise ValueError("RouterClient: pass tls_ca=PATH or insecure=True (exactly one)")
        api_key = api_key if api_key is not None else os.environ.get("KVL_API_KEY", "")
        self.metadata = (("authorization", "Bearer " + api_key),) if api_key else None
        # Send's stream is read on the thread that iterates it, as the installable client does
        # (clients/python): no hand-off from gRPC's own thread for each message
        try:
            from grpc.experimental import ChannelOptions
            opts = [(ChannelOptions.SingleThreadedUnaryStream, 1)]
        except (ImportError, AttributeError):   # a grpcio without the option: its default threading
            opts = []
        if tls_ca:
            with open(tls_ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            self.channel = grpc.secure_channel(address, creds, options=opts)
        else:
            self.channel = grpc.insecure_channel(address, options=opts)
        self.stub = self.pb_grpc.RouterStub(self.channel)
        self.timeout = timeout

    def create_session(self, *, session_id="", model=""):
        r = self.stub.CreateSession(self.pb.CreateSessionRequest(session_id=session_id, model=model),
                                    timeout=self.timeout, metadata=self.metadata)
        return r.session_id

    def send(self, session_id, text=None, tokens=None, **params):
        """Yield (text_piece, None) per token, then ("", TurnSummary) at the end.  params: any
        SendRequest field (max_tokens, temperature, model, escalate, force_reprefill, ...)."""
        req = self.pb.SendRequest(session_id=session_id, text=text or "", tokens=tokens or [],
                                  **params)
        for m in self.stub.Send(req, timeout=self.timeout, metadata=self.metadata):
            if m.HasField("summary"):
                yield "", m.summary
            else:
                yield m.text, None

    def send_all(self, session_id, text=None, tokens=None, **params):
        """Run one turn; returns (token ids, text, summary)."""
        req = self.pb.SendRequest(session_id=session_id, text=text or "", tokens=tokens or [],
                                  **params)
        ids, pieces, summary = [], [], None
        for m in self.stub.Send(req, timeout=self.timeout, metadata=self.metadata):
            if m.HasField("summary"):
                summary = m.summary
            else:
                ids.append(m.token)
                pieces.append(m.text)
        return ids, "".join(pieces), summary

    def get_session(self, session_id, include_tokens=False):
        return self.stub.GetSession(self.pb.GetSessionRequest(session_id=session_id,
                                                              include_tokens=include_tokens),
                                    timeout=self.timeout, metadata=self.metadata)

    def close_session(self, session_id):
        return self.stub.CloseSession(self.pb.CloseSessionRequest(session_id=session_id),
                                      timeout=self.timeout, metadata=self.metadata).closed

    def list_nodes(self):
        return self.stub.ListNodes(self.pb.ListNodesRequest(), timeout=self.timeout, metadata=self.metadata)


def main():
    ap = argparse.ArgumentParser(description="kvlingo-router Python client")
    ap.add_argument("--router", required=True, help="router address host:port")
    ap.add_argument("--tls-ca", help="CA (PEM) that signed the router's certificate (TLS)")
    ap.add_argument("--insecure", action="store_true", help="plaintext (a router run with --insecure)")
    ap.add_argument("--session", default="", help="continue this session (default: a new one)")
    ap.add_argument("--model", default="", help="ask for this model")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--escalate", action="store_true", help="cascade: use the larger model now")
    ap.add_argument("--prefetch-model", default="",
                    help="after this turn, ship the span to this model ahead of the next switch")
    ap.add_argument("--ignore-eos", action="store_true", help="do not stop at EOS (the router does by default)")
    ap.add_argument("--special-text", action="store_true",
                    help="show special tokens' text (<|endoftext|>, ...), left out by default")
    ap.add_argument("--list-nodes", action="store_true")
    ap.add_argument("--api-key", default=None, help="the router's API key (default: $KVL_API_KEY)")
    ap.add_argument("text", nargs="?", default="")
    a = ap.parse_args()
    import grpc
    if bool(a.tls_ca) == a.insecure:
        ap.error("one of --tls-ca FILE or --insecure is required")
    c = RouterClient(a.router, tls_ca=a.tls_ca, insecure=a.insecure, api_key=a.api_key)
    sid, summary = "", False
    try:
        if a.list_nodes:
            print(c.list_nodes())
            return 0
        if not a.text:   # before a session is made: an empty turn is INVALID_ARGUMENT anyway
            ap.error("TEXT is required (or --list-nodes)")
        sid = a.session or c.create_session()
        summary = False
        for piece, s in c.send(sid, a.text, max_tokens=a.max_tokens, model=a.model,
                               escalate=a.escalate, prefetch_model=a.prefetch_model,
                               ignore_eos=a.ignore_eos, special_text=a.special_text):
            if s is None:
                sys.stdout.write(piece)
                sys.stdout.flush()
            else:
                print("\n" + summary_line(sid, s))
                summary = True
    except grpc.RpcError as e:
        print("error: %s: %s" % (e.code().name, e.details()), file=sys.stderr)
        if sid and not summary:   # the session exists even though the turn failed
            print("session %s (continue with --session %s)" % (sid, sid), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
