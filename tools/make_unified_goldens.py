#!/usr/bin/env python3
"""Goldens for the Gemma 4 12B (transformers' Gemma4Unified*): a tiny random checkpoint in both layouts it ships.

  12b-nested  Gemma4UnifiedForConditionalGeneration as save_pretrained writes it: model_type gemma4_unified with a
              gemma4_unified_text text_config, the text weights under `model.language_model.`, the encoder-free
              image and audio embedders (`model.embed_vision.*`, `model.embed_audio.*`) present, in shards
              with an index.
  12b-flat    Gemma4UnifiedForCausalLM: model_type gemma4_unified_text, keys under `model.`; its config.json also
              carries query_pre_attn_scalar, which some 12B configs hold and transformers' attention never reads
              (checked below: the file with it reproduces the logits of the model built without it).
Both hold the same text weights and prompt, so their goldens are identical. The 12B's own features at tiny widths:
k_eq_v full layers with ONE global KV head under 4 query heads (the real 12B: 16 on 1), 2 KV heads on sliding
layers, head dims 16/32, 5:1 pattern, no PLE, no MoE, window 8.

Per checkpoint the files tools/make_goldens.py writes (golden.json, logits.npy; debug/ for the flat one) and, for the
flat one, edges.json + edge-N.npy as tools/make_edge_goldens.py writes them (prompts of 1, 8, 9 and 40 tokens).

The reference is Gemma4UnifiedForCausalLM in float32 on the CPU, eager attention, holding exactly the bf16 values
saved, with the word-embedding scale bf16(sqrt(H)) as a bf16 model uses. Self-checks before anything counts:
  - the full Gemma4UnifiedForConditionalGeneration, fed token ids only, gives the same logits (the multimodal
    wrapper adds nothing to the text path);
  - both directories load with from_pretrained with no missing, unexpected or mismatched keys and reproduce the
    logits; the tensors on disk are the reference's bit for bit;
  - cached generate() gives the full-recomputation greedy ids.
Run (GPU machine: python3 with torch, transformers 5.17; no network, CPU only, ~20 s):
    python3 tools/make_unified_goldens.py --out OUTDIR      # OUTDIR/models/12b-*/ and OUTDIR/unified.tar.gz
"""
import argparse
import copy
import json
import os
import sys
import tarfile
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import (COMMON_TEXT, MM_TOKEN_IDS, N_GREEDY, PROMPT_LEN, ROPE, Failure, capture_debug,  # noqa: E402
                          check, draw_kind, force_eager, greedy_cached, greedy_full_recompute, layer_types_for,
                          logits_close, patch_embed_scales, read_all_tensors)

import transformers  # noqa: E402
from transformers import (Gemma4UnifiedAudioConfig, Gemma4UnifiedConfig, Gemma4UnifiedForCausalLM,  # noqa: E402
                          Gemma4UnifiedForConditionalGeneration, Gemma4UnifiedTextConfig, Gemma4UnifiedVisionConfig)

torch.set_grad_enabled(False)
transformers.logging.set_verbosity_error()

# Gemma4UnifiedTextConfig removes the PLE and MoE fields of Gemma4TextConfig
NOT_UNIFIED = {"vocab_size_per_layer_input", "hidden_size_per_layer_input", "enable_moe_block", "num_experts",
               "top_k_experts", "moe_intermediate_size"}
TEXT = {**{k: v for k, v in COMMON_TEXT.items() if k not in NOT_UNIFIED},
        **dict(vocab_size=640, hidden_size=96, intermediate_size=128, num_hidden_layers=12, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
               attention_k_eq_v=True, num_kv_shared_layers=0, use_double_wide_mlp=False,
               layer_types=layer_types_for(12, 6), use_bidirectional_attention="vision",
               rope_parameters=copy.deepcopy(ROPE))}
VISION = dict(patch_size=4, pooling_kernel_size=2, mm_embed_dim=32, mm_posemb_size=16, output_proj_dims=32)
AUDIO = dict(audio_embed_dim=16)
QUERY_PRE_ATTN_SCALAR = 24  # were it used, the attention scale would be 24**-0.5 instead of 1.0
EDGE_LENGTHS = (1, 8, 9, 40)


def text_config():
    return Gemma4UnifiedTextConfig(**copy.deepcopy(TEXT))


