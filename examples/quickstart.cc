// The complete short training program of docs/user-guide.md, kept compiling here.
//
//   mpirun -np 2 build/examples/quickstart
#include <tutti/tutti.h>

#include <cstdio>

int main(int argc, char** argv) {
  tutti::Job job(argc, argv);                 // MPI world, local rank, device, NCCL (collective)
  const std::string summary = job.summary();  // collective: every rank calls it
  if (job.rank() == 0) std::fputs(summary.c_str(), stdout);

  // Every rank builds the same model; DistributedDataParallel checks that they did.
  tutti::nn::Sequential model;
  model.add<tutti::nn::Linear>(784, 512).add<tutti::nn::ReLU>().add<tutti::nn::Linear>(512, 10);
  tutti::amp::apply(tutti::amp::Policy::bf16(), model);  // optional: bf16 compute and wire, fp32 masters
  model.to(job.device()).init(/*seed=*/1);

  tutti::ddp::DdpOptions ddp_options;
  ddp_options.accumulation_steps = 2;
  tutti::ddp::DistributedDataParallel ddp(job.communicator(), model, ddp_options);
  // Weight decay on matrices, not on biases (optim::weight_decay_groups); the optimizer takes
  // DDP's flat plan, so it updates the whole model in a few fused calls.
  tutti::optim::AdamW optimizer(tutti::optim::weight_decay_groups(model.parameters(), 0.01f), {.lr = 1e-3f});
  ddp.attach(optimizer);
  tutti::amp::LossScaler scaler(tutti::amp::Policy::bf16().default_scaler());
  tutti::nn::CrossEntropyLoss loss;

  // Same order on any number of ranks; each rank reads its slice of each global batch. A
  // next() serves one micro-batch: the optimizer step's 128 samples come in 2 of 64.
  auto data = tutti::data::load_fashion_mnist();
  tutti::data::DistributedLoader loader(
      data.train, {.global_micro_batch_size = 128 / 2, .rank = job.rank(), .world_size = job.world_size(), .seed = 1});
  for (int step = 0; step < 200; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      tutti::data::Batch b = loader.next();
      loss.forward(ddp.forward(b.images.to(job.device())), b.labels.to(job.device()), scaler.scale());
      if (ddp.backward(loss.grad(), scaler.scale())) {               // true on the last micro-batch
        if (scaler.update(ddp.found_nonfinite())) optimizer.step();  // every rank skips alike
        ddp.zero_grad();
      }
    }
    if (job.rank() == 0 && step % 50 == 0) std::printf("step %d loss %.4f\n", step, tutti::nn::item(loss.loss()));
  }
}
