// Byte counts as people read them, for messages and tables ("3.9 KiB", "2.90 GiB"). Internal
// header.
#pragma once

#include <cstdint>
#include <string>

namespace tutti::detail {

enum class ByteUnit : std::uint8_t { B, KiB, MiB, GiB };

// `bytes` in the largest unit from `smallest` to `largest` whose value is at least 1 (in
// `smallest` when none is): B as a whole number, KiB and MiB with `decimals` places, GiB with 2
// (a tenth of a GiB is too coarse for the figures compared). With 1 place from B: "40 B",
// "3.9 KiB", "2.0 MiB", "1.50 GiB"; with 2 from MiB: "0.12 MiB", "2.90 GiB"; in MiB only:
// "0.0 MiB", "4096.0 MiB".
std::string format_bytes(double bytes, int decimals, ByteUnit smallest = ByteUnit::B, ByteUnit largest = ByteUnit::GiB);

// A count with its thousands grouped: "1,234,567", "-4,096", "12".
std::string format_count(std::int64_t n);

}  // namespace tutti::detail
