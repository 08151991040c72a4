// Checked adapters of the KV-cache ops for CPU tensors: metadata checks (kv_cache_checks.h),
// then value checks (cheap on the host: every position the kernel touches must exist), then the
// CPU launcher (kernels/kv_cache_cpu.h).
#include "kv_cache.h"

#include <cstdint>
#include <string>

#include "kernels/kv_cache_cpu.h"
#include "kv_cache_checks.h"

namespace specdec {
namespace {

void check_cpu(const char* op, const at::Tensor& kv_cache) {
  TORCH_CHECK_VALUE(kv_cache.device().is_cpu(), op, ": the CPU kernel got kv_cache on ",
                    kv_cache.device());
}

// "[first, end)", or "[first, first + count)" where the end is past INT64_MAX.
std::string run_str(int64_t first, int64_t count) {
  if (first <= INT64_MAX - count) return c10::str("[", first, ", ", first + count, ")");
  return c10::str("[", first, ", ", first, " + ", count, ")");
}

// Every position in [first, first + count) of row b must have a slot in the cache. The range is
// tested as `first <= capacity - count` (kernels/kv_layout.h: run_inside), never by forming
// `first + count`, which wraps past INT64_MAX for garbage values.
void check_run(const char* op, const char* what, const KvLayout& c, const BlockTable& t,
               int64_t b, int64_t first, int64_t count) {
  if (count <= 0) return;
  const int64_t capacity = row_capacity(c, t);
  TORCH_CHECK_VALUE(run_inside(first, count, capacity), op, ": row ", b, ": ", what,
                    " positions ", run_str(first, count), " are outside [0, ", capacity, ")");
  if (!t.paged) return;
  const int64_t last = first + (count - 1);  // <= capacity - 1: no overflow
  for (int64_t blk = first / c.num_pos; blk <= last / c.num_pos; ++blk) {
    const int32_t id = t.data[b * t.stride + blk];
    TORCH_CHECK_VALUE(0 <= id && id < c.num_rows, op, ": row ", b, ": ", what, " positions ",
                      run_str(first, count), " need block-table entry ", blk, ", which is ", id,
                      " (num_blocks = ", c.num_rows, ")");
  }
}

void write_impl(const char* op, const at::Tensor& kv_cache, int64_t layer, const at::Tensor& key,
                const at::Tensor& value, const at::Tensor* block_tables,
                const at::Tensor& offsets) {
  check_cpu(op, kv_cache);
  const KvWriteArgs a = check_write(op, kv_cache, layer, key, value, block_tables, offsets);
  for (int64_t b = 0; b < a.batch; ++b) {
    check_run(op, "write", a.cache, a.table, b, a.offsets[b], a.num_tokens);
  }
  cpu::launch_kv_write(a);
}

void compact_impl(const char* op, const at::Tensor& kv_cache, const at::Tensor* block_tables,
                  const at::Tensor& src_positions, const at::Tensor& num_keep,
                  const at::Tensor& start) {
  check_cpu(op, kv_cache);
  const KvCompactArgs a =
      check_compact(op, kv_cache, block_tables, src_positions, num_keep, start);
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t n = a.num_keep[b];
    TORCH_CHECK_VALUE(0 <= n && n <= a.num_src, op, ": row ", b, ": num_keep ", n,
                      " is outside [0, ", a.num_src, "] (src_positions has ", a.num_src,
                      " columns)");
    check_run(op, "destination", a.cache, a.table, b, a.start[b], n);
    for (int64_t i = 0; i < n; ++i) {
      check_run(op, "source", a.cache, a.table, b, a.src_positions[b * a.num_src + i], 1);
    }
  }
  cpu::launch_kv_compact(a);
}

}  // namespace

void kv_write_cpu(const at::Tensor& kv_cache, int64_t layer, const at::Tensor& key,
                  const at::Tensor& value, const at::Tensor& offsets) {
  write_impl("kv_write_", kv_cache, layer, key, value, nullptr, offsets.contiguous());
}

void kv_compact_cpu(const at::Tensor& kv_cache, const at::Tensor& src_positions,
                    const at::Tensor& num_keep, const at::Tensor& start) {
  compact_impl("kv_compact_", kv_cache, nullptr, src_positions.contiguous(),
               num_keep.contiguous(), start.contiguous());
}

void paged_kv_write_cpu(const at::Tensor& kv_cache, int64_t layer, const at::Tensor& key,
                        const at::Tensor& value, const at::Tensor& block_tables,
                        const at::Tensor& offsets) {
  const at::Tensor table = block_tables.contiguous();
  write_impl("paged_kv_write_", kv_cache, layer, key, value, &table, offsets.contiguous());
}

void paged_kv_compact_cpu(const at::Tensor& kv_cache, const at::Tensor& block_tables,
                          const at::Tensor& src_positions, const at::Tensor& num_keep,
                          const at::Tensor& start) {
  const at::Tensor table = block_tables.contiguous();
  compact_impl("paged_kv_compact_", kv_cache, &table, src_positions.contiguous(),
               num_keep.contiguous(), start.contiguous());
}

}  // namespace specdec