def full_config():
    return Gemma4UnifiedConfig(text_config=text_config(), vision_config=Gemma4UnifiedVisionConfig(**VISION),
                               audio_config=Gemma4UnifiedAudioConfig(**AUDIO), **MM_TOKEN_IDS)


def draw_text(model, seed):
    g = torch.Generator().manual_seed(seed)
    sd = model.state_dict()
    return {k: draw_kind(k, tuple(sd[k].shape), TEXT, g).to(torch.bfloat16).contiguous()
            for k in sorted(sd) if k != "lm_head.weight"}


def load_into(model, weights, prefix):
    """weights: `model.`-keyed bf16 tensors; loaded as float32 under `prefix` (the rest of the model untouched)."""
    sd = {prefix + k[len("model."):]: v.float() for k, v in weights.items()}
    res = model.load_state_dict(sd, strict=False)
    check(not res.unexpected_keys, f"unexpected keys: {res.unexpected_keys[:8]}")
    missing = [k for k in res.missing_keys if k.startswith(prefix)]
    check(not missing, f"missing text keys: {missing[:8]}")
    model.lm_head.weight.data.copy_(model.get_input_embeddings().weight.data)


def reference(args):
    for attempt in range(args.max_attempts):
        seed = args.seed + attempt
        model = Gemma4UnifiedForCausalLM(text_config()).float().eval()
        force_eager(model)
        check(type(model.model.layers[0]).__name__ == "Gemma4UnifiedTextDecoderLayer", "not the unified decoder")
        for i, layer in enumerate(model.model.layers):  # the 12B's geometry, as transformers built it
            full = TEXT["layer_types"][i] == "full_attention"
            at = layer.self_attn
            check(at.head_dim == (32 if full else 16), f"layer {i}: head_dim {at.head_dim}")
            check(getattr(at, "scaling", None) == 1.0, f"layer {i}: attention scaling {getattr(at, 'scaling', None)}")
            check(tuple(at.k_proj.weight.shape) == ((1 if full else 2) * at.head_dim, 96), f"layer {i}: k_proj")
            check((at.v_proj is None) == full, f"layer {i}: v_proj presence")
        w = draw_text(model, seed)
        load_into(model, w, "model.")
        scales = patch_embed_scales(model)
        gp = torch.Generator().manual_seed(seed + 7)
        prompt = [2] + torch.randint(4, TEXT["vocab_size"], (PROMPT_LEN - 1,), generator=gp).tolist()
        logits, debug = capture_debug(model, torch.tensor([prompt]))
        greedy, margins, maxabs_g = greedy_full_recompute(model, prompt, N_GREEDY)
        max_abs = float(logits.abs().max())
        ok = (bool(torch.isfinite(logits).all()) and min(margins) >= args.margin_rel * max(max_abs, maxabs_g)
              and 1 not in greedy and len(set(greedy)) >= args.min_distinct)
        print(f"seed {seed}: min margin {min(margins):.4f}, max|logit| {max_abs:.3f}, greedy {greedy}"
              f"{'' if ok else ' (rejected)'}", flush=True)
        if ok:
            return dict(model=model, weights=w, seed=seed, prompt=prompt, logits=logits, debug=debug, greedy=greedy,
                        margins=margins, max_abs=max_abs, scales=scales)
    raise Failure(f"no acceptable seed in {args.max_attempts} attempts")


def build_full(ref):
    """The multimodal model with the reference's text weights and random embedders; same logits on token ids."""
    full = Gemma4UnifiedForConditionalGeneration(full_config()).float().eval()
    force_eager(full)
    g = torch.Generator().manual_seed(ref["seed"] + 99)
    embedder = {}
    for k, v in full.state_dict().items():
        if k.startswith(("model.embed_vision.", "model.embed_audio.")):
            base = torch.rand(v.shape, generator=g) + 0.5 if k.endswith("norm.weight") or v.dim() == 1 else \
                torch.randn(v.shape, generator=g) * 0.1
            embedder[k] = base.to(torch.bfloat16)
    check(embedder and all(k.startswith(("model.embed_vision.", "model.embed_audio.")) for k in embedder),
          "no multimodal embedder tensors")
    others = [k for k in full.state_dict() if not k.startswith(("model.language_model.", "model.embed_vision.",
                                                                  "model.embed_audio.", "lm_head."))]
    check(not others, f"the unified model holds tensors outside text and embedders: {others[:8]}")
    full.load_state_dict({k: v.float() for k, v in embedder.items()}, strict=False)
    load_into(full, ref["weights"], "model.language_model.")
    patch_embed_scales(full)
    logits = full(input_ids=torch.tensor([ref["prompt"]]), use_cache=False).logits[0].float()
    ok, diff = logits_close(logits, ref["logits"], 1e-5)
    check(ok, f"Gemma4UnifiedForConditionalGeneration on token ids differs from the text model by {diff}")
    return full, embedder, diff


