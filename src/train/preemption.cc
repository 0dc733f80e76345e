// PreemptionWatcher (include/tutti/train/preemption.h): the sources the clouds give, what counts
// as a notice in each one's answer, and the polling thread.
#include "tutti/train/preemption.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "train/preemption_http.h"
#include "tutti/core/error.h"

namespace tutti::train {
namespace {

constexpr const char* kAwsBase = "http://169.254.169.254/latest";
constexpr const char* kGceUrl = "http://metadata.google.internal/computeMetadata/v1/instance/preempted";
constexpr const char* kAzureUrl = "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01";

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string replace_host(std::string text, const std::string& host) {
  for (std::size_t at = text.find("{host}"); at != std::string::npos; at = text.find("{host}", at + host.size())) {
    text.replace(at, 6, host);
  }
  return text;
}

}  // namespace

bool is_preemption_notice(std::string_view kind, int status, std::string_view body) {
  if (status != 200) return false;  // AWS answers 404 until an action is scheduled
  const std::string_view text = trim(body);
  if (kind == "aws") return !text.empty();
  if (kind == "gce") return text == "TRUE";
  if (kind == "azure") {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("Events") || !j["Events"].is_array()) return false;
    for (const nlohmann::json& e : j["Events"]) {
      if (e.is_object() && e.value("EventType", "") == "Preempt") return true;
    }
    return false;
  }
  return !text.empty() && text != "FALSE" && text != "false" && text != "0";
}

PreemptionWatcher::PreemptionWatcher(PreemptionOptions options, std::string host) : options_(std::move(options)) {
  if (options_.source.empty()) return;
  TUTTI_CHECK_ARG(options_.poll_seconds > 0 && options_.timeout_seconds > 0,
                  "PreemptionWatcher: poll_seconds and timeout_seconds must be positive, got ", options_.poll_seconds,
                  " and ", options_.timeout_seconds);
  const std::string& s = options_.source;
  if (s == "aws" || s == "gce" || s == "azure") {
    kind_ = s;
    source_ = s == "aws" ? std::string(kAwsBase) + "/meta-data/spot/instance-action" : s == "gce" ? kGceUrl : kAzureUrl;
  } else if (s.rfind("http://", 0) == 0) {
    kind_ = "url";
    source_ = replace_host(s, host);
  } else if (s.rfind("file:", 0) == 0 && s.size() > 5) {
    kind_ = "file";
    source_ = replace_host(s.substr(5), host);
  } else {
    TUTTI_THROW(InvalidArgument, "preemption notices: the source '", s,
                "' is none of aws, gce, azure, http://HOST[:PORT]/PATH, file:PATH (--preemption-notice)");
  }
  TUTTI_CHECK_ARG(kind_ == "file" || detail::http_available(), "preemption notices from ", source_,
                  " need tutti built with cpp-httplib (apt-get install libcpp-httplib-dev); file:PATH works without");
  thread_ = std::thread([this] { poll_loop(); });
}

PreemptionWatcher::~PreemptionWatcher() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string PreemptionWatcher::notice() const {
  std::lock_guard lock(mutex_);
  return notice_;
}

std::string PreemptionWatcher::last_error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

bool PreemptionWatcher::poll_once() {
  if (kind_ == "file") {
    std::error_code ec;
    if (!std::filesystem::exists(source_, ec)) return false;
    std::ifstream in(source_);
    std::stringstream text;
    text << in.rdbuf();
    const std::string said(trim(text.str()));
    // Empty: perhaps created and not written yet (a shell's `echo terminate > file`). It counts
    // at the next poll, which quotes what was written by then.
    if (said.empty() && !empty_file_seen_) {
      empty_file_seen_ = true;
      return false;
    }
    std::lock_guard lock(mutex_);
    notice_ = "file " + source_ + " exists: " + said;
    return true;
  }
  std::vector<std::pair<std::string, std::string>> headers;
  if (kind_ == "gce") headers.emplace_back("Metadata-Flavor", "Google");
  if (kind_ == "azure") headers.emplace_back("Metadata", "true");
  if (kind_ == "aws") {
    // IMDSv2: a session token first (IMDSv1, where it is still allowed, answers without one).
    const detail::HttpAnswer token =
        detail::http_request("PUT", std::string(kAwsBase) + "/api/token",
                             {{"X-aws-ec2-metadata-token-ttl-seconds", "300"}}, options_.timeout_seconds);
    if (token.status == 200) headers.emplace_back("X-aws-ec2-metadata-token", std::string(trim(token.body)));
  }
  const detail::HttpAnswer a = detail::http_request("GET", source_, headers, options_.timeout_seconds);
  std::lock_guard lock(mutex_);
  error_ = a.status == 0 ? a.error : "";
  if (!is_preemption_notice(kind_, a.status, a.body)) return false;
  notice_ = source_ + " answered: " + std::string(trim(a.body)).substr(0, 200);
  return true;
}

void PreemptionWatcher::poll_loop() {
  const auto period = std::chrono::microseconds(static_cast<long long>(options_.poll_seconds * 1e6));
  while (true) {
    if (poll_once()) {
      noticed_.store(true, std::memory_order_release);
      return;  // a notice stays: nothing more to ask
    }
    std::unique_lock lock(mutex_);
    if (stop_cv_.wait_for(lock, period, [this] { return stopping_; })) return;
  }
}

}  // namespace tutti::train
