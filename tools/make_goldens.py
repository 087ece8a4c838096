#!/usr/bin/env python3
"""Tiny random-weight Gemma 4 checkpoints plus Hugging Face transformers reference outputs ("goldens").

MarkBase's CPU engine must reproduce, for every checkpoint written here:
  max |logit - ref| <= 1e-4 * max |ref|  over logits.npy, and exactly the greedy ids in golden.json.

Run (GPU machine or any machine with python3.12, torch, transformers 5.17, safetensors, numpy; no network needed):
    python3 tools/make_goldens.py --out OUTDIR
Writes OUTDIR/models/<name>/... and finally OUTDIR/goldens.tar.gz (holding the folder models/).
Exit code 0 means every hard check passed. On a failure the tarball is still written: the failing model's
golden.json is renamed golden.FAILED.json, and models/SUMMARY.json lists the failures.

Four families (e2b, e4b, 26b, 31b), each in two layouts:
  <fam>-flat    Gemma4ForCausalLM, model_type gemma4_text, keys under `model.`
  <fam>-nested  Gemma4ForConditionalGeneration, model_type gemma4 + text_config, keys under `model.language_model.`,
                plus dummy vision/audio tensors and (e2b/e4b) unused k_proj/v_proj/k_norm tensors of KV-shared layers.
Both layouts of a family hold the same text weights and the same prompt, so their goldens are identical.

The reference is computed on the CPU in float32 with attn_implementation="eager", using exactly the bf16-rounded
weights that are saved. The one deliberate deviation from a plain fp32 model: the word-embedding scale sqrt(H) is
patched to bf16(sqrt(H)), as a bf16 model computes it (HF casts the scale to the weight dtype). MarkBase uses that
value. See golden.json "embed_scale_used".
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys
import tarfile
import tempfile
import traceback

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import transformers
from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4TextConfig

torch.set_grad_enabled(False)
transformers.logging.set_verbosity_error()

PROMPT_LEN = 27          # >= 2 * sliding_window + a few
N_GREEDY = 12
SLIDING_WINDOW = 8
MAX_POS = 256
SOFTCAP = 30.0
EOS_ID = 1

POST_NORM_RANGE = (1.5, 3.0)

ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}


def layer_types_for(n_layers, period):
    t = ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(n_layers)]
    t[-1] = "full_attention"
    return t


# --------------------------------------------------------------------------------------------------------------------
# Family specs: the text config each family's reference model is built from (Gemma4TextConfig kwargs, released form).
# "layouts" says which config form each checkpoint uses and which checkpoints are sharded.
# --------------------------------------------------------------------------------------------------------------------
FAMILIES = {
    "e2b": dict(
        text=dict(vocab_size=512, vocab_size_per_layer_input=512, hidden_size=72, intermediate_size=64,
                  num_hidden_layers=10, num_attention_heads=4, num_key_value_heads=1, head_dim=16, global_head_dim=32,
                  # set but must be IGNORED (attention_k_eq_v is false), so full layers keep 1 kv head
                  num_global_key_value_heads=2,
                  attention_k_eq_v=False, use_double_wide_mlp=True, num_kv_shared_layers=5,
                  hidden_size_per_layer_input=16, enable_moe_block=False,
                  layer_types=layer_types_for(10, 5), use_bidirectional_attention=None),
        flat_form="per_layer_config", nested_form="released", shard_flat=False, shard_nested=False,
        audio=True),
    "e4b": dict(
        text=dict(vocab_size=640, vocab_size_per_layer_input=640, hidden_size=88, intermediate_size=96,
                  num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                  num_global_key_value_heads=None,
                  attention_k_eq_v=False, use_double_wide_mlp=False, num_kv_shared_layers=4,
                  hidden_size_per_layer_input=16, enable_moe_block=False,
                  layer_types=layer_types_for(12, 6), use_bidirectional_attention=None),
        flat_form="released_min", nested_form="per_layer_config", shard_flat=False, shard_nested=False,
        audio=True),
    "26b": dict(
        text=dict(vocab_size=512, vocab_size_per_layer_input=512, hidden_size=80, intermediate_size=64,
                  num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                  num_global_key_value_heads=1,
                  attention_k_eq_v=True, use_double_wide_mlp=False, num_kv_shared_layers=0,
                  hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=16, top_k_experts=4,
                  moe_intermediate_size=16,
                  # 5:1 with the last layer forced full: S S S S S F S F
                  layer_types=layer_types_for(8, 6), use_bidirectional_attention="vision"),
        flat_form="per_layer_config", nested_form="released_expert_key", shard_flat=True, shard_nested=False,
        audio=False),
    "31b": dict(
        text=dict(vocab_size=768, vocab_size_per_layer_input=768, hidden_size=104, intermediate_size=96,
                  num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                  num_global_key_value_heads=1,
                  attention_k_eq_v=True, use_double_wide_mlp=False, num_kv_shared_layers=0,
                  hidden_size_per_layer_input=0, enable_moe_block=False,
                  layer_types=layer_types_for(12, 6), use_bidirectional_attention="vision"),
        flat_form="released_expert_null", nested_form="per_layer_config", shard_flat=False, shard_nested=True,
        audio=False),
}

COMMON_TEXT = dict(
    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=MAX_POS, rms_norm_eps=1e-6,
    pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True, attention_bias=False,
    attention_dropout=0.0, sliding_window=SLIDING_WINDOW, final_logit_softcapping=SOFTCAP, initializer_range=0.02,
    use_cache=True, num_experts=None, top_k_experts=None, moe_intermediate_size=None,
)

# small, self-consistent sub-configs written into the nested config.json (the towers are never built here)
VISION_CFG = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=16, patch_size=4,
                  position_embedding_size=16, pooling_kernel_size=3, rms_norm_eps=1e-6)
AUDIO_CFG = dict(model_type="gemma4_audio", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 subsampling_conv_channels=[8, 4], output_proj_dims=48, rms_norm_eps=1e-6)
MM_TOKEN_IDS = dict(boi_token_id=255999, eoi_token_id=258882, image_token_id=258880, video_token_id=258884,
                    boa_token_id=256000, eoa_token_index=258883, audio_token_id=258881)


def full_text_spec(fam):
    s = dict(COMMON_TEXT)
    s.update(FAMILIES[fam]["text"])
    s["rope_parameters"] = copy.deepcopy(ROPE)
    return s


def layer_geom(spec, i):
    """(layer_type, head_dim, kv_heads, kv_shared) exactly as transformers derives them from the released keys."""
    t = spec["layer_types"][i]
    full = t == "full_attention"
    d = spec["global_head_dim"] if full else spec["head_dim"]
    kv = spec["num_key_value_heads"]
    if full and spec["attention_k_eq_v"] and spec["num_global_key_value_heads"] is not None:
        kv = spec["num_global_key_value_heads"]
    first_shared = spec["num_hidden_layers"] - spec["num_kv_shared_layers"]
    return t, d, kv, i >= first_shared


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def bf16_round(x):
    return float(torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).float())


# --------------------------------------------------------------------------------------------------------------------
# Model construction
# --------------------------------------------------------------------------------------------------------------------
def text_model_of(model):
    """Gemma4TextModel inside Gemma4ForCausalLM (model.model) or Gemma4ForConditionalGeneration (model.model.language_model)."""
    inner = model.model
    return inner.language_model if hasattr(inner, "language_model") else inner


def force_eager(model):
    try:
        model.set_attn_implementation("eager")
    except Exception:  # older API
        model.config._attn_implementation = "eager"
    impl = model.config._attn_implementation
    check(impl == "eager", f"could not switch attention to eager (got {impl!r})")
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception:
            pass


def patch_embed_scales(model):
    """Set the word-embedding scale to bf16(sqrt(H)) (and the PLE scale to bf16(sqrt(P))), as a bf16 model uses."""
    tm = text_model_of(model)
    out = {}
    for name in ("embed_tokens", "embed_tokens_per_layer"):
        emb = getattr(tm, name, None)
        if emb is None:
            continue
        check(hasattr(emb, "embed_scale"), f"{name} has no embed_scale buffer: transformers API changed")
        dim = emb.weight.shape[1] if name == "embed_tokens" else tm.config.hidden_size_per_layer_input
        exact = float(torch.tensor(dim ** 0.5, dtype=torch.float32))
        val = bf16_round(dim ** 0.5)
        emb.embed_scale.fill_(val)
        if hasattr(emb, "scalar_embed_scale"):
            emb.scalar_embed_scale = val
        ids = torch.tensor([[3, 5]])
        got = emb(ids)
        want = torch.nn.functional.embedding(ids, emb.weight) * val
        check(torch.equal(got, want), f"{name}: patched embed scale is not what forward() uses")
        out[name] = {"attribute": f"{type(emb).__name__}.embed_scale (buffer) and .scalar_embed_scale",
                     "dim": dim, "used": val, "exact_fp32": exact}
    return out


def build_reference(spec):
    cfg = Gemma4TextConfig(**copy.deepcopy(spec))
    model = Gemma4ForCausalLM(cfg).float().eval()
    force_eager(model)
    return model


def check_geometry(model, spec):
    tm = text_model_of(model)
    check(len(tm.layers) == spec["num_hidden_layers"], "layer count")
    H = spec["hidden_size"]
    for i, layer in enumerate(tm.layers):
        t, d, kv, shared = layer_geom(spec, i)
        at = layer.self_attn
        check(at.head_dim == d, f"layer {i}: head_dim {at.head_dim} != {d}")
        check(tuple(at.q_proj.weight.shape) == (spec["num_attention_heads"] * d, H), f"layer {i}: q_proj shape")
        check(bool(at.is_kv_shared_layer) == shared, f"layer {i}: kv-shared flag")
        if shared:
            check(getattr(at, "k_proj", None) is None, f"layer {i}: shared layer has k_proj")
        else:
            check(tuple(at.k_proj.weight.shape) == (kv * d, H), f"layer {i}: k_proj shape {tuple(at.k_proj.weight.shape)}")
            has_v = at.v_proj is not None
            check(has_v == (not (t == "full_attention" and spec["attention_k_eq_v"])), f"layer {i}: v_proj presence")
        mult = 2 if (spec["use_double_wide_mlp"] and shared) else 1
        check(tuple(layer.mlp.gate_proj.weight.shape) == (spec["intermediate_size"] * mult, H), f"layer {i}: mlp width")


# --------------------------------------------------------------------------------------------------------------------
# Random weights
# --------------------------------------------------------------------------------------------------------------------
def draw_kind(name, shape, spec, g):
    H = spec["hidden_size"]
    last = shape[-1] if len(shape) else 1

    def u(lo, hi):
        return torch.rand(shape, generator=g) * (hi - lo) + lo

    def n(std):
        return torch.randn(shape, generator=g) * std

    if name.endswith("embed_tokens.weight"):
        return n(6.0 / (math.sqrt(H) * 1.04))           # final logits ~ N(0, 6) before the softcap
    if name.endswith("embed_tokens_per_layer.weight"):
        return n(0.25)
    if name.endswith("layer_scalar"):
        return u(0.6, 1.2)
    if name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
        return u(0.4, 1.0)
    if len(shape) == 1 and name.endswith(".weight") and "norm" in name:
        # the post-norms that write into the residual stream get larger weights, so the stream is not dominated
        # by the current token's embedding (with tied embeddings that makes greedy decoding repeat one token)
        if name.split(".")[-2] in ("post_attention_layernorm", "post_feedforward_layernorm", "post_per_layer_input_norm"):
            return u(*POST_NORM_RANGE)
        return u(0.5, 1.5)                                 # every other RMSNorm with a weight
    if name.endswith("router.scale") or name.endswith("router.per_expert_scale"):
        return u(0.5, 1.5)
    if name.endswith("router.proj.weight"):
        return n(2.0)                                      # router logits ~ N(0, 2): no near-tie top-k choices
    if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj") or name.endswith(".weight"):
        check(len(shape) >= 2, f"unexpected 1-D tensor {name}")
        return n(last ** -0.5)
    raise Failure(f"no drawing rule for state-dict key {name} {tuple(shape)}")


def draw_text_weights(model, spec, seed):
    """bf16 tensors for every checkpoint key of the flat layout (`model.` prefix, no lm_head)."""
    g = torch.Generator().manual_seed(seed)
    sd = model.state_dict()
    out = {}
    for k in sorted(sd):
        if k == "lm_head.weight":
            continue
        out[k] = draw_kind(k, tuple(sd[k].shape), spec, g).to(torch.bfloat16).contiguous()
    return out


def load_text_weights(model, w_bf16, prefix_map=("model.", "model.")):
    src, dst = prefix_map
    sd = {}
    for k, v in w_bf16.items():
        check(k.startswith(src), f"key {k} lacks prefix {src}")
        sd[dst + k[len(src):]] = v.float()
    res = model.load_state_dict(sd, strict=False)
    missing = set(res.missing_keys) - {"lm_head.weight"}
    check(not missing, f"missing keys: {sorted(missing)[:10]}")
    check(not res.unexpected_keys, f"unexpected keys: {sorted(res.unexpected_keys)[:10]}")
    emb = text_model_of(model).embed_tokens.weight
    if not torch.equal(model.lm_head.weight, emb):
        model.lm_head.weight.data.copy_(emb.data)  # keep the tie even if parameters are not shared
    check(torch.equal(model.lm_head.weight, emb), "lm_head is not tied to embed_tokens")


# --------------------------------------------------------------------------------------------------------------------
# Reference computations
# --------------------------------------------------------------------------------------------------------------------
class RouterGap:
    """Records the smallest log-probability gap between the k-th and (k+1)-th expert over all routed tokens."""

    def __init__(self, model, k):
        self.k, self.min_gap, self.handles = k, float("inf"), []
        for m in model.modules():
            if type(m).__name__ == "Gemma4TextRouter":
                self.handles.append(m.register_forward_hook(self.hook))

    def hook(self, mod, inp, out):
        probs = (out[0] if isinstance(out, (tuple, list)) else out).float()
        top = torch.topk(probs, self.k + 1, dim=-1).values.clamp_min(1e-30).log()
        self.min_gap = min(self.min_gap, float((top[:, self.k - 1] - top[:, self.k]).min()))

    def close(self):
        for h in self.handles:
            h.remove()


def capture_debug(model, ids):
    """Embedding output, every decoder layer output and the final-norm output for the prompt."""
    tm = text_model_of(model)
    rec = {"layers": [None] * len(tm.layers)}
    hs = [tm.embed_tokens.register_forward_hook(lambda m, i, o: rec.__setitem__("embed", o.detach().clone())),
          tm.norm.register_forward_hook(lambda m, i, o: rec.__setitem__("final_norm", o.detach().clone()))]
    for li, layer in enumerate(tm.layers):
        def h(m, i, o, li=li):
            rec["layers"][li] = (o[0] if isinstance(o, (tuple, list)) else o).detach().clone()
        hs.append(layer.register_forward_hook(h))
    try:
        logits = model(input_ids=ids, use_cache=False).logits
    finally:
        for h_ in hs:
            h_.remove()
    check(all(x is not None for x in rec["layers"]) and "embed" in rec and "final_norm" in rec, "debug hooks did not fire")
    return logits[0].float(), {
        "embeddings": rec["embed"][0].float().numpy(),
        "layer_outputs": torch.stack([x[0] for x in rec["layers"]]).float().numpy(),
        "final_norm": rec["final_norm"][0].float().numpy(),
    }


def greedy_full_recompute(model, prompt, n):
    seq = list(prompt)
    ids, margins, maxabs = [], [], 0.0
    for _ in range(n):
        logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        top = torch.topk(logits, 2)
        nxt = int(top.indices[0])
        check(nxt == int(torch.argmax(logits)), "topk/argmax disagree")
        margins.append(float(top.values[0] - top.values[1]))
        maxabs = max(maxabs, float(logits.abs().max()))
        ids.append(nxt)
        seq.append(nxt)
    return ids, margins, maxabs


def greedy_cached(model, prompt, n):
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    ids = torch.tensor([prompt])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
    seq = out.sequences if hasattr(out, "sequences") else out
    check(seq[0, :len(prompt)].tolist() == list(prompt), "generate() changed the prompt")
    return seq[0, len(prompt):].tolist()


def make_reference(fam, args, log):
    spec = full_text_spec(fam)
    V = spec["vocab_size"]
    last_err = None
    for attempt in range(args.max_attempts):
        seed = args.seed + 1000 * list(FAMILIES).index(fam) + attempt
        model = build_reference(spec)
        check_geometry(model, spec)
        w = draw_text_weights(model, spec, seed)
        load_text_weights(model, w)
        scales = patch_embed_scales(model)
        gp = torch.Generator().manual_seed(seed + 7)
        prompt = [2] + (torch.randint(4, V, (PROMPT_LEN - 1,), generator=gp)).tolist()

        router = RouterGap(model, spec["top_k_experts"]) if spec["enable_moe_block"] else None
        logits, debug = capture_debug(model, torch.tensor([prompt]))
        greedy, margins, maxabs_g = greedy_full_recompute(model, prompt, N_GREEDY)
        if router:
            router.close()
        max_abs = float(logits.abs().max())
        min_margin = min(margins)
        reasons = []
        if not torch.isfinite(logits).all():
            reasons.append("non-finite logits")
        if min_margin < args.margin_rel * max(max_abs, maxabs_g):
            reasons.append(f"greedy margin {min_margin:.4g} < {args.margin_rel} * max|logit|")
        if EOS_ID in greedy:
            reasons.append("greedy hits eos id 1")
        if len(set(greedy)) < args.min_distinct:
            reasons.append(f"greedy ids not diverse enough ({len(set(greedy))} distinct: {greedy})")
        if router and router.min_gap < args.router_gap:
            reasons.append(f"router top-k gap {router.min_gap:.3g} < {args.router_gap}")
        if reasons:
            log(f"  {fam}: seed {seed} rejected: {'; '.join(reasons)}")
            last_err = reasons
            continue
        log(f"  {fam}: seed {seed} accepted (min margin {min_margin:.4f}, max|logit| {max_abs:.3f}, greedy {greedy})")
        return dict(spec=spec, model=model, weights=w, seed=seed, attempt=attempt, prompt=prompt, logits=logits,
                    debug=debug, greedy=greedy, margins=margins, max_abs=max_abs, max_abs_greedy=maxabs_g,
                    scales=scales, router_min_gap=(router.min_gap if router else None))
    raise Failure(f"{fam}: no acceptable seed in {args.max_attempts} attempts (last: {last_err})")


# --------------------------------------------------------------------------------------------------------------------
# Config files
# --------------------------------------------------------------------------------------------------------------------
def released_text_dict(spec, drop_defaults=False):
    d = copy.deepcopy(spec)
    d["model_type"] = "gemma4_text"
    d["dtype"] = "bfloat16"
    if drop_defaults:  # keys a loader must fill in from Gemma4TextConfig's class defaults
        for k in ("rms_norm_eps", "hidden_activation", "attention_bias", "attention_dropout", "tie_word_embeddings",
                  "pad_token_id", "eos_token_id", "bos_token_id", "initializer_range", "use_cache"):
            d.pop(k, None)
    return d


def manual_per_layer_config(spec):
    """The per_layer_config form built by hand (only used if transformers does not write it itself)."""
    L = spec["num_hidden_layers"]
    digits = len(str(L - 1))
    plc = {}
    for i in range(L):
        t, d, kv, _ = layer_geom(spec, i)
        ov = {}
        if d != spec["head_dim"]:
            ov["head_dim"] = d
        if kv != spec["num_key_value_heads"]:
            ov["num_key_value_heads"] = kv
        if ov:
            plc[str(i).zfill(digits)] = ov
    return plc


def saved_by_transformers(cfg_obj):
    with tempfile.TemporaryDirectory() as td:
        cfg_obj.save_pretrained(td)
        with open(os.path.join(td, "config.json")) as f:
            return json.load(f)


def per_layer_text_form(spec, notes):
    """What transformers 5.17 writes for this text config (save_pretrained -> to_diff_dict)."""
    cfg = Gemma4TextConfig(**copy.deepcopy(spec))
    d = saved_by_transformers(cfg)
    ok = "per_layer_config" in d and "global_head_dim" not in d and "num_global_key_value_heads" not in d
    if not ok:
        notes.append("transformers did not write per_layer_config on save; it was added by hand in the same format")
        d.pop("global_head_dim", None)
        d.pop("num_global_key_value_heads", None)
        d["per_layer_config"] = manual_per_layer_config(spec)
    else:
        notes.append("config.json text part written by transformers' own save_pretrained (per_layer_config form)")
    d["dtype"] = "bfloat16"
    return d


def flat_config(fam, form, spec, notes):
    if form == "per_layer_config":
        d = per_layer_text_form(spec, notes)
    elif form == "released_min":
        d = released_text_dict(spec, drop_defaults=True)
        notes.append("released key form (global_head_dim); default-valued keys omitted on purpose: rms_norm_eps, "
                     "hidden_activation, attention_bias, attention_dropout, tie_word_embeddings, pad/eos/bos ids, "
                     "initializer_range, use_cache")
    elif form == "released_expert_null":
        d = released_text_dict(spec)
        d["expert_intermediate_size"] = None
        notes.append("released key form (global_head_dim, num_global_key_value_heads), plus "
                     "expert_intermediate_size: null as in the re-published 31B config")
    else:
        raise Failure(f"unknown flat form {form}")
    d["architectures"] = ["Gemma4ForCausalLM"]
    d["model_type"] = "gemma4_text"
    return d


def nested_config(fam, form, spec, notes):
    audio = FAMILIES[fam]["audio"]
    if form == "per_layer_config":
        text = per_layer_text_form(spec, notes)
        text.pop("architectures", None)
        text.pop("transformers_version", None)
        try:  # the whole nested file as transformers writes it
            top_obj = Gemma4Config(text_config=Gemma4TextConfig(**copy.deepcopy(spec)), vision_config=dict(VISION_CFG),
                                   audio_config=dict(AUDIO_CFG) if audio else None, **MM_TOKEN_IDS)
            top = saved_by_transformers(top_obj)
            if "per_layer_config" not in top.get("text_config", {}):
                raise Failure("nested save lacks text_config.per_layer_config")
            notes.append("nested config.json written by transformers' Gemma4Config.save_pretrained")
        except Exception as e:  # fall back to assembling it around the text part
            notes.append(f"nested Gemma4Config.save_pretrained failed or lacked per_layer_config ({e!r}); "
                         "assembled by hand around the transformers-written text_config")
            top = dict(model_type="gemma4", text_config=text, vision_config=dict(VISION_CFG),
                       audio_config=dict(AUDIO_CFG) if audio else None, tie_word_embeddings=True, **MM_TOKEN_IDS)
        top["text_config"]["dtype"] = "bfloat16"
    else:
        text = released_text_dict(spec)
        if form == "released_expert_key":
            text["expert_intermediate_size"] = text.pop("moe_intermediate_size")
            notes.append("released key form; the expert width is given ONLY as text_config.expert_intermediate_size "
                         "(no moe_intermediate_size key). transformers 5.17 does not map that key (it becomes an "
                         "unused attribute), so the self-check renames it to moe_intermediate_size before handing "
                         "the file to transformers; the reference model was built with moe_intermediate_size="
                         f"{spec['moe_intermediate_size']}")
        else:
            notes.append("released key form (global_head_dim, num_global_key_value_heads)")
        text.pop("dtype", None)
        text["dtype"] = "bfloat16"
        top = dict(model_type="gemma4", text_config=text, vision_config=dict(VISION_CFG),
                   audio_config=dict(AUDIO_CFG) if audio else None, tie_word_embeddings=True,
                   initializer_range=0.02, **MM_TOKEN_IDS)
    top["architectures"] = ["Gemma4ForConditionalGeneration"]
    top["model_type"] = "gemma4"
    top["dtype"] = "bfloat16"
    top.setdefault("transformers_version", transformers.__version__)
    return top


# --------------------------------------------------------------------------------------------------------------------
# Checkpoint files
# --------------------------------------------------------------------------------------------------------------------
def nested_extra_tensors(spec, audio, seed):
    g = torch.Generator().manual_seed(seed + 99)
    H = spec["hidden_size"]
    ex = {}
    r = lambda *s: (torch.randn(s, generator=g) * 0.1).to(torch.bfloat16).contiguous()
    ex["model.vision_tower.patch_embedder.input_proj.weight"] = r(32, 48)
    ex["model.vision_tower.patch_embedder.position_embedding_table"] = r(2, 16, 32)
    ex["model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight"] = r(32, 32)
    ex["model.embed_vision.embedding_projection.weight"] = r(H, 32)
    if audio:
        ex["model.audio_tower.layers.0.feed_forward1.ffw_layer_1.linear.weight"] = r(128, 32)
        # clipped-linear bounds are 0-d float32 tensors in released files
        ex["model.audio_tower.layers.0.feed_forward1.ffw_layer_1.input_max"] = torch.tensor(3.5, dtype=torch.float32)
        ex["model.audio_tower.output_proj.bias"] = r(48)
        ex["model.embed_audio.embedding_projection.weight"] = r(H, 48)
    unused = {}
    for i in range(spec["num_hidden_layers"]):
        t, d, kv, shared = layer_geom(spec, i)
        if not shared:
            continue
        p = f"model.language_model.layers.{i}.self_attn."
        unused[p + "k_proj.weight"] = r(kv * d, H)
        unused[p + "v_proj.weight"] = r(kv * d, H)
        unused[p + "k_norm.weight"] = (torch.rand(d, generator=g) + 0.5).to(torch.bfloat16)
    return ex, unused


def write_safetensors(dirpath, tensors, shard):
    names = sorted(tensors)
    files = {}
    if not shard:
        save_file({k: tensors[k] for k in names}, os.path.join(dirpath, "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    half = (len(names) + 1) // 2
    parts = [names[:half], names[half:]]
    wm, total = {}, 0
    for n, part in enumerate(parts):
        fn = f"model-{n + 1:05d}-of-{len(parts):05d}.safetensors"
        save_file({k: tensors[k] for k in part}, os.path.join(dirpath, fn), metadata={"format": "pt"})
        files[fn] = part
        for k in part:
            wm[k] = fn
            total += tensors[k].numel() * tensors[k].element_size()
    with open(os.path.join(dirpath, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2, sort_keys=True)
    return sorted(files)


def read_all_tensors(dirpath):
    idx = os.path.join(dirpath, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    out = {}
    for fn in files:
        with safe_open(os.path.join(dirpath, fn), framework="pt") as f:
            for k in f.keys():
                check(k not in out, f"duplicate tensor {k}")
                out[k] = f.get_tensor(k)
    return out


# --------------------------------------------------------------------------------------------------------------------
# Self-checks on the written files
# --------------------------------------------------------------------------------------------------------------------
def logits_close(a, b, rel):
    d = float((a - b).abs().max())
    return d <= rel * float(b.abs().max()), d


def selfcheck_flat(dirpath, ref, args):
    res = {}
    # 1. the tensors on disk are exactly the bf16 tensors of the reference
    disk = read_all_tensors(dirpath)
    check(set(disk) == set(ref["weights"]), f"flat file keys differ: {sorted(set(disk) ^ set(ref['weights']))[:8]}")
    for k, v in disk.items():
        check(v.dtype == torch.bfloat16 and torch.equal(v, ref["weights"][k]), f"tensor {k} differs on disk")
    # 2. transformers loads the directory with no missing/unexpected keys and reproduces the logits
    model, info = Gemma4ForCausalLM.from_pretrained(dirpath, dtype=torch.float32, attn_implementation="eager",
                                                    output_loading_info=True)
    model.eval()
    force_eager(model)
    info = {k: sorted(map(str, v)) if isinstance(v, (list, set, tuple)) else str(v) for k, v in dict(info).items()}
    res["from_pretrained_loading_info"] = info
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]
    check(not missing, f"from_pretrained missing keys: {missing[:8]}")
    check(not info.get("unexpected_keys"), f"from_pretrained unexpected keys: {info.get('unexpected_keys')[:8]}")
    check(not info.get("mismatched_keys"), f"from_pretrained mismatched keys: {info.get('mismatched_keys')}")
    check(next(model.parameters()).dtype == torch.float32, "from_pretrained did not give float32")
    check_geometry(model, ref["spec"])
    patch_embed_scales(model)
    logits = model(input_ids=torch.tensor([ref["prompt"]]), use_cache=False).logits[0].float()
    ok, diff = logits_close(logits, ref["logits"], 1e-5)
    res["from_pretrained_max_abs_logit_diff"] = diff
    check(ok, f"from_pretrained logits differ from the in-memory reference by {diff}")
    return res


def parse_nested_config(dirpath, notes_out):
    d = json.load(open(os.path.join(dirpath, "config.json")))
    tc = d["text_config"]
    if "expert_intermediate_size" in tc and tc.get("moe_intermediate_size") is None:
        tc["moe_intermediate_size"] = tc.pop("expert_intermediate_size")
        notes_out.append("self-check renamed text_config.expert_intermediate_size -> moe_intermediate_size")
    return d


def selfcheck_nested(dirpath, ref, extras, unused, args):
    res, notes = {}, []
    spec = ref["spec"]
    d = parse_nested_config(dirpath, notes)
    try:
        cfg = Gemma4Config.from_dict(copy.deepcopy(d))
    except Exception as e:  # only the dummy vision/audio sub-configs can be at fault here: retry without them
        notes.append(f"WARNING: Gemma4Config.from_dict rejected the file ({e!r}); parsed again with "
                     "vision_config/audio_config set to null")
        d_tmp = copy.deepcopy(d)
        d_tmp["vision_config"] = None
        d_tmp["audio_config"] = None
        cfg = Gemma4Config.from_dict(d_tmp)
    text_cfg = cfg.text_config
    check(type(text_cfg).__name__ == "Gemma4TextConfig", f"text_config parsed as {type(text_cfg)}")
    # 1. build the text model from transformers' reading of this config.json, load the text tensors by hand
    model = Gemma4ForCausalLM(text_cfg).float().eval()
    force_eager(model)
    check_geometry(model, spec)
    disk = read_all_tensors(dirpath)
    P = "model.language_model."
    mm = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")
    text_keys = {k for k in disk if k.startswith(P)}
    other = set(disk) - text_keys
    check(all(k.startswith(mm) for k in other), f"unexpected non-text keys: {sorted(k for k in other if not k.startswith(mm))}")
    check(other == set(extras), "dummy multimodal tensors differ from what was written")
    ignore = set(unused)
    ignore_hf = set()
    for i, layer in enumerate(model.model.layers):
        if layer.self_attn.is_kv_shared_layer:
            ignore_hf |= {f"{P}layers.{i}.self_attn.{n}.weight" for n in ("k_proj", "v_proj", "k_norm", "v_norm")}
    check(ignore <= ignore_hf, f"unused tensors not covered by transformers' ignore list: {sorted(ignore - ignore_hf)}")
    check(ignore <= text_keys, "unused kv-shared tensors missing from the file")
    load = {("model." + k[len(P):]): v for k, v in disk.items() if k in text_keys and k not in ignore}
    flat_names = {k for k in model.state_dict() if k != "lm_head.weight"}
    check(set(load) == flat_names, f"nested text keys != model keys: {sorted(set(load) ^ flat_names)[:8]}")
    for k, v in load.items():
        check(v.dtype == torch.bfloat16 and torch.equal(v, ref["weights"][k]), f"nested tensor {k} differs")
    load_text_weights(model, load)
    patch_embed_scales(model)
    logits = model(input_ids=torch.tensor([ref["prompt"]]), use_cache=False).logits[0].float()
    ok, diff = logits_close(logits, ref["logits"], 1e-5)
    res["text_config_parse_max_abs_logit_diff"] = diff
    check(ok, f"nested (config parsed by transformers) logits differ by {diff}")

    # 2. soft check: the full Gemma4ForConditionalGeneration path (towers disabled) loading the same directory
    try:
        from transformers import Gemma4ForConditionalGeneration
        d2 = copy.deepcopy(d)
        d2["vision_config"] = None
        d2["audio_config"] = None
        cfg2 = Gemma4Config.from_dict(d2)
        cg, info = Gemma4ForConditionalGeneration.from_pretrained(dirpath, config=cfg2, dtype=torch.float32,
                                                                  attn_implementation="eager", output_loading_info=True)
        cg.eval()
        force_eager(cg)
        patch_embed_scales(cg)
        info = {k: sorted(map(str, v)) if isinstance(v, (list, set, tuple)) else str(v) for k, v in dict(info).items()}
        lg = cg(input_ids=torch.tensor([ref["prompt"]]), use_cache=False).logits[0].float()
        ok2, diff2 = logits_close(lg, ref["logits"], 1e-5)
        missing = [k for k in info.get("missing_keys", []) if "lm_head" not in k]
        res["conditional_generation_check"] = {
            "max_abs_logit_diff": diff2, "ok": ok2, "missing_keys": missing,
            "unexpected_keys_count": len(info.get("unexpected_keys", [])),
            "unexpected_keys_sample": info.get("unexpected_keys", [])[:12]}
        if not ok2 and not missing:
            raise Failure(f"Gemma4ForConditionalGeneration loaded the nested checkpoint without missing keys "
                          f"but its logits differ by {diff2}")
    except Failure:
        raise
    except Exception as e:
        res["conditional_generation_check"] = {"skipped_error": repr(e)[:500]}
    res["notes"] = notes
    return res


# --------------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------------
def expert_key_probe():
    """Does transformers' Gemma4TextConfig accept / map `expert_intermediate_size`?"""
    try:
        c = Gemma4TextConfig(**{**full_text_spec("26b"), "moe_intermediate_size": None, "expert_intermediate_size": 32})
        return {"accepted": True, "moe_intermediate_size_after": c.moe_intermediate_size,
                "stored_as_attribute": getattr(c, "expert_intermediate_size", "<absent>")}
    except Exception as e:
        return {"accepted": False, "error": repr(e)[:300]}


