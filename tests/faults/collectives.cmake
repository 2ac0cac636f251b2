# Fault matrix, collective side (docs/reliability.md): a rank that stops calling collectives, a
# rank that exits early, and mismatched calls under TANDEM_DEBUG=DETAIL. Each ends the job with
# an error naming the call, its sequence number and the ranks concerned, within the collective
# timeout (3 s here) plus 5 s.
add_executable(collective_faults faults/collective_faults.cpp)
target_link_libraries(collective_faults PRIVATE tandem_test_support)
tandem_test_target(collective_faults)
tandem_reuse_pch(collective_faults)
set(_fault ${CMAKE_CURRENT_SOURCE_DIR}/faults/collective_fault.sh ${TANDEM_CLI_PATH} $<TARGET_FILE:collective_faults>)
# The second pattern on: what `tandem run` prints from every rank's flight record (Note [Flight
# recorder] in src/comm/flight_recorder.h).
add_test(NAME faults.hung_rank.gloo2 COMMAND ${_fault} 2 hang-rank-1 3000
  "all_reduce of 4 Float on cpu \\(sum\\) failed on rank 0 of 2 at collective #4: .*rank 1 did not arrive"
  "flight recorder: the world group: rank 1 did not reach collective #4 \\(all_reduce \\(sum\\) of Float\\[4\\] on cpu, issued by rank 0\\); its last was #3"
  "flight recorder: rank 1 \\(dumped on SIGUSR1\\): last completed collective #3")
add_test(NAME faults.hung_rank.gloo4 COMMAND ${_fault} 4 hang-rank-1 3000
  "failed on rank [023] of 4 at collective #4: .*rank 1 did not arrive"
  "flight recorder: the world group: rank 1 did not reach collective #4 \\(all_reduce \\(sum\\) of Float\\[4\\] on cpu, issued by ranks 0, 2, 3\\)")
add_test(NAME faults.hung_rank.ddp COMMAND ${_fault} 2 hang-in-ddp 3000
  "DDP gradient all_reduce of [0-9]+ Float failed on rank 0 of 2 at collective #[0-9]+: .*rank 1 did not arrive")
add_test(NAME faults.hung_rank.fsdp COMMAND ${_fault} 2 hang-in-fsdp 3000
  "fsdp all-gather of unit '0' failed on rank 0 of 2 at collective #[0-9]+: .*rank 1 did not arrive")
add_test(NAME faults.exited_rank.gloo2 COMMAND ${_fault} 2 exit-rank-1 3000
  "failed on rank 0 of 2 at collective #[0-9]+: .*rank 1 did not arrive"
  "flight recorder: rank 1 left no flight record \\(it exited")
add_test(NAME faults.debug.shape_mismatch COMMAND ${_fault} 2 mismatch-shape 3000
  "collective #4 differs across ranks \\(TANDEM_DEBUG=DETAIL\\): rank 0 calls #4 all_reduce \\(sum\\) of Float\\[4\\] on cpu; rank 1 calls #4 all_reduce \\(sum\\) of Float\\[5\\] on cpu")
add_test(NAME faults.debug.op_mismatch COMMAND ${_fault} 2 mismatch-op 3000
  "rank 0 calls #4 all_reduce \\(sum\\) of Float\\[2, 2\\] on cpu; rank 1 calls #4 broadcast \\(root 0\\) of Float\\[2, 2\\] on cpu")
set_tests_properties(faults.debug.shape_mismatch faults.debug.op_mismatch PROPERTIES ENVIRONMENT TANDEM_DEBUG=DETAIL)
# Without the debug mode: different operations both time out, and each rank's report names the
# other's call; different sizes make Gloo abort the process with its own "collective mismatch"
# message (PyTorch behaves the same). Neither hangs. TANDEM_DEBUG is cleared: these document the default.
add_test(NAME faults.mismatch.op_without_debug COMMAND ${_fault} 2 mismatch-op 3000
  "failed on rank 0 of 2 at collective #4: .*rank 1 was in collective #4, broadcast \\(root 0\\) of Float\\[2, 2\\] on cpu"
  "flight recorder: the world group: the ranks disagree at collective #4: all_reduce \\(sum\\) of Float\\[2, 2\\] on cpu on rank 0; broadcast \\(root 0\\) of Float\\[2, 2\\] on cpu on rank 1")
# The flight recorder's other divergences, at 3 ranks: a skipped collective, a message to the wrong
# peer, and a rank killed in the middle of a stream of messages.
add_test(NAME faults.flight.skipped_collective COMMAND ${_fault} 3 skip-collective 3000
  "at collective #4: "
  "flight recorder: the world group: the ranks disagree at collective #4: all_reduce \\(sum\\) of Float\\[4\\] on cpu on ranks 0, 2; broadcast \\(root 0\\) of Float\\[4\\] on cpu on rank 1")
