# find_package(opgen REQUIRED PATHS "<output of: python -m opgen cmake-dir>"): opgen.cmake's functions,
# opgen_add_extension() and opgen_add_runtime() (see there).
include("${CMAKE_CURRENT_LIST_DIR}/opgen.cmake")
