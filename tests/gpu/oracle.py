"""Float64 oracle for the GPU tests: the package's flashgdn.bench.oracle (one source for the tests and
the benchmark's accuracy columns). It evaluates the chunked form of DESIGN §1 in float64
(backward_f64: its gradients by torch autograd); test_oracle_matches_reference and
test_oracle_backward_matches_reference check it against flashgdn's C++ float64 reference (itself
checked against the naive token recurrence to 1e-12 by the CPU tests), so the chain of trust ends
at the naive recurrence.
"""

from flashgdn.bench.oracle import CHUNK, backward_f64, forward_f64, l2norm, rel_l2  # noqa: F401
