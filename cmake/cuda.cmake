# SM90 kernels and the runtime that launches them. Included from the top-level CMakeLists.
#
# Kernels are built only for sm_90a (wgmma, setmaxnreg, TMA need the "a" target); nvcc needs no
# GPU to do so, so CI compiles every translation unit even though it cannot run them.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

# CMake 3.25 does not know that nvcc 13 speaks C++20 (and CUDA targets inherit CXX_STANDARD 20):
# teach it the flag.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# The -gencode form: "-arch=sm_90a" also runs a plain sm_90 pass that rejects wgmma.
set(CMAKE_CUDA_ARCHITECTURES OFF)
set(FLASHGDN_CUDA_FLAGS
  -gencode=arch=compute_90a,code=sm_90a
  -lineinfo
  --expt-relaxed-constexpr
  -Xptxas=--warn-on-spills
  -Xptxas=--warn-on-local-memory-usage)
if(FLASHGDN_PTXAS_VERBOSE)
  list(APPEND FLASHGDN_CUDA_FLAGS -Xptxas=-v)
endif()

file(GLOB FLASHGDN_KERNEL_SOURCES CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/src/kernels/sm90/*.cu
  ${PROJECT_SOURCE_DIR}/src/kernels/sm90/instantiations/*.cu)
file(GLOB FLASHGDN_RUNTIME_SOURCES CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/src/runtime/*.cu
  ${PROJECT_SOURCE_DIR}/src/runtime/*.cpp)
list(REMOVE_ITEM FLASHGDN_RUNTIME_SOURCES ${PROJECT_SOURCE_DIR}/src/runtime/no_kernels.cpp)

add_library(flashgdn STATIC ${FLASHGDN_RUNTIME_SOURCES} ${FLASHGDN_KERNEL_SOURCES})
target_include_directories(flashgdn PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(flashgdn PUBLIC flashgdn_host CUDA::cudart_static CUDA::cuda_driver)
target_compile_options(flashgdn PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:${FLASHGDN_CUDA_FLAGS}>
  $<$<COMPILE_LANGUAGE:CXX>:${FLASHGDN_WARNINGS}>)
target_compile_definitions(flashgdn PUBLIC FLASHGDN_WITH_KERNELS=1)
if(FLASHGDN_TIMELINE)
  target_compile_definitions(flashgdn PRIVATE FLASHGDN_TIMELINE=1)
endif()
set_target_properties(flashgdn PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)

# Inter-GPU CP over NCCL (include/flashgdn/distributed.h): built where nccl.h and libnccl are found
# (the CUDA toolkit's folders, NCCL_HOME, or the nvidia-nccl pip package's, given as NCCL_HOME).
# NCCL_HOME first, so that the header and the library come from one installation.
find_path(FLASHGDN_NCCL_INCLUDE nccl.h HINTS $ENV{NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS})
find_library(FLASHGDN_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS $ENV{NCCL_HOME}/lib ${CUDAToolkit_LIBRARY_DIR})
if(FLASHGDN_NCCL_INCLUDE AND FLASHGDN_NCCL_LIBRARY)
  message(STATUS "flashgdn: NCCL at ${FLASHGDN_NCCL_LIBRARY}: building flashgdn_distributed")
  add_library(flashgdn_distributed STATIC ${PROJECT_SOURCE_DIR}/src/distributed/distributed.cpp)
  target_include_directories(flashgdn_distributed PRIVATE ${PROJECT_SOURCE_DIR}/src PUBLIC ${FLASHGDN_NCCL_INCLUDE})
  target_link_libraries(flashgdn_distributed PUBLIC flashgdn ${FLASHGDN_NCCL_LIBRARY})
  target_compile_options(flashgdn_distributed PRIVATE ${FLASHGDN_WARNINGS})
else()
  message(STATUS "flashgdn: NCCL not found: flashgdn_distributed (the C++ inter-GPU entry point) not built")
endif()
