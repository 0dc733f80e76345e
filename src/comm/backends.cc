// Which backends this build has. The one place where a build with and without NCCL differ:
// nccl_backend.cc is compiled only with TUTTI_WITH_NCCL (see src/comm/CMakeLists.txt).
#include "comm/backend.h"

namespace tutti::detail {

#if TUTTI_WITH_NCCL
std::shared_ptr<Backend> make_nccl_backend_impl(Bootstrap& bootstrap, std::unique_ptr<ControlChannel> agreement,
                                                Device device, CommOptions options, int board_comm);
std::string nccl_version_impl();

bool built_with_nccl() { return true; }
std::string nccl_version() { return nccl_version_impl(); }
std::shared_ptr<Backend> make_nccl_backend(Bootstrap& bootstrap, std::unique_ptr<ControlChannel> agreement,
                                           Device device, CommOptions options, int board_comm) {
  return make_nccl_backend_impl(bootstrap, std::move(agreement), device, std::move(options), board_comm);
}
#else
bool built_with_nccl() { return false; }
std::string nccl_version() { return "none"; }
std::shared_ptr<Backend> make_nccl_backend(Bootstrap&, std::unique_ptr<ControlChannel>, Device, CommOptions, int) {
  TUTTI_THROW(BackendError, "Backend nccl is not available: tutti was built without NCCL (TUTTI_WITH_NCCL=OFF)");
}
#endif

}  // namespace tutti::detail
