# `tandem run --backend {auto,gloo,mpi}` (docs/guide.md, "Launching with Open MPI"), label mpi.
# The launcher side needs only Open MPI's mpirun (scripts skip with 77 where it is missing); the
# collectives case needs Tandem's MPI backend too (TANDEM_HAVE_MPI).
set(_launch ${CMAKE_CURRENT_SOURCE_DIR}/launch)

# Flags, the mpirun command line and the output parser, without starting anything (LibTorch-free).
add_executable(mpirun_launch_test launch/mpirun_launch_test.cpp)
tandem_test_target(mpirun_launch_test)
target_link_libraries(mpirun_launch_test PRIVATE tandem_launch GTest::gtest_main)
add_test(NAME launch.mpi.unit COMMAND mpirun_launch_test)

# End to end with shell workers: ranks and environment, --backend gloo, restart, failure, SIGTERM.
foreach(_mode env gloo-env restart fail sigterm)
  add_test(NAME launch.mpi.${_mode} COMMAND ${_launch}/mpi_test.sh ${_mode} ${TANDEM_CLI_PATH})
endforeach()

# Two network-namespace hosts, 2 ranks each, from one launcher (mpirun's rsh agent enters host B).
add_test(NAME launch.mpi.netns COMMAND ${_launch}/mpi_netns_test.sh ${TANDEM_CLI_PATH})
set_tests_properties(launch.mpi.netns PROPERTIES RUN_SERIAL ON)

# Bad input: one line, exit 2, nothing started.
set(_fail ${CMAKE_CURRENT_SOURCE_DIR}/expect_failure.sh 20)
add_test(NAME launch.mpi.fail.no_mpirun COMMAND ${_fail}
  "^tandem: --backend mpi needs Open MPI's mpirun on PATH \\(Debian: openmpi-bin\\)$"
  sh -c "d=$(mktemp -d) && ln -s /bin/true $d/prog && PATH=$d ${TANDEM_CLI_PATH} run --backend mpi -- prog; rc=$?; rm -rf $d; exit $rc")
add_test(NAME launch.mpi.fail.hosts_without_mpi COMMAND ${_fail}
  "^tandem: --hosts needs --backend mpi" ${TANDEM_CLI_PATH} run --hosts a,b -- /bin/true)
add_test(NAME launch.mpi.fail.node_rank COMMAND ${_fail}
  "^tandem: --node-rank is not used with --backend mpi" ${TANDEM_CLI_PATH} run --backend mpi --node-rank 0 -- /bin/true)
add_test(NAME launch.mpi.fail.unknown_backend COMMAND ${_fail}
  "^tandem: --backend 'openmpi' is not valid: expected auto, gloo or mpi$" ${TANDEM_CLI_PATH} run --backend openmpi -- /bin/true)
add_test(NAME launch.mpi.fail.host_count COMMAND ${_fail}
  "^tandem: --nnodes 3 does not match the 2 host\\(s\\) of --hosts a,b"
  ${TANDEM_CLI_PATH} run --backend mpi --nnodes 3 --hosts a,b -- /bin/true)
add_test(NAME launch.mpi.fail.nnodes_without_hosts COMMAND ${_fail}
  "^tandem: --nnodes 2 with --backend mpi needs --hosts" ${TANDEM_CLI_PATH} run --backend mpi --nnodes 2 -- /bin/true)
set(_launch_mpi_tests launch.mpi.unit launch.mpi.env launch.mpi.gloo-env launch.mpi.restart launch.mpi.fail
  launch.mpi.sigterm launch.mpi.netns launch.mpi.fail.no_mpirun launch.mpi.fail.hosts_without_mpi launch.mpi.fail.node_rank
  launch.mpi.fail.unknown_backend launch.mpi.fail.host_count launch.mpi.fail.nnodes_without_hosts)

# 2 ranks through mpirun that see each other: a few collectives on Tandem's MPI backend.
if(TANDEM_HAVE_MPI)
  add_test(NAME launch.mpi.collectives2 COMMAND ${TANDEM_CLI_PATH} run --backend mpi --nproc-per-node 2 --
    $<TARGET_FILE:collectives_test>
    "--gtest_filter=Collectives.CpuBackendIsTheExpectedOne:Collectives.AllReduceSumIsExact:Collectives.BroadcastFromEveryRoot:Collectives.AllGatherOrdersByRank:Collectives.BarrierWaitsForEveryRank")
  set_tests_properties(launch.mpi.collectives2 PROPERTIES ENVIRONMENT TANDEM_TEST_EXPECT_CPU_BACKEND=mpi)
  list(APPEND _launch_mpi_tests launch.mpi.collectives2)
endif()
set_tests_properties(${_launch_mpi_tests} PROPERTIES LABELS "mpi;launch" TIMEOUT 120 SKIP_RETURN_CODE 77)
