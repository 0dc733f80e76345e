// The complete short training program of docs/user-guide.md, kept compiling here.
//
//   mpirun -np 2 build/examples/quickstart            # again after a stop (exit 75): it resumes
#include <tutti/tutti.h>

#include <cstdio>

int main(int argc, char** argv) {
  tutti::train::Summary summary("quickstart.json");  // the JSON summary, however the run ends
  try {
    tutti::Job job(argc, argv, {.catch_stop_signals = true});  // SIGTERM & co. stop after a step
    const std::string hello = job.summary();                   // collective: every rank calls it
    if (job.rank() == 0) std::fputs(hello.c_str(), stdout);

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
        data.train,
        {.global_micro_batch_size = 128 / 2, .rank = job.rank(), .world_size = job.world_size(), .seed = 1});

    // Run control: resumes ckpt/checkpoint.tckp when there is one, checkpoints every 100 steps,
    // at the end and on a stop signal; stops every rank after the same step.
    tutti::train::Run run(job, {ddp, optimizer, scaler, loader},
                          {.steps = 200,
                           .checkpoint_dir = "ckpt",
                           .resume = tutti::train::Resume::automatic,
                           .checkpoint_every = 100,
                           .summary = &summary});
    while (run.next()) {
      for (int micro = 0; micro < 2; ++micro) {
        tutti::data::Batch b = loader.next();
        loss.forward(ddp.forward(b.images.to(job.device())), b.labels.to(job.device()), scaler.scale());
        run.add_loss(loss.loss(), 0.5f);                               // the step's mean loss
        if (ddp.backward(loss.grad(), scaler.scale())) {               // true on the last micro-batch
          if (scaler.update(ddp.found_nonfinite())) optimizer.step();  // every rank skips alike
          ddp.zero_grad();
        }
      }
      const tutti::train::StepEnd& end = run.end_step();  // collective: the loss, the stop flag, checkpoints
      if (job.rank() == 0 && end.step % 50 == 0) std::printf("step %lld loss %.4f\n", (long long)end.step, end.loss);
    }
    const tutti::train::Outcome outcome = run.finish();  // 0; 75 stopped (rerun to resume); 3 diverged
    if (!outcome.message.empty()) std::fprintf(stderr, "quickstart: %s\n", outcome.message.c_str());
    return outcome.exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quickstart: error: %s\n", e.what());
    summary.failed(e.what());
    return 1;
  }
}
