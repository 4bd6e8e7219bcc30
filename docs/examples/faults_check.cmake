# A ctest test that a trainer survives injected faults (docs/faults.md, "In CI"): ctrun runs it
# twice, once clean and once under a seeded fault plan, and the faulted run must succeed and end
# with the clean run's results (what each rank wrote to CTRUN_RESULT_FILE, or passed to
# ctrun_worker.write_result). Run by CMake itself (cmake -P), so it needs nothing else; in your
# CMakeLists.txt:
#
#   add_test(NAME trainer_survives_faults COMMAND ${CMAKE_COMMAND}
#     -DCTRUN=ctrun -DTRAINER=$<TARGET_FILE:my_trainer>
#     "-DTRAINER_ARGS=--epochs;2;--checkpoint_dir;${CMAKE_CURRENT_BINARY_DIR}/faults/@RUN@.ckpt"
#     "-DFAULTS=random:seed=5,count=5,kinds=kill+term+hang,ranks=0-1,steps=5-100,duration=1"
#     -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/faults
#     -P ${CMAKE_CURRENT_SOURCE_DIR}/faults_check.cmake)
#
# CTRUN, TRAINER, FAULTS and WORK_DIR are required; TRAINER_ARGS is a list in which @RUN@
# stands for the run's name (clean, faulted), so that each run keeps its own checkpoints;
# NPROC (default 2) and MAX_RESTARTS (default 10) are optional. WORK_DIR is emptied first.
cmake_minimum_required(VERSION 3.19)  # string(JSON)

foreach(required CTRUN TRAINER FAULTS WORK_DIR)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "faults_check: -D${required}=... is required")
  endif()
endforeach()
if(NOT DEFINED NPROC)
  set(NPROC 2)
endif()
if(NOT DEFINED MAX_RESTARTS)
  set(MAX_RESTARTS 10)
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# Runs the trainer under ctrun as `name` with `ARGN` for ctrun; sets `out_report` to its fault
# report (JSON text). A failed run ends the test with the end of its log.
function(run_job name out_report)
  string(REPLACE "@RUN@" "${name}" args "${TRAINER_ARGS}")
  set(report "${WORK_DIR}/${name}.json")
  set(log "${WORK_DIR}/${name}.log")
  execute_process(
    COMMAND "${CTRUN}" --standalone --nproc_per_node=${NPROC} --fault_report=${report} ${ARGN}
            "${TRAINER}" ${args}
    RESULT_VARIABLE rc OUTPUT_FILE "${log}" ERROR_FILE "${log}" TIMEOUT 900)
  if(NOT rc EQUAL 0)
    file(READ "${log}" text)
    string(LENGTH "${text}" length)
    if(length GREATER 4000)
      math(EXPR from "${length} - 4000")
      string(SUBSTRING "${text}" ${from} -1 text)
    endif()
    message(FATAL_ERROR "faults_check: the ${name} run failed (${rc}); ${log} ends:\n${text}")
  endif()
  file(READ "${report}" json)
  set(${out_report} "${json}" PARENT_SCOPE)
endfunction()

run_job(clean clean)
run_job(faulted faulted --max_restarts=${MAX_RESTARTS} --faults=${FAULTS})

string(JSON outcome GET "${faulted}" outcome)
if(NOT outcome STREQUAL "succeeded")
  message(FATAL_ERROR "faults_check: the faulted run's outcome is ${outcome}")
endif()
string(JSON fired LENGTH "${faulted}" faults)
if(fired EQUAL 0)
  message(FATAL_ERROR "faults_check: no fault fired: is the plan's window inside the job?")
endif()
string(JSON clean_results GET "${clean}" results)
string(JSON faulted_results GET "${faulted}" results)
string(JSON ranks LENGTH "${clean}" results)
if(ranks EQUAL 0)
  message(FATAL_ERROR "faults_check: the trainer wrote no result (CTRUN_RESULT_FILE)")
endif()
if(NOT clean_results STREQUAL faulted_results)
  message(FATAL_ERROR "faults_check: the results differ after ${fired} faults:\n"
                      "clean:   ${clean_results}\nfaulted: ${faulted_results}")
endif()
message(STATUS "faults_check: ${fired} faults, and the results of all ${ranks} ranks are the "
               "clean run's")
