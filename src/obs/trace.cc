#include "tutti/obs/trace.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "obs/util.h"
#include "tutti/core/error.h"

namespace tutti::obs {
namespace {

std::int64_t parse_step(const std::string& text, const std::string& whole) {
  try {
    std::size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size() && v >= 0) return v;
  } catch (...) {
  }
  TUTTI_THROW(InvalidArgument, "TUTTI_TRACE_STEPS='", whole,
              "': expected FROM:TO (steps, either may be empty), e.g. "
              "10:20");
}

// Microseconds with nanosecond digits: what the Trace Event format counts in.
std::string micros(std::int64_t ns) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(std::llabs(ns % 1000)));
  std::string out;
  if (ns < 0 && ns > -1000) out += '-';  // -0.500 (ns / 1000 lost the sign)
  out += buf;
  return out;
}

// Rank r's text on rank 0 (others get an empty vector). COLLECTIVE: one allgather of the
// lengths, then one broadcast per rank of its bytes packed into i32 words.
std::vector<std::string> gather_text(Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  Tensor len = Tensor::from_ints({static_cast<std::int64_t>(mine.size())}, {1}, DType::i64);
  Tensor lens = Tensor::empty({n}, DType::i64);
  CallOptions call;
  call.label = "trace gather (lengths)";
  comm.allgather(len, lens, call).wait();
  const std::vector<std::int64_t> sizes = lens.to_ints();
  std::vector<std::string> out;
  if (comm.rank() == 0) out.resize(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    const std::int64_t bytes = sizes[static_cast<std::size_t>(r)];
    if (r == 0) {
      if (comm.rank() == 0) out[0] = mine;
      continue;
    }
    const std::int64_t words = std::max<std::int64_t>((bytes + 3) / 4, 1);
    Tensor buf = Tensor::zeros({words}, DType::i32);
    if (comm.rank() == r) std::memcpy(buf.data(), mine.data(), mine.size());
    call.label = "trace gather (rank " + std::to_string(r) + ")";
    comm.broadcast(buf, r, call).wait();
    if (comm.rank() == 0)
      out[static_cast<std::size_t>(r)].assign(static_cast<const char*>(buf.data()), static_cast<std::size_t>(bytes));
  }
  return out;
}

void write_file(const std::string& path, const std::string& body) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TUTTI_CHECK(f.good(), "TraceSession: cannot write ", tmp, " (", std::strerror(errno), ")");
    f << body;
    f.flush();
    TUTTI_CHECK(f.good(), "TraceSession: writing ", tmp, " failed (", std::strerror(errno), ")");
  }
  std::filesystem::rename(tmp, path);
}

std::string wrap(const std::string& events, const std::string& other) {
  return "{\"displayTimeUnit\":\"ms\",\"otherData\":{" + other + "},\"traceEvents\":[\n" + events + "\n]}\n";
}

}  // namespace

TraceOptions TraceOptions::from_env() {
  TraceOptions o;
  if (const char* dir = std::getenv("TUTTI_TRACE")) o.dir = dir;
  if (const char* steps = std::getenv("TUTTI_TRACE_STEPS"); steps != nullptr && *steps != '\0') {
    const std::string s = steps;
    const auto colon = s.find(':');
    TUTTI_CHECK_ARG(colon != std::string::npos, "TUTTI_TRACE_STEPS='", s, "': expected FROM:TO, e.g. 10:20");
    const std::string from = s.substr(0, colon), to = s.substr(colon + 1);
    o.window.first_step = from.empty() ? 0 : parse_step(from, s);
    o.window.last_step = to.empty() ? -1 : parse_step(to, s);
    TUTTI_CHECK_ARG(o.window.last_step < 0 || o.window.last_step >= o.window.first_step, "TUTTI_TRACE_STEPS='", s,
                    "': the last step is before the first");
  }
  if (const char* max = std::getenv("TUTTI_TRACE_MAX_EVENTS"); max != nullptr && *max != '\0') {
    const std::int64_t v = parse_step(max, max);
    TUTTI_CHECK_ARG(v > 0, "TUTTI_TRACE_MAX_EVENTS must be positive");
    o.window.max_events = static_cast<std::size_t>(v);
  }
  return o;
}

