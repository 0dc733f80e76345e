#include "tutti/kernels/threads.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <string>

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

namespace tutti::kernels {
namespace {

TEST(CpuBlas, SaysWhichKernelsRunAndWhenTheyAreTooOld) {
  const CpuBlasInfo info = cpu_blas_info();
  EXPECT_FALSE(info.core.empty());
  EXPECT_TRUE(info.cpu_isa == "avx512" || info.cpu_isa == "avx2" || info.cpu_isa == "avx" || info.cpu_isa == "sse" ||
              info.cpu_isa == "other")
      << info.cpu_isa;
  EXPECT_TRUE(info.conv.rfind("oneDNN ", 0) == 0 || info.conv == "im2col + OpenBLAS") << info.conv;
  if (info.suggested.empty()) {
    EXPECT_EQ(info.warning(), "");
  } else {
    EXPECT_NE(info.warning().find("OPENBLAS_CORETYPE=" + info.suggested), std::string::npos) << info.warning();
    EXPECT_NE(info.warning().find(info.core), std::string::npos) << info.warning();
  }
  // ctest runs this test again with OPENBLAS_CORETYPE forced (the variable OpenBLAS reads when
  // it loads): its oldest x86-64 kernels, AVX2 kernels, AVX-512 kernels.
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced == nullptr || (info.cpu_isa != "avx512" && info.cpu_isa != "avx2")) return;
  // OpenBLAS reads the variable without regard to case and reports its own spelling.
  auto lower = [](std::string v) {
    for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return v;
  };
  if (lower(forced) == "skylakex" && info.cpu_isa != "avx512") return;  // OpenBLAS takes older kernels then
  EXPECT_EQ(lower(info.core), lower(forced));
  if (lower(forced) == "prescott") {
    EXPECT_EQ(info.suggested, info.cpu_isa == "avx512" ? "SkylakeX" : "Haswell");
  } else if (lower(forced) == "haswell") {
    // AVX2 kernels: right for an AVX2 CPU; an AVX-512 CPU is told about its AVX-512 kernels.
    EXPECT_EQ(info.suggested, info.cpu_isa == "avx512" ? "SkylakeX" : "");
    if (info.cpu_isa == "avx512") EXPECT_NE(info.warning().find("(AVX2) on a CPU with AVX-512"), std::string::npos);
  } else if (lower(forced) == "skylakex") {
    EXPECT_EQ(info.suggested, "");
  }
}

}  // namespace
}  // namespace tutti::kernels
