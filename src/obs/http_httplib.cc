// HttpExporter with Debian's cpp-httplib (libcpp-httplib-dev): built where CMake finds it.
#include <httplib.h>

#include <chrono>

#include "tutti/core/error.h"
#include "tutti/obs/metrics.h"

namespace tutti::obs {

struct HttpExporter::Impl {
  httplib::Server server;
  std::thread thread;
};

bool HttpExporter::available() { return true; }

HttpExporter::HttpExporter(const MetricRegistry& registry, int port, std::string address)
    : impl_(std::make_unique<Impl>()) {
  TUTTI_CHECK_ARG(port >= 0 && port < 65536, "HttpExporter: port ", port, " is out of range");
  const MetricRegistry* r = &registry;
  impl_->server.Get("/metrics", [r](const httplib::Request&, httplib::Response& res) {
    res.set_content(r->text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  impl_->server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("tutti: metrics at /metrics\n", "text/plain");
  });
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, with which a second server on a
  // port in use (two ranks of a host given the same port) binds silently and shares the requests.
  impl_->server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<void*>(&yes), sizeof(yes));
  });
  port_ = port == 0 ? impl_->server.bind_to_any_port(address.c_str())
                    : (impl_->server.bind_to_port(address.c_str(), port) ? port : -1);
  TUTTI_CHECK(port_ > 0, "HttpExporter: cannot listen on ", address, ":", port,
              " (in use? another rank of this host "
              "on the same port?)");
  Impl* impl = impl_.get();
  impl_->thread = std::thread([impl] { impl->server.listen_after_bind(); });
  // Serving before the constructor returns (and before a destructor could stop a server that
  // has not started: stop() would then do nothing and the thread would listen forever).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!impl_->server.is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

HttpExporter::~HttpExporter() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace tutti::obs