def save_bf16(model, d, shard):
    m = copy.deepcopy(model).to(torch.bfloat16)
    m.save_pretrained(d, max_shard_size=shard) if shard else m.save_pretrained(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    return cfg


def reload_check(cls, d, ref, expect, groups=()):
    """The text tensors on disk are `expect` bit for bit; every other one starts with a prefix of one of `groups`
    (tuples of alternative prefixes), and each group has at least one (save_pretrained names the vision embedder
    `model.vision_embedder.*`, not after its module `embed_vision`)."""
    disk = read_all_tensors(d)
    other = sorted(set(disk) - set(expect))
    check(set(expect) <= set(disk), f"{d}: text tensors missing on disk: {sorted(set(expect) - set(disk))[:8]}")
    allowed = tuple(p for g in groups for p in g)
    stray = [k for k in other if not (allowed and k.startswith(allowed))]
    check(not stray, f"{d}: unexpected tensors on disk: {stray[:8]}")
    for g in groups:
        check(any(k.startswith(g) for k in other), f"{d}: no tensor under {g} on disk")
    for k in expect:
        v = disk[k]
        check(v.dtype == torch.bfloat16 and torch.equal(v, expect[k]), f"{d}: tensor {k} differs on disk")
    model, info = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model.eval()
    force_eager(model)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        bad = [str(k) for k in info.get(key, []) if "lm_head" not in str(k)]
        check(not bad, f"{d}: from_pretrained {key}: {bad[:8]}")
    patch_embed_scales(model)
    logits = model(input_ids=torch.tensor([ref["prompt"]]), use_cache=False).logits[0].float()
    ok, diff = logits_close(logits, ref["logits"], 1e-5)
    check(ok, f"{d}: from_pretrained logits differ by {diff}")
    return diff, other


def write_golden(d, name, ref, checks, files, cached, notes):
    np.save(os.path.join(d, "logits.npy"), ref["logits"].numpy().astype(np.float32))
    golden = {
        "status": "ok", "model": name, "prompt_ids": ref["prompt"], "logits_file": "logits.npy",
        "logits_shape": list(ref["logits"].shape), "greedy_ids": ref["greedy"], "greedy_margins": ref["margins"],
        "greedy_min_margin": min(ref["margins"]), "max_abs_logit": ref["max_abs"],
        "tolerance": "max|logit-ref| <= 1e-4 * max|ref| over logits.npy; greedy_ids identical",
        "greedy_method": "full recomputation (use_cache=False), argmax of the last row",
        "cached_generate_ids": cached, "cached_generate_matches_full_recompute": cached == ref["greedy"],
        "embed_scale_used": ref["scales"]["embed_tokens"]["used"], "seed": ref["seed"],
        "checkpoint_files": files, "self_checks": checks, "notes": " | ".join(notes),
        "reference": {"library": "transformers", "class": "Gemma4UnifiedForCausalLM",
                      "transformers_version": transformers.__version__, "torch_version": torch.__version__,
                      "dtype": "float32 (weights are exactly the bf16 values saved)",
                      "attn_implementation": "eager", "device": "cpu"},
    }
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f, indent=2)


