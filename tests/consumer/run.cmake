# ctest driver: install the built Tandem into a prefix, then configure, build and run the consumer.
set(PREFIX "${WORK}/prefix")
file(REMOVE_RECURSE "${WORK}")
foreach(step
    "${CMAKE_COMMAND};--install;${BUILD};--prefix;${PREFIX}"
    "${CMAKE_COMMAND};-S;${SOURCE}/tests/consumer;-B;${WORK}/build;-G;Ninja;-DCMAKE_PREFIX_PATH=${PREFIX}"
    "${CMAKE_COMMAND};--build;${WORK}/build"
    "${WORK}/build/consumer")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer step failed (${rc}): ${step}")
  endif()
endforeach()
