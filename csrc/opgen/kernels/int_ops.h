// Integer arithmetic as Python does it, for the size and grid expressions opgen evaluates in C++
// (the executor's `sym` lines, Triton launchers' grids and argument expressions). No Python here.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>

namespace opgen {

// Python's `//` on int64 (rounds toward -inf); a zero divisor throws c10::ValueError.
inline int64_t floordiv(int64_t a, int64_t b) {
  TORCH_CHECK_VALUE(b != 0, "integer division by zero in a size, grid or argument expression");
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// Python's `%` on int64 (the result takes the divisor's sign).
inline int64_t floormod(int64_t a, int64_t b) { return a - floordiv(a, b) * b; }

}  // namespace opgen
