// The smallest tutti job: join the job, print who is who, and check one allreduce.
//
//   mpirun -np 2 build/examples/hello_ranks          (or srun, or alone: a world of one)
//   TUTTI_DEBUG=1 mpirun -np 2 build/examples/hello_ranks --device cpu
#include <tutti/tutti.h>

#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  tutti::JobOptions options;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0) options.device = argv[i + 1];
    if (std::strcmp(argv[i], "--backend") == 0) options.backend = argv[i + 1];
  }
  try {
    auto job = tutti::init(argc, argv, options);
    const std::string summary = job.summary();  // collective: every rank calls it
    if (job.rank() == 0) std::fputs(summary.c_str(), stdout);

    // Every rank contributes rank + 1; the sum is n(n+1)/2 on every rank.
    const int n = job.world_size();
    auto x = tutti::Tensor::from_floats({static_cast<float>(job.rank() + 1)}, {1}).to(job.device());
    job.communicator().allreduce(x, tutti::ReduceOp::sum, {.label = "hello"}).wait();
    const float got = x.to_floats()[0];
    const float want = static_cast<float>(n * (n + 1) / 2);
    if (job.rank() == 0)
      std::printf("allreduce over %d rank(s): %g (expected %g) %s\n", n, got, want, got == want ? "ok" : "WRONG");
    return got == want ? 0 : 1;
  } catch (const tutti::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
