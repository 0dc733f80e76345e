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

}  // namespace tutti::detail
