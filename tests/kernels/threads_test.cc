#include "tutti/kernels/threads.h"

#include <gtest/gtest.h>

#include "tutti/core/error.h"

namespace tutti::kernels {
namespace {

TEST(CpuThreads, SetAndRead) {
  set_cpu_threads(1);
  EXPECT_EQ(cpu_threads(), 1);
  set_cpu_threads(2);
  EXPECT_EQ(cpu_threads(), 2);
  EXPECT_THROW(set_cpu_threads(0), InvalidArgument);
  EXPECT_EQ(cpu_threads(), 2);
}

}  // namespace
}  // namespace tutti::kernels
