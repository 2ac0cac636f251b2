# Fault matrix, launcher and checkpoint side (docs/reliability.md): kill -9 of a rank under
# `tandem run --max-restarts 1` resumes bit-identically, kill -9 inside save_state leaves the
# previous checkpoint as the one to resume, SIGTERM lets workers finish a checkpoint within the
# grace period, and the rendezvous store refuses strangers. Every script bounds every wait (no
# hang) and judges results against an uninterrupted run, never against a speed.
add_executable(fault_trainer faults/fault_trainer.cpp)
target_link_libraries(fault_trainer PRIVATE tandem)
target_include_directories(fault_trainer SYSTEM PRIVATE ${TANDEM_JSON_INCLUDE_DIR})
tandem_test_target(fault_trainer)
tandem_reuse_pch(fault_trainer)

set(_faults ${CMAKE_CURRENT_SOURCE_DIR}/faults)
set(_trainer ${TANDEM_CLI_PATH} $<TARGET_FILE:fault_trainer>)
set(_reference ${CMAKE_CURRENT_BINARY_DIR}/faults_reference)
# The uninterrupted run every restart and checkpoint case is compared with (20 steps, k = 4).
add_test(NAME faults.reference COMMAND ${_faults}/reference.sh ${_trainer} ${_reference})
set_tests_properties(faults.reference PROPERTIES FIXTURES_SETUP faults_reference)
add_test(NAME faults.restart.kill9_mid_epoch COMMAND ${_faults}/restart_test.sh ${_trainer} ${_reference})
add_test(NAME faults.checkpoint.kill9_during_save COMMAND ${_faults}/kill_during_save_test.sh ${_trainer} ${_reference})
add_test(NAME faults.sigterm.checkpoint_in_grace COMMAND ${_faults}/sigterm_test.sh ${_trainer} ${_reference})
set_tests_properties(faults.restart.kill9_mid_epoch faults.checkpoint.kill9_during_save faults.sigterm.checkpoint_in_grace
  PROPERTIES FIXTURES_REQUIRED faults_reference)
# Rendezvous hardening: loopback-only store, run ids, busy and free ports.
foreach(_case loopback run_id busy_port)
  add_test(NAME faults.rendezvous.${_case} COMMAND ${_faults}/rendezvous_test.sh ${_case} ${_trainer})
endforeach()
set_tests_properties(faults.reference faults.restart.kill9_mid_epoch faults.checkpoint.kill9_during_save
  faults.sigterm.checkpoint_in_grace faults.rendezvous.loopback faults.rendezvous.run_id faults.rendezvous.busy_port
  PROPERTIES LABELS "faults;multiprocess" TIMEOUT 240)
# Preemption under a real (private) Slurm: examples/slurm/requeue.sbatch, scancel --signal=TERM,
# the job requeued and resumed bit for bit (label slurm; skipped without Slurm).
add_test(NAME slurm.requeue COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/launch/slurm_requeue_test.sh ${_trainer} ${_reference})
set_tests_properties(slurm.requeue PROPERTIES FIXTURES_REQUIRED faults_reference LABELS "slurm;faults;multiprocess"
  TIMEOUT 300 SKIP_RETURN_CODE 77 RUN_SERIAL ON)
# Elastic world size (Note [Elastic rounds], docs/cluster.md): two network-namespace hosts under
# `tandem run --nnodes 1:2`, host B killed mid-epoch and started again; the same node loss under
# torchrun's own elastic mode; what an elastic node refuses. Every sample of every epoch once.
add_test(NAME faults.elastic.two_hosts COMMAND ${_faults}/elastic_test.sh ${_trainer})
add_test(NAME faults.elastic.torchrun COMMAND ${_faults}/torchrun_elastic_test.sh "${_eco_torchrun}" $<TARGET_FILE:fault_trainer>)
add_test(NAME faults.elastic.refusals COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/launch/elastic_refusals_test.sh ${_trainer})
set_tests_properties(faults.elastic.two_hosts faults.elastic.torchrun faults.elastic.refusals
  PROPERTIES LABELS "faults;elastic;multiprocess" TIMEOUT 300 SKIP_RETURN_CODE 77)
set_tests_properties(faults.elastic.two_hosts faults.elastic.torchrun PROPERTIES RUN_SERIAL ON)
# Bad elastic flags at the command line: one line, exit non-zero, nothing started.
set(_elastic_fail ${CMAKE_CURRENT_SOURCE_DIR}/expect_failure.sh 20)
add_test(NAME launch.elastic.fail.min_above_max COMMAND ${_elastic_fail}
  "^tandem: --nnodes 3:2 is not valid: MIN \\(3\\) is more than MAX \\(2\\)$"
  ${TANDEM_CLI_PATH} run --nnodes 3:2 --rdzv-endpoint 127.0.0.1:29400 -- /bin/true)
add_test(NAME launch.elastic.fail.endpoint COMMAND ${_elastic_fail}
  "^tandem: --rdzv-endpoint '127\\.0\\.0\\.1' is not valid: expected HOST:PORT$"
  ${TANDEM_CLI_PATH} run --nnodes 1:2 --rdzv-endpoint 127.0.0.1 -- /bin/true)
set_tests_properties(launch.elastic.fail.min_above_max launch.elastic.fail.endpoint PROPERTIES LABELS "launch;elastic")
