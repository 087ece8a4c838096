# Fills cmake/build_info.h.in into ${CMAKE_BINARY_DIR}/generated/markbase_build_info.h. Included by
# CMakeLists.txt after the CUDA and HTTP sections, whose results it records.

# The commit: read at configure time; CMake configures again when HEAD moves (the files below), so a rebuild
# after a commit reports the new one. Edits made since the last configure are not seen (the -dirty mark is
# the tree's state when CMake ran).
set(MARKBASE_GIT_COMMIT "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short HEAD
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} RESULT_VARIABLE git_rc OUTPUT_VARIABLE git_commit
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(git_rc EQUAL 0 AND git_commit)
    set(MARKBASE_GIT_COMMIT "${git_commit}")
    execute_process(COMMAND ${GIT_EXECUTABLE} status --porcelain --untracked-files=no
      WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} RESULT_VARIABLE git_rc OUTPUT_VARIABLE git_status ERROR_QUIET)
    if(git_rc EQUAL 0 AND NOT git_status STREQUAL "")
      string(APPEND MARKBASE_GIT_COMMIT "-dirty")
    endif()
    # HEAD itself (a checkout of another branch or commit) and the branch it names (a commit on it)
    execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --path-format=absolute --git-path HEAD
      WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} OUTPUT_VARIABLE git_head OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(COMMAND ${GIT_EXECUTABLE} symbolic-ref -q HEAD
      WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} OUTPUT_VARIABLE git_ref OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(git_ref)
      execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --path-format=absolute --git-path "${git_ref}"
        WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} OUTPUT_VARIABLE git_ref_file OUTPUT_STRIP_TRAILING_WHITESPACE
        ERROR_QUIET)
    endif()
    foreach(f IN ITEMS "${git_head}" "${git_ref_file}")
      if(f AND EXISTS "${f}")
        set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${f}")
      endif()
    endforeach()
  endif()
endif()

if(MARKBASE_NATIVE)
  set(MARKBASE_NATIVE_01 1)
else()
  set(MARKBASE_NATIVE_01 0)
endif()
set(MARKBASE_CUDA_ARCHS_TEXT "")
if(MARKBASE_HAS_CUDA)
  if(MARKBASE_CUDA_PREBUILT_USED)
    # the device code comes from another build folder, whose architectures this configure does not know
    set(MARKBASE_CUDA_ARCHS_TEXT "those of ${MARKBASE_CUDA_OBJECTS_FROM}")
  else()
    get_target_property(MARKBASE_SM90A_ARCHS markbase_cuda_sm90a CUDA_ARCHITECTURES)
    set(MARKBASE_CUDA_ARCHS_TEXT "${CMAKE_CUDA_ARCHITECTURES} (the wgmma kernels ${MARKBASE_SM90A_ARCHS})")
  endif()
endif()
if(NOT MARKBASE_HTTPLIB_FOUND)
  set(MARKBASE_HTTPLIB_VERSION "")
endif()
configure_file(${CMAKE_SOURCE_DIR}/cmake/build_info.h.in ${CMAKE_BINARY_DIR}/generated/markbase_build_info.h
  @ONLY)
