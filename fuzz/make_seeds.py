#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora under fuzz/corpus/<harness>/ from files the repository already holds:
the golden checkpoints' configs, the bundled model's generation_config.json, small hand-made safetensors files
and index, a tiny tokenizer.json, chat turns and argument lists. Run from the repository root; the output is
committed."""
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "fuzz", "corpus")


def put(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    header, blobs, off = {}, b"", 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs += blob
        off += len(blob)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + blobs


def main():
    models = os.path.join(ROOT, "tests", "data", "models")
    for m in sorted(os.listdir(models)):
        p = os.path.join(models, m, "config.json")
        if os.path.exists(p):
            put("config_json", m + ".json", open(p, "rb").read())
    put("config_json", "default.json", open(os.path.join(ROOT, "models", "default", "config.json"), "rb").read())
    fp8 = json.load(open(os.path.join(ROOT, "models", "default", "config.json")))
    fp8["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}},
        "ignore": ["lm_head", "re:.*router.*", "re:model\\.layers\\.[0-3]\\.(mlp|self_attn)\\..*_proj$"]}
    put("config_json", "default-fp8.json", json.dumps(fp8, indent=1))

    put("generation_config", "default.json",
        open(os.path.join(ROOT, "models", "default", "generation_config.json"), "rb").read())
    put("generation_config", "greedy.json", json.dumps({"do_sample": False, "eos_token_id": 1}))
    put("generation_config", "full.json", json.dumps({"temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05,
                                                      "repetition_penalty": 1.1, "eos_token_id": [1, 106]}))

    bf = struct.pack("<6H", *([0x3f80] * 6))
    put("safetensors", "two.safetensors", safetensors([("a", "BF16", [2, 3], bf), ("b", "F32", [2], b"\0" * 8)]))
    put("safetensors", "meta.safetensors", safetensors([("x", "BF16", [3], bf[:6])], {"format": "pt"}))
    put("safetensors", "empty.safetensors", safetensors([], {}))

    put("safetensors_index", "index.json", json.dumps({"metadata": {"total_size": 20}, "weight_map": {
        "model.a.weight": "model-00001-of-00002.safetensors", "model.b.weight": "model-00002-of-00002.safetensors"}}))

    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": 0, "content": "<bos>", "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True}],
           "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
           "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\n+"}, "behavior": "Isolated", "invert": False},
           "post_processor": None,
           "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"},
                                                         "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]},
           "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                     "vocab": {"<bos>": 0, "<unk>": 1, "a": 2, "b": 3, "ab": 4, "\u2581": 5, "\u2581ab": 6, "\n": 7,
                               "<0x41>": 8, "<0xC3>": 9, "<0xA9>": 10},
                     "merges": [["a", "b"], ["\u2581", "ab"]]}}
    put("tokenizer_json", "tiny.json", json.dumps(tok, ensure_ascii=False))

    put("chat", "one.txt", "Who are you?")
    put("chat", "turns.txt", "Be brief.\0Hello there\0<|channel>thought\nhmm<channel|>Hi!\0And again\n")
    put("chat", "specials.txt", "<bos><|turn>user\n\xc3\xa9t\xc3\xa9 <turn|>\0\t  \0")

    put("cli_args", "ids.txt", "--ids\x002,17,300\0-n\x0012\0--temp\x000")
    put("cli_args", "prompt.txt", "-m\0/tmp/m\0-p\0And God said\0--top-p=0.9\0--json\0-c\x004096")
    put("cli_args", "list.txt", "--ids\0[2, 17, 300]\0--n-predict=-1")


if __name__ == "__main__":
    main()
