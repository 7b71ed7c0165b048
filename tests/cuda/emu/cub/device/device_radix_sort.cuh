/* tests/cuda/emu/cub/device/device_radix_sort.cuh -- cub::DeviceRadixSort::SortPairs
 * on the emulated CUDA runtime (cuda_runtime.h), as runtime/cuda/rt_cuda_ops.cu
 * calls it: with d_temp_storage NULL only the temporary storage's size is
 * written (a small nonzero size, as CUB's is); otherwise the pairs are sorted
 * on the stream (kcu_emu_enqueue: recorded under capture), ascending by the
 * key bits [begin_bit, end_bit) taken as unsigned (CUB flips the sign bit of
 * signed keys, so negative keys sort first: so here), stable: equal keys keep
 * their input order.  The temporary storage is not used beyond its size check. */
#ifndef KCU_EMU_CUB_DEVICE_RADIX_SORT_CUH
#define KCU_EMU_CUB_DEVICE_RADIX_SORT_CUH

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

namespace cub {

struct DeviceRadixSort {
  /* The key's radix-sortable bits: unsigned, the sign bit flipped for signed
   * integers (floats are not supported here). */
  template <class K> static uint64_t ordered_bits(K k) {
    static_assert(std::is_integral<K>::value, "kcu_emu's SortPairs sorts integer keys only");
    typedef std::make_unsigned_t<K> U;
    U u = (U)k;
    if (std::is_signed<K>::value) u ^= (U)((U)1 << (sizeof(K) * 8 - 1));
    return (uint64_t)u;
  }

  template <class K, class V>
  static cudaError_t SortPairs(void *d_temp_storage, size_t &temp_storage_bytes,
                               const K *d_keys_in, K *d_keys_out, const V *d_values_in,
                               V *d_values_out, int num_items, int begin_bit = 0,
                               int end_bit = sizeof(K) * 8, cudaStream_t stream = 0) {
    if (!d_temp_storage) {
      temp_storage_bytes = 256;
      return cudaSuccess;
    }
    if (temp_storage_bytes < 256 || num_items < 0 || begin_bit < 0 || end_bit <= begin_bit ||
        end_bit > (int)sizeof(K) * 8)
      return cudaErrorInvalidValue;
    const uint64_t mask = (end_bit - begin_bit >= 64 ? ~(uint64_t)0
                                                     : (((uint64_t)1 << (end_bit - begin_bit)) - 1))
                          << begin_bit;
    if (kcu_emu_enqueue(stream, [=]() {
          std::vector<int> order((size_t)num_items);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
            return (ordered_bits(d_keys_in[a]) & mask) < (ordered_bits(d_keys_in[b]) & mask);
          });
          std::vector<K> k((size_t)num_items);
          std::vector<V> v((size_t)num_items);
          for (int i = 0; i < num_items; i++)
            k[(size_t)i] = d_keys_in[order[(size_t)i]], v[(size_t)i] = d_values_in[order[(size_t)i]];
          if (num_items) {
            std::memcpy(d_keys_out, k.data(), sizeof(K) * (size_t)num_items);
            std::memcpy(d_values_out, v.data(), sizeof(V) * (size_t)num_items);
          }
        }))
      return cudaGetLastError();
    return cudaSuccess;
  }
};

} // namespace cub

#endif
