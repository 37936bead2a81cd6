"""Runtime: compile generated C into cached shared libraries, load kernels, execute graphs."""
