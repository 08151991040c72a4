// The counter RNG of specdec_kernels/reference/rng.py, bit for bit: every random number is a pure
// function of (seed, position, purpose, index), MurmurHash3's fmix32 over the key words. Used by
// the verification kernels (verify_cpu_kernel.h) and the drafter's sampled chain
// (model_cpu.cpp). In an anonymous namespace: each unit gets its own copy, as the verification
// kernels are compiled once per CPU capability.
#pragma once

#include <cmath>
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
constexpr float UNIFORM_SCALE = 1.0f / 8388608.0f;  // 2**-23: the coarse cells
constexpr uint32_t FINE_LIMIT = 1u << 23;            // draws below it keep all 32 bits
constexpr float FINE_SCALE = 1.0f / 4294967296.0f;  // 2**-32
constexpr float SERIES_LIMIT = 1.0f / 512.0f;       // 2**-9: E by its series below it

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

// The 32-bit draw of (stream, index).
inline uint32_t draw(uint32_t stream, uint32_t index) {
  return fmix32(fmix32(stream ^ (index * INDEX_MULT)) + stream);
}

// A draw as a uniform that is fine near 0: (r + 0.5) * 2**-32 below 2**23, else
// ((r >> 9) + 0.5) * 2**-23. Exact in float32, in [2**-33, 1 - 2**-24] (rng.unit_interval).
inline float unit_interval(uint32_t r) {
  return r < FINE_LIMIT ? (static_cast<float>(r) + 0.5f) * FINE_SCALE
                        : (static_cast<float>(r >> 9) + 0.5f) * UNIFORM_SCALE;
}

inline float uniform(uint32_t stream, uint32_t index) {
  return unit_interval(draw(stream, index));
}

// The race's Exp(1) draw -log(1 - v): its series below 2**-9 (1 - v would round), else the log
// of the exact 1 - v. Finite and >= v > 0 (rng.exponential).
inline float exponential(float v) {
  return v < SERIES_LIMIT ? v * (1.0f + v * (0.5f + v * (1.0f / 3.0f))) : -std::log(1.0f - v);
}

}  // namespace counter_rng
}  // namespace
}  // namespace specdec
