#include "core/format_bytes.h"

#include <cstdio>

namespace tutti::detail {

std::string format_bytes(double bytes, int decimals, ByteUnit smallest, ByteUnit largest) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB"};
  // Dividing by 1024 is exact: the value is bytes / 1024^unit to the last bit.
  auto unit = static_cast<int>(smallest);
  double value = bytes;
  for (int u = 0; u < unit; ++u) value /= 1024.0;
  for (; unit < static_cast<int>(largest) && value >= 1024.0; ++unit) value /= 1024.0;
  int places = decimals;
  if (unit == static_cast<int>(ByteUnit::B)) places = 0;
  if (unit == static_cast<int>(ByteUnit::GiB)) places = 2;
  char text[64];
  std::snprintf(text, sizeof text, "%.*f %s", places, value, kNames[unit]);
  return text;
}

std::string format_count(std::int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string s = n < 0 ? "-" : "";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

}  // namespace tutti::detail
