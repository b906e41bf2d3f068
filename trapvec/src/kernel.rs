//! The kernel backend: ioctls to `/dev/trapvec` (served by `kmod/`), symbols from `/proc/kallsyms`.
