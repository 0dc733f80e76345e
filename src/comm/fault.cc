// Fault injection (see fault.h).
#include "comm/fault.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tutti/core/error.h"

namespace tutti::detail {
namespace {

struct Fault {
  int rank = -1;
  std::string action;
  FaultPoint point = FaultPoint::start;
  std::uint64_t n = 0;
  std::string text;
};

std::vector<Fault> parse(const char* spec) {
  std::vector<Fault> out;
  std::stringstream all(spec);
  std::string one;
  while (std::getline(all, one, ';')) {
    if (one.empty()) continue;
    const auto colon = one.find(':');
    const auto at = one.find('@');
    TUTTI_CHECK_ARG(colon != std::string::npos && at != std::string::npos && colon < at, "TUTTI_FAULT='", one,
                    "' is not <rank>:<throw|stall|exit>@<start|init|ready|collective=N>");
    Fault f;
    f.text = one;
    f.rank = std::atoi(one.substr(0, colon).c_str());
    f.action = one.substr(colon + 1, at - colon - 1);
    const std::string point = one.substr(at + 1);
    TUTTI_CHECK_ARG(f.action == "throw" || f.action == "stall" || f.action == "exit", "TUTTI_FAULT='", one,
                    "': the action must be throw, stall or exit");
    if (point == "start") {
      f.point = FaultPoint::start;
    } else if (point == "init") {
      f.point = FaultPoint::init;
    } else if (point == "ready") {
      f.point = FaultPoint::ready;
    } else if (point.rfind("collective=", 0) == 0) {
      f.point = FaultPoint::collective;
      f.n = std::strtoull(point.c_str() + 11, nullptr, 10);
    } else {
      TUTTI_THROW(InvalidArgument, "TUTTI_FAULT='", one, "': the point must be start, init, ready or collective=N");
    }
    out.push_back(f);
  }
  return out;
}

const std::vector<Fault>& faults() {
  static const std::vector<Fault> all = [] {
    const char* spec = std::getenv("TUTTI_FAULT");
    return spec != nullptr && *spec != '\0' ? parse(spec) : std::vector<Fault>{};
  }();
  return all;
}

std::atomic<std::uint64_t> collectives{0};

// A line on stderr with the wall-clock time (tests measure how long the job takes to end).
void say(const Fault& f, const char* doing) {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  std::fprintf(stderr, "tutti [rank %d]: TUTTI_FAULT='%s': %s at %.3f\n", error_rank(), f.text.c_str(), doing,
               static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9);
  std::fflush(stderr);
}

}  // namespace

void inject_fault(FaultPoint point) {
  const auto& all = faults();
  if (all.empty()) return;
  const std::uint64_t n = point == FaultPoint::collective ? collectives.fetch_add(1) + 1 : 0;
  for (const Fault& f : all) {
    if (f.rank != error_rank() || f.point != point || (point == FaultPoint::collective && f.n != n)) continue;
    if (f.action == "throw") {
      say(f, "throwing");
      TUTTI_THROW(Error, "fault injected by TUTTI_FAULT='", f.text, "'");
    }
    if (f.action == "stall") {
      say(f, "stopping this process (SIGSTOP)");
      ::raise(SIGSTOP);
    }
    if (f.action == "exit") {
      say(f, "exiting");
      std::_Exit(42);
    }
  }
}

}  // namespace tutti::detail
