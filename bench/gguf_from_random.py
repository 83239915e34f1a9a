#!/usr/bin/env python3
"""bench/gguf_from_random.py: the same weights as a `kvlingo model random` directory, as a GGUF
file that llama.cpp loads, so `bench_llamacpp.sh` compares both runtimes on one model.

  gguf_from_random.py MODEL_DIR OUT.gguf [--dtype f16|f32] [--tokenizer tokenizer.json[.xz]]

MODEL_DIR: config.json + model.safetensors of a Qwen2 geometry (qwen2.5-0.5b, qwen2.5-1.5b),
bf16 or f32 on disk. Matrices are written in --dtype (f16 default: llama.cpp's 16-bit CPU
path), norms and biases in f32 as llama.cpp's own converter does. The vocabulary comes from the
Qwen tokenizer (testdata/tokenizers/qwen3, the same BPE as Qwen2.5), padded to vocab_size;
llama.cpp needs one to load a model, the benchmark never decodes text.

Needs the Python packages numpy and gguf (llama.cpp's writer, `pip install gguf numpy`).
"""
import argparse
import json
import lzma
import os
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("gguf_from_random.py: the Python package 'gguf' is missing (pip install gguf numpy)")

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TOKENIZER = os.path.join(os.path.dirname(HERE), "testdata", "tokenizers", "qwen3", "tokenizer.json.xz")

# Hugging Face tensor name (after "model.layers.N.") -> GGUF name (after "blk.N.")
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def read_safetensors(path):
    """Yields (name, float32 array) in file order."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            f.seek(base + a)
            raw = f.read(b - a)
            if t["dtype"] == "BF16":
                arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif t["dtype"] == "F32":
                arr = np.frombuffer(raw, np.float32)
            else:
                sys.exit(f"{path}: tensor {name}: dtype {t['dtype']} not handled (BF16 or F32)")
            yield name, arr.reshape(t["shape"])


def load_vocab(path, vocab_size):
    raw = lzma.open(path).read() if path.endswith(".xz") else open(path, "rb").read()
    tok = json.loads(raw)
    toks = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for s, i in tok["model"]["vocab"].items():
        if i < vocab_size:
            toks[i], types[i] = s, gguf.TokenType.NORMAL
    for a in tok["added_tokens"]:
        if a["id"] < vocab_size:
            toks[a["id"]], types[a["id"]] = a["content"], gguf.TokenType.CONTROL
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    return toks, types, merges


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="f16", choices=("f16", "f32"))
    ap.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    a = ap.parse_args()
    cfg_path = os.path.join(a.model_dir, "config.json")
    cfg = json.load(open(cfg_path))
    if cfg.get("model_type") != "qwen2":
        sys.exit(f"{cfg_path}: model_type {cfg.get('model_type')!r}: only qwen2 geometries are converted")
    if not cfg.get("tie_word_embeddings", False):
        sys.exit(f"{cfg_path}: tie_word_embeddings false: untied LM heads are not converted")
    mat_dtype = np.float16 if a.dtype == "f16" else np.float32
    w = gguf.GGUFWriter(a.out, "qwen2")
    w.add_name(os.path.basename(os.path.normpath(a.model_dir)))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if a.dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    toks, types, merges = load_vocab(a.tokenizer, cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(False)
    for name, arr in read_safetensors(os.path.join(a.model_dir, "model.safetensors")):
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name.startswith("model.layers."):
            layer, rest = name[len("model.layers."):].split(".", 1)
            if rest not in LAYER_NAMES:
                sys.exit(f"{a.model_dir}: tensor {name} has no GGUF name here")
            gname = f"blk.{layer}.{LAYER_NAMES[rest]}"
        else:
            sys.exit(f"{a.model_dir}: tensor {name} has no GGUF name here")
        w.add_tensor(gname, arr.astype(mat_dtype if arr.ndim == 2 else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"gguf_from_random.py: wrote {a.out} ({a.dtype})")


if __name__ == "__main__":
    main()
