// The counter RNG of specdec_kernels/reference/rng.py, bit for bit: every random number is a pure
// function of (seed, position, purpose, index), MurmurHash3's fmix32 over the key words. Used by
// the verification kernels (verify_cpu_kernel.h) and the drafter's sampled chain
// (model/drafter.cpp). In an anonymous namespace: each unit gets its own copy, as the verification
// kernels are compiled once per CPU capability.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace specdec {
namespace {
namespace counter_rng {

constexpr uint32_t GOLDEN = 0x9E3779B9u;
constexpr uint32_t POS_MULT = 0x85EBCA77u;
constexpr uint32_t PURPOSE_MULT = 0xC2B2AE3Du;
constexpr uint32_t INDEX_MULT = 0x27D4EB2Fu;
// what a number is for: the accept test, the resampling race, the drafter's race
constexpr uint32_t PURPOSE_ACCEPT = 0, PURPOSE_SAMPLE = 1, PURPOSE_DRAFT = 2;
// uniforms: cells of 2**-32 for draws below 2**23, else of 2**-23 (the scales' float bits)
constexpr uint32_t FINE_SCALE_BITS = 0x2F800000u;    // 2**-32
constexpr uint32_t COARSE_SCALE_BITS = 0x34000000u;  // 2**-23
constexpr float SERIES_LIMIT = 1.0f / 512.0f;        // 2**-9: E by its series below it

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
// Branch-free integer selection (the compiler vectorises loops over it; a ternary on floats
// kept them scalar): the cell index is r (fine) or r >> 9 (coarse), both below 2**23 and so
// converted exactly as signed ints, and the scale 2**-32 or 2**-23 is picked by its bits.
inline float unit_interval(uint32_t r) {
  const uint32_t fine = 0u - static_cast<uint32_t>((r >> 23) == 0);  // all ones when fine
  const uint32_t cell = (r & fine) | ((r >> 9) & ~fine);
  const uint32_t scale_bits = (FINE_SCALE_BITS & fine) | (COARSE_SCALE_BITS & ~fine);
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof(scale));
  return (static_cast<float>(static_cast<int32_t>(cell)) + 0.5f) * scale;
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
