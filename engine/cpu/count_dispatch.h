// Run-time count to compile-time constant, for kernels specialised on a
// small count (vectors per head, activation rows per pass) whose
// accumulators must be registers.
#pragma once

#include <type_traits>
#include <utility>

namespace pdserve::engine::cpu {

// Calls fn(std::integral_constant<int, c>{}) for c = clamp(n, 1, kMax).
template <int kMax, typename Fn>
void WithCount(int n, Fn&& fn) {
  const int c = n < 1 ? 1 : (n > kMax ? kMax : n);
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (void)((c == I + 1 ? (fn(std::integral_constant<int, I + 1>{}), true) : false) || ...);
  }
  (std::make_integer_sequence<int, kMax>{});
}

}  // namespace pdserve::engine::cpu
