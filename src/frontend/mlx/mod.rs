//! `MLXBackend` blobs: the MLX0 header and the `mlx_delegate.MLXGraph` flatbuffer.
