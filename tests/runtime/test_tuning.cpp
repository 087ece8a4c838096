// The engine's tuning string (runtime/tuning.h): the defaults are the product's, every key parses, and a
// wrong key or value is refused naming the source, the key, the value and what was expected.
#include <gtest/gtest.h>

#include <string>

#include "model/error.h"
#include "runtime/tuning.h"

namespace markbase {
namespace {

std::string error_of(const std::string& spec) {
    try {
        parse_tuning(spec, "MARKBASE_TUNING");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(Tuning, EmptyIsTheDefaults) {
    const Tuning t = parse_tuning("");
    EXPECT_TRUE(t.device_sampling);
    EXPECT_EQ(t.gemv, Tuning::Gemv::kAuto);
    EXPECT_EQ(t.attn_cluster, Tuning::Choice::kAuto);
    EXPECT_EQ(t.tp_allreduce, Tuning::AllReduce::kP2p);
    EXPECT_EQ(t.load_threads, 0);
    EXPECT_EQ(t.load_chunk_mib, 64);
    EXPECT_FALSE(t.load_direct);
    EXPECT_EQ(t.attn_gemm_rows, 0);
    EXPECT_TRUE(t.moe_gemm);
    EXPECT_EQ(t.gemm_inputs, Tuning::GemmInputs::kBf16);
    EXPECT_EQ(t.batch_attn_keys, 64);
    EXPECT_EQ(t.batch_attn_heads, 0);
    EXPECT_EQ(t.batch_attn, Tuning::BatchAttn::kMma);
    EXPECT_EQ(t.decode_attn, Tuning::DecodeAttn::kAuto);
    EXPECT_EQ(t.stream_gemm, 16);
    EXPECT_EQ(t.tile_gemm, 128);
    EXPECT_FALSE(t.cpu_pin);
    EXPECT_TRUE(t.skip.empty());
    EXPECT_EQ(tuning_string(t), "");
}

TEST(Tuning, EveryKeyParsesAndPrintsBack) {
    const std::string spec =
        "device_sampling=0,gemv=async_geglu,attn_cluster=1,tp_allreduce=nccl,load_threads=3,load_chunk_mib=1,"
        "load_direct=1,attn_gemm_rows=40,batch_attn_keys=16,batch_attn_heads=2,"
        "batch_attn=warp,decode_attn=mma,stream_gemm=0,tile_gemm=32,moe_gemm=0,gemm_inputs=halves,"
        "cpu_pin=1,skip=qkv+route_topk";
    const Tuning t = parse_tuning(spec);
    EXPECT_FALSE(t.device_sampling);
    EXPECT_EQ(t.gemv, Tuning::Gemv::kAsyncGeglu);
    EXPECT_EQ(t.attn_cluster, Tuning::Choice::kOn);
    EXPECT_EQ(t.tp_allreduce, Tuning::AllReduce::kNccl);
    EXPECT_EQ(t.load_threads, 3);
    EXPECT_EQ(t.load_chunk_mib, 1);
    EXPECT_TRUE(t.load_direct);
    EXPECT_EQ(t.attn_gemm_rows, 40);
    EXPECT_EQ(t.decode_attn, Tuning::DecodeAttn::kMma);
    EXPECT_EQ(parse_tuning("decode_attn=pieces").decode_attn, Tuning::DecodeAttn::kPieces);
    EXPECT_EQ(tuning_string(parse_tuning("decode_attn=pieces")), "decode_attn=pieces");
    EXPECT_EQ(tuning_string(parse_tuning("decode_attn=auto")), "");
    EXPECT_FALSE(t.moe_gemm);
    EXPECT_EQ(t.gemm_inputs, Tuning::GemmInputs::kHalves);
    EXPECT_EQ(t.batch_attn_keys, 16);
    EXPECT_EQ(t.batch_attn_heads, 2);
    EXPECT_EQ(t.batch_attn, Tuning::BatchAttn::kWarp);
    EXPECT_EQ(t.stream_gemm, 0);
    EXPECT_EQ(t.tile_gemm, 32);
    EXPECT_TRUE(t.cpu_pin);
    ASSERT_EQ(t.skip.size(), 2u);
    EXPECT_EQ(t.skip[1], "route_topk");
    EXPECT_EQ(tuning_string(t), spec);
    EXPECT_EQ(parse_tuning("gemv=rows,attn_cluster=0").gemv, Tuning::Gemv::kRows);
    EXPECT_EQ(parse_tuning("attn_cluster=0").attn_cluster, Tuning::Choice::kOff);
    EXPECT_EQ(parse_tuning("gemv=rows,,gemv=auto").gemv, Tuning::Gemv::kAuto) << "the last one wins";
}

TEST(Tuning, WrongKeysAndValuesAreRefusedByName) {
    EXPECT_NE(error_of("gemv_variant=warp").find("MARKBASE_TUNING: unknown key 'gemv_variant'"),
              std::string::npos);
    EXPECT_NE(error_of("gemv").find("'gemv' is not key=value"), std::string::npos);
    EXPECT_NE(error_of("gemv=warpk").find("gemv=warpk: expected auto, rows or async_geglu"),
              std::string::npos);
    EXPECT_NE(error_of("attn_cluster=yes").find("attn_cluster=yes: expected 0 or 1"), std::string::npos);
    EXPECT_NE(error_of("device_sampling=").find("device_sampling=: expected 0 or 1"), std::string::npos);
    EXPECT_NE(error_of("tp_allreduce=mpi").find("expected p2p or nccl"), std::string::npos);
    EXPECT_NE(error_of("load_threads=-1").find("load_threads=-1: expected"), std::string::npos);
    EXPECT_NE(error_of("load_chunk_mib=0").find("load_chunk_mib=0"), std::string::npos);
    EXPECT_NE(error_of("load_chunk_mib=2k").find("load_chunk_mib=2k"), std::string::npos);
    EXPECT_NE(error_of("attn_gemm_rows=8").find("attn_gemm_rows=8"), std::string::npos);
    EXPECT_NE(error_of("batch_attn_keys=8").find("batch_attn_keys=8: expected 16 to"), std::string::npos);
    EXPECT_NE(error_of("batch_attn_heads=3").find("batch_attn_heads=3: expected 0 (automatic), 1, 2, 4 or 8"),
              std::string::npos);
    EXPECT_NE(error_of("batch_attn_heads=16").find("batch_attn_heads=16: expected"), std::string::npos);
    EXPECT_NE(error_of("batch_attn=tc").find("batch_attn=tc: expected mma or warp"), std::string::npos);
    EXPECT_NE(error_of("decode_attn=warp").find("decode_attn=warp: expected auto, pieces or mma"),
              std::string::npos);
    EXPECT_NE(error_of("stream_gemm=65").find("stream_gemm=65: expected 0 (off) to 64"), std::string::npos);
    EXPECT_NE(error_of("tile_gemm=129").find("tile_gemm=129: expected 0 (off) to 128"), std::string::npos);
    EXPECT_NE(error_of("gemm_inputs=fp32").find("gemm_inputs=fp32: expected bf16 or halves"),
              std::string::npos);
    EXPECT_NE(error_of("skip=").find("skip=: expected"), std::string::npos);
    EXPECT_NE(error_of("skip=qkv++ffn").find("skip=qkv++ffn"), std::string::npos);
}

}  // namespace
}  // namespace markbase
