# Layering rules checked when the build is configured: which libraries a
# target must never link, directly or through another. The executor depends
# on spec/ and models/ (and reports/, comm), never on the planner's tracer or
# plan builder: the two share one description (spec/), the planner simulates
# what the engine runs, and neither reaches into the other. A
# target_link_libraries that brings the planner back fails the configure
# step, naming the path. The closure is also written
# to ${CMAKE_BINARY_DIR}/link_rules/<target>.txt, which the ctest
# `executor_links_no_planner` (tests/spec) checks again.

# Sets `out_var` to "<lib>" items `target` links, transitively, each as
# "parent>child" edges so that an error can show the path.
function(shardfit_link_closure target out_var)
  set(seen ${target})
  set(queue ${target})
  set(edges "")
  while(queue)
    list(POP_FRONT queue t)
    set(libs "")
    get_target_property(type ${t} TYPE)
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(direct ${t} LINK_LIBRARIES)
      if(direct)
        list(APPEND libs ${direct})
      endif()
    endif()
    get_target_property(iface ${t} INTERFACE_LINK_LIBRARIES)
    if(iface)
      list(APPEND libs ${iface})
    endif()
    foreach(lib IN LISTS libs)
      # $<LINK_ONLY:x> (static libraries' private links) counts as x.
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" lib "${lib}")
      if(lib MATCHES "^::@" OR lib MATCHES "^\\$<" OR NOT TARGET ${lib})
        continue()
      endif()
      if(NOT "${t}>${lib}" IN_LIST edges)
        list(APPEND edges "${t}>${lib}")
      endif()
      if(NOT lib IN_LIST seen)
        list(APPEND seen ${lib})
        list(APPEND queue ${lib})
      endif()
    endforeach()
  endwhile()
  set(${out_var} ${edges} PARENT_SCOPE)
endfunction()

# FATAL_ERROR when `target` reaches any of the FORBIDDEN targets.
function(shardfit_forbid_links target)
  cmake_parse_arguments(ARG "" "" "FORBIDDEN" ${ARGN})
  if(NOT TARGET ${target})
    return()
  endif()
  shardfit_link_closure(${target} edges)
  set(reached "")
  foreach(edge IN LISTS edges)
    string(REPLACE ">" ";" pair "${edge}")
    list(GET pair 1 child)
    list(APPEND reached ${child})
  endforeach()
  list(REMOVE_DUPLICATES reached)
  file(WRITE ${CMAKE_BINARY_DIR}/link_rules/${target}.txt "${reached}\n")
  foreach(bad IN LISTS ARG_FORBIDDEN)
    if(bad IN_LIST reached)
      set(via "")
      foreach(edge IN LISTS edges)
        if(edge MATCHES ">${bad}$")
          list(APPEND via "${edge}")
        endif()
      endforeach()
      message(FATAL_ERROR "${target} links ${bad} (via ${via}): the executor depends on spec/ and models/, "
                          "not on the planner; move what it needs into spec/ or models/")
    endif()
  endforeach()
endfunction()
