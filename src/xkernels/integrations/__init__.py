"""Integrations with model libraries (each module registers xkernels where that library looks for kernels)."""
