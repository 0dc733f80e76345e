// HttpExporter where tutti was built without cpp-httplib: it says so.
#include "tutti/core/error.h"
#include "tutti/obs/metrics.h"

namespace tutti::obs {

struct HttpExporter::Impl {};

bool HttpExporter::available() { return false; }

HttpExporter::HttpExporter(const MetricRegistry&, int, std::string) {
  TUTTI_THROW(BackendError,
              "HttpExporter: this tutti was built without cpp-httplib (Debian's libcpp-httplib-dev, "
              "which scripts/setup.sh installs): no /metrics endpoint; use TextfileExporter");
}

HttpExporter::~HttpExporter() = default;

}  // namespace tutti::obs
