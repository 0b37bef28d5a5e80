# opgen.cmake: build a kernel_ops extension from an op spec inside any CMake project, or the C++
# runtime that runs opgen packages without Python.
#
#   list(APPEND CMAKE_MODULE_PATH "<output of: python -m opgen cmake-dir>")
#   include(opgen)                  # or: find_package(opgen REQUIRED PATHS "<that folder>")
#   opgen_add_extension(my_ops SPEC ${CMAKE_CURRENT_SOURCE_DIR}/my_ops.yaml MODULE _C)
#   opgen_add_runtime(opgen_runtime)                # opgen/package/package.h, for programs with no Python
#   target_link_libraries(my_app PRIVATE opgen_runtime)
#
# The generator runs as a build step: editing the spec (or opgen itself) regenerates the bindings,
# and only files whose bytes changed are recompiled. opgen_add_extension requires
# find_package(Python) first; opgen_add_runtime finds an interpreter itself (it runs the generator).

set(_OPGEN_ROOT "${CMAKE_CURRENT_LIST_DIR}/..")            # the opgen Python package
get_filename_component(_OPGEN_PYTHONPATH "${_OPGEN_ROOT}/.." ABSOLUTE)
if(EXISTS "${_OPGEN_ROOT}/csrc/opgen/bind/binding.h")      # installed: opgen/csrc
  set(_OPGEN_CSRC "${_OPGEN_ROOT}/csrc")
else()                                                     # source tree: <repo>/csrc
  get_filename_component(_OPGEN_CSRC "${_OPGEN_ROOT}/../csrc" ABSOLUTE)
endif()

# The hand-written sources, by room of csrc/opgen (docs/development.md). The runtime's rooms have no
# Python: they make the standalone runtime (opgen_add_runtime) and are part of every extension.
set(_OPGEN_RUNTIME_SOURCES kernels/kernels.cpp exec/executor.cpp exec/executor_parse.cpp exec/executor_print.cpp
    exec/thunk_registry.cpp package/package.cpp)
list(TRANSFORM _OPGEN_RUNTIME_SOURCES PREPEND "${_OPGEN_CSRC}/opgen/")
set(_OPGEN_PYTHON_SOURCES py/python_errors.cpp py/input_check.cpp py/ranged_check.cpp bind/binding.cpp bind/checks.cpp
    jit/jit_binding.cpp module/module.cpp module/executor_py.cpp module/executor_externs.cpp module/thunks_py.cpp)
list(TRANSFORM _OPGEN_PYTHON_SOURCES PREPEND "${_OPGEN_CSRC}/opgen/")

# Finds torch through the interpreter's torch.utils.cmake_prefix_path, and libtorch_python.
macro(opgen_find_torch)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.version.cuda or '')"
    OUTPUT_VARIABLE _opgen_torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _opgen_torch_rc)
  if(NOT _opgen_torch_rc EQUAL 0)
    message(FATAL_ERROR "opgen: cannot import torch with ${Python_EXECUTABLE}; install torch first "
                        "and build with --no-build-isolation")
  endif()
  string(REPLACE "\n" ";" _opgen_torch_info "${_opgen_torch_info}")
  list(GET _opgen_torch_info 0 _opgen_torch_prefix)
  list(LENGTH _opgen_torch_info _opgen_n)
  set(OPGEN_TORCH_CUDA "")
  if(_opgen_n GREATER 1)
    list(GET _opgen_torch_info 1 OPGEN_TORCH_CUDA)
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${_opgen_torch_prefix}")
  find_package(Torch REQUIRED)
  set(OPGEN_TORCH_VERSION "${Torch_VERSION}" CACHE INTERNAL "the torch version opgen_find_torch found")
  find_library(OPGEN_TORCH_PYTHON_LIBRARY torch_python PATHS "${TORCH_INSTALL_PREFIX}/lib" REQUIRED NO_DEFAULT_PATH)
endmacro()

# One C++ runtime in the process. Some toolchains link libstdc++ statically by default (the GPU machine's
# /opt/gcc g++ does: its extension carried about 3,000 of libstdc++'s symbols and no libstdc++.so.6 among
# its needed libraries). The extension then holds a second copy of the runtime beside the shared one torch
# loads, the process resolves some of its symbols to each, and formatting a number into an error message
# (an ostream inside TORCH_CHECK) crashed the process with a segmentation fault. Naming the shared library
# torch loads, ahead of the driver's own libstdc++, resolves every symbol there; where it is the one the
# toolchain links anyway, nothing changes. The library is the libstdc++ in the interpreter's maps once torch
# is imported (Linux; elsewhere none is found and the toolchain's choice stands).
function(_opgen_one_cxx_runtime target)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import torch; print(next((l.split()[-1] for l in open('/proc/self/maps') if '/libstdc++.so' in l), ''))"
    OUTPUT_VARIABLE libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(libstdcxx AND EXISTS "${libstdcxx}")
    target_link_libraries(${target} PRIVATE "${libstdcxx}")
    message(STATUS "opgen: ${target} links the C++ runtime torch loads, ${libstdcxx}")
  endif()
