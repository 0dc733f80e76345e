// The Bootstrap interface's default.
#include "tutti/comm/bootstrap.h"

#include "tutti/core/error.h"

namespace tutti {

std::string Bootstrap::broadcast(std::string_view bytes, int root) {
  TUTTI_CHECK_ARG(root >= 0 && root < size(), "Bootstrap::broadcast: root ", root, " of ", size(), " rank(s)");
  return allgather(rank() == root ? bytes : std::string_view())[static_cast<std::size_t>(root)];
}

}  // namespace tutti
