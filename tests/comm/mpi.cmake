# The Open MPI backend (docs/design/mpi.md): the same oracles as Gloo, run through
# `tandem run --backend mpi` (Open MPI's mpirun), on one host and across two network-namespace
# hosts; its failures end the job without a hang. Built only where the backend is.
if(NOT TANDEM_HAVE_MPI)
  return()
endif()
set(_mpi_run ${TANDEM_CLI_PATH} run --backend mpi)
add_test(NAME comm.collectives.mpi2
  COMMAND ${_mpi_run} --nproc-per-node 2 -- $<TARGET_FILE:collectives_test> ${_cpu_filter})
add_test(NAME comm.collectives.mpi3
  COMMAND ${_mpi_run} --nproc-per-node 3 -- $<TARGET_FILE:collectives_test> ${_cpu_filter})
add_test(NAME comm.collectives.mpi4
  COMMAND ${_mpi_run} --nproc-per-node 4 -- $<TARGET_FILE:collectives_test> ${_cpu_filter})
set_tests_properties(comm.collectives.mpi2 comm.collectives.mpi3 comm.collectives.mpi4 PROPERTIES ENVIRONMENT TANDEM_TEST_EXPECT_CPU_BACKEND=mpi)
add_test(NAME mesh.parallel.mpi4 COMMAND ${_mpi_run} --nproc-per-node 4 -- $<TARGET_FILE:mesh_parallel_test>)
set_tests_properties(mesh.parallel.mpi4 PROPERTIES LABELS "mpi;multiprocess" TIMEOUT 300)
foreach(_n 2 4)
  add_test(NAME comm.subgroups.mpi${_n}
    COMMAND ${_mpi_run} --nproc-per-node ${_n} -- $<TARGET_FILE:subgroups_test> --gtest_filter=-SubgroupTimeout.*:NcclSubgroups.*)
  set_tests_properties(comm.subgroups.mpi${_n} PROPERTIES LABELS "comm;multiprocess;mpi" TIMEOUT 300)
endforeach()
# (Not the collective that times out: MPI cannot cancel one, so the job would end there, by design.)
add_test(NAME comm.nccl_rules.mpi2 COMMAND ${_mpi_run} --nproc-per-node 2 -- $<TARGET_FILE:subgroups_test>
  --gtest_filter=NcclRules.*:-NcclRules.ACollectiveWaitsForTheSendIssuedBeforeIt)
set_tests_properties(comm.nccl_rules.mpi2 PROPERTIES LABELS "comm;multiprocess;mpi" TIMEOUT 300
  ENVIRONMENT "TANDEM_NCCL_RULES=1;TANDEM_TEST_COLLECTIVE_TIMEOUT_MS=3000")
# Pipelines over MPI: its tags keep the streams of interleaved 1F1B apart, as Gloo's do.
add_test(NAME pp.mpi2 COMMAND ${_mpi_run} --nproc-per-node 2 -- $<TARGET_FILE:pipeline_test>)
set_tests_properties(pp.mpi2 PROPERTIES LABELS "pp;multiprocess;mpi" TIMEOUT 300)
# Auto under plain mpirun (no --backend, no TANDEM_CPU_BACKEND) is MPI.
add_test(NAME comm.collectives.mpi.auto_under_mpirun
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ecosystem/mpirun.sh ok -- $<TARGET_FILE:collectives_test>
    --gtest_filter=Collectives.CpuBackendIsTheExpectedOne:Collectives.AllReduceSumIsExact)
set_tests_properties(comm.collectives.mpi.auto_under_mpirun PROPERTIES
  ENVIRONMENT "TANDEM_TEST_EXPECT_CPU_BACKEND=mpi;TANDEM_CPU_BACKEND=" SKIP_RETURN_CODE 77)
add_test(NAME ddp.mpi2 COMMAND ${_mpi_run} --nproc-per-node 2 -- $<TARGET_FILE:ddp_test> --gtest_filter=-DdpGpu.*)
add_test(NAME ddp.mpi4 COMMAND ${_mpi_run} --nproc-per-node 4 -- $<TARGET_FILE:ddp_test> --gtest_filter=-DdpGpu.*)
if(TARGET train_ddp)
  add_test(NAME example.train_ddp.mpi2 COMMAND ${_mpi_run} --nproc-per-node 2 -- $<TARGET_FILE:train_ddp> --epochs 2)
  set_tests_properties(example.train_ddp.mpi2 PROPERTIES
    PASS_REGULAR_EXPRESSION "CPU collectives on mpi.*all 2 ranks hold identical weights")
endif()
# Failures: a hung rank is named (within the timeout + 5 s by construction); a rank that returns early is named too;
# a killed rank ends the job; asking for MPI without an MPI launcher is a one-line error.
set(_mpi_fault ${CMAKE_CURRENT_SOURCE_DIR}/faults/collective_fault.sh ${TANDEM_CLI_PATH} $<TARGET_FILE:collective_faults>)
add_test(NAME faults.hung_rank.mpi2 COMMAND ${_mpi_fault} 2 hang-rank-1 3000
  "all_reduce of 4 Float on cpu \\(sum\\) failed on rank 0 of 2 at collective #4: MPI all_reduce timed out after 3000 ms; rank 1 did not arrive")
add_test(NAME faults.exited_rank.mpi2 COMMAND ${_mpi_fault} 2 exit-rank-1 3000
  "failed on rank 0 of 2 at collective #[0-9]+: .*rank 1 did not arrive")
add_test(NAME faults.hung_rank.ddp.mpi2 COMMAND ${_mpi_fault} 2 hang-in-ddp 3000
  "DDP gradient all_reduce of [0-9]+ Float failed on rank 0 of 2 at collective #[0-9]+: .*rank 1 did not arrive")
