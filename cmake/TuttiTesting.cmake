# Helpers for tutti's tests.
#
# tutti_add_test(NAME <name> SOURCES <files...> [LIBS <targets...>] [RANKS <k...>] [TIMEOUT <s>] [LABELS <l...>])
#   Builds a GoogleTest executable <name> and registers it with ctest. Without RANKS it runs
#   once as a plain process. With RANKS it runs once per k under
#   `mpiexec -n k --oversubscribe`, as tests named <name>.np<k>.
#   Tests may include internal headers ("core/...", "kernels/...").
find_package(GTest REQUIRED)

# Open MPI refuses to run as root unless told; CI runs as root. Oversubscription lets
# 4 ranks share 2 cores, and yielding when idle keeps busy-polling ranks from starving others.
set(TUTTI_MPI_TEST_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
  OMPI_MCA_btl_vader_single_copy_mechanism=none)

function(tutti_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;RANKS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE tutti::tutti GTest::gtest ${T_LIBS})
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/tests)
  if(NOT T_RANKS)
    target_link_libraries(${T_NAME} PRIVATE GTest::gtest_main)
    add_test(NAME ${T_NAME} COMMAND ${T_NAME})
    set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
    return()
  endif()
  foreach(k IN LISTS T_RANKS)
    add_test(NAME ${T_NAME}.np${k}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${k} --oversubscribe
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${T_NAME}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${T_NAME}.np${k} PROPERTIES
      TIMEOUT ${T_TIMEOUT} PROCESSORS ${k} LABELS "mpi;${T_LABELS}"
      ENVIRONMENT "${TUTTI_MPI_TEST_ENV}")
  endforeach()
endfunction()
