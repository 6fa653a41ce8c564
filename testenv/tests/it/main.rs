//! testenv's integration tests, one binary: the local control plane behaves like a real cluster where our
//! controllers depend on it, and test processes each get one of their own.

mod controlplane;
mod isolation;
