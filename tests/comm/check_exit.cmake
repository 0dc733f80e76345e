# Runs comm_exit_test under mpiexec and judges the whole job (cmake -P script, run by ctest).
# Variables: MPIEXEC, NP, TEST, MODE (throw|abort), DEADLINE.
string(TIMESTAMP t0 "%s")
execute_process(
  COMMAND ${MPIEXEC} -n ${NP} --oversubscribe ${TEST} ${MODE} ${DEADLINE}
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 120)
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
set(all "${out}\n${err}")
message(STATUS "mpiexec exited with ${rc} after ${elapsed} s; output:\n${all}")

math(EXPR waiting "${NP} - 1")
if(MODE STREQUAL "unwind")
  string(REGEX MATCHALL "UNWIND-CHECK rank [0-9]+: OK" oks "${all}")
  list(LENGTH oks n_ok)
  if(NOT n_ok EQUAL NP OR NOT rc EQUAL 0)
    message(FATAL_ERROR "expected all ${NP} ranks to report OK and mpiexec to exit with 0 (clean MPI_Finalize everywhere), got ${n_ok} OK and exit ${rc}")
  endif()
elseif(MODE STREQUAL "throw")
  string(REGEX MATCHALL "TIMEOUT-CHECK rank [0-9]+: OK" oks "${all}")
  list(LENGTH oks n_ok)
  if(NOT n_ok EQUAL waiting)
    message(FATAL_ERROR "expected ${waiting} waiting rank(s) to report OK, got ${n_ok}")
  endif()
  if(all MATCHES "FAILED")
    message(FATAL_ERROR "a rank reported FAILED")
  endif()
else()
  if(rc EQUAL 0)
    message(FATAL_ERROR "the job ended successfully, but a timeout must end it with an error")
  endif()
  foreach(piece "TIMEOUT: collective #2 allreduce\\(sum\\) 1000 x f32 \\(3.9 KiB\\) issued by 'timeout-test bucket 7' on backend mpi"
                "did not complete within its deadline of"
                "Ending the job \\(MPI_Abort\\)")
    if(NOT all MATCHES "${piece}")
      message(FATAL_ERROR "the report lacks '${piece}'")
    endif()
  endforeach()
endif()
# Startup of mpiexec and MPI takes a few seconds on a loaded machine; the deadline adds to it.
if(elapsed GREATER 30)
  message(FATAL_ERROR "the job took ${elapsed} s to end, the deadline was ${DEADLINE} s")
endif()
