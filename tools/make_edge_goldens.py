#!/usr/bin/env python3
"""transformers' logits for the prompt lengths where cache and chunking bugs live, on the golden checkpoints.

For each family's flat checkpoint under tests/data/models (written by tools/make_goldens.py, sliding window 8),
prompts of 1 token, exactly the window (8), the window + 1 (9) and 40 tokens (more than two prefill chunks of
16), each BOS then seeded random ids. MoE prompts are redrawn until every routed token's k-th and (k+1)-th expert
differ by at least --router-gap in log-probability, so a last-bit difference cannot flip an expert choice.

Run (GPU machine, python3 with torch and transformers 5.17; no network needed):
    python3 tools/make_edge_goldens.py --models tests/data/models --out OUTDIR
Writes OUTDIR/<fam>-flat/edges.json and edge-<n>.npy (float32 [n, vocab]); copy them into the model folders.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import RouterGap, force_eager, patch_embed_scales  # noqa: E402

import transformers  # noqa: E402
from transformers import Gemma4ForCausalLM  # noqa: E402

torch.set_grad_enabled(False)
transformers.logging.set_verbosity_error()

LENGTHS = (1, 8, 9, 40)
FAMILIES = ("e2b", "e4b", "26b", "31b")


def load(dirpath):
    model = Gemma4ForCausalLM.from_pretrained(dirpath, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    force_eager(model)
    scales = patch_embed_scales(model)
    return model, scales


def draw_prompt(n, vocab, rng):
    return [2] + [int(x) for x in rng.integers(3, vocab, size=n - 1)]


def family_edges(fam, models_dir, out_dir, args):
    src = os.path.join(models_dir, f"{fam}-flat")
    model, scales = load(src)
    cfg = model.config
    moe = bool(getattr(cfg, "enable_moe_block", False))
    vocab = cfg.vocab_size
    rng = np.random.default_rng(args.seed + sum(map(ord, fam)))
    dst = os.path.join(out_dir, f"{fam}-flat")
    os.makedirs(dst, exist_ok=True)
    cases = []
    for n in LENGTHS:
        for attempt in range(200):
            ids = draw_prompt(n, vocab, rng)
            gap = RouterGap(model, cfg.top_k_experts) if moe else None
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
            if gap:
                gap.close()
            if not gap or gap.min_gap >= args.router_gap:
                break
        else:
            raise SystemExit(f"{fam}: no {n}-token prompt with router gap >= {args.router_gap}")
        assert np.isfinite(logits).all(), f"{fam} n={n}: non-finite logits"
        name = f"edge-{n}.npy"
        np.save(os.path.join(dst, name), logits.astype(np.float32))
        cases.append({"n": n, "prompt_ids": ids, "logits_file": name, "max_abs_logit": float(np.abs(logits).max()),
                      "router_min_topk_logprob_gap": gap.min_gap if gap else None, "attempts": attempt + 1})
        print(f"{fam} n={n}: max|logit| {cases[-1]['max_abs_logit']:.3f}, attempts {attempt + 1}", flush=True)
    meta = {
        "what": "transformers fp32 logits of every position for prompts at the sliding-window edges",
        "sliding_window": cfg.sliding_window,
        "cases": cases,
        "embed_scales_patched": scales,
        "reference": {"library": "transformers", "transformers_version": transformers.__version__,
                      "torch_version": torch.__version__, "attn_implementation": "eager", "dtype": "float32",
                      "device": "cpu"},
    }
    with open(os.path.join(dst, "edges.json"), "w") as f:
        json.dump(meta, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tests/data/models")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--router-gap", type=float, default=1e-3)
    args = ap.parse_args()
    for fam in FAMILIES:
        family_edges(fam, args.models, args.out, args)


if __name__ == "__main__":
    main()
