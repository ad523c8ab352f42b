//! lagoon-cpu: the CPU backend.
