"""MarkBase against transformers at the released variants' real widths, on checkpoints we did not write.

For each variant, ../shared/tools/make_random_ckpt.py (the shared random-checkpoint writer, not MarkBase's) writes a
random-weight checkpoint cut to a few layers (real widths, real vocab). `markbase logits` computes the logits of a
random prompt on each requested device; transformers computes them in float32 (eager attention, TF32 off) with the
word-embedding scale set to bf16(sqrt(H)) as a bf16 model uses. Reports max |logit - ref| / max |ref| and top-1
agreement per variant and device. Runs on the GPU machine (torch, transformers 5.17).

usage: python3 tools/check_real_widths.py --markbase build-gpu/markbase --maker PATH/make_random_ckpt.py \
           --out results.json [--variants e2b:10,e4b:8,26b-a4b:4,31b:3] [--devices cpu,cuda] [--workdir /tmp/rw]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
from transformers import Gemma4ForCausalLM


def bf16_round(x):
    return float(torch.tensor(x, dtype=torch.float32).bfloat16().float())


def reference_logits(ckpt, ids):
    model = Gemma4ForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    tm = model.model
    emb = tm.embed_tokens
    h = emb.weight.shape[1]
    emb.embed_scale.fill_(bf16_round(h ** 0.5))
    if hasattr(emb, "scalar_embed_scale"):
        emb.scalar_embed_scale = bf16_round(h ** 0.5)
    ple = getattr(tm, "embed_tokens_per_layer", None)
    if ple is not None:
        p = tm.config.hidden_size_per_layer_input
        ple.embed_scale.fill_(bf16_round(p ** 0.5))
        if hasattr(ple, "scalar_embed_scale"):
            ple.scalar_embed_scale = bf16_round(p ** 0.5)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(dev)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=dev), use_cache=False).logits[0].float().cpu().numpy()
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--markbase", required=True)
    ap.add_argument("--maker", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="e2b:10,e4b:8,26b-a4b:4,31b:3")
    ap.add_argument("--devices", default="cpu")
    ap.add_argument("--workdir", default="/tmp/realwidth")
    ap.add_argument("--n-ids", type=int, default=16)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    results = []
    for item in a.variants.split(","):
        variant, layers = item.split(":")
        ckpt = os.path.join(a.workdir, f"{variant}-{layers}")
        shutil.rmtree(ckpt, ignore_errors=True)
        t0 = time.time()
        mk = subprocess.run([sys.executable, a.maker, variant, ckpt, "--layers", layers, "--seed", "1234"],
                            capture_output=True, text=True)
        row = {"variant": variant, "layers": int(layers), "make_s": round(time.time() - t0, 1)}
        if mk.returncode != 0:
            row["error"] = "make_random_ckpt failed: " + mk.stderr[-2000:]
            results.append(row)
            print(json.dumps(row), flush=True)
            continue
        rng = np.random.default_rng(7)
        ids = [2] + [int(x) for x in rng.integers(3, 262144, size=a.n_ids - 1)]
        try:
            ref = reference_logits(ckpt, ids)
        except Exception as e:  # report, keep going
            row["error"] = f"transformers failed: {e!r}"
            results.append(row)
            print(json.dumps(row), flush=True)
            continue
        scale = float(np.abs(ref).max())
        ref_top = ref.argmax(-1)
        srt = np.sort(ref, axis=-1)
        margins = (srt[:, -1] - srt[:, -2]) / scale
        row["max_abs_ref"] = scale
        row["min_top1_margin_rel"] = float(margins.min())
        for dev in a.devices.split(","):
            npy = os.path.join(a.workdir, f"{variant}-{dev}.npy")
            t1 = time.time()
            r = subprocess.run([a.markbase, "logits", "-m", ckpt, "--ids", ",".join(map(str, ids)), "-o", npy,
                                "--device", dev], capture_output=True, text=True)
            if r.returncode != 0:
                row[dev] = {"error": r.stderr[-2000:]}
                continue
            ours = np.load(npy)
            err = np.abs(ours - ref)
            clear = margins > 1e-3
            row[dev] = {
                "seconds": round(time.time() - t1, 2),
                "max_abs_err": float(err.max()),
                "max_err_rel": float(err.max() / scale),
                "top1_agree": float((ours.argmax(-1) == ref_top).mean()),
                "top1_agree_where_margin_clear": float((ours.argmax(-1) == ref_top)[clear].mean()) if clear.any() else None,
                "finite": bool(np.isfinite(ours).all()),
            }
        results.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(ckpt, ignore_errors=True)

    with open(a.out, "w") as f:
        json.dump({"tool": "check_real_widths", "transformers": __import__("transformers").__version__,
                   "torch": torch.__version__, "results": results}, f, indent=1)
    print(f"{'variant':10} {'layers':>6} " + " ".join(f"{d + ' rel err':>14} {d + ' top1':>9}" for d in a.devices.split(",")))
    for r in results:
        cells = []
        for d in a.devices.split(","):
            x = r.get(d, {})
            cells.append(f"{x.get('max_err_rel', float('nan')):14.2e} {x.get('top1_agree', float('nan')):9.3f}")
        print(f"{r['variant']:10} {r['layers']:6d} " + " ".join(cells) + ("  " + r["error"][:80] if "error" in r else ""))


if __name__ == "__main__":
    main()
