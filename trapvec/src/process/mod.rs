//! The process backend: the running process modifies its own code.
