//! The 30-byte `VH00` header at the start of a Vulkan blob (`vulkan_graph_serialize.py`,
//! `VulkanDelegateHeader`): where the VK00 flatbuffer and the raw constant region lie.

use super::{VulkanError, VulkanHeader};
use crate::fb;

/// Header bytes as written; the serializer pads it to 32 before the flatbuffer.
pub const HEADER_LEN: usize = 30;
const MAGIC: &[u8; 4] = b"VH00";

fn header_err<T>(what: impl Into<String>) -> Result<T, VulkanError> {
    Err(VulkanError::Header(what.into()))
}

fn read<T>(r: fb::Result<T>) -> Result<T, VulkanError> {
    r.map_err(|e| VulkanError::Header(e.to_string()))
}

/// Reads and checks the header against the blob's length.
pub fn parse(blob: &[u8]) -> Result<VulkanHeader, VulkanError> {
    if blob.len() < HEADER_LEN {
        return header_err(format!(
            "blob is {} bytes, shorter than the {HEADER_LEN}-byte VH00 header",
            blob.len()
        ));
    }
    // Bytes 0..4 are zero padding so the magic sits where a flatbuffer identifier would.
    let magic = &blob[4..8];
    if magic != MAGIC {
        return header_err(format!(
            "magic is {:?}, expected \"VH00\"",
            String::from_utf8_lossy(magic)
        ));
    }
    let len = read(fb::read_u16(blob, 8))? as usize;
    if len != HEADER_LEN {
        return header_err(format!(
            "declares a {len}-byte header, expected {HEADER_LEN}"
        ));
    }
    let fb_offset = read(fb::read_u32(blob, 10))? as u64;
    let fb_size = read(fb::read_u32(blob, 14))? as u64;
    let bytes_offset = read(fb::read_u32(blob, 18))? as u64;
    let bytes_size = read(fb::read_u64(blob, 22))?;
    let blob_len = blob.len() as u64;

    if fb_size == 0 {
        return header_err("flatbuffer size is 0");
    }
    // u32 + u32 cannot overflow u64.
    let fb_end = fb_offset + fb_size;
    if fb_offset < HEADER_LEN as u64 || fb_end > blob_len {
        return header_err(format!(
            "flatbuffer at {fb_offset}..{fb_end} is outside the header-to-end range \
             {HEADER_LEN}..{blob_len}"
        ));
    }
    // The upstream writer and runtime both require the constant region after the flatbuffer.
    if bytes_offset < fb_end {
        return header_err(format!(
            "constant region offset {bytes_offset} lies inside the flatbuffer (ends at {fb_end})"
        ));
    }
    match bytes_offset.checked_add(bytes_size) {
        Some(end) if end <= blob_len => {}
        _ => {
            return header_err(format!(
                "constant region of {bytes_size} bytes at {bytes_offset} runs past the end of \
                 the {blob_len}-byte blob"
            ))
        }
    }
    // Every value is now at most blob.len(), so it fits in usize.
    Ok(VulkanHeader {
        flatbuffer_offset: fb_offset as usize,
        flatbuffer_size: fb_size as usize,
        bytes_offset: bytes_offset as usize,
        bytes_size: bytes_size as usize,
    })
}

/// The header bytes for the given layout (test blobs only).
#[cfg(test)]
pub fn encode(h: &VulkanHeader) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    b[4..8].copy_from_slice(MAGIC);
    b[8..10].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
    b[10..14].copy_from_slice(&(h.flatbuffer_offset as u32).to_le_bytes());
    b[14..18].copy_from_slice(&(h.flatbuffer_size as u32).to_le_bytes());
    b[18..22].copy_from_slice(&(h.bytes_offset as u32).to_le_bytes());
    b[22..30].copy_from_slice(&(h.bytes_size as u64).to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(h: &VulkanHeader, total: usize) -> Vec<u8> {
        let mut b = vec![0u8; total];
        b[..HEADER_LEN].copy_from_slice(&encode(h));
        b
    }

    const GOOD: VulkanHeader = VulkanHeader {
        flatbuffer_offset: 32,
        flatbuffer_size: 100,
        bytes_offset: 144,
        bytes_size: 16,
    };

    fn msg(r: Result<VulkanHeader, VulkanError>) -> String {
        r.expect_err("header was accepted").to_string()
    }

    #[test]
    fn reads_the_layout_the_serializer_writes() {
        assert_eq!(parse(&blob(&GOOD, 160)).unwrap(), GOOD);
        // All-named-data blobs: empty constant region ending exactly at the blob's end.
        let h = VulkanHeader {
            bytes_offset: 160,
            bytes_size: 0,
            ..GOOD
        };
        assert_eq!(parse(&blob(&h, 160)).unwrap(), h);
    }

    #[test]
    fn rejects_short_blob_bad_magic_and_bad_length() {
        assert!(msg(parse(&[0u8; 29])).contains("shorter than the 30-byte"));
        let mut b = blob(&GOOD, 160);
        b[4..8].copy_from_slice(b"XH00");
        assert!(msg(parse(&b)).contains("\"XH00\", expected \"VH00\""));
        let mut b = blob(&GOOD, 160);
        b[8] = 32;
        assert!(msg(parse(&b)).contains("32-byte header"));
    }

    #[test]
    fn rejects_regions_outside_the_blob_or_overlapping() {
        type Edit = fn(&mut VulkanHeader);
        let cases: [(Edit, &str); 6] = [
            (|h| h.flatbuffer_size = 0, "size is 0"),
            (|h| h.flatbuffer_offset = 8, "outside"),
            (|h| h.flatbuffer_size = 200, "outside"),
            (|h| h.bytes_offset = 100, "inside the flatbuffer"),
            (|h| h.bytes_size = 17, "past the end"),
            (|h| h.bytes_size = usize::MAX, "past the end"),
        ];
        for (edit, want) in cases {
            let mut h = GOOD;
            edit(&mut h);
            let m = msg(parse(&blob(&h, 160)));
            assert!(m.contains(want), "{h:?}: {m}");
        }
    }
}
