#!/usr/bin/env python3
"""Write tests/tokenizer/features_golden.json: Hugging Face `tokenizers` ids for variants of the
shipped models' tokenizer.json that exercise each supported component option (Split behaviours and
invert, ByteLevel add_prefix_space/use_regex, added-token lstrip/rstrip/single_word/normalized,
ignore_merges, unk_token, "a b" merges).  test_tokenizer.c applies the same patches and checks
kvlingo's ids.  Needs `pip install tokenizers`; rerun only when the variants change.
"""
import json
import os
import sys

import tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BASE = os.path.join(ROOT, "models", "qwen3-a", "tokenizer.json")

QWEN_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
           "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def split(pattern, behavior, invert=False, regex=True):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern}, "behavior": behavior,
            "invert": invert}


def seq(*p):
    return {"type": "Sequence", "pretokenizers": list(p)}


def added(content, id_, **kw):
    d = {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False}
    d.update(kw)
    return d


TEXTS = [
    "Hello world, it's 2024-06-01!  Numbers 12345 and   spaces\n\nnew lines\r\n",
    "a1b22c333 d4444-e55555 ... x",
    "  leading and trailing  ",
    "x <mask> y<mask>z <mask>\t\tw",
    "[W] a[W] [W]b ([W]) _[W] é[W]",
    "Cafe\u0301 <norm> cafe\u0301 <NORM> <|end|> end<|end|>",
    "don't STOP 'til it's ſ done",
    "",
    "   ",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbb",
    "emoji 😀 and ümlaut and 中文",
]

VARIANTS = []
for beh in ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
    for inv in [False, True]:
        VARIANTS.append({"name": f"split_{beh}_{'inv' if inv else 'noinv'}",
                         "patch": {"pre_tokenizer": seq(split("\\d+|\\s", beh, inv), BL)}})
VARIANTS += [
    {"name": "split_string", "patch": {"pre_tokenizer": seq(split(" ", "MergedWithNext", False, regex=False), BL)}},
    {"name": "bytelevel_gpt2", "patch": {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True,
                                                             "trim_offsets": True, "use_regex": True}}},
    {"name": "bytelevel_gpt2_noprefix", "patch": {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                                                      "trim_offsets": True, "use_regex": True}}},
    {"name": "qwen_prefix_space", "patch": {"pre_tokenizer": seq(split(QWEN_RE, "Isolated"), dict(BL, add_prefix_space=True))}},
    {"name": "no_normalizer", "patch": {"normalizer": None}},
    {"name": "nfc_sequence", "patch": {"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]}}},
    {"name": "ignore_merges", "patch": {"model_set": {"ignore_merges": True}}},
    {"name": "string_merges", "patch": {"merges_as_strings": True}},
    {"name": "added_flags", "patch": {"added_tokens_append": [
        added("<mask>", 4096, lstrip=True, rstrip=True),
        added("[W]", 4097, single_word=True),
        added("<norm>", 4098, normalized=True),
        added("café", 4099, normalized=True),
        added("<|end|>", 4100, special=True),
        added("<|en", 4101, special=True),
    ]}},
]


def apply(conf, patch):
    conf = json.loads(json.dumps(conf))
    for k in ("normalizer", "pre_tokenizer"):
        if k in patch:
            conf[k] = patch[k]
    conf["model"].update(patch.get("model_set", {}))
    if patch.get("merges_as_strings"):
        conf["model"]["merges"] = [" ".join(m) for m in conf["model"]["merges"]]
    conf["added_tokens"] = conf["added_tokens"] + patch.get("added_tokens_append", [])
    return conf


def main():
    base = json.load(open(BASE, encoding="utf-8"))
    out = {"tokenizers_version": tokenizers.__version__, "base": "models/qwen3-a/tokenizer.json", "variants": []}
    for v in VARIANTS:
        tok = tokenizers.Tokenizer.from_str(json.dumps(apply(base, v["patch"])))
        cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in TEXTS]
        out["variants"].append({"name": v["name"], "patch": v["patch"], "cases": cases})
    path = os.path.join(HERE, "features_golden.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
    print(f"wrote {path}: {len(VARIANTS)} variants x {len(TEXTS)} texts")


if __name__ == "__main__":
    sys.exit(main())
