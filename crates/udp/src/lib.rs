//! ferry-udp: being written (issue 5).
