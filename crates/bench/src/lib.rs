//! ferry-bench: being written (issue 4).