std::string trace_events_json(const std::vector<trace::Event>& events, int rank, const std::string& host,
                              std::int64_t offset_ns, std::int64_t origin_ns) {
  std::string out;
  out.reserve(events.size() * 160 + 512);
  const std::string pid = std::to_string(rank);
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"name\":\"rank " + pid +
         (host.empty() ? "" : " (" + json_escape(host) + ")") + "\"}},\n";
  out += "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"sort_index\":" + pid +
         "}}";
  for (int lane = 0; lane < 3; ++lane) {
    out += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + std::to_string(lane) +
           ",\"args\":{\"name\":\"" + std::string(trace::name_of(static_cast<trace::Lane>(lane))) + "\"}}";
  }
  for (const trace::Event& e : events) {
    const std::int64_t begin = e.begin_ns - offset_ns - origin_ns;
    out += ",\n{\"name\":\"" + json_escape(e.name) + "\",\"cat\":\"" + json_escape(e.category) +
           "\",\"ph\":\"X\",\"pid\":" + pid + ",\"tid\":" + std::to_string(static_cast<int>(e.lane)) +
           ",\"ts\":" + micros(begin) + ",\"dur\":" + micros(std::max<std::int64_t>(e.end_ns - e.begin_ns, 0)) +
           ",\"args\":{\"step\":" + std::to_string(e.step) + (e.args.empty() ? "" : "," + e.args) + "}}";
  }
  return out;
}

TraceSession::TraceSession(Communicator& comm, TraceOptions options) : comm_(comm), options_(std::move(options)) {
  TUTTI_CHECK_ARG(!options_.dir.empty(), "TraceSession: no directory (TraceOptions::dir, or TUTTI_TRACE)");
  TUTTI_CHECK(!trace::started(), "TraceSession: another trace session is recording in this process");
  std::error_code ec;
  std::filesystem::create_directories(options_.dir, ec);
  TUTTI_CHECK(std::filesystem::is_directory(options_.dir), "TraceSession: cannot create the directory ", options_.dir,
              ec ? " (" + ec.message() + ")" : "");
  // Clock offsets: after a barrier every rank reads its clock; the differences to rank 0 are
  // the offsets plus the barrier's exit skew. The median of several rounds.
  const int n = comm_.size();
  constexpr int kRounds = 7;
  std::vector<std::int64_t> mine;
  std::int64_t origin = 0;
  CallOptions call;
  call.label = "trace clock offsets";
  for (int round = 0; round < kRounds; ++round) {
    comm_.barrier(call).wait();
    const std::int64_t t = trace::now_ns();
    Tensor all = Tensor::empty({n}, DType::i64);
    comm_.allgather(Tensor::from_ints({t}, {1}, DType::i64), all, call).wait();
    const std::vector<std::int64_t> ts = all.to_ints();
    mine.push_back(ts[static_cast<std::size_t>(comm_.rank())] - ts[0]);
    if (round == 0) origin = ts[0];
  }
  std::sort(mine.begin(), mine.end());
  offset_ns_ = mine[mine.size() / 2];
  origin_ns_ = origin;
  trace::start(options_.window);
}

std::unique_ptr<TraceSession> TraceSession::from_env(Communicator& comm, std::string host) {
  TraceOptions o = TraceOptions::from_env();
  if (o.dir.empty()) return nullptr;
  o.host = std::move(host);
  return std::make_unique<TraceSession>(comm, std::move(o));
}

TraceSession::~TraceSession() {
  if (!written_) trace::stop();
}

std::vector<std::string> TraceSession::write() {
  TUTTI_CHECK(!written_, "TraceSession::write: called twice");
  written_ = true;
  trace::stop();
  const std::uint64_t dropped = trace::dropped();
  const std::vector<trace::Event> events = trace::collect();
  const int rank = comm_.rank();
  const std::string body = trace_events_json(events, rank, options_.host, offset_ns_, origin_ns_);
  const std::string other = "\"tutti_rank\":" + std::to_string(rank) +
                            ",\"tutti_world_size\":" + std::to_string(comm_.size()) +
                            ",\"tutti_clock_offset_ns\":" + std::to_string(offset_ns_) +
                            ",\"tutti_dropped_spans\":" + std::to_string(dropped) +
                            ",\"tutti_max_spans\":" + std::to_string(options_.window.max_events);
  std::vector<std::string> written;
  const std::string path = options_.dir + "/trace-rank" + std::to_string(rank) + ".json";
  write_file(path, wrap(body, other));
  written.push_back(path);
  const std::vector<std::string> all = gather_text(comm_, body);
  if (rank == 0) {
    std::string merged;
    for (const std::string& part : all) merged += (merged.empty() ? "" : ",\n") + part;
    const std::string merged_path = options_.dir + "/trace.json";
    write_file(merged_path, wrap(merged, "\"tutti_world_size\":" + std::to_string(comm_.size())));
    written.push_back(merged_path);
  }
  return written;
}

}  // namespace tutti::obs
