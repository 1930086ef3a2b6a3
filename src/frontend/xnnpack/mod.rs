//! `XnnpackBackend` blobs: the XH00 header and the XN01 `fb_xnnpack.XNNGraph` flatbuffer.
