#!/usr/bin/env python3
"""Load generator for any OpenAI-compatible /v1/completions server (markbase serve, llama-server, vLLM, ...).

Measures what `vllm bench serve` and SGLang's bench_serving measure: request and token throughput, TTFT, TPOT,
ITL and end-to-end latency (mean, median, p99), streaming every request. Python 3 standard library only.

    python3 tools/bench_serve.py --base-url http://127.0.0.1:8080 --api-key KEY \
        --input-len 128 --output-len 64 --num-prompts 64 --max-concurrency 8 --request-rate 20

Exit status: 0 when every request succeeded (or --allow-failures), 1 otherwise, 2 on bad arguments.
"""
import argparse
import datetime
import http.client
import json
import math
import os
import random
import sys
import threading
import time
import urllib.parse

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there one all we their been has when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such like "
         "our over man me even most made after also did many before must through back years where much your way").split()


def percentile(values, q):
    """numpy.percentile(values, q) with its default 'linear' interpolation."""
    xs = sorted(values)
    if not xs:
        return 0.0
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats_ms(values):
    """mean / median / p99 in milliseconds of a list of seconds."""
    ms = [v * 1000.0 for v in values]
    return {"mean": sum(ms) / len(ms) if ms else 0.0, "median": percentile(ms, 50), "p99": percentile(ms, 99)}


class Client:
    """One HTTP connection per request, to the base URL (http or https, optional path prefix)."""

    def __init__(self, base_url, api_key, timeout):
        u = urllib.parse.urlsplit(base_url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"--base-url must be http(s)://host[:port][/prefix], got {base_url!r}")
        self.scheme, self.host, self.port, self.prefix = u.scheme, u.hostname, u.port, u.path
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def open(self, method, path, body=None):
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout)
        conn.request(method, self.prefix + path, body=None if body is None else json.dumps(body), headers=self.headers)
        return conn, conn.getresponse()

    def get_json(self, path):
        conn, resp = self.open("GET", path)
        try:
            data = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {resp.status}: {data[:300].decode(errors='replace')}")
            return json.loads(data)
        finally:
            conn.close()


def run_request(client, payload):
    """Streams one completion; returns a dict of timings in seconds (or the error)."""
    r = {"success": False, "ttft": 0.0, "itl": [], "latency": 0.0, "output_tokens": 0, "prompt_tokens": None,
         "error": ""}
    start = time.perf_counter()
    conn = None
    try:
        conn, resp = client.open("POST", "/v1/completions", payload)
        if resp.status != 200:
            r["error"] = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
            return r
        last, chunks, usage, done = None, 0, None, False
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            msg = json.loads(data)
            if "error" in msg:
                r["error"] = f"stream error: {json.dumps(msg['error'])[:300]}"
                return r
            if msg.get("usage"):
                usage = msg["usage"]
            choices = msg.get("choices") or []
            if choices and choices[0].get("text"):
                now = time.perf_counter()
                if last is None:
                    r["ttft"] = now - start
                else:
                    r["itl"].append(now - last)
                last, chunks = now, chunks + 1
        r["latency"] = time.perf_counter() - start
        if not done:
            r["error"] = "the stream ended without data: [DONE]"
            return r
        if last is None:
            r["error"] = "no text in the stream"
            return r
        r["output_tokens"] = usage.get("completion_tokens", chunks) if usage else chunks
        r["prompt_tokens"] = usage.get("prompt_tokens") if usage else None
        r["success"] = True
    except Exception as e:  # connection refused/reset, timeout, bad JSON: a failed request
        r["latency"] = time.perf_counter() - start
        r["error"] = f"{type(e).__name__}: {e}"
    finally:
        if conn is not None:
            conn.close()
    return r


def make_prompts(args, rng):
    """num_prompts prompts of input_len tokens (ids) or words (text); returns (prompt, nominal length) pairs."""
    out = []
    for _ in range(args.num_prompts):
        if args.prompt_text:
            out.append((" ".join(rng.choice(WORDS) for _ in range(args.input_len)), args.input_len))
        else:
            out.append(([rng.randrange(args.id_low, args.id_high) for _ in range(args.input_len)], args.input_len))
    return out


