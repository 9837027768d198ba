"""The `xkernels` command: check, bench, inspect."""
