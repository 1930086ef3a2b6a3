//! `VulkanBackend` blobs: the VH00 header and the VK00 `vkgraph.VkGraph` flatbuffer.
