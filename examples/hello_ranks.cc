// Placeholder main job: each rank says who it is, which device it would use and which
// communication backend tutti would choose. Replaced by the Fashion-MNIST trainer.
//
//   mpirun -np 2 build/examples/hello_ranks
#include <mpi.h>
#include <tutti/tutti.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  int local_rank = 0;
  MPI_Comm_rank(local, &local_rank);

  const int gpus = tutti::cuda_device_count();
  const tutti::Device device = gpus > 0 ? tutti::Device::cuda(local_rank % gpus) : tutti::Device::cpu();
  const std::string backend = device.is_cuda() ? "nccl" : "mpi";
  // One line per rank, in rank order.
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      std::printf("rank %d/%d (local %d): device %s [%s], backend %s, tutti %s, CUDA built=%s runtime=%s\n",
                  rank, size, local_rank, device.str().c_str(), tutti::device_description(device).c_str(),
                  backend.c_str(), tutti::version(), tutti::built_with_cuda() ? "yes" : "no",
                  tutti::cuda_runtime_version().c_str());
      std::fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Comm_free(&local);
  MPI_Finalize();
  return 0;
}
