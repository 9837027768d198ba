"""The seeds' benchmark method: correctness first, random inputs, rotation, warm-up, CUDA events, peers in-run."""
