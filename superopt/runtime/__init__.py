"""Runtime: compile generated C into cached shared libraries, load kernels, execute graphs."""

from superopt.ir.externs.control_flow import install_body_runner
from superopt.runtime.subgraph import run_body

install_body_runner(run_body)  # control-flow bodies (If, Loop, Scan) run compiled
