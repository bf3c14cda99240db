# cmake -DCLOSURE=file -DFORBIDDEN=a,b -P check_link_closure.cmake: fails when
# the closure file (a ;-list of the targets a target links, transitively)
# names a forbidden target, or when it is missing (the rule never ran).
cmake_minimum_required(VERSION 3.18)  # IN_LIST
if(NOT EXISTS "${CLOSURE}")
  message(FATAL_ERROR "${CLOSURE} is missing: cmake/ShardfitLinkRules.cmake did not run")
endif()
file(READ "${CLOSURE}" closure)
string(STRIP "${closure}" closure)
string(REPLACE "," ";" forbidden "${FORBIDDEN}")
if(NOT "shardfit_spec" IN_LIST closure)
  message(FATAL_ERROR "the closure (${closure}) lacks shardfit_spec: is it the executor's?")
endif()
foreach(bad IN LISTS forbidden)
  if(bad IN_LIST closure)
    message(FATAL_ERROR "the executor links ${bad}: ${closure}")
  endif()
endforeach()
message(STATUS "the executor links ${closure}: none of ${FORBIDDEN}")