set_tests_properties(faults.hung_rank.mpi2 faults.exited_rank.mpi2 faults.hung_rank.ddp.mpi2 PROPERTIES ENVIRONMENT TANDEM_FAULT_BACKEND=mpi)
add_test(NAME faults.killed_rank.mpi2 COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/comm/mpi_killed_rank_test.sh
  ${TANDEM_CLI_PATH} $<TARGET_FILE:collective_faults>)
add_test(NAME comm.mpi.fail.no_launcher COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_failure.sh 30
  "the MPI backend needs processes started by an MPI launcher \\(`tandem run --backend mpi`, mpirun, or srun --mpi=pmix\\): none of OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK is set"
  env TANDEM_CPU_BACKEND=mpi $<TARGET_FILE:train_ddp> --epochs 1)
add_test(NAME comm.mpi.fail.bad_variable COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_failure.sh 30
  "TANDEM_CPU_BACKEND='mpich' is not a CPU backend: use auto, gloo or mpi"
  env TANDEM_CPU_BACKEND=mpich $<TARGET_FILE:train_ddp> --epochs 1)
# Ranks that disagree on the backend are refused at creation, naming both (instead of one rank
# waiting in MPI's setup, which has no timeout).
add_test(NAME comm.mpi.fail.backend_differs COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_failure.sh 60
  "the CPU backend differs between ranks: rank 0 uses gloo, rank 1 mpi: set the same TANDEM_CPU_BACKEND"
  ${TANDEM_CLI_PATH} run --nproc-per-node 2 -- sh -c "[ \"$RANK\" = 1 ] && export TANDEM_CPU_BACKEND=mpi; exec \"$0\" --epochs 1" $<TARGET_FILE:train_ddp>)
# `tandem run`'s own workers inside an MPI job (srun with PMIx, or under mpirun) inherit its
# variables, yet are no MPI world: auto must stay on Gloo for them.
add_test(NAME comm.collectives.gloo2.inside_an_mpi_job
  COMMAND env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 PMIX_RANK=0 TANDEM_TEST_EXPECT_CPU_BACKEND=gloo
    ${TANDEM_CLI_PATH} run --nproc-per-node 2 -- $<TARGET_FILE:collectives_test>
    --gtest_filter=Collectives.CpuBackendIsTheExpectedOne:Collectives.AllReduceSumIsExact)
# ZeRO-1 (tests/zero/sharded_optimizer_test.cpp) on MPI's own collectives.
add_test(NAME zero.sharded_optimizer.mpi2 COMMAND ${_mpi_run} --nproc-per-node 2 -- $<TARGET_FILE:sharded_optimizer_test>)
add_test(NAME zero.sharded_optimizer.mpi3 COMMAND ${_mpi_run} --nproc-per-node 3 -- $<TARGET_FILE:sharded_optimizer_test>)
# FSDP (tests/fsdp/fsdp_test.cpp) on MPI's own collectives.
add_test(NAME fsdp.mpi2 COMMAND ${_mpi_run} --nproc-per-node 2 -- $<TARGET_FILE:fsdp_test>)
add_test(NAME fsdp.mpi3 COMMAND ${_mpi_run} --nproc-per-node 3 -- $<TARGET_FILE:fsdp_test>)
add_test(NAME fsdp.mpi4 COMMAND ${_mpi_run} --nproc-per-node 4 -- $<TARGET_FILE:fsdp_test>)
add_test(NAME accelerate.zero.mpi2 COMMAND ${_mpi_run} --nproc-per-node 2 -- $<TARGET_FILE:accelerator_test>
  --gtest_filter=AcceleratorZero.*:AcceleratorFsdp.*)
set(_mpi_tests comm.mpi.fail.backend_differs comm.collectives.gloo2.inside_an_mpi_job comm.collectives.mpi2 comm.collectives.mpi3 comm.collectives.mpi4 comm.collectives.mpi.auto_under_mpirun ddp.mpi2 ddp.mpi4
  zero.sharded_optimizer.mpi2 zero.sharded_optimizer.mpi3 accelerate.zero.mpi2 fsdp.mpi2 fsdp.mpi3 fsdp.mpi4
  faults.hung_rank.mpi2 faults.exited_rank.mpi2 faults.hung_rank.ddp.mpi2 faults.killed_rank.mpi2
  comm.mpi.fail.no_launcher comm.mpi.fail.bad_variable)
if(TARGET train_ddp)
  list(APPEND _mpi_tests example.train_ddp.mpi2)
endif()
set_tests_properties(${_mpi_tests} PROPERTIES LABELS "mpi;multiprocess" TIMEOUT 300)
# Two network-namespace hosts, MPI over TCP between them (tests/comm/netns_mpi_test.sh).
add_test(NAME comm.collectives.netns.mpi COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/comm/netns_mpi_test.sh ${TANDEM_CLI_PATH}
  $<TARGET_FILE:collectives_test> --gtest_filter=Collectives.AllReduce*:Collectives.Broadcast*:Collectives.AllGather*:Collectives.Barrier*:Collectives.CpuBackendIsTheExpectedOne)
add_test(NAME ddp.netns.mpi COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/comm/netns_mpi_test.sh ${TANDEM_CLI_PATH}
  $<TARGET_FILE:ddp_test> --gtest_filter=-DdpGpu.*)
set_tests_properties(comm.collectives.netns.mpi ddp.netns.mpi PROPERTIES LABELS "mpi;multiprocess" TIMEOUT 300
  SKIP_RETURN_CODE 77 RUN_SERIAL ON ENVIRONMENT TANDEM_TEST_EXPECT_CPU_BACKEND=mpi)
