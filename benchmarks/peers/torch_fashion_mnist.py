#!/usr/bin/python3
"""PyTorch peer of tutti's examples/train_fashion_mnist: the same model (--model mlp:
784-512-256-10, ReLU; --model cnn: two conv 3x3 pad 1 + ReLU + max-pool blocks, 1->16->32
channels, then 1568-128-10), global batch, optimizer and epochs, data-parallel under
torch.nn.parallel.DistributedDataParallel (gloo on the CPU, nccl on a GPU), for a side-by-side
comparison (benchmarks/peers/compare.sh; scripts/gpu-check.sh on a GPU).

Launch it the way tutti's trainer is launched:
    mpirun -np 2 /usr/bin/python3 benchmarks/peers/torch_fashion_mnist.py --epochs 1
(rank and world size from OMPI_COMM_WORLD_RANK/SIZE), or alone; RANK/WORLD_SIZE (torchrun) are
read too, though Debian bookworm's torchrun fails in its own agent (see README.md). Here it uses
Debian's python3-torch, which lives in /usr/bin/python3 (see README.md); on the lent GPU machine,
the image's python3 (PyTorch 2.x).

Data: the IDX gz files of Debian's dataset-fashion-mnist package, read with gzip + numpy;
pixels standardized, (b / 255 - 0.2860406) / 0.3530242, as the trainer does (tutti's
load_fashion_mnist with standardize = true); --no-standardize keeps b / 255 in [0, 1]. Each epoch has one
global order (a permutation from the seed and the epoch, the same on every rank); global batch
s is positions [s*B, (s+1)*B) of it and rank r takes rows [r*B/N, (r+1)*B/N); the last
incomplete global batch is dropped (tutti's DistributedLoader does the same, with its own
permutation, so the two runs see the same batch sizes but not the same samples).

Pipeline, as the trainer's: the data set stays in host memory, each rank gathers its batch on
the host and copies it to the device every step (--data-on-device keeps the whole training
set on the GPU and gathers there instead, which is not what tutti's trainer does). On a GPU,
float32 stays float32: TF32 is off for matrix products and cuDNN convolutions, as tutti's
cuBLAS (CUBLAS_COMPUTE_32F) and cuDNN (CUDNN_FMA_MATH) calls have it.

Output (rank 0): one JSON object on stdout, and in --json FILE:
  samples_per_s   training samples per second over all ranks: epochs*steps*B / train_s
  train_s         seconds of the training loop (all epochs; evaluation excluded)
  wall_s          seconds from the start of the script to the end (imports, data, init, eval)
  test_accuracy   fraction of the 10000 test images classified right after the last epoch
  final_train_loss  cross-entropy of the last global batch (the trainer's key of that name)
  final_loss      mean cross-entropy over the last epoch's global batches
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

WALL_START = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860406, 0.3530242  # tutti::data::kFashionMnistMean / kFashionMnistStd
HINT = ("Fashion-MNIST comes from Debian's package: `apt-get install dataset-fashion-mnist` "
        "(scripts/setup.sh installs it); for a copy elsewhere pass --data DIR")


def env_int(names, default):
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    return default


def read_idx(path, ndim):
    """An unsigned-byte IDX file of `ndim` dimensions as a numpy uint8 array."""
    if not os.path.exists(path):
        sys.exit(f"error: {path} does not exist. {HINT}")
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        sys.exit(f"error: {path} is corrupt ({e}). {HINT}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        sys.exit(f"error: {path} is truncated. {HINT}")
    zero, dtype, nd = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08 or nd != ndim:
        sys.exit(f"error: {path} is not an unsigned-byte IDX file of {ndim} dimensions. {HINT}")
    dims = struct.unpack(">" + "I" * ndim, raw[4:header])
    count = int(np.prod(dims))
    if len(raw) != header + count:
        sys.exit(f"error: {path} has {len(raw)} bytes, its header {list(dims)} needs {header + count}. {HINT}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_split(data_dir, prefix, standardize):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"), 3)
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"), 1)
    x = images.reshape(len(images), 28 * 28).astype(np.float32) / np.float32(255.0)
    if standardize:
        x = (x - np.float32(MEAN)) / np.float32(STD)
    x = torch.from_numpy(x)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def make_mlp():
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


def make_cnn():
    """examples/train_fashion_mnist/models.h's make_cnn(), on [N, 1, 28, 28]."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


