# A CPack pre-build script: the static libraries go into the package without their debug
# information (their symbols stay), so that a RelWithDebInfo build makes a package of tens of
# megabytes, not hundreds.
file(GLOB_RECURSE archives "${CPACK_TEMPORARY_INSTALL_DIRECTORY}/*.a")
foreach(archive IN LISTS archives)
  execute_process(COMMAND strip --strip-debug "${archive}" RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "strip --strip-debug ${archive} failed")
  endif()
endforeach()
