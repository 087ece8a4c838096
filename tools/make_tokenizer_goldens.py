#!/usr/bin/env python3
"""Golden tokenisations, decodes and Gemma 4 chat prompts from HF `tokenizers` / `transformers`, for MarkBase's tests.

Run from the repository root (needs tokenizers and transformers; no network, no ../shared):

    python3 tools/make_tokenizer_goldens.py --out OUTDIR [--bench] [--cxx-bench]

Inputs (all under tests/data/tokenizer/, override with --data):
    gemma4/tokenizer.json.xz, gemma3/tokenizer.json.xz    the two real tokenizers, xz-compressed
    corpus.jsonl                                         {"name", "text"} per line
    decode_cases.jsonl                                   {"name", "pieces": [token strings]} or {"name", "ids"}
    gemma4/chat_cases.jsonl, gemma4/chat_template.jinja  conversations and the shipped template

Outputs in OUTDIR (copy the .jsonl files to tests/data/tokenizer/goldens/):
    gemma4_encode.jsonl, gemma3_encode.jsonl   {"name", "text", "ids", "tokens", "decoded", "decoded_skip"}
    gemma4_decode.jsonl, gemma3_decode.jsonl   {"name", "ids", "decoded", "decoded_skip"} or {"name", "missing"}
    gemma4_chat.jsonl                          {"name", ..., "text", "ids", "renderer"}
    bench.json (with --bench)                  HF load ms and encode MB/s on the corpus text, plus MarkBase's
                                               own numbers on the same machine with --cxx-bench (needs g++ and
                                               nlohmann/json.hpp; --cxx-include DIR if it is not on the path)
"""
import argparse
import json
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def read_jsonl(path):
    # split("\n"), not splitlines(): texts may hold U+2028 and friends, which JSON writes raw.
    with open(path, encoding="utf-8", newline="") as f:
        return [json.loads(line) for line in f.read().split("\n") if line.strip()]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(rows)} lines)")


def decompress(src, dst):
    with lzma.open(src, "rb") as f, open(dst, "wb") as g:
        shutil.copyfileobj(f, g)
    return dst


def encode_goldens(tok, corpus):
    rows = []
    for case in corpus:
        enc = tok.encode(case["text"], add_special_tokens=False)
        rows.append({
            "name": case["name"],
            "text": case["text"],
            "ids": enc.ids,
            "tokens": enc.tokens,
            "decoded": tok.decode(enc.ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(enc.ids, skip_special_tokens=True),
        })
    return rows


def decode_goldens(tok, cases):
    rows = []
    for case in cases:
        if "ids" in case:
            ids = case["ids"]
        else:
            ids = [tok.token_to_id(p) for p in case["pieces"]]
            missing = [p for p, i in zip(case["pieces"], ids) if i is None]
            if missing:
                rows.append({"name": case["name"], "missing": missing})
                continue
        rows.append({
            "name": case["name"],
            "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True),
        })
    return rows


def make_renderer(tokenizer_json_path, template):
    """apply_chat_template through transformers; jinja2 as HF configures it if transformers cannot be used."""
    try:
        import transformers
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast
        specials = dict(bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>",
                        mask_token="<mask>")
        try:
            hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(tokenizer_json_path), **specials)
        except Exception:  # noqa: BLE001 - older/newer constructor signatures
            hf = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json_path, **specials)
        hf.chat_template = template

        def render(messages, gen, think):
            out = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, enable_thinking=think)
            return out if isinstance(out, str) else out[0]

        return render, f"transformers {transformers.__version__} apply_chat_template"
    except Exception as e:  # noqa: BLE001
        print(f"warning: transformers unusable ({e!r}); rendering with jinja2 as HF configures it", file=sys.stderr)
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env.globals["raise_exception"] = raise_exception
        compiled = env.from_string(template)

        def render(messages, gen, think):
            return compiled.render(messages=messages, add_generation_prompt=gen, enable_thinking=think,
                                   bos_token="<bos>", eos_token="<eos>")

        return render, f"jinja2 {jinja2.__version__} (HF settings)"


def chat_goldens(tok, tokenizer_json_path, template, cases):
    render, renderer = make_renderer(tokenizer_json_path, template)
    rows = []
    for case in cases:
        text = render(case["messages"], case["add_generation_prompt"], case["enable_thinking"])
        row = dict(case)
        row.update({"text": text, "ids": tok.encode(text, add_special_tokens=False).ids, "renderer": renderer})
        rows.append(row)
    return rows


