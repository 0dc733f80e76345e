# shellcheck shell=bash
# Sourced by scripts/gpu-check.sh and benchmarks/peers/gpt_gpu.sh on the GPU machine, from the
# repository root: unpacks the carried .deb files of .gpu-deps/ (scripts/gpu-deps.sh) into a
# private root and points the environment at it (PATH, libraries, Open MPI, CMake). Sets the
# array `extra`: the CMake flags that find them there.
root=/tmp/tutti-deps
mkdir -p $root
for f in .gpu-deps/*.deb; do dpkg -x "$f" $root; done
# Debian names Open MPI's programs mpicc.openmpi etc. and links the plain names through the
# alternatives system when a package is installed; dpkg -x does not, so link them here.
for p in mpicc mpicxx mpiexec mpirun; do ln -sf $p.openmpi $root/usr/bin/$p; done
arch=x86_64-linux-gnu
export PATH=$root/usr/bin:$PATH
export LD_LIBRARY_PATH=$root/usr/lib/$arch:$root/usr/lib/$arch/openblas-pthread:$root/usr/lib/$arch/openmpi/lib:${LD_LIBRARY_PATH:-}
export OPAL_PREFIX=$root/usr
# PMIx's compression plugin does not load from the private root, and PMIx then prints a
# help text it cannot find either; it is only used to shrink launch messages.
export PMIX_MCA_pcompress_base_silence_warning=1
export OMPI_MCA_plm=isolated OMPI_MCA_btl_vader_single_copy_mechanism=none
# Components whose drivers the machine lacks (PSM, UCX, ...) fail to load; that is expected.
export OMPI_MCA_mca_base_component_show_load_errors=0
# The data set from the carried dataset-fashion-mnist .deb (the trainer's and tests' default).
[ -d $root/usr/share/datasets/fashion-mnist ] && export TUTTI_FASHION_MNIST_DIR=$root/usr/share/datasets/fashion-mnist
export CMAKE_PREFIX_PATH=$root/usr:$root/usr/lib/$arch/cmake
# shellcheck disable=SC2034  # read by the scripts that source this file
extra=("-DMPI_C_COMPILER=$root/usr/bin/mpicc" "-DMPIEXEC_EXECUTABLE=$root/usr/bin/mpiexec"
       "-DOpenBLAS_DIR=$root/usr/lib/$arch/openblas-pthread/cmake/openblas")
# Debian's OpenBLAS config (the real file: the one under cmake/ is an alternatives link)
# hardcodes /usr paths: point it at the private root.
sed -i "s|/usr/|$root/usr/|g" $root/usr/lib/$arch/openblas-pthread/cmake/openblas/OpenBLASConfig.cmake