endfunction()

# Defines OPGEN_THUNK_ABI for <target>: "thunk.h:<first 16 hex digits of the SHA-256 of
# csrc/opgen/exec/thunk.h>,torch:<torch's CMake version>". A module's executor calls another module's
# thunks (its THUNKS capsule, exec::ThunkExport) only where the two are equal: thunk.h lays out all a
# thunk touches (Frame, Instr, ThunkEntry), torch the IValues and tensors in them.
function(_opgen_define_thunk_abi target)
  set(version "${Torch_VERSION}")                          # find_package(Torch), here or by the caller
  if(NOT version)
    set(version "${OPGEN_TORCH_VERSION}")                  # an earlier opgen_find_torch
  endif()
  if(NOT version)
    message(FATAL_ERROR "opgen: no torch version for ${target}'s thunk ABI (find_package(Torch) sets Torch_VERSION)")
  endif()
  set(header "${_OPGEN_CSRC}/opgen/exec/thunk.h")
  file(SHA256 "${header}" hash)
  string(SUBSTRING "${hash}" 0 16 hash)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${header}")  # an edit re-hashes it
  target_compile_definitions(${target} PRIVATE "OPGEN_THUNK_ABI=\"thunk.h:${hash},torch:${version}\"")
endfunction()

# opgen_add_extension(<target> SPEC <yaml> [MODULE <name>] [SHARDS <n>]
#                     [SOURCES <files...>] [INCLUDE_DIRS <dirs...>] [LIBRARIES <libs...>])
# Defines a Python extension target <target> whose module <name> (default _C) has `kernel_ops`, and
# `THUNKS`, its C++ executor's thunks, which opgen._C.register_thunks(prefix, THUNKS) lets another
# module's executor call (csrc/opgen/exec/thunk_registry.h).
# Your own kernels (a spec entry with `kernels: {cpu: mylib::f}` and `includes: [mylib/f.h]`, docs/spec.md):
#   SOURCES       your .cpp files (and .cu files: compiled as CUDA only where your project has enabled the
#                 CUDA language, project(... LANGUAGES CXX CUDA) or enable_language(CUDA); opgen passes them on)
#   INCLUDE_DIRS  folders the spec's `includes` are found in (a missing header fails the build with an
#                 #error naming the spec line)
#   LIBRARIES     targets or libraries to link (your kernels built as a library of their own, say)
function(opgen_add_extension target)
  cmake_parse_arguments(ARG "" "SPEC;MODULE;SHARDS" "SOURCES;INCLUDE_DIRS;LIBRARIES" ${ARGN})
  if(NOT ARG_SPEC)
    message(FATAL_ERROR "opgen_add_extension(${target}): SPEC <yaml> is required")
  endif()
  if(NOT ARG_MODULE)
    set(ARG_MODULE _C)
  endif()
  if(NOT ARG_SHARDS)
    set(ARG_SHARDS 4)
  endif()
  if(NOT TARGET torch)
    opgen_find_torch()
  endif()

  set(gen_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}_generated")
  math(EXPR last "${ARG_SHARDS} - 1")
  set(gen_cpp "${gen_dir}/module.cpp")
  foreach(i RANGE ${last})
    list(APPEND gen_cpp "${gen_dir}/kernel_ops_${i}.cpp" "${gen_dir}/thunks_${i}.cpp")  # thunks: the C++ executor's
  endforeach()
  list(APPEND gen_cpp "${gen_dir}/thunk_tables.cpp")
  file(GLOB generator_sources "${_OPGEN_ROOT}/*.py" "${_OPGEN_ROOT}/spec/*.py" "${_OPGEN_ROOT}/gen/*.py"
       "${_OPGEN_ROOT}/jit/__init__.py" "${_OPGEN_ROOT}/jit/expr.py" "${_OPGEN_ROOT}/templates/*.j2"
       "${_OPGEN_ROOT}/cmake/generate.py")
  add_custom_command(
    OUTPUT ${gen_cpp} "${gen_dir}/kernel_ops.pyi"
    COMMAND "${CMAKE_COMMAND}" -E env "PYTHONPATH=${_OPGEN_PYTHONPATH}"
            "${Python_EXECUTABLE}" "${_OPGEN_ROOT}/cmake/generate.py" gen --spec "${ARG_SPEC}" --out "${gen_dir}"
            --shards ${ARG_SHARDS} --module ${ARG_MODULE}
    DEPENDS "${ARG_SPEC}" ${generator_sources}
    COMMENT "opgen: generating kernel_ops bindings from ${ARG_SPEC}"
    VERBATIM)

  set(helpers ${_OPGEN_PYTHON_SOURCES} ${_OPGEN_RUNTIME_SOURCES})
  # Triton ops launch through jit_launcher.cpp in CUDA builds; jit_stub.cpp makes them raise otherwise.
  set(jit_impl "${_OPGEN_CSRC}/opgen/jit/jit_stub.cpp")
  if(OPGEN_TORCH_CUDA)
    list(APPEND helpers "${_OPGEN_CSRC}/opgen/graphs/cuda_graph.cpp"   # the CUDA-graph runner
                        "${_OPGEN_CSRC}/opgen/graphs/repoint.cpp")     # and its repointing of inputs
    set(jit_impl "${_OPGEN_CSRC}/opgen/jit/jit_launcher.cpp")          # the Triton kernel launcher
  endif()
  list(APPEND helpers "${jit_impl}")
  Python_add_library(${target} MODULE WITH_SOABI ${gen_cpp} ${helpers} ${ARG_SOURCES})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME ${ARG_MODULE} CXX_STANDARD 20
                        CXX_STANDARD_REQUIRED ON CXX_VISIBILITY_PRESET hidden)
  target_include_directories(${target} PRIVATE "${_OPGEN_CSRC}" ${TORCH_INCLUDE_DIRS} ${ARG_INCLUDE_DIRS})
  target_link_libraries(${target} PRIVATE ${TORCH_LIBRARIES} "${OPGEN_TORCH_PYTHON_LIBRARY}" ${ARG_LIBRARIES})
  _opgen_one_cxx_runtime(${target})
  if(OPGEN_TORCH_CUDA)
    target_compile_definitions(${target} PRIVATE OPGEN_WITH_CUDA)
  endif()
  _opgen_define_thunk_abi(${target})
  set_property(TARGET ${target} PROPERTY OPGEN_STUB "${gen_dir}/kernel_ops.pyi")