def write_family(fam, ref, out_models, args, log, summary):
    spec = ref["spec"]
    fam_cfg = FAMILIES[fam]
    cached = None
    try:
        cached = greedy_cached(ref["model"], ref["prompt"], N_GREEDY)
        cached_err = None
    except Exception as e:
        cached_err = repr(e)[:500]
    cached_match = cached == ref["greedy"]
    if not cached_match:
        log(f"  WARNING {fam}: cached generate ids {cached} != full-recompute ids {ref['greedy']} ({cached_err})")

    for layout in ("flat", "nested"):
        name = f"{fam}-{layout}"
        d = os.path.join(out_models, name)
        os.makedirs(d, exist_ok=True)
        notes = []
        status, err, checks = "ok", None, {}
        files, extras, unused, shard = [], {}, {}, None
        try:
            if layout == "flat":
                cfg = flat_config(fam, fam_cfg["flat_form"], spec, notes)
                tensors = dict(ref["weights"])
                shard = fam_cfg["shard_flat"]
                extras, unused = {}, {}
            else:
                cfg = nested_config(fam, fam_cfg["nested_form"], spec, notes)
                tensors = {"model.language_model." + k[len("model."):]: v for k, v in ref["weights"].items()}
                extras, unused = nested_extra_tensors(spec, fam_cfg["audio"], ref["seed"])
                check(not (set(extras) & set(tensors)) and not (set(unused) & set(tensors)), "name clash")
                tensors.update(extras)
                tensors.update(unused)
                shard = fam_cfg["shard_nested"]
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f, indent=2, sort_keys=True)
                f.write("\n")
            files = write_safetensors(d, tensors, shard)
            checks = selfcheck_flat(d, ref, args) if layout == "flat" else selfcheck_nested(d, ref, extras, unused, args)
        except Exception as e:
            status, err = "FAILED", f"{e!r}\n{traceback.format_exc()}"
            log(f"  FAILED {name}: {e!r}")

        np.save(os.path.join(d, "logits.npy"), ref["logits"].numpy().astype(np.float32))
        if layout == "flat":  # identical for both layouts: stored once
            dbg = os.path.join(d, "debug")
            os.makedirs(dbg, exist_ok=True)
            for k, v in ref["debug"].items():
                np.save(os.path.join(dbg, f"{k}.npy"), v.astype(np.float32))
        dbg_prefix = "" if layout == "flat" else f"../{fam}-flat/"
        golden = {
            "status": status,
            "model": name,
            "prompt_ids": ref["prompt"],
            "logits_file": "logits.npy",
            "logits_shape": list(ref["logits"].shape),
            "greedy_ids": ref["greedy"],
            "greedy_margins": ref["margins"],
            "prompt_argmax_ids": [int(x) for x in ref["logits"].argmax(-1).tolist()],
            "greedy_min_margin": min(ref["margins"]),
            "max_abs_logit": ref["max_abs"],
            "max_abs_logit_greedy_steps": ref["max_abs_greedy"],
            "tolerance": "max|logit-ref| <= 1e-3 * max|ref| over logits.npy; greedy_ids identical",
            "greedy_method": "full recomputation: each step runs the whole sequence with use_cache=False, argmax of the last row",
            "cached_generate_ids": cached,
            "cached_generate_matches_full_recompute": cached_match,
            "cached_generate_error": cached_err,
            "embed_scale_used": ref["scales"]["embed_tokens"]["used"],
            "embed_scale_exact_fp32": ref["scales"]["embed_tokens"]["exact_fp32"],
            "embed_scales_patched": ref["scales"],
            "router_min_topk_logprob_gap": ref["router_min_gap"],
            "seed": ref["seed"],
            "seed_attempt": ref["attempt"],
            "checkpoint_files": files,
            "sharded": bool(shard) if status == "ok" else None,
            "config_form": (fam_cfg["flat_form"] if layout == "flat" else fam_cfg["nested_form"]),
            "layer_geometry": [dict(zip(("type", "head_dim", "kv_heads", "kv_shared"), layer_geom(spec, i)))
                               for i in range(spec["num_hidden_layers"])],
            "ignored_tensors": {"multimodal": sorted(extras), "unused_kv_shared": sorted(unused)},
            "debug_files": {
                dbg_prefix + "debug/embeddings.npy": "[T,H] scaled token embedding h0 (bf16(sqrt(H)) scale)",
                dbg_prefix + "debug/layer_outputs.npy": "[L,T,H] output of decoder layer i (after layer_scalar)",
                dbg_prefix + "debug/final_norm.npy": "[T,H] final RMSNorm output (lm_head input)"},
            "reference": {"library": "transformers", "transformers_version": transformers.__version__,
                          "torch_version": torch.__version__, "numpy_version": np.__version__,
                          "dtype": "float32 (weights are exactly the bf16 values saved)",
                          "attn_implementation": "eager", "device": "cpu"},
            "self_checks": checks,
            "notes": " | ".join(notes + [
                "word-embedding scale patched from fp32 sqrt(H) to bf16(sqrt(H)) = embed_scale_used "
                "(HF: `* self.embed_scale.to(self.weight.dtype)`); PLE scale sqrt(P) is exact (P=16)"
                if spec["hidden_size_per_layer_input"] else
                "word-embedding scale patched from fp32 sqrt(H) to bf16(sqrt(H)) = embed_scale_used "
                "(HF: `* self.embed_scale.to(self.weight.dtype)`)",
                "same weights and prompt as the other layout of this family"]),
        }
        if err:
            golden["error"] = err
        gname = "golden.json" if status == "ok" else "golden.FAILED.json"
        with open(os.path.join(d, gname), "w") as f:
            json.dump(golden, f, indent=2)
        summary["models"][name] = {"status": status, "greedy_min_margin": golden["greedy_min_margin"],
                                   "max_abs_logit": golden["max_abs_logit"], "cached_generate_matches": cached_match,
                                   "files": files, "error": (err or "").splitlines()[0] if err else None}
        log(f"  wrote {name}: {status}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (models/ and goldens.tar.gz go here)")
    ap.add_argument("--only", default="", help="comma-separated subset of families: e2b,e4b,26b,31b")
    ap.add_argument("--seed", type=int, default=20260901)
    ap.add_argument("--max-attempts", type=int, default=40)
    ap.add_argument("--margin-rel", type=float, default=2e-3,
                    help="reject a draw if a greedy step's top1-top2 margin < this * max|logit|")
    ap.add_argument("--min-distinct", type=int, default=6,
                    help="reject a draw whose 12 greedy ids hold fewer distinct tokens than this")
    ap.add_argument("--router-gap", type=float, default=1e-3,
                    help="reject a draw if some token's k-th vs (k+1)-th expert log-prob gap is below this")
    args = ap.parse_args()

    fams = [f for f in (args.only.split(",") if args.only else FAMILIES) if f]
    for f in fams:
        if f not in FAMILIES:
            sys.exit(f"unknown family {f}")
    out_models = os.path.join(args.out, "models")
    if os.path.exists(out_models):
        shutil.rmtree(out_models)
    os.makedirs(out_models)
    logf = open(os.path.join(out_models, "LOG.txt"), "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    log(f"transformers {transformers.__version__}, torch {torch.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}")
    if transformers.__version__ != "5.17.0":
        log(f"WARNING: written against transformers 5.17.0; running {transformers.__version__}")
    torch.manual_seed(0)
    summary = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
               "expert_intermediate_size_probe": expert_key_probe(), "models": {}, "family_errors": {}}
    log(f"expert_intermediate_size probe: {summary['expert_intermediate_size_probe']}")

    for fam in fams:
        log(f"[{fam}]")
        try:
            ref = make_reference(fam, args, log)
        except Exception as e:
            summary["family_errors"][fam] = f"{e!r}\n{traceback.format_exc()}"
            log(f"  FAILED {fam}: {e!r}")
            traceback.print_exc()
            continue
        write_family(fam, ref, out_models, args, log, summary)

    bad = [n for n, m in summary["models"].items() if m["status"] != "ok"] + list(summary["family_errors"])
    cache_mismatch = [n for n, m in summary["models"].items() if not m["cached_generate_matches"]]
    summary["all_ok"] = not bad
    summary["failed"] = bad
    summary["cached_generate_mismatch"] = cache_mismatch
    with open(os.path.join(out_models, "SUMMARY.json"), "w") as f:
        json.dump(summary, f, indent=2)
    logf.close()

    tar_path = os.path.join(args.out, "goldens.tar.gz")
    with tarfile.open(tar_path, "w:gz") as tar:
        tar.add(out_models, arcname="models")
    size = os.path.getsize(tar_path)
    print(json.dumps({"tarball": tar_path, "bytes": size, "all_ok": not bad, "failed": bad,
                      "cached_generate_mismatch": cache_mismatch}, indent=1))
    if size > 16 * 1024 * 1024:
        print("WARNING: tarball larger than 16 MB", file=sys.stderr)
    sys.exit(0 if not bad else 1)


if __name__ == "__main__":
    main()
