// What the loader does when a file it reads is not a regular file: a FIFO (which blocks an open forever), a
// character device (/dev/zero never ends), a symlink loop, a directory. Each must be a prompt
// markbase::Error naming the file and what is there instead; each load runs on its own thread and a test
// fails (instead of hanging) when it does not return within a few seconds.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "loading/checkpoint.h"
#include "loading/config_json.h"
#include "loading/generation_config.h"
#include "loading/random_checkpoint.h"
#include "loading/safetensors.h"
#include "model/error.h"
#include "support/error_text.h"
#include "support/tiny_models.h"
#include "tokenizer/tokenizer.h"

namespace markbase {
namespace {

namespace fs = std::filesystem;
using testing::expect_has;

// The message `f` throws, "(no error)", or "(timed out)" when it has not returned after `seconds`; then
// every FIFO under `dir` is opened for writing and closed, which lets a reader blocked on one go on.
std::string error_within(const std::function<void()>& f, const fs::path& dir, int seconds = 3) {
    struct State {
        std::mutex m;
        std::condition_variable cv;
        bool done = false;
        std::string msg;
    };
    auto st = std::make_shared<State>();
    std::thread([st, f] {
        std::string msg = "(no error)";
        try {
            f();
        } catch (const Error& e) {
            msg = e.what();
        } catch (const std::exception& e) {
            msg = std::string("(not a markbase::Error) ") + e.what();
        }
        std::lock_guard<std::mutex> lock(st->m);
        st->msg = msg;
        st->done = true;
        st->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(st->m);
    if (st->cv.wait_for(lock, std::chrono::seconds(seconds), [&] { return st->done; })) return st->msg;
    lock.unlock();
    for (const auto& e : fs::recursive_directory_iterator(dir))
        if (fs::is_fifo(e.symlink_status())) ::close(::open(e.path().c_str(), O_WRONLY | O_NONBLOCK));
    lock.lock();
    st->cv.wait_for(lock, std::chrono::seconds(seconds), [&] { return st->done; });
    return "(timed out)";
}

// A tiny checkpoint with a tokenizer.json; each test replaces one file with something that is not a file.
class CheckpointFileKinds : public ::testing::Test {
  protected:
    void SetUp() override {
        write_random_checkpoint(dir.path(), testing::tiny_config("e2b"), 1);
        std::ofstream(dir.path() / "tokenizer.json")
            << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}})";
    }
    fs::path replace_with_fifo(const std::string& name) {
        const fs::path p = dir.path() / name;
        fs::remove(p);
        EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0);
        return p;
    }
    fs::path replace_with_link(const std::string& name, const fs::path& target) {
        const fs::path p = dir.path() / name;
        fs::remove(p);
        fs::create_symlink(target, p);
        return p;
    }
    fs::path replace_with_loop(const std::string& name) {
        replace_with_link(name + ".loop", dir.path() / name);
        return replace_with_link(name, dir.path() / (name + ".loop"));
    }
    std::string load_error() {
        const fs::path d = dir.path();
        return error_within([d] { load_checkpoint(d); }, d);
    }
    std::string tokenizer_error() {
        const fs::path d = dir.path();
        return error_within([d] { Tokenizer::load(d); }, d);
    }
    testing::TempDir dir{"filekinds"};
};

TEST_F(CheckpointFileKinds, ConfigJson) {
    replace_with_fifo("config.json");
    expect_has(load_error(), {"config.json", "FIFO"});
    replace_with_link("config.json", "/dev/zero");
    expect_has(load_error(), {"config.json", "character device"});
    replace_with_loop("config.json");
    expect_has(load_error(), {"config.json", "symlink loop"});
    replace_with_link("config.json", dir.path());
    expect_has(load_error(), {"config.json", "is a directory"});
}

TEST_F(CheckpointFileKinds, ModelSafetensors) {
    replace_with_fifo("model.safetensors");
    expect_has(load_error(), {"model.safetensors", "FIFO"});
    replace_with_link("model.safetensors", "/dev/zero");
    expect_has(load_error(), {"model.safetensors", "character device"});
    replace_with_loop("model.safetensors");
    expect_has(load_error(), {"model.safetensors", "symlink loop"});
}

TEST_F(CheckpointFileKinds, SafetensorsFileGivenDirectly) {
    const fs::path p = replace_with_fifo("model.safetensors");
    expect_has(error_within([p] { SafetensorsSet::open(p); }, dir.path()), {p.string(), "FIFO"});
    const fs::path loop = replace_with_loop("model.safetensors");
    expect_has(error_within([loop] { SafetensorsSet::open(loop); }, dir.path()),
               {loop.string(), "symlink loop"});
}

TEST_F(CheckpointFileKinds, ShardListedInTheIndex) {
    fs::rename(dir.path() / "model.safetensors", dir.path() / "model-00001-of-00001.safetensors");
    SafetensorsSet s = SafetensorsSet::open(dir.path() / "model-00001-of-00001.safetensors");
    nlohmann::json wm = nlohmann::json::object();
    for (const auto& [name, t] : s.tensors()) wm[name] = "model-00001-of-00001.safetensors";
    std::ofstream(dir.path() / "model.safetensors.index.json") << nlohmann::json{{"weight_map", wm}}.dump();
    replace_with_fifo("model-00001-of-00001.safetensors");
    expect_has(load_error(), {"model-00001-of-00001.safetensors", "FIFO"});
    replace_with_fifo("model.safetensors.index.json");
    expect_has(load_error(), {"model.safetensors.index.json", "FIFO"});
}

TEST_F(CheckpointFileKinds, ModelFolderIsASymlinkLoop) {
    const fs::path loop = replace_with_loop("sub");
    expect_has(error_within([loop] { load_checkpoint(loop); }, dir.path()), {loop.string(), "symlink loop"});
}

TEST_F(CheckpointFileKinds, TokenizerJson) {
    replace_with_fifo("tokenizer.json");
    expect_has(tokenizer_error(), {"tokenizer.json", "FIFO"});
    replace_with_link("tokenizer.json", "/dev/zero");
    expect_has(tokenizer_error(), {"tokenizer.json", "character device"});
    replace_with_loop("tokenizer.json");
    expect_has(tokenizer_error(), {"tokenizer.json", "symlink loop"});
    fs::remove(dir.path() / "tokenizer.json");
    fs::create_directory(dir.path() / "tokenizer.json");
    expect_has(tokenizer_error(), {"tokenizer.json", "is a directory"});
    fs::remove(dir.path() / "tokenizer.json");
    expect_has(tokenizer_error(), {"tokenizer.json"});
}

TEST_F(CheckpointFileKinds, GenerationConfigJson) {
    const fs::path d = dir.path();
    replace_with_fifo("generation_config.json");
    expect_has(error_within([d] { read_generation_config(d); }, d), {"generation_config.json", "FIFO"});
    replace_with_link("generation_config.json", "/dev/zero");
    expect_has(error_within([d] { read_generation_config(d); }, d),
               {"generation_config.json", "character device"});
    fs::remove(d / "generation_config.json");
    EXPECT_EQ(error_within([d] { read_generation_config(d); }, d), "(no error)");  // absent: no defaults
}

}  // namespace
}  // namespace markbase
