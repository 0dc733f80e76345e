# Helpers for tutti's tests.
#
# tutti_add_test(NAME <name> SOURCES <files...> [LIBS <targets...>] [RANKS <k...>] [TIMEOUT <s>]
#                [LABELS <l...>] [EMU] [EMU_ENV <VAR=value...>] [EMU_FILTER <gtest filter>]
#                [EMU_RANKS <k...>])
#   Builds a GoogleTest executable <name> and registers it with ctest. Without RANKS it runs
#   once as a plain process. With RANKS it runs once per k under
#   `mpiexec -n k --oversubscribe`, as tests named <name>.np<k>.
#   EMU (where the build has the emulated CUDA device): the same objects are also linked against
#   libtutti_emu as <name>_emu, registered the same way with the label "emu" and EMU_ENV, so its
#   GPU tests run on the emulated device. A GPU test that skips there fails: the emulated run
#   exists so that none does. EMU_FILTER leaves out the tests that only mean something without
#   a GPU (e.g. "-Device.MissingGpuIsAClearError"); EMU_RANKS runs the twin at other world
#   sizes than RANKS.
#   Tests may include internal headers ("core/...", "kernels/...").
#
# tutti_add_ref_test(NAME <name> SCRIPT <file.py> [ARGS <args...>] [TIMEOUT <s>] [LABELS <l...>])
#   A Python test run by the interpreter of the Python reference environment, TUTTI_REF_PYTHON
#   (.venv-ref/bin/python, which scripts/setup.sh makes: Hugging Face transformers, tokenizers and
#   safetensors on Debian's torch), through tests/ref_python.py: offline (HF_HUB_OFFLINE=1), and
#   skipped with a message (exit 77) where that interpreter is missing, or failed where
#   TUTTI_REQUIRE_REF_PYTHON=1 (scripts/test.sh sets it: CI made the environment, so a missing
#   one is a broken setup). Label "python".
find_package(GTest REQUIRED)
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(TUTTI_REF_PYTHON ${PROJECT_SOURCE_DIR}/.venv-ref/bin/python CACHE FILEPATH
    "the Python reference environment's interpreter (scripts/setup.sh makes it)")

# Open MPI refuses to run as root unless told; CI runs as root. Oversubscription lets
# 4 ranks share 2 cores, and yielding when idle keeps busy-polling ranks from starving others.
# The ob1 messaging layer (shared memory, TCP), named: Open MPI picks it anyway here (Debian's
# openmpi-mca-params.conf excludes UCX), but only after opening the cm layer, whose psm/psm2
# transports' probe took 0.2 s of each mpirun's 0.33 s (2 ranks), and the suite starts hundreds.
set(TUTTI_MPI_TEST_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
  OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_pml=ob1)

# ctest's slots (PROCESSORS) of a test of k processes: k, at most 2. ctest -j4 on 2 cores gives 4
# slots and starts a test only once all of its slots are free; as single-slot tests take each slot
# that frees up, tests of 3 and 4 slots waited until every other test had run and then ran one at
# a time (120 of 284 s of the suite, with mostly one core busy). Ranks beyond the 2 cores share
# them in any case (mpi_yield_when_idle).
set(TUTTI_TEST_MAX_SLOTS 2)
function(tutti_test_slots out k)
  if(k GREATER TUTTI_TEST_MAX_SLOTS)
    set(k ${TUTTI_TEST_MAX_SLOTS})
  endif()
  set(${out} ${k} PARENT_SCOPE)
endfunction()

# Tests whose processes mostly wait (for a deadline, a probe, a peer's end: 0.1-0.4 of a core
# alone, over 2-8 s) take one slot whatever their rank count. As single-slot tests take each slot
# that frees up, the tests of 2 slots all run after them, two at a time: with these among them,
# that last part of the suite (213 of its 260 s) kept the cores 56% busy.
function(tutti_test_mostly_waits)
  set_tests_properties(${ARGN} PROPERTIES PROCESSORS 1)
endfunction()