endfunction()

# opgen_add_runtime(<target> [SPEC <yaml>])
# A static library <target> with the C++ executor, its thunks and the package reader
# (csrc/opgen/package/package.h: `opgen::Package pkg(path); pkg.run(inputs)`), linked against libtorch only:
# a program linking it runs opgen packages with no Python in the process. Python runs at build time
# only, to generate the thunks from SPEC: by default the spec the installed opgen was built from, so
# that the thunks are the ones packages record (a package made for other thunks is refused at load,
# naming both digests). Torch: an existing `torch` target (find_package(Torch) with your Torch_DIR),
# else the one the interpreter imports.
function(opgen_add_runtime target)
  cmake_parse_arguments(ARG "" "SPEC" "" ${ARGN})
  if(NOT ARG_SPEC)
    if(EXISTS "${_OPGEN_ROOT}/ops.yaml")                  # installed: the spec the build used
      set(ARG_SPEC "${_OPGEN_ROOT}/ops.yaml")
    else()                                                # source tree
      get_filename_component(ARG_SPEC "${_OPGEN_ROOT}/../ops.yaml" ABSOLUTE)
    endif()
  endif()
  if(NOT Python_EXECUTABLE)
    find_package(Python 3.10 COMPONENTS Interpreter REQUIRED)
  endif()
  if(NOT TARGET torch)
    opgen_find_torch()
  endif()
  set(gen_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}_generated")
  set(gen_cpp "${gen_dir}/thunk_tables.cpp")
  foreach(i RANGE 3)                                      # the generator's default 4 shards
    list(APPEND gen_cpp "${gen_dir}/thunks_${i}.cpp")
  endforeach()
  file(GLOB generator_sources "${_OPGEN_ROOT}/*.py" "${_OPGEN_ROOT}/spec/*.py" "${_OPGEN_ROOT}/gen/*.py"
       "${_OPGEN_ROOT}/jit/__init__.py" "${_OPGEN_ROOT}/jit/expr.py" "${_OPGEN_ROOT}/templates/*.j2"
       "${_OPGEN_ROOT}/cmake/generate.py")
  add_custom_command(
    OUTPUT ${gen_cpp}
    COMMAND "${CMAKE_COMMAND}" -E env "PYTHONPATH=${_OPGEN_PYTHONPATH}"
            "${Python_EXECUTABLE}" "${_OPGEN_ROOT}/cmake/generate.py" gen --spec "${ARG_SPEC}" --out "${gen_dir}"
            --shards 4 --quiet
    DEPENDS "${ARG_SPEC}" ${generator_sources}
    COMMENT "opgen: generating the executor's thunks from ${ARG_SPEC}"
    VERBATIM)
  add_library(${target} STATIC ${gen_cpp} ${_OPGEN_RUNTIME_SOURCES})
  set_target_properties(${target} PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON
                        POSITION_INDEPENDENT_CODE ON)
  target_include_directories(${target} PUBLIC "${_OPGEN_CSRC}" ${TORCH_INCLUDE_DIRS})
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
  _opgen_one_cxx_runtime(${target})                       # passed on to the program that links it
  _opgen_define_thunk_abi(${target})
endfunction()
