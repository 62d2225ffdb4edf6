//! CUDA C kernels for sm_60 (the Tesla P100), compiled at build time, and thin launch wrappers.
