# ctest driver: install Tandem into a prefix, then configure, build and run the consumer project
# against it (find_package(Tandem)).
#   MODE full  installs the suite's own build (every target: the benchmark's workers included)
#   MODE demo  configures a build folder of its own (DEMO_BUILD) like the suite's, builds only what
#              scripts/demo builds (the tandem_demo target), installs that, and checks the prefix
#              holds the library, headers, package and CLI but no benchmark worker, whose absence
#              `tandem bench` names in one line (issue 43: the install failed after scripts/demo)
set(PREFIX "${WORK}/prefix")
file(REMOVE_RECURSE "${WORK}")

function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer step failed (${rc}): ${ARGN}")
  endif()
endfunction()

if(MODE STREQUAL "demo")
  # The suite's build type, flags and Python: the compiler cache then serves every object.
  file(REMOVE_RECURSE "${DEMO_BUILD}")
  run_step(${CMAKE_COMMAND} -S ${SOURCE} -B ${DEMO_BUILD} -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
           "-DCMAKE_CXX_FLAGS_${BUILD_TYPE_UPPER}=${BUILD_TYPE_FLAGS}" -DTANDEM_PYTHON=${PYTHON}
           -DTANDEM_UNITY_BUILD=${UNITY} -DTANDEM_UNITY_BATCH_SIZE=${UNITY_BATCH})
  run_step(${CMAKE_COMMAND} --build ${DEMO_BUILD} --target tandem_demo)
  set(BUILD "${DEMO_BUILD}")
endif()
run_step(${CMAKE_COMMAND} --install ${BUILD} --prefix ${PREFIX})

if(MODE STREQUAL "demo")
  # lib* : GNUInstallDirs' libdir is lib or lib64, by platform.
  foreach(f bin/tandem libexec/tandem/tandem-torch include/tandem/version.h lib*/libtandem.a
            lib*/cmake/Tandem/TandemConfig.cmake)
    file(GLOB found "${PREFIX}/${f}")
    if(NOT found)
      message(FATAL_ERROR "the install after the demo's targets lacks ${f}")
    endif()
  endforeach()
  if(EXISTS "${PREFIX}/libexec/tandem/tandem-bench-worker")
    message(FATAL_ERROR "the demo's build made the benchmark worker: this test no longer installs a partial build")
  endif()
  # The installed CLI works, and its benchmark names what is missing instead of failing later.
  run_step(${PREFIX}/bin/tandem --version)
  execute_process(COMMAND ${PREFIX}/bin/tandem bench --models small --strategies single --repeats 1
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
  if(rc EQUAL 0 OR NOT err MATCHES "benchmark worker .*tandem-bench-worker is missing or not executable: build every target")
    message(FATAL_ERROR "`tandem bench` without its worker: exit ${rc}, said: ${err}${out}")
  endif()
else()
  foreach(f libexec/tandem/tandem-bench-worker libexec/tandem/tandem-frontier-worker share/tandem/bench/peer.py)
    if(NOT EXISTS "${PREFIX}/${f}")
      message(FATAL_ERROR "the install of every target lacks ${f}")
    endif()
  endforeach()
endif()

run_step(${CMAKE_COMMAND} -S ${SOURCE}/tests/consumer -B ${WORK}/build -G Ninja -DCMAKE_PREFIX_PATH=${PREFIX})
run_step(${CMAKE_COMMAND} --build ${WORK}/build)
run_step(${WORK}/build/consumer)
