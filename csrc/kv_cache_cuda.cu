// Checked adapters of the KV-cache ops for CUDA tensors: metadata checks (kv_cache_checks.h),
// device guard, current stream, then the launchers of kernels/kv_cache_cuda.cuh. Values are not
// checked here (that would synchronise); the kernels skip out-of-range positions instead, and
// the Python classes validate values before calling.
// c10's CUDA headers only: ATen/cuda/CUDAContext.h would pull in cuBLAS/cuSPARSE headers.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/kv_cache_cuda.cuh"
#include "kv_cache.h"
#include "kv_cache_checks.h"

namespace specdec {
namespace {

void check_cuda(const char* op, const at::Tensor& kv_cache) {
  TORCH_CHECK_VALUE(kv_cache.is_cuda(), op, ": the CUDA kernel got kv_cache on ",
                    kv_cache.device());
}

void write_impl(const char* op, const at::Tensor& kv_cache, int64_t layer, const at::Tensor& key,
                const at::Tensor& value, const at::Tensor* block_tables,
                const at::Tensor& offsets) {
  check_cuda(op, kv_cache);
  const c10::cuda::CUDAGuard device_guard(kv_cache.device());
  const KvWriteArgs a = check_write(op, kv_cache, layer, key, value, block_tables, offsets);
  cuda::launch_kv_write(a, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void compact_impl(const char* op, const at::Tensor& kv_cache, const at::Tensor* block_tables,
                  const at::Tensor& src_positions, const at::Tensor& num_keep,
                  const at::Tensor& start) {
  check_cuda(op, kv_cache);
  TORCH_CHECK_VALUE(kv_cache.size(0) <= 65535, op, ": at most 65535 layers per launch, kv_cache "
                    "has shape ", kv_cache.sizes());
  const c10::cuda::CUDAGuard device_guard(kv_cache.device());
  const KvCompactArgs a =
      check_compact(op, kv_cache, block_tables, src_positions, num_keep, start);
  at::Tensor scratch;
  const int64_t scratch_bytes = cuda::compact_scratch_bytes(a);
  if (scratch_bytes > 0) {
    scratch = at::empty({scratch_bytes}, kv_cache.options().dtype(at::kByte));
  }
  cuda::launch_kv_compact(a, scratch_bytes > 0 ? scratch.data_ptr() : nullptr,
                          c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void kv_write_cuda(const at::Tensor& kv_cache, int64_t layer, const at::Tensor& key,
                   const at::Tensor& value, const at::Tensor& offsets) {
  write_impl("kv_write_", kv_cache, layer, key, value, nullptr, offsets.contiguous());
}

void kv_compact_cuda(const at::Tensor& kv_cache, const at::Tensor& src_positions,
                     const at::Tensor& num_keep, const at::Tensor& start) {
  compact_impl("kv_compact_", kv_cache, nullptr, src_positions.contiguous(),
               num_keep.contiguous(), start.contiguous());
}

void paged_kv_write_cuda(const at::Tensor& kv_cache, int64_t layer, const at::Tensor& key,
                         const at::Tensor& value, const at::Tensor& block_tables,
                         const at::Tensor& offsets) {
  const at::Tensor table = block_tables.contiguous();
  write_impl("paged_kv_write_", kv_cache, layer, key, value, &table, offsets.contiguous());
}

void paged_kv_compact_cuda(const at::Tensor& kv_cache, const at::Tensor& block_tables,
                           const at::Tensor& src_positions, const at::Tensor& num_keep,
                           const at::Tensor& start) {
  const at::Tensor table = block_tables.contiguous();
  compact_impl("paged_kv_compact_", kv_cache, &table, src_positions.contiguous(),
               num_keep.contiguous(), start.contiguous());
}

}  // namespace specdec
