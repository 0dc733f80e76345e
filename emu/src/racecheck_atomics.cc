// The hazard detector's view of kernel code's atomics: ThreadSanitizer's atomic entry points
// (what -fsanitize=thread code calls for every std::atomic_ref operation, so for atomicAdd and the
// other device atomics), defined here in place of libtsan's, as racecheck.cc does for loads and
// stores.
#include <cstdint>

#include "racecheck.h"

namespace rc = tutti::emu::racecheck;

// Atomics: done as asked (sequentially consistent, which is at least as strong); on shared
// memory checked against plain accesses, on global memory not recorded.
#define TUTTI_RACECHECK_ATOMIC(bits, T)                                                                     \
  extern "C" T __tsan_atomic##bits##_load(const volatile T* a, int) {                                       \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                            \
  }                                                                                                         \
  extern "C" void __tsan_atomic##bits##_store(volatile T* a, T v, int) {                                    \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                               \
  }                                                                                                         \
  extern "C" T __tsan_atomic##bits##_exchange(volatile T* a, T v, int) {                                    \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                                     \
  }                                                                                                         \
  extern "C" T __tsan_atomic##bits##_fetch_add(volatile T* a, T v, int) {                                   \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                                      \
  }                                                                                                         \
  extern "C" T __tsan_atomic##bits##_fetch_sub(volatile T* a, T v, int) {                                   \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                                      \
  }                                                                                                         \
  extern "C" T __tsan_atomic##bits##_fetch_and(volatile T* a, T v, int) {                                   \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                                      \
  }                                                                                                         \
  extern "C" T __tsan_atomic##bits##_fetch_or(volatile T* a, T v, int) {                                    \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                                       \
  }                                                                                                         \
  extern "C" T __tsan_atomic##bits##_fetch_xor(volatile T* a, T v, int) {                                   \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                                      \
  }                                                                                                         \
  extern "C" T __tsan_atomic##bits##_fetch_nand(volatile T* a, T v, int) {                                  \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                                     \
  }                                                                                                         \
  extern "C" int __tsan_atomic##bits##_compare_exchange_strong(volatile T* a, T* expected, T v, int, int) { \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    return __atomic_compare_exchange_n(a, expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);          \
  }                                                                                                         \
  extern "C" int __tsan_atomic##bits##_compare_exchange_weak(volatile T* a, T* expected, T v, int, int) {   \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    return __atomic_compare_exchange_n(a, expected, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);           \
  }                                                                                                         \
  extern "C" T __tsan_atomic##bits##_compare_exchange_val(volatile T* a, T expected, T v, int, int) {       \
    rc::atomic_access(a, sizeof(T), __builtin_return_address(0));                                           \
    __atomic_compare_exchange_n(a, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                \
    return expected;                                                                                        \
  }
TUTTI_RACECHECK_ATOMIC(8, std::uint8_t)
TUTTI_RACECHECK_ATOMIC(16, std::uint16_t)
TUTTI_RACECHECK_ATOMIC(32, std::uint32_t)
TUTTI_RACECHECK_ATOMIC(64, std::uint64_t)
#undef TUTTI_RACECHECK_ATOMIC

extern "C" void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
extern "C" void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
