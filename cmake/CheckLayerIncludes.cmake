# Fails if a file of one layer of csrc/ includes a header of a layer it may not use.
# Run as a script at build time, once per layer library (CMakeLists.txt,
# shardwise_add_layer), so an edit that adds a forbidden include fails the next build
# without a reconfigure:
#
#   cmake -DCSRC=<csrc dir> -DLAYER=<dir under csrc> -DALLOWED=<a,b,c> [-DSTAMP=<file>]
#         -P cmake/CheckLayerIncludes.cmake
#
# ALLOWED is the layer itself and every layer it links to, directly or through the layers
# below (comma-separated: a ';' would be split by the custom command's shell). An include
# `"x/..."` or `<x/...>` counts as a layer include when x is a directory of CSRC; any other
# (fmt/, nlohmann/, the standard library) is not this check's business. A relative include
# that climbs out of the file's folder (`"../search/x.h"`) is refused as well, since it
# would reach any layer past the check. On success, STAMP is touched (the build's output).
cmake_minimum_required(VERSION 3.22)

foreach(var CSRC LAYER ALLOWED)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "CheckLayerIncludes.cmake: -D${var}=... is required")
  endif()
endforeach()
string(REPLACE "," ";" allowed "${ALLOWED}")
list(JOIN allowed ", " allowed_text)

file(GLOB layer_dirs LIST_DIRECTORIES true RELATIVE ${CSRC} ${CSRC}/*)
set(layers)
foreach(d IN LISTS layer_dirs)
  if(IS_DIRECTORY ${CSRC}/${d})
    list(APPEND layers ${d})
  endif()
endforeach()

set(include_regex "^[ \t]*#[ \t]*include[ \t]*[<\"]([A-Za-z0-9_.]+)/")
file(GLOB_RECURSE files ${CSRC}/${LAYER}/*.h ${CSRC}/${LAYER}/*.cc)
list(SORT files)
set(offenders)
foreach(f IN LISTS files)
  # Fast path: most files have no offending include, and file(STRINGS REGEX) finds that
  # without walking the lines one by one in CMake.
  file(STRINGS ${f} include_lines REGEX "${include_regex}")
  set(bad FALSE)
  foreach(line IN LISTS include_lines)
    string(REGEX MATCH "${include_regex}" _ "${line}")
    set(target ${CMAKE_MATCH_1})
    if(target STREQUAL ".." OR (target IN_LIST layers AND NOT target IN_LIST allowed))
      set(bad TRUE)
    endif()
  endforeach()
  if(NOT bad)
    continue()
  endif()
  # Slow path, for the message only: number the lines. The text becomes a CMake list, so
  # the characters a list treats specially (';' '[' ']' '\') are blanked first; they never
  # matter to an #include line.
  file(READ ${f} text)
  string(REGEX REPLACE "[][;\\\\]" " " text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  file(RELATIVE_PATH rel ${CSRC}/.. ${f})
  set(n 0)
  foreach(line IN LISTS lines)
    math(EXPR n "${n} + 1")
    if(line MATCHES "${include_regex}")
      set(target ${CMAKE_MATCH_1})
      if(target STREQUAL ".." OR (target IN_LIST layers AND NOT target IN_LIST allowed))
        string(STRIP "${line}" line)
        list(APPEND offenders "${rel}:${n}: ${line}")
      endif()
    endif()
  endforeach()
endforeach()

if(offenders)
  list(JOIN offenders "\n  " msg)
  message(FATAL_ERROR "Layer '${LAYER}' includes headers of layers it does not depend on:\n  ${msg}\n"
    "csrc/${LAYER} may include only: ${allowed_text}. The layers and their dependencies are "
    "SHARDWISE_LAYER_DEPS in CMakeLists.txt, drawn in docs/architecture.md; change both "
    "together if the dependency is right.")
endif()
if(DEFINED STAMP)
  file(TOUCH ${STAMP})
endif()
