# cmake -P script: install, configure the consumer, build it, run it, check its output; then the
# installed tutti-launch: its --help, the Slurm script beside it, and a launch of the consumer's
# own training program (launched.cc) on this host, through a crash of one rank, to the end.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()
run(${CMAKE_COMMAND} --install ${TUTTI_BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
string(REPLACE "." "\\." version_regex "${EXPECTED_VERSION}")
if(NOT last_output MATCHES "tutti ${version_regex}: Tensor\\[2, 3\\] bf16 cpu")
  message(FATAL_ERROR "consumer printed something unexpected:\n${last_output}")
endif()
message(STATUS "consumer ran: ${last_output}")

# ---- the installed launcher ----------------------------------------------------------------
set(launcher ${prefix}/bin/tutti-launch)
if(NOT EXISTS ${prefix}/share/tutti/slurm/tutti-elastic.sbatch)
  message(FATAL_ERROR "the Slurm script is not installed in ${prefix}/share/tutti/slurm")
endif()
run(${launcher} --help)
foreach(promise IN ITEMS "--hostfile" "--status-file" "--max-failures" "TUTTI_RESUME" "75")
  string(FIND "${last_output}" "${promise}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "tutti-launch --help does not mention ${promise}:\n${last_output}")
  endif()
endforeach()
if(NOT MPIEXEC)
  message(STATUS "no mpiexec: the launch of the consumer's program is not checked")
  return()
endif()
# Rank 1 dies after step 7 (exit 9, no finish()): the launcher relaunches, the Run resumes from the
# checkpoint of step 5 (TUTTI_RESUME=auto) and completes its 20 steps; the status file says so.
file(WRITE ${WORK_DIR}/hosts "localhost slots=2\n")
execute_process(COMMAND ${launcher} --hostfile ${WORK_DIR}/hosts --mpirun ${MPIEXEC} --mpirun-arg=--oversubscribe
                        --retry-delay 0.1 --status-file ${WORK_DIR}/status.json
                        -- ${WORK_DIR}/build/launched ${WORK_DIR}/ckpt 7
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tutti-launch of the consumer's program failed (${rc}):\n${out}\n${err}")
endif()
# The status is written at most every 0.2 s besides checkpoints: the last step done it names is 5 to 7.
if(NOT err MATCHES "step\\(s\\) lost \\(last step done [5-7], checkpoint at step 5\\)")
  message(FATAL_ERROR "tutti-launch did not say what was lost:\n${err}")
endif()
foreach(said IN ITEMS "attempt 1 failed (exit 9)" "the job resumed at step 5 from the checkpoint file"
                      "done: exit 0 after 2 attempt(s)")
  string(FIND "${err}" "${said}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "tutti-launch did not say '${said}':\n${err}")
  endif()
endforeach()
file(READ ${WORK_DIR}/status.json status)
string(JSON state GET "${status}" state)
string(JSON step GET "${status}" step)
string(JSON attempts GET "${status}" accounting attempts)
if(NOT state STREQUAL "completed" OR NOT step EQUAL 20 OR NOT attempts EQUAL 2)
  message(FATAL_ERROR "the status file says ${state} at step ${step} after ${attempts} attempt(s):\n${status}")
endif()
message(STATUS "the installed tutti-launch kept the consumer's program running through a crash:\n${err}")
