#include "cli/commands/version.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/commands/args.h"
#include "cli/commands/commands.h"
#include "cli/commands/model_options.h"
#include "cpu/matmul.h"
#include "markbase_build_info.h"
#include "model/error.h"
#if defined(MARKBASE_HAS_CUDA) && __has_include(<cublas_api.h>)
#include <cublas_api.h>
#endif
#if defined(MARKBASE_HAS_NCCL) && __has_include(<nccl.h>)
#include <nccl.h>
#endif

namespace markbase::cli {
namespace {

void add_line(std::string& out, const char* name, const std::string& value) {
    out += name;
    out += ": ";
    out += value;
    out += '\n';
}

// The versions come from the headers the build compiled against (the libraries linked may be newer).
void add_cuda_lines(std::string& out) {
#ifdef MARKBASE_HAS_CUDA
    add_line(out, "cuda",
             std::string("yes (toolkit ") + MARKBASE_CUDA_TOOLKIT_VERSION + ", architectures " +
                 MARKBASE_CUDA_ARCHITECTURES + ")");
#if defined(CUBLAS_VER_MAJOR)
    add_line(out, "cublas",
             std::to_string(CUBLAS_VER_MAJOR) + "." + std::to_string(CUBLAS_VER_MINOR) + "." +
                 std::to_string(CUBLAS_VER_PATCH));
#else
    add_line(out, "cublas", std::string("the CUDA toolkit's (") + MARKBASE_CUDA_TOOLKIT_VERSION + ")");
#endif
#if defined(NCCL_MAJOR)
    add_line(
        out, "nccl",
        std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH));
#elif defined(MARKBASE_HAS_NCCL)
    add_line(out, "nccl", "yes (version unknown)");
#else
    add_line(out, "nccl", "no (multi-GPU runs left out)");
#endif
#else
    add_line(out, "cuda", "no (a CPU-only build: --device cpu)");
#endif
}

// The instruction-set extensions the compiler was allowed to use everywhere (-march), as its macros say.
std::string cpu_build_text() {
    std::string features;
    auto add = [&](const char* name) {
        if (!features.empty()) features += ' ';
        features += name;
    };
#if defined(__x86_64__)
    add("x86-64");
#elif defined(__aarch64__)
    add("aarch64");
#endif
#ifdef __AVX2__
    add("avx2");
#endif
#ifdef __FMA__
    add("fma");
#endif
#ifdef __F16C__
    add("f16c");
#endif
#ifdef __AVX512F__
    add("avx512f");
#endif
#ifdef __AVX512BW__
    add("avx512bw");
#endif
#ifdef __AVX512VL__
    add("avx512vl");
#endif
#ifdef __AVX512BF16__
    add("avx512bf16");
#endif
    const char* how = MARKBASE_BUILT_NATIVE ? "-march=native" : "the compiler's default target";
    return std::string(how) + " (" + features + "); runs only on CPUs with these";
}

// The kernels compiled in, those this CPU runs, and the one chosen (src/cpu/matmul.cpp's run-time choice).
std::string cpu_matmul_text() {
    std::string runs;
    for (cpu::SimdPath p : cpu::supported_simd_paths()) {
        if (!runs.empty()) runs += ' ';
        runs += cpu::simd_path_name(p);
    }
    return std::string(cpu::matmul_simd_path()) + " (compiled: " + MARKBASE_MATMUL_PATHS_COMPILED +
           "; this CPU runs: " + runs + ")";
}

std::string http_text() {
#ifdef MARKBASE_HAS_HTTP
    return std::string("yes (cpp-httplib ") + MARKBASE_HTTPLIB_VERSION + ", markbase serve)";
#else
    return "no (built without cpp-httplib: markbase serve left out)";
#endif
}

std::string default_model_text() {
    try {
        std::string dir = default_model_dir();
        if (std::getenv("MARKBASE_MODEL") != nullptr) dir += " (MARKBASE_MODEL)";
        return dir;
    } catch (const Error&) {
        return "none found (pass -m DIR or set MARKBASE_MODEL)";
    }
}

}  // namespace

const char* markbase_version() {
    return MARKBASE_VERSION;
}

std::string build_info_text() {
    std::string out = std::string("markbase ") + MARKBASE_VERSION + "\n";
    add_line(out, "commit", MARKBASE_GIT_COMMIT);
    add_line(out, "build type", MARKBASE_BUILD_TYPE);
    add_line(out, "compiler", MARKBASE_COMPILER);
    add_cuda_lines(out);
    add_line(out, "cpu build", cpu_build_text());
    add_line(out, "cpu matmul", cpu_matmul_text());
    add_line(out, "http server", http_text());
    add_line(out, "default model", default_model_text());
    return out;
}

int cmd_version(const Args& args) {
    ArgReader a("version", args);
    a.finish();
    std::fputs(build_info_text().c_str(), stdout);
    return 0;
}

}  // namespace markbase::cli
