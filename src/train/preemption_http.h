// One plain HTTP request for the preemption watcher (preemption.cc): with Debian's cpp-httplib
// (preemption_http_httplib.cc) or, in a build without it, nothing (preemption_http_none.cc).
// Internal header.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tutti::train::detail {

struct HttpAnswer {
  int status = 0;  // 0: no answer (error says why)
  std::string body;
  std::string error;
};

bool http_available();
// `url`: "http://host[:port]/path?query". Never throws: a failure is in HttpAnswer::error.
HttpAnswer http_request(const std::string& method, const std::string& url,
                        const std::vector<std::pair<std::string, std::string>>& headers, double timeout_seconds);

}  // namespace tutti::train::detail
