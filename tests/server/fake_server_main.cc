// markbase_fake_server [-m DIR] [--host H] [--port N] [--api-key KEY] [--token-delay-ms N] [-np N] [-c N]
//                      [--max-queue N]
// markbase serve's HTTP layer over the fake engine (fake_engine.h) and a real tokenizer (the bundled model's
// without -m): what the openai npm client's tests (tests/server/js) run against where no serving engine is
// linked. Prints "listening on http://HOST:PORT" on stdout once it accepts; SIGINT/SIGTERM stop it.
#include <cstdio>
#include <ctime>
#include <exception>

#include "cli/commands/args.h"
#include "cli/commands/model_options.h"
#include "server/fake_engine.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
    using namespace markbase;
    try {
        cli::ArgReader a("markbase_fake_server", std::vector<std::string>(argv + 1, argv + argc));
        const std::string dir = a.value_or({"-m", "--model"}, "");
        server::ServerOptions so;
        so.host = a.value_or({"--host"}, "127.0.0.1");
        so.port = a.integer({"--port"}, 0, 0, 65535);
        so.api_key = a.value_or({"--api-key"}, "");
        so.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
        testing::FakeEngineOptions fo;
        fo.token_delay = std::chrono::milliseconds(a.integer({"--token-delay-ms"}, 0, 0, 10000));
        fo.limits.max_sequences = a.integer({"-np", "--parallel"}, 4, 1, 4096);
        fo.limits.ctx_size = a.integer<int64_t>({"-c", "--ctx-size"}, 4096, 2, 1 << 30);
        fo.limits.max_queue = a.integer({"--max-queue"}, 64, 0, 1 << 20);
        a.finish();
        Tokenizer tok = Tokenizer::load(dir.empty() ? cli::default_model_dir() : dir);
        fo.vocab = tok.vocab_size();
        testing::FakeEngine engine(fo);
        server::ServedModel model{
            "fake", static_cast<int64_t>(std::time(nullptr)), tok, SamplingParams{}, {1}};
        server::HttpServer http(engine, std::move(model), so);
        const int port = http.start();
        server::install_stop_handlers();
        std::printf("listening on http://%s:%d\n", so.host.c_str(), port);
        std::fflush(stdout);
        return server::serve_until_signal(http, engine);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
