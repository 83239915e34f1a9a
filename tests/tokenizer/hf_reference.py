#!/usr/bin/env python3
"""Reference ids from Hugging Face `tokenizers` for kvlingo's differential tokenizer test.

Generates N seeded random strings per vocabulary (random Unicode from many scripts, emoji,
combining marks, digits, whitespace runs, CR/LF, special-token text, long words, ...) and writes,
for each, the ids of `Tokenizer.encode(s, add_special_tokens=False)`, the Hugging Face decode of
those ids, and the expected round trip (the normalizer applied to s: NFC for Qwen, s for Llama 3).

Exit status 77 when the `tokenizers` package cannot be imported (the C test reports SKIPPED).

usage: hf_reference.py --out FILE [--n 5000] [--seed 1234] NAME=TOKENIZER_JSON ...
"""
import argparse
import json
import random
import sys
import unicodedata

try:
    import tokenizers
except ImportError:
    print("SKIPPED: python package 'tokenizers' is not importable (pip install tokenizers)")
    sys.exit(77)

# Blocks stable since Unicode <= 6 (avoids characters whose properties differ between the Unicode
# versions of Oniguruma, PCRE2, utf8proc and Python's unicodedata).
SCRIPTS = [
    (0x0041, 0x007A), (0x00C0, 0x024F), (0x0370, 0x03FF), (0x0400, 0x04FF), (0x0531, 0x0587),
    (0x05D0, 0x05EA), (0x0620, 0x064A), (0x0904, 0x0939), (0x0980, 0x09FA), (0x0E01, 0x0E5B),
    (0x10A0, 0x10FA), (0x1100, 0x11FF), (0x1E00, 0x1FFF), (0x2000, 0x206F), (0x2100, 0x22FF),
    (0x3041, 0x30FF), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3), (0xFF01, 0xFF9F),
]
EMOJI = [(0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6C5)]
COMBINING = [(0x0300, 0x036F), (0x0483, 0x0487), (0x0591, 0x05BD), (0x093C, 0x094D), (0x3099, 0x309A)]
DIGITS = "0123456789" + "٠١٢٣٤٥٦٧٨٩" + "०१२३४५६७८९" + "０１２３４５６７８９" + "²³¹½¼ⅧⅫ"
SPACES = [" ", "  ", "\t", "\u00a0", "\u3000", "\u2003", "\u2009", "\u0085", "\u2028", "\u200b", "\u180e",
          "\u000b", "\u000c", "\u001c"]
NEWLINES = ["\n", "\r\n", "\r", "\n\n", "\r\n\r\n", " \n", "\n ", "\t\n"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "--", "“", "”", "’", "«", "»", "。", "、", "！", "…"]
APOS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'ſ", "'Re", "ſ", "K", "'x"]
WORDS = ["the", "The", "hello", "world", "Qwen", "tokenizer", "naïve", "café", "Straße", "İstanbul",
         "ﬁnance", "Ⅻ", "東京", "안녕하세요", "привет", "γειά", "مرحبا", "שלום", "नमस्ते", "ภาษาไทย"]


def pick(rng, ranges):
    while True:
        lo, hi = rng.choice(ranges)
        c = chr(rng.randint(lo, hi))
        if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
            return c


def fragment(rng, specials):
    k = rng.randrange(12)
    if k == 0:
        return "".join(pick(rng, SCRIPTS) for _ in range(rng.randint(1, 12)))
    if k == 1:
        return "".join(pick(rng, EMOJI) for _ in range(rng.randint(1, 4))) + rng.choice(["", "\u200d", "\ufe0f", "\U0001F3FD"])
    if k == 2:
        return pick(rng, SCRIPTS) + "".join(pick(rng, COMBINING) for _ in range(rng.randint(1, 3)))
    if k == 3:
        return "".join(rng.choice(DIGITS) for _ in range(rng.randint(1, 14)))
    if k == 4:
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 6)))
    if k == 5:
        return rng.choice(NEWLINES) * rng.randint(1, 3)
    if k == 6 and specials:
        s = rng.choice(specials)
        r = rng.random()
        if r < 0.15:
            return s[: rng.randint(1, max(1, len(s) - 1))]  # partial special-token text
        if r < 0.25:
            return " " + s + " "
        return s
    if k == 7:
        n = rng.choice([30, 80, 200, 600])
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)) if rng.random() < 0.5 \
            else rng.choice("xaZ9 -=") * n
    if k == 8:
        return rng.choice(PUNCT) * rng.randint(1, 3)
    if k == 9:
        return rng.choice(APOS)
    if k == 10:
        return rng.choice(WORDS)
    return rng.choice(["", " "]) + "".join(pick(rng, [(0x61, 0x7A), (0x41, 0x5A)]) for _ in range(rng.randint(1, 9)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("vocabs", nargs="+")
    a = ap.parse_args()
    out = {"tokenizers_version": tokenizers.__version__, "vocabs": []}
    for spec in a.vocabs:
        name, path = spec.split("=", 1)
        tok = tokenizers.Tokenizer.from_file(path)
        conf = json.load(open(path, encoding="utf-8"))
        specials = [t["content"] for t in conf.get("added_tokens", [])]
        nfc = conf.get("normalizer") is not None
        rng = random.Random(f"{a.seed}:{name}")
        texts = ["".join(fragment(rng, specials) for _ in range(rng.randint(1, 12))) for _ in range(a.n)]
        encs = tok.encode_batch(texts, add_special_tokens=False)
        ids = [e.ids for e in encs]
        decoded = tok.decode_batch(ids, skip_special_tokens=False)
        cases = []
        for t, i, d in zip(texts, ids, decoded):
            cases.append({"text": t, "ids": i, "hf_decoded": d,
                          "roundtrip": unicodedata.normalize("NFC", t) if nfc else t})
        out["vocabs"].append({"name": name, "path": path, "cases": cases})
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    print(f"tokenizers {tokenizers.__version__}: wrote {sum(len(v['cases']) for v in out['vocabs'])} cases to {a.out}")


if __name__ == "__main__":
    main()