# One GEMM thread per test process unless a test says otherwise (its env, or set_cpu_threads): idle
# OpenBLAS threads wait in sched_yield loops, and under ctest -j4 on 2 cores those loops took the
# cores from the other tests (train_memory_plan_test_emu: 11.0 s of system time in 12.6 s, 1.0 s
# with one thread, the same wall time alone). A Job sets no count of its own where one is given.
set(TUTTI_TEST_BLAS_ENV OPENBLAS_NUM_THREADS=1)

# Registers executable <target> as test <name> (one process, or once per rank count), with
# extra program arguments `args`.
function(tutti_register_test name target timeout labels ranks env args)
  list(PREPEND env ${TUTTI_TEST_BLAS_ENV})
  if(NOT ranks)
    add_test(NAME ${name} COMMAND ${target} ${args})
    set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout} LABELS "${labels}" ENVIRONMENT "${env}")
    return()
  endif()
  foreach(k IN LISTS ranks)
    add_test(NAME ${name}.np${k}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${k} --oversubscribe
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${args})
    tutti_test_slots(slots ${k})
    set_tests_properties(${name}.np${k} PROPERTIES
      TIMEOUT ${timeout} PROCESSORS ${slots} LABELS "mpi;${labels}"
      ENVIRONMENT "${TUTTI_MPI_TEST_ENV};${env}")
  endforeach()
endfunction()

function(tutti_add_test)
  cmake_parse_arguments(T "EMU" "NAME;TIMEOUT;EMU_FILTER" "SOURCES;LIBS;RANKS;LABELS;EMU_ENV;EMU_RANKS" ${ARGN})
  if(NOT T_EMU_RANKS)
    set(T_EMU_RANKS ${T_RANKS})
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set(main "")
  if(NOT T_RANKS)
    set(main GTest::gtest_main)
  endif()
  # Compiled once, linked once per flavour of libtutti.
  add_library(${T_NAME}_objects OBJECT ${T_SOURCES})
  target_link_libraries(${T_NAME}_objects PRIVATE tutti::tutti GTest::gtest ${T_LIBS})
  target_include_directories(${T_NAME}_objects PRIVATE
    ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/tests)
  add_executable(${T_NAME} $<TARGET_OBJECTS:${T_NAME}_objects>)
  target_link_libraries(${T_NAME} PRIVATE tutti::tutti GTest::gtest ${main} ${T_LIBS})
  tutti_register_test(${T_NAME} ${T_NAME} ${T_TIMEOUT} "${T_LABELS}" "${T_RANKS}" "" "")
  if(T_EMU AND TARGET tutti_emu)
    add_executable(${T_NAME}_emu $<TARGET_OBJECTS:${T_NAME}_objects>)
    target_link_libraries(${T_NAME}_emu PRIVATE tutti_emu GTest::gtest ${main} ${T_LIBS})
    set(args "")
    if(T_EMU_FILTER)
      set(args --gtest_filter=${T_EMU_FILTER})
    endif()
    # The hazard detector (emu/src/racecheck.cc) costs 1.0-1.7x (docs/development.md): it checks
    # the kernels in their own tests (label "kernels"); the twins above them run the same kernels
    # with it off.
    set(env ${T_EMU_ENV})
    if(NOT "kernels" IN_LIST T_LABELS)
      list(PREPEND env TUTTI_EMU_RACECHECK=0)
    endif()
    tutti_register_test(${T_NAME}_emu ${T_NAME}_emu ${T_TIMEOUT} "emu;${T_LABELS}" "${T_EMU_RANKS}" "${env}"
                        "${args}")
    set(names ${T_NAME}_emu)
    if(T_EMU_RANKS)
      list(TRANSFORM T_EMU_RANKS PREPEND ${T_NAME}_emu.np OUTPUT_VARIABLE names)
    endif()
    set_tests_properties(${names} PROPERTIES FAIL_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endif()
endfunction()

function(tutti_add_ref_test)
  cmake_parse_arguments(T "" "NAME;SCRIPT;TIMEOUT" "ARGS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_test(NAME ${T_NAME}
           COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/tests/ref_python.py ${TUTTI_REF_PYTHON}
                   ${CMAKE_CURRENT_SOURCE_DIR}/${T_SCRIPT} ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "python;${T_LABELS}" SKIP_RETURN_CODE 77)
endfunction()
