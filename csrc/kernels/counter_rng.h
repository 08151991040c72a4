// The counter RNG of specdec_kernels/reference/rng.py, bit for bit: every random number is a pure
// function of (seed, position, purpose, index), MurmurHash3's fmix32 over the key words. Used by
// the verification kernels (verify_cpu_kernel.h) and the drafter's sampled chain
// (model_cpu.cpp). In an anonymous namespace: each unit gets its own copy, as the verification
// kernels are compiled once per CPU capability.
#pragma once

#include <cstdint>

namespace specdec {
namespace {
namespace counter_rng {

constexpr uint32_t GOLDEN = 0x9E3779B9u;
constexpr uint32_t POS_MULT = 0x85EBCA77u;
constexpr uint32_t PURPOSE_MULT = 0xC2B2AE3Du;
constexpr uint32_t INDEX_MULT = 0x27D4EB2Fu;
// what a number is for: the accept test, the resampling race, the drafter's race
constexpr uint32_t PURPOSE_ACCEPT = 0, PURPOSE_SAMPLE = 1, PURPOSE_DRAFT = 2;
constexpr float UNIFORM_SCALE = 1.0f / 8388608.0f;  // 2**-23
constexpr float EXP_FLOOR = 1.0f / 33554432.0f;     // 2**-25

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

inline uint32_t row_key(int64_t seed) {
  const uint64_t s = static_cast<uint64_t>(seed);
  return fmix32(static_cast<uint32_t>(s) ^ fmix32(static_cast<uint32_t>(s >> 32) + GOLDEN));
}

inline uint32_t stream_key(uint32_t key, int64_t position, uint32_t purpose) {
  return fmix32(key + static_cast<uint32_t>(position) * POS_MULT + purpose * PURPOSE_MULT);
}

// ((r >> 9) + 0.5) * 2**-23: exact in float32, in [2**-24, 1 - 2**-24].
inline float uniform(uint32_t stream, uint32_t index) {
  const uint32_t r = fmix32(fmix32(stream ^ (index * INDEX_MULT)) + stream);
  return (static_cast<float>(r >> 9) + 0.5f) * UNIFORM_SCALE;
}

}  // namespace counter_rng
}  // namespace
}  // namespace specdec
