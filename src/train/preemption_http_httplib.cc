// The preemption watcher's HTTP request with Debian's cpp-httplib (libcpp-httplib-dev).
#include <httplib.h>

#include <chrono>

#include "train/preemption_http.h"

namespace tutti::train::detail {

bool http_available() { return true; }

HttpAnswer http_request(const std::string& method, const std::string& url,
                        const std::vector<std::pair<std::string, std::string>>& headers, double timeout_seconds) {
  HttpAnswer answer;
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    answer.error = "not an http:// URL";
    return answer;
  }
  const std::size_t slash = url.find('/', scheme.size());
  const std::string origin = url.substr(0, slash);
  const std::string path = slash == std::string::npos ? "/" : url.substr(slash);
  try {
    httplib::Client client(origin);
    const auto timeout = std::chrono::microseconds(static_cast<long long>(timeout_seconds * 1e6));
    client.set_connection_timeout(timeout);
    client.set_read_timeout(timeout);
    client.set_write_timeout(timeout);
    httplib::Headers h;
    for (const auto& [k, v] : headers) h.emplace(k, v);
    const httplib::Result r =
        method == "PUT" ? client.Put(path.c_str(), h, "", "text/plain") : client.Get(path.c_str(), h);
    if (!r) {
      answer.error = "no answer from " + origin + " (" + httplib::to_string(r.error()) + ")";
      return answer;
    }
    answer.status = r->status;
    answer.body = r->body;
  } catch (const std::exception& e) {
    answer.error = e.what();
  }
  return answer;
}

}  // namespace tutti::train::detail
