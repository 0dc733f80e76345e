// The observability layer under mpirun: the timeline (a DDP run traced, the files read back as
// Trace Event JSON: valid, spans nest per lane, every bucket's collective inside its step,
// bounded by the ring and the step window, clocks aligned), Prometheus text and its exporters,
// and FLOPs/peaks for MFU. Stragglers: straggler_test.cc.
//
// obs_test_emu runs the same on the emulated CUDA device (a GPU per rank, nccl): the layers'
// spans then come from CUDA events on the model's stream and the collectives' from events on
// NCCL's stream.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ddp/ddp_test_util.h"
#include "tutti/core/trace.h"
#include "tutti/ddp/ddp.h"
#include "tutti/nn/loss.h"
#include "tutti/obs/metrics.h"
#include "tutti/obs/mfu.h"
#include "tutti/obs/straggler.h"
#include "tutti/obs/trace.h"

namespace tutti::obs {
namespace {

using namespace tutti::testing;
using json = nlohmann::json;

// A fresh directory every rank sees (rank 0 makes it, every rank learns its name).
std::string shared_tmpdir() {
  std::string dir;
  if (world().rank() == 0) {
    char name[] = "/tmp/tutti_obs_XXXXXX";
    dir = mkdtemp(name);
  }
  return all_hosts(world().cpu_communicator(), dir)[0];
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

// The complete ("X") events of a trace.
std::vector<json> spans_of(const json& trace) {
  std::vector<json> out;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X") out.push_back(e);
  }
  return out;
}

// Every span well formed (Trace Event format), and on every (pid, tid) the spans nest or follow
// each other: none partly overlaps another. Device spans are placed from float milliseconds:
// 1 us of slack there.
void expect_valid_and_nested(const json& trace, int ranks, int only_rank = -1) {
  ASSERT_TRUE(trace.contains("traceEvents"));
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> lanes;
  std::set<int> named;
  for (const json& e : trace.at("traceEvents")) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name")) << e.dump();
    if (e.at("ph") == "M") {
      if (e.at("name") == "process_name") named.insert(e.at("pid").get<int>());
      continue;
    }
    ASSERT_EQ(e.at("ph"), "X") << e.dump();
    ASSERT_TRUE(e.at("name").is_string() && e.at("cat").is_string()) << e.dump();
    ASSERT_TRUE(e.at("ts").is_number() && e.at("dur").is_number()) << e.dump();
    ASSERT_GE(e.at("dur").get<double>(), 0.0) << e.dump();
    const int pid = e.at("pid").get<int>(), tid = e.at("tid").get<int>();
    ASSERT_TRUE(pid >= 0 && pid < ranks) << e.dump();
    ASSERT_TRUE(tid >= 0 && tid <= 2) << e.dump();
    ASSERT_TRUE(e.at("args").at("step").is_number_integer()) << e.dump();
    const double ts = e.at("ts").get<double>();
    lanes[{pid, tid}].emplace_back(ts, ts + e.at("dur").get<double>());
  }
  for (int r = 0; r < ranks; ++r) {
    if (only_rank < 0 || r == only_rank) EXPECT_TRUE(named.count(r)) << "no process_name for rank " << r;
  }
  for (auto& [lane, spans] : lanes) {
    const double slack = lane.second == 0 ? 0.002 : 1.0;  // us
    std::sort(spans.begin(), spans.end(),
              [](auto a, auto b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
    std::vector<double> open_ends;  // a stack of the ends of the spans that contain the current one
    for (const auto& [begin, end] : spans) {
      while (!open_ends.empty() && open_ends.back() <= begin + slack) open_ends.pop_back();
      if (!open_ends.empty()) {
        ASSERT_LE(end, open_ends.back() + slack)
            << "rank " << lane.first << " lane " << lane.second << ": the span [" << begin << ", " << end
            << "] overlaps the end of one that contains its start (" << open_ends.back() << ")";
      }
      open_ends.push_back(end);
    }
  }
}

// A small DDP run with several buckets, traced; returns the plan's bucket count.
struct Traced {
  int buckets = 0;
  std::vector<std::string> files;
  std::string dir;
  std::int64_t offset_ns = 0;
  Traced() = default;
  Traced(const Traced&) = delete;
  // The files go when every rank has read them.
  ~Traced() {
    world().cpu_communicator().barrier().wait();
    if (world().rank() == 0 && !dir.empty()) std::filesystem::remove_all(dir);
  }
};
void run_traced(Traced& out, int steps, trace::Options window) {
  out.dir = shared_tmpdir();
  const Device device = world().device();
  const Stream stream = device.is_cuda() ? Stream::create(device) : Stream();
  auto model = make_mlp(64);
  model->to(device, stream).init(kSeed);
  ddp::DdpOptions o;
  o.bucket_cap_mb = 0.002;  // several buckets: the MLP's layers hold 3-5 KiB of gradients each
  o.first_bucket_cap_mb = 0.001;
  ddp::DistributedDataParallel ddp(world().communicator(), *model, o);
  auto opt = make_optimizer(Opt::sgd, *model);
  ddp.attach(*opt);
  out.buckets = static_cast<int>(ddp.reducer().plan().buckets.size());
  nn::CrossEntropyLoss loss;
  const Batch global = global_batch({12}, 8 * world().world_size(), 7);
  const Batch mine = my_slice(global);
  const Tensor x = mine.x.to(device, stream), y = mine.y.to(device, stream);

  TraceOptions to;
  to.dir = out.dir;
  to.window = window;
  to.host = world().hostname();
  TraceSession session(world().cpu_communicator(), to);
  out.offset_ns = session.clock_offset_ns();
  for (int step = 1; step <= steps; ++step) {
    trace::begin_step(step);
    loss.forward(ddp.forward(x), y, 1.0, stream);
    EXPECT_TRUE(ddp.backward(loss.grad()));
    if (!ddp.found_nonfinite()) opt->step();
    ddp.zero_grad();
    stream.synchronize();
    trace::end_step();
  }
  out.files = session.write();
  world().cpu_communicator().barrier().wait();
}

TEST(Trace, ValidNestedAndEveryBucketInsideItsStep) {
  const int n = world().world_size(), steps = 4;
  Traced t;
  run_traced(t, steps, {});
  ASSERT_EQ(t.files.size(), world().rank() == 0 ? 2u : 1u);
  EXPECT_EQ(t.files[0], t.dir + "/trace-rank" + std::to_string(world().rank()) + ".json");
  EXPECT_LT(std::abs(t.offset_ns), 200'000'000) << "one host, one CLOCK_MONOTONIC: the offset is the barrier's skew";
  if (world().rank() == 0) EXPECT_LT(t.offset_ns, 1) << "rank 0's offset to itself";
  // This rank's own file, then the merged one on rank 0.
  expect_valid_and_nested(read_json(t.files[0]), n, world().rank());
  if (world().rank() != 0) return;
  const json merged = read_json(t.dir + "/trace.json");
  expect_valid_and_nested(merged, n);
  const std::vector<json> spans = spans_of(merged);
  const bool gpu = world().device().is_cuda();
  for (int r = 0; r < n; ++r) {
    std::map<int, std::pair<double, double>> step_span;
    std::map<int, int> buckets_in_step, forward_layers, backward_layers, waits, optimizer;
    for (const json& e : spans) {
      if (e.at("pid") != r) continue;
      const std::string name = e.at("name"), cat = e.at("cat");
      const int step = e.at("args").at("step");
      const double ts = e.at("ts"), end = ts + e.at("dur").get<double>();
      if (cat == "step") step_span[step] = {ts, end};
      if (cat == "forward" && name.find("Linear") != std::string::npos) ++forward_layers[step];
      if (cat == "backward" && name.find("Linear") != std::string::npos) ++backward_layers[step];
      if (name == "wait for gradients") ++waits[step];
      if (cat == "optimizer") ++optimizer[step];
      if (cat == "forward" || cat == "backward") EXPECT_EQ(e.at("tid").get<int>(), gpu ? 1 : 0) << e.dump();
    }
    ASSERT_EQ(step_span.size(), static_cast<std::size_t>(steps)) << "rank " << r;
    for (const json& e : spans) {
      if (e.at("pid") != r || e.at("cat") != "comm") continue;
      const std::string name = e.at("name");
      if (name.rfind("ddp bucket ", 0) != 0) continue;
      const int step = e.at("args").at("step");
      ASSERT_TRUE(step_span.count(step)) << e.dump();
      const auto [begin, end] = step_span[step];
      const double slack = gpu ? 1000.0 : 0.002;  // us: device times come through an anchor event
      EXPECT_GE(e.at("ts").get<double>(), begin - slack) << "rank " << r << " " << e.dump();
      EXPECT_LE(e.at("ts").get<double>() + e.at("dur").get<double>(), end + slack) << "rank " << r << " " << e.dump();
      EXPECT_EQ(e.at("tid"), 2);
      EXPECT_GT(e.at("args").at("bytes").get<std::int64_t>(), 0);
      EXPECT_EQ(e.at("args").at("dtype"), "f32");
      EXPECT_EQ(e.at("args").at("backend"), std::string(world().communicator().backend()));
      ++buckets_in_step[step];
    }
    for (int s = 1; s <= steps; ++s) {
      EXPECT_EQ(buckets_in_step[s], t.buckets) << "rank " << r << " step " << s;
      EXPECT_EQ(forward_layers[s], 3) << "rank " << r << " step " << s;
      EXPECT_EQ(backward_layers[s], 3) << "rank " << r << " step " << s;
      EXPECT_EQ(waits[s], 1) << "rank " << r << " step " << s;
      EXPECT_EQ(optimizer[s], 1) << "rank " << r << " step " << s;
    }
  }
  EXPECT_GT(t.buckets, 1) << "the run should have several buckets";
}

TEST(Trace, BoundedByTheRingWhenLong) {
  trace::Options w;
  w.max_events = 40;
  Traced t;
  run_traced(t, 12, w);
  const json mine = read_json(t.files[0]);
  const std::vector<json> spans = spans_of(mine);
  EXPECT_LE(spans.size(), 40u);
  EXPECT_GT(mine.at("otherData").at("tutti_dropped_spans").get<int>(), 0);
  // The ring keeps the newest: the last step is there, the first is gone.
  bool first = false, last = false;
  for (const json& e : spans) {
    first = first || e.at("name") == "step 1";
    last = last || e.at("name") == "step 12";
  }
  EXPECT_FALSE(first);
  EXPECT_TRUE(last);
}

TEST(Trace, StepWindowRecordsOnlyItsSteps) {
  trace::Options w;
  w.first_step = 3;
  w.last_step = 4;
  Traced t;
  run_traced(t, 6, w);
  const std::vector<json> spans = spans_of(read_json(t.files[0]));
  ASSERT_FALSE(spans.empty());
  std::set<int> steps;
  for (const json& e : spans) steps.insert(e.at("args").at("step").get<int>());
  EXPECT_EQ(steps, (std::set<int>{3, 4}));
}

TEST(Trace, OffRecordsNothing) {
  EXPECT_FALSE(trace::on());
  auto model = make_mlp();
  model->init(kSeed);
  trace::begin_step(1);
  model->forward(Tensor::zeros({2, 12}, DType::f32));
  trace::end_step();
  EXPECT_FALSE(trace::on());
  EXPECT_TRUE(trace::collect().empty());
}

TEST(Trace, StepsFromTheEnvironment) {
  setenv("TUTTI_TRACE", "/tmp/somewhere", 1);
  setenv("TUTTI_TRACE_STEPS", "10:20", 1);
  TraceOptions o = TraceOptions::from_env();
  EXPECT_EQ(o.dir, "/tmp/somewhere");
  EXPECT_EQ(o.window.first_step, 10);
  EXPECT_EQ(o.window.last_step, 20);
  setenv("TUTTI_TRACE_STEPS", "100:", 1);
  o = TraceOptions::from_env();
  EXPECT_EQ(o.window.first_step, 100);
  EXPECT_EQ(o.window.last_step, -1);
  setenv("TUTTI_TRACE_STEPS", "20:10", 1);
  EXPECT_THROW(TraceOptions::from_env(), InvalidArgument);
  setenv("TUTTI_TRACE_STEPS", "ten", 1);
  EXPECT_THROW(TraceOptions::from_env(), InvalidArgument);
  unsetenv("TUTTI_TRACE");
  unsetenv("TUTTI_TRACE_STEPS");
}

// ---- metrics ---------------------------------------------------------------------------------

MetricLabels labels() {
  MetricLabels l;
  l.job = "test \"job\"";
  l.rank = world().rank();
  l.local_rank = world().local_rank();
  l.host = world().hostname();
  return l;
}

TEST(Metrics, TextFormatAndCountersOnlyGrow) {
  TrainingMetricsOptions o;
  o.peak_flops = 1e12;
  o.backend = "mpi";
  o.device = "cpu";
  TrainingMetrics m(labels(), o);
  StepRecord s;
  s.step = 1;
  s.step_seconds = 0.5;
  s.samples = 64;
  s.loss = 2.25;
  s.flops = 2e11;
  s.ddp.bytes_reduced = 1000;
  s.ddp.busbw_gbs = 1.5;
  m.observe_step(s);
  const std::string text = m.registry().text();
  const std::string lab = "job=\"test \\\"job\\\"\",rank=\"" + std::to_string(world().rank()) + "\",local_rank=\"" +
                          std::to_string(world().local_rank()) + "\",host=\"" + world().hostname() + "\"";
  EXPECT_NE(text.find("# TYPE tutti_steps_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tutti_steps_total{" + lab + "} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tutti_throughput_samples_per_second{" + lab + "} 128\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tutti_mfu{" + lab + "} 0.40000000000000002\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tutti_tflops{" + lab + "} 0.40000000000000002\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tutti_bus_bandwidth_gbs{" + lab + "} 1.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tutti_bus_bandwidth_bytes_per_second{" + lab + "} 1500000000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tutti_info{" + lab + ",version=\""), std::string::npos) << text;
  EXPECT_GT(m.registry().value("tutti_memory_host_bytes"), 1e6);
  // Counters: only up.
  EXPECT_THROW(m.registry().add("tutti_steps_total", -1), InvalidArgument);
  EXPECT_THROW(m.registry().define("tutti_bad", MetricType::counter, "x"), InvalidArgument);
  EXPECT_THROW(m.registry().define("9bad", MetricType::gauge, "x"), InvalidArgument);
  double last_steps = 0, last_bytes = 0;
  for (int i = 0; i < 5; ++i) {
    s.step = 2 + i;
    m.observe_step(s);
    const double steps = m.registry().value("tutti_steps_total"),
                 bytes = m.registry().value("tutti_reduced_bytes_total");
    EXPECT_GT(steps, last_steps);
    EXPECT_GT(bytes, last_bytes);
    last_steps = steps;
    last_bytes = bytes;
  }
  EXPECT_EQ(last_steps, 6);
}

TEST(Metrics, TextfileIsReplacedAtomically) {
  const std::string dir = shared_tmpdir();
  const std::string path = dir + "/tutti_rank" + std::to_string(world().rank()) + ".prom";
  TrainingMetrics m(labels());
  {
    TextfileExporter exporter(m.registry(), path, 0.02);
    ASSERT_TRUE(std::filesystem::exists(path)) << "written at once";
    StepRecord s;
    s.step = 1;
    s.step_seconds = 0.1;
    s.samples = 8;
    m.observe_step(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    std::ifstream f(path);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("tutti_steps_total{"), std::string::npos);
    EXPECT_NE(text.find("} 1\n"), std::string::npos) << "rewritten after the step:\n" << text;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/.tutti_rank" + std::to_string(world().rank()) + ".prom.tmp"))
      << "a temporary file was left";
  EXPECT_THROW(TextfileExporter(m.registry(), "/nonexistent-dir/x.prom"), Error);
  world().cpu_communicator().barrier().wait();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// GET path from 127.0.0.1:port with a plain socket; the whole response.
std::string http_get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t got; (got = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(got));
  close(fd);
  return out;
}

TEST(Metrics, HttpEndpointAnswers) {
  TrainingMetrics m(labels());
  if (!HttpExporter::available()) {
    // Built without cpp-httplib: the endpoint is not there, and says why.
    try {
      HttpExporter e(m.registry(), 0);
      FAIL() << "HttpExporter built without cpp-httplib must throw";
    } catch (const BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("cpp-httplib"), std::string::npos) << e.what();
    }
    std::printf("obs_test: this build has no /metrics endpoint (cpp-httplib was not found)\n");
    return;
  }
  HttpExporter server(m.registry(), 0, "127.0.0.1");
  ASSERT_GT(server.port(), 0);
  StepRecord s;
  s.step = 1;
  s.step_seconds = 0.1;
  s.samples = 8;
  m.observe_step(s);
  const std::string response = http_get(server.port(), "/metrics");
  EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  EXPECT_NE(response.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << response;
  EXPECT_NE(response.find("# TYPE tutti_steps_total counter"), std::string::npos) << response;
  EXPECT_NE(response.find("tutti_steps_total{job=\"test"), std::string::npos) << response;
  EXPECT_EQ(http_get(server.port(), "/nothing").rfind("HTTP/1.1 404", 0), 0u);
  // A port in use is an error, not a silent exporter that serves nothing.
  EXPECT_THROW(HttpExporter(m.registry(), server.port(), "127.0.0.1"), Error);
}

// ---- FLOPs and peaks -------------------------------------------------------------------------

TEST(Mfu, FlopsOfLayersSummedBySequential) {
  nn::Sequential mlp;
  mlp.add<nn::Linear>(784, 512).add<nn::ReLU>().add<nn::Linear>(512, 256).add<nn::ReLU>().add<nn::Linear>(256, 10);
  const double forward = 2.0 * (784 * 512 + 512 * 256 + 256 * 10);
  // Backward: both gradients of every Linear, except the first one's input gradient: its input
  // is data, and backward does not compute it (counting it would let MFU pass 100%).
  const double first_dx = 2.0 * 784 * 512;
  Shape out;
  const nn::Flops f = mlp.flops({784}, out);
  EXPECT_EQ(f.forward, forward);
  EXPECT_EQ(f.backward, 2 * forward - first_dx);
  EXPECT_EQ(out, (Shape{10}));
  EXPECT_EQ(mlp.training_flops_per_sample({784}), 3 * forward - first_dx);
  EXPECT_EQ(mlp.training_flops_per_sample({784}), 2407424.0);  // the trainer's MLP
  // Per token: a [T, C] sample is T rows.
  EXPECT_EQ(mlp.training_flops_per_sample({5, 784}), 5 * (3 * forward - first_dx));
  // A model whose input needs a gradient (a part of a larger model) computes it: counted.
  mlp.set_input_grad(true);
  EXPECT_EQ(mlp.training_flops_per_sample({784}), 3 * forward);

  nn::Conv2dOptions same;
  same.padding = 1;
  nn::Sequential cnn;
  cnn.add<nn::Conv2d>(1, 16, 3, same).add<nn::ReLU>().add<nn::MaxPool2d>();
  cnn.add<nn::Conv2d>(16, 32, 3, same).add<nn::ReLU>().add<nn::MaxPool2d>();
  cnn.add<nn::Flatten>().add<nn::Linear>(32 * 7 * 7, 128).add<nn::ReLU>().add<nn::Linear>(128, 10);
  const double conv1 = 2.0 * 16 * 28 * 28 * 1 * 9, conv2 = 2.0 * 32 * 14 * 14 * 16 * 9;
  const double fc = 2.0 * (1568 * 128 + 128 * 10);
  EXPECT_EQ(cnn.flops({1, 28, 28}, out).forward, conv1 + conv2 + fc);
  EXPECT_EQ(cnn.flops({1, 28, 28}, out).backward, 2 * (conv1 + conv2 + fc) - conv1);
  EXPECT_EQ(out, (Shape{10}));
}

TEST(Mfu, PeakTableOverrideAndCpuCeiling) {
  EXPECT_EQ(gpu_peak_flops("NVIDIA H200", DType::bf16), 989.4e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 80GB HBM3", DType::f16), 989.4e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 PCIe", DType::f32), 51.2e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA A100-SXM4-80GB", DType::bf16), 312e12);
  EXPECT_EQ(gpu_peak_flops("Some New GPU", DType::bf16), 0.0);
  EXPECT_EQ(peak_flops(Device::cpu(), DType::f32, 2.5).flops, 2.5e12);
  EXPECT_EQ(peak_flops(Device::cpu(), DType::f32, 2.5).source, "override");
  setenv("TUTTI_PEAK_TFLOPS", "0.75", 1);
  EXPECT_EQ(peak_flops(Device::cpu(), DType::f32).flops, 0.75e12);
  setenv("TUTTI_PEAK_TFLOPS", "fast", 1);
  EXPECT_THROW(peak_flops(Device::cpu(), DType::f32), InvalidArgument);
  unsetenv("TUTTI_PEAK_TFLOPS");
  const PeakFlops cpu = peak_flops(Device::cpu(), DType::f32);
  EXPECT_EQ(cpu.source, "measured CPU GEMM (f32)");
  // A CPU core does 1-100 GFLOP/s in f32 GEMM; a ceiling outside that is a wrong measurement.
  EXPECT_GT(cpu.flops, 0.5e9);
  EXPECT_LT(cpu.flops, 1e13);
  EXPECT_NEAR(mfu(100.0, 10.0, 2, 1000.0), 0.5, 1e-12);
  EXPECT_EQ(mfu(100.0, 10.0, 2, 0.0), 0.0);
}

TEST(Mfu, ProbesKeepTheBestAndComeAtPowersOfTwo) {
  // A measured peak probed again keeps the larger: one measured absurdly high stays as it is,
  // one measured absurdly low is replaced by the probe.
  PeakFlops high{1e18, "measured CPU GEMM (f32)", true};
  EXPECT_EQ(remeasure_peak(high, 0.01).flops, 1e18);
  PeakFlops low{1.0, "measured CPU GEMM (f32)", true};
  const PeakFlops probed = remeasure_peak(low, 0.01);
  EXPECT_GT(probed.flops, 0.5e9);
  EXPECT_EQ(probed.source, low.source);
  // A peak that was given or looked up is not measured, so never probed.
  PeakFlops given{2.5e12, "override", false};
  EXPECT_EQ(remeasure_peak(given, 0.01).flops, 2.5e12);
  std::vector<std::int64_t> due;
  for (std::int64_t steps = 0; steps <= 40; ++steps) {
    if (peak_probe_due(steps)) due.push_back(steps);
  }
  EXPECT_EQ(due, (std::vector<std::int64_t>{1, 2, 4, 8, 16, 32}));
}

TEST(Metrics, NewPeakSetsTheMfuOfLaterSteps) {
  TrainingMetricsOptions o;
  o.peak_flops = 1e12;
  TrainingMetrics m(labels(), o);
  StepRecord s;
  s.step = 1;
  s.step_seconds = 0.5;
  s.samples = 8;
  s.flops = 2e11;
  m.observe_step(s);
  EXPECT_DOUBLE_EQ(m.registry().value("tutti_mfu"), 0.4);
  m.set_peak_flops(4e12);
  EXPECT_EQ(m.registry().value("tutti_peak_flops"), 4e12);
  s.step = 2;
  m.observe_step(s);
  EXPECT_DOUBLE_EQ(m.registry().value("tutti_mfu"), 0.1);
  EXPECT_THROW(m.set_peak_flops(-1), InvalidArgument);
}

TEST(Metrics, TheRunsAccountingAndItsCostOnlyWithAPrice) {
  TrainingMetrics m(labels());
  train::Accounting a;
  a.attempts = 3;
  a.rank_hours = 12.5;
  a.goodput = 0.96;
  a.lost_seconds = 40;
  a.cost = 25;
  m.observe_accounting(a, /*priced=*/false);
  EXPECT_EQ(m.registry().value("tutti_run_attempts"), 3);
  EXPECT_EQ(m.registry().value("tutti_run_rank_hours"), 12.5);
  EXPECT_EQ(m.registry().value("tutti_goodput_ratio"), 0.96);
  EXPECT_EQ(m.registry().value("tutti_lost_to_failures_seconds"), 40);
  EXPECT_TRUE(std::isnan(m.registry().value("tutti_run_cost")));
  EXPECT_EQ(m.registry().text().find("tutti_run_cost"), std::string::npos);
  m.observe_accounting(a, /*priced=*/true);
  EXPECT_EQ(m.registry().value("tutti_run_cost"), 25);
}

}  // namespace
}  // namespace tutti::obs

int main(int argc, char** argv) { return tutti::testing::run_world_tests(argc, argv, "auto"); }
