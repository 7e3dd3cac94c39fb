//! The GPU backend. Placeholder until the CUDA issue lands: the crate builds with no CUDA present.
