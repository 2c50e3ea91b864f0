# HiGHS, the MIP and LP solver of csrc/search (the SPMD integer programme and the
# heterogeneous balance LP), as the imported target highs::highs.
#
# Why this way: `pip install` must work without root, so no C++ dependency may come from
# apt. HiGHS publishes no C++ package on PyPI, but highspy's source release there carries
# all of HiGHS. The first configure downloads that pinned tarball (checked by SHA-256),
# builds HiGHS as a static library once and installs it under SHARDWISE_DEPS_DIR, which
# every build tree of this checkout shares (build/core, build/asan, build/fuzz,
# build/python): the ~240 files compile once per checkout, not once per tree.
#
# Offline: SHARDWISE_HIGHS_SOURCE=<the highspy-X.tar.gz or its unpacked folder>.
# An installed HiGHS instead: SHARDWISE_HIGHS_ROOT=<its install prefix>.
set(SHARDWISE_HIGHS_VERSION 1.16.0)
set(SHARDWISE_HIGHS_URL
  "https://files.pythonhosted.org/packages/39/2a/900b9bd6663ffbc6be7c6f9adedda691734f7a392d4ed0d4b9c0d13beab3/highspy-1.16.0.tar.gz")
set(SHARDWISE_HIGHS_SHA256 83519368321b1ac0ed508b8562b335928b6fd249e2ab42ff0218491e1486d985)

set(SHARDWISE_DEPS_DIR "$ENV{SHARDWISE_DEPS_DIR}" CACHE PATH
  "Where downloaded and built C++ dependencies live (default: <source>/build/_deps)")
if(NOT SHARDWISE_DEPS_DIR)
  set(SHARDWISE_DEPS_DIR "${PROJECT_SOURCE_DIR}/build/_deps" CACHE PATH "" FORCE)
endif()

# HiGHS's API passes std::string: it must be built with the core's libstdc++ ABI.
function(shardwise_build_highs prefix)
  set(work "${SHARDWISE_DEPS_DIR}/highs-${SHARDWISE_HIGHS_VERSION}-work")
  set(source "$ENV{SHARDWISE_HIGHS_SOURCE}")
  if(source AND IS_DIRECTORY "${source}")
    set(tree "${source}")
  else()
    if(NOT source)
      set(source "${SHARDWISE_DEPS_DIR}/highspy-${SHARDWISE_HIGHS_VERSION}.tar.gz")
      if(NOT EXISTS "${source}")
        message(STATUS "HiGHS: downloading highspy ${SHARDWISE_HIGHS_VERSION}'s source release from PyPI")
        file(DOWNLOAD "${SHARDWISE_HIGHS_URL}" "${source}.part" EXPECTED_HASH SHA256=${SHARDWISE_HIGHS_SHA256}
          STATUS status TLS_VERIFY ON)
        list(GET status 0 code)
        if(NOT code EQUAL 0)
          message(FATAL_ERROR "HiGHS: could not download ${SHARDWISE_HIGHS_URL} (${status}). Without "
            "network, download it elsewhere and set SHARDWISE_HIGHS_SOURCE to the file.")
        endif()
        file(RENAME "${source}.part" "${source}")
      endif()
    endif()
    file(SHA256 "${source}" got)
    if(NOT got STREQUAL SHARDWISE_HIGHS_SHA256)
      message(FATAL_ERROR "HiGHS: ${source} has SHA-256 ${got}, expected ${SHARDWISE_HIGHS_SHA256}")
    endif()
    file(REMOVE_RECURSE "${work}")
    file(ARCHIVE_EXTRACT INPUT "${source}" DESTINATION "${work}")
    set(tree "${work}/highspy-${SHARDWISE_HIGHS_VERSION}")
  endif()
  # highspy's release leaves out two files HiGHS's own CMakeLists reads (the command-line
  # app and the pkg-config template); neither is built here, so empty ones do.
  if(NOT EXISTS "${tree}/app/CMakeLists.txt")
    file(WRITE "${tree}/app/CMakeLists.txt" "")
  endif()
  if(NOT EXISTS "${tree}/highs.pc.in")
    file(WRITE "${tree}/highs.pc.in" "")
  endif()

  message(STATUS "HiGHS: building ${SHARDWISE_HIGHS_VERSION} into ${prefix} (once per checkout; a few minutes)")
  set(build "${work}/build")
  include(ProcessorCount)
  ProcessorCount(cores)
  if(cores EQUAL 0)
    set(cores 2)
  endif()
  # Through ccache where the core builds through it: its 240 steps (about 300 s of CPU on two
  # cores) are then compiled once per machine, not once per checkout (the tree lies under the
  # checkout, whose paths ccache takes relative to CCACHE_BASEDIR).
  set(launcher)
  if(CCACHE_PROGRAM)
    set(launcher -DCMAKE_C_COMPILER_LAUNCHER=${CCACHE_PROGRAM} -DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE_PROGRAM})
  endif()
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S "${tree}" -B "${build}" -G "${CMAKE_GENERATOR}" ${launcher}
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=${prefix} -DCMAKE_INSTALL_LIBDIR=lib
      -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_SHARED_LIBS=OFF -DFAST_BUILD=ON
      -DBUILD_TESTING=OFF -DBUILD_CXX_EXE=OFF -DBUILD_EXAMPLES=OFF -DBUILD_SHARED_EXTRAS_LIB=OFF
      -DZLIB=OFF "-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=${SHARDWISE_CXX11_ABI}"
    OUTPUT_FILE "${work}/configure.log" ERROR_FILE "${work}/configure.log" RESULT_VARIABLE rc)
  if(rc EQUAL 0)
    execute_process(COMMAND ${CMAKE_COMMAND} --build "${build}" --target install -j ${cores}
      OUTPUT_FILE "${work}/build.log" ERROR_FILE "${work}/build.log" RESULT_VARIABLE rc)
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "HiGHS: the build failed (${rc}); see ${work}/configure.log and ${work}/build.log")
  endif()
  file(REMOVE_RECURSE "${build}")
endfunction()

if(DEFINED ENV{SHARDWISE_HIGHS_ROOT})
  set(SHARDWISE_HIGHS_PREFIX "$ENV{SHARDWISE_HIGHS_ROOT}")
else()
  set(SHARDWISE_HIGHS_PREFIX "${SHARDWISE_DEPS_DIR}/highs-${SHARDWISE_HIGHS_VERSION}-abi${SHARDWISE_CXX11_ABI}")
  # One configure at a time builds it (two build trees may be configured at once).
  file(MAKE_DIRECTORY "${SHARDWISE_DEPS_DIR}")
  file(LOCK "${SHARDWISE_DEPS_DIR}/highs.lock" GUARD PROCESS TIMEOUT 3600)
  if(NOT EXISTS "${SHARDWISE_HIGHS_PREFIX}/lib/cmake/highs/highs-config.cmake")
    shardwise_build_highs("${SHARDWISE_HIGHS_PREFIX}")
  endif()
  file(LOCK "${SHARDWISE_DEPS_DIR}/highs.lock" RELEASE)
endif()
find_package(highs CONFIG REQUIRED PATHS "${SHARDWISE_HIGHS_PREFIX}" NO_DEFAULT_PATH)