def benchmark(args, client, model, prompts, rng):
    results = [None] * len(prompts)
    gate = threading.Semaphore(args.max_concurrency) if args.max_concurrency else None
    lock = threading.Lock()
    active = [0, 0]  # now, most at once

    def worker(i, prompt):
        if gate:
            gate.acquire()
        try:
            with lock:
                active[0] += 1
                active[1] = max(active[1], active[0])
            payload = {"model": model, "prompt": prompt, "max_tokens": args.output_len,
                       "temperature": args.temperature, "stream": True, "stream_options": {"include_usage": True}}
            if args.ignore_eos:  # vLLM's extension (markbase serve, vLLM, SGLang take it): exact output lengths
                payload["ignore_eos"] = True
            results[i] = run_request(client, payload)
            with lock:
                active[0] -= 1
        finally:
            if gate:
                gate.release()

    threads = []
    start = time.perf_counter()
    for i, (prompt, _) in enumerate(prompts):
        if i and not math.isinf(args.request_rate):  # Poisson arrivals: exponential gaps
            time.sleep(rng.expovariate(args.request_rate))
        t = threading.Thread(target=worker, args=(i, prompt), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return results, time.perf_counter() - start, active[1]


STEP_COUNTERS = ("markbase_step_seconds_total", "markbase_steps_total", "markbase_step_decode_rows_total",
                 "markbase_step_prompt_tokens_total")


def server_steps(client):
    """MarkBase's step counters from GET /metrics ({name or name{labels}: value}); {} from any other server."""
    try:
        conn, resp = client.open("GET", "/metrics")
        try:
            text = resp.read().decode(errors="replace") if resp.status == 200 else ""
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return {}
    out = {}
    for ln in text.splitlines():
        if ln.startswith(STEP_COUNTERS):
            key, _, value = ln.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def step_split(before, after, duration):
    """Where the server's scheduler thread spent the run (the counters' differences), or None."""
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    steps = d.get("markbase_steps_total", 0.0)
    if not steps:
        return None
    phase = {p: d.get(f'markbase_step_seconds_total{{phase="{p}"}}', 0.0)
             for p in ("prefill", "decode", "mixed", "engine")}
    busy = sum(phase.values())
    return {
        "steps": int(steps),
        "prefill_s": phase["prefill"], "decode_s": phase["decode"], "mixed_s": phase["mixed"],
        "engine_s": phase["engine"],
        "idle_s": max(0.0, duration - busy),
        "decode_rows_per_step": d.get("markbase_step_decode_rows_total", 0.0) / steps,
        "prompt_tokens": int(d.get("markbase_step_prompt_tokens_total", 0.0)),
        "decode_ms_per_step": 1e3 * phase["decode"] / steps,
    }


def summarize(args, results, duration, prompts, peak):
    ok = [r for r in results if r["success"]]
    inputs = sum(r["prompt_tokens"] if r["prompt_tokens"] is not None else n for r, (_, n) in zip(results, prompts)
                 if r["success"])
    outputs = sum(r["output_tokens"] for r in ok)
    tpot = [(r["latency"] - r["ttft"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1]
    return {
        "successful_requests": len(ok),
        "failed_requests": len(results) - len(ok),
        "benchmark_duration_s": duration,
        "total_input_tokens": inputs,
        "total_output_tokens": outputs,
        "request_throughput": len(ok) / duration,
        "output_throughput": outputs / duration,
        "total_token_throughput": (inputs + outputs) / duration,
        "max_concurrency_reached": peak,
        "ttft_ms": stats_ms([r["ttft"] for r in ok]),
        "tpot_ms": stats_ms(tpot),
        "itl_ms": stats_ms([g for r in ok for g in r["itl"]]),
        "e2e_latency_ms": stats_ms([r["latency"] for r in ok]),
        "errors": [r["error"] for r in results if not r["success"]],
    }


def print_table(s, args):
    line = lambda k, v: print(f"{k:<40}{v:<10}")
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    line("Successful requests:", s["successful_requests"])
    line("Failed requests:", s["failed_requests"])
    line("Maximum request concurrency:", args.max_concurrency or "none")
    line("Max concurrency reached:", s["max_concurrency_reached"])
    line("Request rate (req/s):", args.request_rate)
    line("Benchmark duration (s):", f"{s['benchmark_duration_s']:.2f}")
    line("Total input tokens:", s["total_input_tokens"])
    line("Total generated tokens:", s["total_output_tokens"])
    line("Request throughput (req/s):", f"{s['request_throughput']:.2f}")
    line("Output token throughput (tok/s):", f"{s['output_throughput']:.2f}")
    line("Total token throughput (tok/s):", f"{s['total_token_throughput']:.2f}")
    for key, title, name in (("ttft_ms", "Time to First Token", "TTFT"), ("tpot_ms", "Time per Output Token (excl. 1st token)", "TPOT"),
                             ("itl_ms", "Inter-token Latency", "ITL"), ("e2e_latency_ms", "End-to-end Latency", "E2EL")):
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        line(f"Mean {name} (ms):", f"{s[key]['mean']:.2f}")
        line(f"Median {name} (ms):", f"{s[key]['median']:.2f}")
        line(f"P99 {name} (ms):", f"{s[key]['p99']:.2f}")
    if s.get("server_steps"):
        st = s["server_steps"]
        print("{s:{c}^{n}}".format(s="Server time (GET /metrics)", n=50, c="-"))
        for k in ("prefill", "decode", "engine", "idle"):
            line(f"{k.capitalize()} (s):", f"{st[k + '_s']:.2f} ({100 * st[k + '_s'] / s['benchmark_duration_s']:.1f}%)")
        line("Steps:", st["steps"])
        line("Decode rows per step (mean):", f"{st['decode_rows_per_step']:.1f}")
        line("Decode ms per step (mean):", f"{st['decode_ms_per_step']:.2f}")
    print("=" * 50)
    for e in s["errors"][:5]:
        print(f"error: {e}", file=sys.stderr)
    if len(s["errors"]) > 5:
        print(f"... and {len(s['errors']) - 5} more errors", file=sys.stderr)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080 (without /v1)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="default: $OPENAI_API_KEY")
    p.add_argument("--model", help="default: the first id of GET /v1/models")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (ids) or words (text)")
    p.add_argument("--output-len", type=int, default=64, help="max_tokens of every request")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=0, help="requests in flight at most; 0: no limit")
    p.add_argument("--request-rate", type=float, default=math.inf, help="Poisson arrivals per second; inf: all at once")
    p.add_argument("--seed", type=int, default=0)
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--prompt-ids", action="store_true", help="random token ids as the prompt array (the default)")
    kind.add_argument("--prompt-text", action="store_true", help="random words instead (input length approximate)")
    p.add_argument("--id-low", type=int, default=100, help="lowest random token id")
    p.add_argument("--id-high", type=int, default=8000, help="random token ids are below this (keep it <= vocab)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true",
                   help="ask the server to ignore end-of-sequence ids, so every reply has --output-len tokens")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request socket operation")
    p.add_argument("--json-out", help="also write the settings and results to this JSON file")
    p.add_argument("--allow-failures", action="store_true", help="exit 0 even when requests failed")
    args = p.parse_args(argv)
    if args.input_len < 1 or args.output_len < 1 or args.num_prompts < 1 or args.max_concurrency < 0:
        p.error("--input-len, --output-len and --num-prompts must be >= 1, --max-concurrency >= 0")
    if not args.request_rate > 0:
        p.error("--request-rate must be > 0 (or inf)")
    if not 0 <= args.id_low < args.id_high:
        p.error("need 0 <= --id-low < --id-high")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        client = Client(args.base_url, args.api_key, args.timeout)
        model = args.model or (client.get_json("/v1/models").get("data") or [{}])[0].get("id")
    except (ValueError, RuntimeError, OSError, http.client.HTTPException) as e:
        sys.exit(f"error: {e}")
    if not model:
        sys.exit("error: GET /v1/models listed no model; pass --model")
    rng = random.Random(args.seed)
    prompts = make_prompts(args, rng)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print(f"{args.num_prompts} requests to {args.base_url} (model {model}), {args.input_len} "
          f"{'words' if args.prompt_text else 'token ids'} in, up to {args.output_len} out", file=sys.stderr)
    before = server_steps(client)
    results, duration, peak = benchmark(args, client, model, prompts, rng)
    summary = summarize(args, results, duration, prompts, peak)
    summary["server_steps"] = step_split(before, server_steps(client), duration) if before else None
    print_table(summary, args)
    if args.json_out:
        settings = {k: v for k, v in vars(args).items()
                    if k not in ("api_key", "json_out", "base_url", "model", "prompt_ids", "prompt_text")}
        settings["request_rate"] = "inf" if math.isinf(args.request_rate) else args.request_rate
        settings["prompt_kind"] = "text" if args.prompt_text else "ids"
        with open(args.json_out, "w") as f:
            json.dump({"date": date, "base_url": args.base_url, "model": model, "settings": settings, **summary},
                      f, indent=2)
            f.write("\n")
    return 0 if summary["failed_requests"] == 0 or args.allow_failures else 1


if __name__ == "__main__":
    sys.exit(main())
