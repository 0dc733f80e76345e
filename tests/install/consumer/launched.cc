// A user's own training program, built from the installed headers on train::Run alone: no
// --resume flag, no progress lines, its own arguments. install_consumer_test launches it with
// the installed tutti-launch, which must keep it running through a crash: the launcher speaks
// to the Run through the environment (TUTTI_RESUME, TUTTI_STATUS_FILE).
//
//   launched CHECKPOINT_DIR CRASH_AT    rank 1 dies after step CRASH_AT, once (a marker file
//                                       in CHECKPOINT_DIR remembers it)
#include <tutti/tutti.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: launched CHECKPOINT_DIR CRASH_AT\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::int64_t crash_at = std::stoll(argv[2]);
  tutti::Job job(argc, argv, {.device = "cpu", .catch_stop_signals = true});

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(64 * 8);
  for (float& v : x) v = normal(rng);
  std::vector<std::int64_t> y(64);
  for (auto& v : y) v = static_cast<std::int64_t>(rng() % 4);
  tutti::data::Dataset data{tutti::Tensor::from_floats(x, {64, 8}),
                            tutti::Tensor::from_ints(y, {64}, tutti::DType::i32)};

  tutti::nn::Sequential model;
  model.add<tutti::nn::Linear>(8, 16).add<tutti::nn::ReLU>().add<tutti::nn::Linear>(16, 4);
  model.init(1);
  tutti::ddp::DistributedDataParallel ddp(job.communicator(), model, {});
  tutti::optim::SGD optimizer(model.parameters(), {.lr = 0.05f, .momentum = 0.9f});
  ddp.attach(optimizer);
  tutti::amp::LossScaler scaler(tutti::amp::LossScalerOptions{.mode = tutti::amp::ScalerMode::off});
  tutti::data::DistributedLoader loader(
      data, {.global_micro_batch_size = 16, .rank = job.rank(), .world_size = job.world_size(), .seed = 3});
  tutti::nn::CrossEntropyLoss loss;

  tutti::train::Run run(
      job, {ddp, optimizer, scaler, loader},
      {.steps = 20, .checkpoint_dir = dir, .checkpoint_every = 5, .checkpoint_mode = tutti::io::CheckpointMode::sync});
  while (run.next()) {
    const tutti::data::Batch b = loader.next();
    loss.forward(ddp.forward(b.images), b.labels);
    ddp.backward(loss.grad());
    run.add_loss(loss.loss());
    optimizer.step();
    ddp.zero_grad();
    run.end_step();
    const std::string marker = dir + "/crashed";
    if (run.step() == crash_at && job.rank() == 1 && !std::filesystem::exists(marker)) {
      std::ofstream(marker) << "rank 1 died after step " << crash_at << "\n";
      std::_Exit(9);  // as if killed: no finish(), no MPI_Finalize
    }
  }
  const tutti::train::Outcome outcome = run.finish();
  if (!outcome.message.empty()) std::fprintf(stderr, "launched: %s\n", outcome.message.c_str());
  return outcome.exit_code;
}
