# Real launchers from the ecosystem (PyTorch's torchrun, Debian's mpirun) starting Tandem programs:
# the README's promise that they can, as tests. Each prints what the launcher printed.
# Skipped (exit 77) only where the launcher itself is absent; scripts/setup installs both.
set(_eco "${CMAKE_CURRENT_SOURCE_DIR}/ecosystem")
get_filename_component(_eco_bin "${TANDEM_TEST_PYTHON}" DIRECTORY)
set(_eco_torchrun "${_eco_bin}/torchrun")
set(_eco_python "${_eco_bin}/python")
set(_eco_tests)

if(TARGET train_ddp)
  set(_ok "all 2 ranks hold identical weights")
  foreach(_mode static standalone c10d)
    add_test(NAME ecosystem.torchrun.${_mode}
      COMMAND ${_eco}/torchrun.sh ${_mode} ${_eco_torchrun} --expect "${_ok}" -- $<TARGET_FILE:train_ddp> --epochs 1)
    list(APPEND _eco_tests ecosystem.torchrun.${_mode})
  endforeach()
  # Under plain mpirun the CPU collectives take the MPI backend by themselves, where it is built.
  set(_eco_mpi_backend "gloo")
  if(TANDEM_HAVE_MPI)
    set(_eco_mpi_backend "mpi")
  endif()
  add_test(NAME ecosystem.mpirun.train_ddp
    COMMAND ${_eco}/mpirun.sh ok --expect "${_ok}" --expect "CPU collectives on ${_eco_mpi_backend}"
      -- $<TARGET_FILE:train_ddp> --epochs 1)
  add_test(NAME ecosystem.mpirun.no_master_addr
    COMMAND ${_eco}/mpirun.sh no-master-addr
      --expect "MASTER_ADDR is not set: a world of 2 ranks \\(OMPI_COMM_WORLD_SIZE=2\\) needs the host of rank 0 \\(e\\.g\\. mpirun -x MASTER_ADDR=127\\.0\\.0\\.1\\)"
      -- $<TARGET_FILE:train_ddp> --epochs 1)
  # A store already serves MASTER_PORT (what torchrun's agent does): without
  # TORCHELASTIC_USE_AGENT_STORE rank 0 says what to do; with it, hand-started ranks connect.
  add_test(NAME ecosystem.agent_store.busy_port
    COMMAND ${_eco}/agent_store.sh busy ${_eco_python}
      --expect "train_ddp: port 127\\.0\\.0\\.1:[0-9]+ is busy\\. If another job holds it, choose another --master-port / MASTER_PORT .*If a launcher already serves the rendezvous store there .*set TORCHELASTIC_USE_AGENT_STORE=True for workers started by hand next to a running store$"
      -- $<TARGET_FILE:train_ddp> --epochs 1)
  add_test(NAME ecosystem.agent_store.hand_started_clients
    COMMAND ${_eco}/agent_store.sh client ${_eco_python} --expect "${_ok}" -- $<TARGET_FILE:train_ddp> --epochs 1)
  list(APPEND _eco_tests ecosystem.mpirun.train_ddp ecosystem.mpirun.no_master_addr
    ecosystem.agent_store.busy_port ecosystem.agent_store.hand_started_clients)
endif()

# torchrun --max-restarts 1: attempt 0 dies after its process group is up (keys written in the
# agent's store); attempt 1 must rendezvous in that same store without seeing them.
add_test(NAME ecosystem.torchrun.restart
  COMMAND ${_eco}/torchrun.sh restart ${_eco_torchrun}
    --expect "rank 1: exiting on attempt 0 after creating the process group"
    --expect "rank 0: attempt 1 rendezvoused without seeing attempt 0's keys"
    --expect "rank 1: attempt 1 rendezvoused without seeing attempt 0's keys"
    --expect "PASSED.* 3 tests"
    -- $<TARGET_FILE:collectives_test>
    "--gtest_filter=Collectives.AllReduceSumIsExact:Collectives.BarrierWaitsForEveryRank:Collectives.AllGatherOrdersByRank")
list(APPEND _eco_tests ecosystem.torchrun.restart)

set_tests_properties(${_eco_tests} PROPERTIES LABELS "ecosystem;multiprocess" TIMEOUT 60 SKIP_RETURN_CODE 77)
