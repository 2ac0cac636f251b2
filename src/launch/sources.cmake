# The launcher's sources (behind `tandem run`), one list for the two builds that compile them:
# tandem_launch (src/CMakeLists.txt) and the fuzzers' product library (tests/fuzz/CMakeLists.txt).
set(TANDEM_LAUNCH_SOURCES)
foreach(_file gpu_count install_layout launch_options mpirun_command mpirun_output output_pump process_tree
              elastic_agent elastic_protocol elastic_rounds rendezvous_client rendezvous_server supervisor
              worker_process flight_analysis uncaught_exception)
  list(APPEND TANDEM_LAUNCH_SOURCES ${CMAKE_CURRENT_LIST_DIR}/${_file}.cpp)
endforeach()
