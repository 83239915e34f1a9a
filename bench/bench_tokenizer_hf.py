#!/usr/bin/env python3
"""Hugging Face `tokenizers` figures for bench_tokenizer: load time of a tokenizer.json and
single-thread encode MB/s on a corpus encoded line by line (same protocol as bench_tokenizer.c:
best of 3 loads; first pass 'cold', best of 3 further passes 'warm').

usage: bench_tokenizer_hf.py [--table-row] TOKENIZER_JSON CORPUS
Exit status 77 when `tokenizers` is not importable.
"""
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"          # one thread, before tokenizers starts its pool
os.environ["TOKENIZERS_PARALLELISM"] = "false"
try:
    import tokenizers
except ImportError:
    print("tokenizers is not installed", file=sys.stderr)
    sys.exit(77)


def main():
    args = [a for a in sys.argv[1:] if a != "--table-row"]
    row = "--table-row" in sys.argv
    tj = args[0] if args else "build/testdata/tokenizers/qwen3/tokenizer.json"  # unpacked by the build
    corpus = args[1] if len(args) > 1 else "testdata/corpus/valid.txt"
    raw = open(corpus, "rb").read()
    lines = raw.decode("utf-8").splitlines(keepends=True)
    best_load = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        tok = tokenizers.Tokenizer.from_file(tj)
        best_load = min(best_load, time.perf_counter() - t0)
    t0 = time.perf_counter()
    n = sum(len(tok.encode(line, add_special_tokens=False).ids) for line in lines)
    cold = time.perf_counter() - t0
    warm = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        for line in lines:
            tok.encode(line, add_special_tokens=False)
        warm = min(warm, time.perf_counter() - t0)
    mb = len(raw) / 1e6
    name = f"HF tokenizers {tokenizers.__version__}"
    if row:
        print(f"| {name:<25} | {best_load * 1e3:7.1f} | {mb / cold:18.2f} | {mb / warm:18.2f} |")
    else:
        print(f"{name}: load {best_load * 1e3:.1f} ms, encode cold {mb / cold:.2f} MB/s, warm {mb / warm:.2f} MB/s, "
              f"{n} tokens, one thread")


if __name__ == "__main__":
    main()