def hf_bench(json_path, text, min_seconds):
    from tokenizers import Tokenizer
    loads = []
    for _ in range(3):
        t0 = time.perf_counter()
        tok = Tokenizer.from_file(json_path)
        loads.append((time.perf_counter() - t0) * 1e3)
    data = text.encode("utf-8")
    ids = tok.encode(text, add_special_tokens=False).ids  # warm-up
    passes, t0 = 0, time.perf_counter()
    while True:
        ids = tok.encode(text, add_special_tokens=False).ids
        passes += 1
        spent = time.perf_counter() - t0
        if spent >= min_seconds:
            break
    out_bytes, dpasses, t1 = 0, 0, time.perf_counter()
    while True:
        out_bytes += len(tok.decode(ids, skip_special_tokens=False).encode("utf-8"))
        dpasses += 1
        dspent = time.perf_counter() - t1
        if dspent >= min_seconds / 2:
            break
    lines = text.split("\n")
    t2 = time.perf_counter()
    tok.encode_batch(lines, add_special_tokens=False)
    batch_spent = time.perf_counter() - t2
    return {
        "load_ms_min": min(loads), "load_ms_median": statistics.median(loads),
        "bytes": len(data), "tokens": len(ids), "passes": passes,
        "encode_mb_s": len(data) * passes / spent / 1e6,
        "decode_mb_s": out_bytes / dspent / 1e6,
        "encode_batch_lines_all_threads_mb_s": len(data) / batch_spent / 1e6,
    }


def cxx_bench(root, include, json_path, corpus_path, workdir):
    """Builds bench/tokenizer/bench_main.cpp with MarkBase's tokenizer sources and runs it on the same text."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        return {"skipped": "no C++ compiler"}
    srcs = sorted(os.path.join(root, "src/tokenizer", f) for f in os.listdir(os.path.join(root, "src/tokenizer"))
                  if f.endswith(".cpp"))
    exe = os.path.join(workdir, "markbase_tokenizer_bench")
    cmd = [cxx, "-std=c++20", "-O3", "-march=native", "-I", os.path.join(root, "src")]
    if include:
        cmd += ["-I", include]
    cmd += srcs + [os.path.join(root, "bench/tokenizer/bench_main.cpp"), "-o", exe, "-lpthread"]
    build = subprocess.run(cmd, capture_output=True, text=True)
    if build.returncode != 0:
        return {"skipped": "build failed", "stderr": build.stderr[-2000:]}
    run = subprocess.run([exe, json_path, corpus_path], capture_output=True, text=True)
    if run.returncode != 0:
        return {"skipped": "run failed", "stderr": run.stderr[-2000:]}
    return json.loads(run.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--data", default="tests/data/tokenizer", help="the tokenizer test data directory")
    ap.add_argument("--bench", action="store_true", help="also time HF tokenizers on the corpus text")
    ap.add_argument("--cxx-bench", action="store_true", help="with --bench: also build and time MarkBase's")
    ap.add_argument("--cxx-include", default=None, help="directory holding nlohmann/json.hpp, if not standard")
    ap.add_argument("--seconds", type=float, default=2.0, help="minimum timing per measurement")
    args = ap.parse_args()

    import tokenizers
    from tokenizers import Tokenizer
    os.makedirs(args.out, exist_ok=True)
    corpus = read_jsonl(os.path.join(args.data, "corpus.jsonl"))
    decode_cases = read_jsonl(os.path.join(args.data, "decode_cases.jsonl"))
    chat_cases = read_jsonl(os.path.join(args.data, "gemma4/chat_cases.jsonl"))
    with open(os.path.join(args.data, "gemma4/chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    corpus_text = "\n".join(c["text"] for c in corpus)  # what `markbase tokenize --bench corpus.jsonl` times

    bench = {"tokenizers_version": tokenizers.__version__, "python": sys.version.split()[0],
             "cpu_count": os.cpu_count(), "text": "corpus.jsonl texts joined with \\n"}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("gemma4", "gemma3"):
            json_path = decompress(os.path.join(args.data, name, "tokenizer.json.xz"),
                                   os.path.join(tmp, f"{name}_tokenizer.json"))
            tok = Tokenizer.from_file(json_path)
            write_jsonl(os.path.join(args.out, f"{name}_encode.jsonl"), encode_goldens(tok, corpus))
            write_jsonl(os.path.join(args.out, f"{name}_decode.jsonl"), decode_goldens(tok, decode_cases))
            if name == "gemma4":
                write_jsonl(os.path.join(args.out, "gemma4_chat.jsonl"),
                            chat_goldens(tok, json_path, template, chat_cases))
            if args.bench:
                entry = {"hf": hf_bench(json_path, corpus_text, args.seconds)}
                if args.cxx_bench:
                    entry["markbase"] = cxx_bench(os.getcwd(), args.cxx_include, json_path,
                                                  os.path.join(args.data, "corpus.jsonl"), tmp)
                bench[name] = entry
                print(name, json.dumps(entry, indent=1))
    if args.bench:
        with open(os.path.join(args.out, "bench.json"), "w") as f:
            json.dump(bench, f, indent=1)
        print(f"wrote {os.path.join(args.out, 'bench.json')}")


if __name__ == "__main__":
    main()