MODELS = {"mlp": (make_mlp, "mlp-784-512-256-10"), "cnn": (make_cnn, "cnn-c16-c32-fc128-10")}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="directory of the *-ubyte.gz files")
    p.add_argument("--model", choices=sorted(MODELS), default="mlp")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128, help="global batch size B (over all ranks)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-standardize", dest="standardize", action="store_false",
                   help="pixels b / 255 in [0, 1] instead of standardized")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--data-on-device", action="store_true",
                   help="keep the training set on the device and gather batches there (default: gather "
                        "on the host and copy each batch, as tutti's trainer does)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads per rank (0: the CPUs divided by the ranks on this node)")
    p.add_argument("--json", default="", help="also write the result to this file")
    args = p.parse_args()

    rank = env_int(["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"], 0)
    world = env_int(["OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"], 1)
    local_rank = env_int(["OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"], 0)
    local_world = env_int(["OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"], world)
    if args.batch_size % world != 0:
        sys.exit(f"error: global batch size {args.batch_size} is not divisible by world size {world}")

    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    backend = "nccl" if use_cuda else "gloo"
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT", "29500")
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)

    x_train, y_train = load_split(args.data, "train", args.standardize)
    x_test, y_test = load_split(args.data, "t10k", args.standardize)
    if args.model == "cnn":
        x_train, x_test = x_train.reshape(-1, 1, 28, 28), x_test.reshape(-1, 1, 28, 28)
    data_device = device if args.data_on_device else torch.device("cpu")
    x_train, y_train = x_train.to(data_device), y_train.to(data_device)
    n = len(x_train)
    B = args.batch_size
    b = B // world
    if B > n:
        sys.exit(f"error: global batch size {B} is larger than the training set ({n})")
    steps = n // B  # the last incomplete global batch is dropped

    torch.manual_seed(args.seed)
    make_model, model_name = MODELS[args.model]
    model = DDP(make_model().to(device), device_ids=[device.index] if use_cuda else None)
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                              weight_decay=args.weight_decay)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    loss_fn = nn.CrossEntropyLoss()

    def sync():
        if use_cuda:
            torch.cuda.synchronize()
        dist.barrier()

    sync()
    train_start = time.perf_counter()
    final_loss = final_train_loss = float("nan")
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(args.seed * 1000003 + epoch)
        order = torch.randperm(n, generator=g).to(data_device)
        loss_sum = torch.zeros((), device=device)
        model.train()
        for step in range(steps):
            idx = order[step * B + rank * b: step * B + (rank + 1) * b]
            xb, yb = x_train.index_select(0, idx).to(device), y_train.index_select(0, idx).to(device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()  # DDP averages the gradients over the ranks here
            opt.step()
            loss_sum += loss.detach()
        last = loss.detach().reshape(1).clone()
        sums = torch.cat([loss_sum.reshape(1), last])
        dist.all_reduce(sums)  # one reduction per epoch, not per step
        final_loss = sums[0].item() / (world * steps)
        final_train_loss = sums[1].item() / world
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: mean loss {final_loss:.4f} "
                  f"({time.perf_counter() - train_start:.2f} s)", file=sys.stderr, flush=True)
    sync()
    train_s = time.perf_counter() - train_start

    # Test accuracy: each rank scores its contiguous share, the counts are summed.
    model.eval()
    nt = len(x_test)
    lo, hi = rank * nt // world, (rank + 1) * nt // world
    with torch.no_grad():
        pred = model.module(x_test[lo:hi].to(device)).argmax(dim=1)
        correct = torch.tensor([(pred == y_test[lo:hi].to(device)).sum().item()], dtype=torch.float64,
                               device=device)
    dist.all_reduce(correct)
    test_accuracy = correct.item() / nt

    result = {
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "backend": backend,
        "device": str(device) if not use_cuda else torch.cuda.get_device_name(),
        "world_size": world,
        "threads_per_rank": threads,
        "model": model_name,
        "data_on_device": args.data_on_device,
        "optimizer": args.optimizer,
        "lr": args.lr,
        "momentum": args.momentum,
        "weight_decay": args.weight_decay,
        "epochs": args.epochs,
        "global_batch_size": B,
        "steps": steps * args.epochs,
        "samples_per_s": steps * B * args.epochs / train_s,
        "train_s": train_s,
        "test_accuracy": test_accuracy,
        "final_loss": final_loss,
        "final_train_loss": final_train_loss,
        "standardize": args.standardize,
        "wall_s": time.perf_counter() - WALL_START,
    }
    if rank == 0:
        print(json.dumps(result), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
                f.write("\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
