# Sourced by bench/serve_h200.sh and bench/peers/llama_server_h200.sh: a server started and stopped around
# tools/bench_serve.py's loads, GPU memory sampled meanwhile. Needs PORT, OUT and say() from the caller.

# start_server NAME CMD...: runs CMD in the background (its output to $OUT/NAME-server.txt), waits up to two
# minutes for GET /health to answer 200; SERVER_PID and SMI_PID are set. Returns 1 when it never answers.
start_server() {
    local name=$1
    shift
    "$@" > "$OUT/$name-server.txt" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 240); do
        if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" \
            > /dev/null 2>&1; then
            say "$name up"
            nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/$name-mem.txt" 2>&1 &
            SMI_PID=$!
            return 0
        fi
        kill -0 "$SERVER_PID" 2> /dev/null || break
        sleep 0.5
    done
    say "$name did not come up"
    tail -20 "$OUT/$name-server.txt"
    kill "$SERVER_PID" 2> /dev/null
    return 1
}

# load NAME LIMIT_S ARGS...: tools/bench_serve.py against the server with ARGS, its JSON to $OUT/NAME.json.
load() {
    local name=$1 limit=$2
    shift 2
    timeout "$limit" python3 "$BENCH" --base-url "http://127.0.0.1:$PORT" --allow-failures "$@" \
        --json-out "$OUT/$name.json" > "$OUT/$name.txt" 2>&1
    say "$name rc=$?"
}

# stop_server: SIGTERM (in-flight streams end with an error event) and waits for it to exit.
stop_server() {
    kill "$SMI_PID" 2> /dev/null
    kill -TERM "$SERVER_PID" 2> /dev/null
    wait "$SERVER_PID" 2> /dev/null
}