def write_edges(d, model, scales, seed):
    rng = np.random.default_rng(seed)
    cases = []
    for n in EDGE_LENGTHS:
        ids = [2] + [int(x) for x in rng.integers(3, TEXT["vocab_size"], size=n - 1)]
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
        check(np.isfinite(logits).all(), f"edge {n}: non-finite logits")
        np.save(os.path.join(d, f"edge-{n}.npy"), logits.astype(np.float32))
        cases.append({"n": n, "prompt_ids": ids, "logits_file": f"edge-{n}.npy",
                      "max_abs_logit": float(np.abs(logits).max())})
    meta = {"what": "transformers fp32 logits of every position for prompts at the sliding-window edges",
            "sliding_window": TEXT["sliding_window"], "cases": cases, "embed_scales_patched": scales,
            "reference": {"library": "transformers", "class": "Gemma4UnifiedForCausalLM",
                          "transformers_version": transformers.__version__, "attn_implementation": "eager",
                          "dtype": "float32", "device": "cpu"}}
    with open(os.path.join(d, "edges.json"), "w") as f:
        json.dump(meta, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--max-attempts", type=int, default=40)
    ap.add_argument("--margin-rel", type=float, default=2e-3)
    ap.add_argument("--min-distinct", type=int, default=6)
    args = ap.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    models = os.path.join(args.out, "models")
    os.makedirs(models, exist_ok=True)

    ref = reference(args)
    cached = greedy_cached(ref["model"], ref["prompt"], N_GREEDY)
    check(cached == ref["greedy"], f"cached generate {cached} != full recomputation {ref['greedy']}")
    full, embedder, wrapper_diff = build_full(ref)

    # nested: exactly what save_pretrained writes for the multimodal model, in two shards
    d = os.path.join(models, "12b-nested")
    os.makedirs(d, exist_ok=True)
    cfg = save_bf16(full, d, "200KB")
    check(cfg.get("model_type") == "gemma4_unified" and
          cfg.get("text_config", {}).get("model_type") == "gemma4_unified_text" and
          cfg.get("architectures") == ["Gemma4UnifiedForConditionalGeneration"], f"nested config.json: {cfg}")
    expect = {"model.language_model." + k[len("model."):]: v for k, v in ref["weights"].items()}
    nested_diff, on_disk = reload_check(Gemma4UnifiedForConditionalGeneration, d, ref, expect,
                                        [("model.vision_embedder.", "model.embed_vision."), ("model.embed_audio.",)])
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    check(len(files) >= 2, f"nested: expected a sharded checkpoint, got {files}")
    write_golden(d, "12b-nested", ref, {"wrapper_vs_text_model_max_abs_diff": wrapper_diff,
                                        "from_pretrained_max_abs_logit_diff": nested_diff}, files, cached,
                 ["config.json and shards written by transformers' save_pretrained (bf16)",
                  f"multimodal embedder tensors on disk: {on_disk}",
                  "same weights and prompt as 12b-flat"])

    # flat: the causal LM's save_pretrained, plus query_pre_attn_scalar, which transformers must ignore
    d = os.path.join(models, "12b-flat")
    os.makedirs(d, exist_ok=True)
    cfg = save_bf16(ref["model"], d, None)
    check(cfg.get("model_type") == "gemma4_unified_text", f"flat config.json model_type {cfg.get('model_type')}")
    cfg["query_pre_attn_scalar"] = QUERY_PRE_ATTN_SCALAR
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    flat_diff, _ = reload_check(Gemma4UnifiedForCausalLM, d, ref, ref["weights"])
    dbg = os.path.join(d, "debug")
    os.makedirs(dbg, exist_ok=True)
    for k, v in ref["debug"].items():
        np.save(os.path.join(dbg, f"{k}.npy"), v.astype(np.float32))
    write_golden(d, "12b-flat", ref, {"from_pretrained_with_query_pre_attn_scalar_max_abs_logit_diff": flat_diff},
                 ["model.safetensors"], cached,
                 ["config.json written by transformers' save_pretrained (bf16), then query_pre_attn_scalar "
                  f"{QUERY_PRE_ATTN_SCALAR} added: the reloaded model reproduces the logits, so transformers ignores it",
                  "same weights and prompt as 12b-nested"])
    write_edges(d, ref["model"], ref["scales"], args.seed + 5)
    for name in ("12b-flat", "12b-nested"):
        for junk in ("generation_config.json",):  # the goldens are greedy with eos ignored: no sampling settings
            p = os.path.join(models, name, junk)
            if os.path.exists(p):
                os.remove(p)

    tar = os.path.join(args.out, "unified.tar.gz")
    with tarfile.open(tar, "w:gz") as t:
        t.add(models, arcname="models")
    print(json.dumps({"ok": True, "tarball": tar, "bytes": os.path.getsize(tar), "seed": ref["seed"],
                      "greedy": ref["greedy"], "diffs": [wrapper_diff, nested_diff, flat_diff]}), flush=True)


if __name__ == "__main__":
    try:
        main()
    except Failure as e:
        sys.exit(f"FAILED: {e}")
