// detail::format_bytes (src/core/format_bytes.h), in the three forms its callers print: the
// collectives' sizes (1 place from B), the memory plan's table (2 places from MiB) and the
// memory snapshots' sizes (MiB only); and detail::format_count, the plans' element counts. The
// expected texts are the ones tests and docs quote.
#include "core/format_bytes.h"

#include <gtest/gtest.h>

namespace tutti::detail {
namespace {

constexpr double kKiB = 1024.0, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

TEST(FormatBytes, CollectiveSizesFromBytes) {
  EXPECT_EQ(format_bytes(0, 1), "0 B");
  EXPECT_EQ(format_bytes(40, 1), "40 B");
  EXPECT_EQ(format_bytes(1023, 1), "1023 B");
  EXPECT_EQ(format_bytes(kKiB, 1), "1.0 KiB");
  EXPECT_EQ(format_bytes(4000, 1), "3.9 KiB");
  EXPECT_EQ(format_bytes(kMiB - 1, 1), "1024.0 KiB");  // rounds up, but still below a MiB
  EXPECT_EQ(format_bytes(2 * kMiB, 1), "2.0 MiB");
  EXPECT_EQ(format_bytes(1.5 * kGiB, 1), "1.50 GiB");  // GiB always with 2 places
  EXPECT_EQ(format_bytes(3000 * kGiB, 1), "3000.00 GiB");
}

TEST(FormatBytes, MemoryPlanFromMiB) {
  EXPECT_EQ(format_bytes(0, 2, ByteUnit::MiB), "0.00 MiB");
  EXPECT_EQ(format_bytes(16 * 1024 * 8, 2, ByteUnit::MiB), "0.12 MiB");
  EXPECT_EQ(format_bytes(200 * kMiB, 2, ByteUnit::MiB), "200.00 MiB");
  EXPECT_EQ(format_bytes(kGiB - 1, 2, ByteUnit::MiB), "1024.00 MiB");
  EXPECT_EQ(format_bytes(54032059408.0, 2, ByteUnit::MiB), "50.32 GiB");
}

TEST(FormatBytes, SnapshotsInMiBOnly) {
  EXPECT_EQ(format_bytes(0, 1, ByteUnit::MiB, ByteUnit::MiB), "0.0 MiB");
  EXPECT_EQ(format_bytes(4.1 * kMiB, 1, ByteUnit::MiB, ByteUnit::MiB), "4.1 MiB");
  EXPECT_EQ(format_bytes(2 * kGiB, 1, ByteUnit::MiB, ByteUnit::MiB), "2048.0 MiB");
}

// Element counts in plans and messages.
TEST(FormatCount, GroupsThousands) {
  EXPECT_EQ(format_count(0), "0");
  EXPECT_EQ(format_count(999), "999");
  EXPECT_EQ(format_count(1000), "1,000");
  EXPECT_EQ(format_count(1557686400), "1,557,686,400");
  EXPECT_EQ(format_count(-4096), "-4,096");
}

}  // namespace
}  // namespace tutti::detail
