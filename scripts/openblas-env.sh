# shellcheck shell=bash
# Sourced (`. scripts/openblas-env.sh`) by the scripts that run tutti's programs on the CPU.
# OpenBLAS picks its kernels from the CPU's model number when it loads; on a CPU it does not
# know (a new model, or a virtual machine that hides it) it falls back to its oldest x86-64
# kernels ("Prescott", SSE3), and the CPU GEMMs run 3-4x slower (docs/benchmarks.md). Where that
# happens and OPENBLAS_CORETYPE is not set, this sets it to the kernels the CPU can run
# (SkylakeX with AVX-512, Haswell with AVX2), with the same rule as
# tutti::kernels::cpu_blas_info(), and says so on stderr. A value already set is left alone.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  _tutti_core=$(/usr/bin/python3 - 2>/dev/null <<'PY' || true
import ctypes
core = ctypes.CDLL("libopenblas.so.0")
core.openblas_get_corename.restype = ctypes.c_char_p
name = core.openblas_get_corename().decode().lower()
flags = set()
with open("/proc/cpuinfo") as f:
    for line in f:
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
avx2_kernels = {"haswell", "skylakex", "cooperlake", "sapphirerapids", "zen", "excavator"}
if name not in avx2_kernels:
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        print("SkylakeX")
    elif {"avx2", "fma"} <= flags:
        print("Haswell")
PY
)
  if [ -n "$_tutti_core" ]; then
    export OPENBLAS_CORETYPE=$_tutti_core
    echo "openblas-env: OpenBLAS did not recognize this CPU and would run its oldest kernels;" \
         "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE set for this run" >&2
  fi
  unset _tutti_core
fi
