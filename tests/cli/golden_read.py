#!/usr/bin/env python3
"""Print a golden int32/float tensor from a safetensors file as comma-separated values.

Standard library only (the format is an 8-byte header length, a JSON header, then raw data), so
the CLI tests need no numpy/torch.  usage: golden_read.py FILE TENSOR"""
import json
import struct
import sys

path, name = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
    info = header[name]
    begin, end = info["data_offsets"]
    f.seek(8 + n + begin)
    raw = f.read(end - begin)
fmt = {"I32": "i", "F32": "f", "I64": "q"}[info["dtype"]]
vals = struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw)
print(",".join(str(v) for v in vals))
