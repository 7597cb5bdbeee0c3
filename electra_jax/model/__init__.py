"""ELECTRA's networks: kernels, layer layouts, sharding, the optimizer, weights as data."""
