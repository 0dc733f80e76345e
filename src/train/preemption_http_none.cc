// The preemption watcher in a build without cpp-httplib: URL sources are refused at the
// watcher's construction (file: sources work).
#include "train/preemption_http.h"

namespace tutti::train::detail {

bool http_available() { return false; }

HttpAnswer http_request(const std::string&, const std::string&, const std::vector<std::pair<std::string, std::string>>&,
                        double) {
  return {0, "", "tutti was built without cpp-httplib"};
}

}  // namespace tutti::train::detail