add_test(NAME faults.flight.p2p_wrong_peer COMMAND ${_fault} 3 p2p-wrong-peer 3000
  "recv of 6 Float on cpu from rank 0, message #1 from that rank, failed on rank 1"
  "flight recorder: the world group: rank 1's receive #1 from rank 0 \\(6 Float\\) failed: rank 0 has not sent it \\(its last send to rank 1: none\\)"
  "flight recorder: the world group: rank 0's send #1 to rank 2 \\(6 Float\\) (failed|is still waiting): rank 2 has not posted that receive")
add_test(NAME faults.flight.p2p_killed_mid COMMAND ${_fault} 3 p2p-killed-mid 3000
  "rank 1 .*signal 9"
  "flight recorder: rank 1 left no flight record"
  "flight recorder: rank 0 \\(dumped on .*last completed receive #2 from rank 1 \\(6 Float\\)")
add_test(NAME faults.flight.doctor COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/faults/doctor_test.sh ${TANDEM_CLI_PATH}
  $<TARGET_FILE:collective_faults>)
set_tests_properties(faults.flight.skipped_collective faults.flight.p2p_wrong_peer faults.flight.p2p_killed_mid faults.flight.doctor PROPERTIES
  LABELS "faults;multiprocess" TIMEOUT 120 ENVIRONMENT "TANDEM_DEBUG=OFF;TORCH_DISTRIBUTED_DEBUG=OFF")
add_test(NAME faults.mismatch.shape_without_debug COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_failure.sh 60
  "Is there a distributed collective mismatch" ${TANDEM_CLI_PATH} run --nproc-per-node 2 -- $<TARGET_FILE:collective_faults> --scenario=mismatch-shape)
set_tests_properties(faults.mismatch.op_without_debug faults.mismatch.shape_without_debug PROPERTIES
  ENVIRONMENT "TANDEM_DEBUG=OFF;TORCH_DISTRIBUTED_DEBUG=OFF;TANDEM_TEST_COLLECTIVE_TIMEOUT_MS=3000")
set_tests_properties(faults.hung_rank.gloo2 faults.hung_rank.gloo4 faults.hung_rank.ddp faults.hung_rank.fsdp faults.exited_rank.gloo2
  faults.debug.shape_mismatch faults.debug.op_mismatch faults.mismatch.op_without_debug faults.mismatch.shape_without_debug
  PROPERTIES LABELS "faults;multiprocess" TIMEOUT 120)
# Uneven inputs: rank r has 3 + 2r batches; inside DDP's join() the job completes and every rank
# ends with the single-process reference's weights (the DdpJoin oracle of tests/ddp/ddp_test.cpp).
# Without join() a rank that runs out and exits is named by the others (faults.exited_rank.gloo2).
add_test(NAME faults.uneven_inputs.join.gloo2 COMMAND ${TANDEM_CLI_PATH} run --nproc-per-node 2 -- $<TARGET_FILE:ddp_test> --gtest_filter=Cases/DdpJoin.*:DdpJoinBuffers.*)
add_test(NAME faults.uneven_inputs.join.gloo4 COMMAND ${TANDEM_CLI_PATH} run --nproc-per-node 4 -- $<TARGET_FILE:ddp_test> --gtest_filter=Cases/DdpJoin.*:DdpJoinBuffers.*)
set_tests_properties(faults.uneven_inputs.join.gloo2 faults.uneven_inputs.join.gloo4 PROPERTIES LABELS "faults;multiprocess" TIMEOUT 300)
# The debug mode adds a collective before every call, so all ranks must have it or none: a rank
# whose TANDEM_DEBUG differs from rank 0's is refused when the process group is created.
add_test(NAME faults.debug.level_differs COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_failure.sh 60
  "the collective debug level differs between ranks: rank 0 runs with OFF, rank 1 with DETAIL"
  ${TANDEM_CLI_PATH} run --nproc-per-node 2 -- sh -c "[ \"$RANK\" = 1 ] && export TANDEM_DEBUG=DETAIL; exec \"$0\" --scenario=mismatch-op" $<TARGET_FILE:collective_faults>)
set_tests_properties(faults.debug.level_differs PROPERTIES LABELS "faults;multiprocess" TIMEOUT 120
  ENVIRONMENT "TANDEM_DEBUG=OFF;TORCH_DISTRIBUTED_DEBUG=")
