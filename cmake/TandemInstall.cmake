# install target and the find_package(Tandem) package.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS tandem EXPORT TandemTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS tandem_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# bin/tandem finds its LibTorch helper at ../libexec/tandem/ (Note [Two binaries]).
install(TARGETS tandem_torch_cli RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/tandem)
# `tandem bench`'s workers: Tandem's beside the helper, the PyTorch peer under share/. OPTIONAL:
# scripts/demo builds the library, the CLI and its example only, and `cmake --install` after it
# installs what was built (`tandem bench` then says which worker is missing and how to build it).
install(TARGETS tandem_bench_worker tandem_frontier_worker OPTIONAL RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/tandem)
install(FILES bench/peer.py bench/gloo_exit.py bench/frontier_peer.py DESTINATION ${CMAKE_INSTALL_DATADIR}/tandem/bench)
install(PROGRAMS bench/in_memory_cgroup.sh DESTINATION ${CMAKE_INSTALL_DATADIR}/tandem/bench)
install(DIRECTORY include/tandem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES cmake/TandemTorch.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tandem)
install(EXPORT TandemTargets NAMESPACE tandem:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tandem)
configure_package_config_file(cmake/TandemConfig.cmake.in
  "${PROJECT_BINARY_DIR}/TandemConfig.cmake"
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tandem)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/TandemConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/TandemConfig.cmake" "${PROJECT_BINARY_DIR}/TandemConfigVersion.cmake"
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tandem)
