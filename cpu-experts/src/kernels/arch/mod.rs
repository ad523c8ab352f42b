//! Per-architecture kernels. Each submodule hands back a complete [`super::Table`] only
//! after a runtime feature check.

pub(crate) mod x86_64;
