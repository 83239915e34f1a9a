#!/usr/bin/env python3
"""clients/python/generate_stubs.py: regenerate kvlingo/v1/*_pb2*.py from the repository's proto/
with grpcio-tools (pinned in pyproject's comment and scripts/test.sh, so the output is
reproducible).  usage: generate_stubs.py [OUT_DIR]   (default: this folder)
"""
import os
import sys

from grpc_tools import protoc
import grpc_tools

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join(os.path.dirname(os.path.dirname(HERE)), "proto")
FILES = ["kvlingo/v1/span.proto", "kvlingo/v1/node.proto", "kvlingo/v1/router.proto"]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else HERE
    os.makedirs(os.path.join(out, "kvlingo", "v1"), exist_ok=True)
    inc = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", "-I" + PROTO, "-I" + inc, "--python_out=" + out, "--grpc_python_out=" + out] + \
        [os.path.join(PROTO, f) for f in FILES]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for pkg in ("kvlingo", os.path.join("kvlingo", "v1")):
        open(os.path.join(out, pkg, "__init__.py"), "a").close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
