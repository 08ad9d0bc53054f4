// Compiled with a plain C++ compiler and only include/ on the path: the public API needs no CUDA.
#include "flashgdn/flashgdn.h"
#include "flashgdn/reference.h"

int flashgdn_api_standalone_probe() {
  flashgdn::ForwardProblem problem;
  problem.in.shape.num_qk_heads = 1;
  return static_cast<int>(problem.in.shape.head_dim_k);
}
