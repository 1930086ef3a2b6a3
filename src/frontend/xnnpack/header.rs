//! The `XH00` header in front of every XNNPACK blob (`serialization/xnnpack_graph_serialize.py`
//! `XNNHeader`): where the XN01 flatbuffer and the inline constant data lie in the blob.

use super::{Result, XnnError};
use crate::fb::{read_u16, read_u32, read_u64};
use std::ops::Range;

pub const MAGIC: &[u8; 4] = b"XH00";
/// Bytes the header's fields occupy; the serializer writes exactly this length (then pads to 32).
pub const HEADER_LEN: usize = 30;

/// A validated `XNNHeader`: both ranges lie inside the blob and do not overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XnnHeader {
    /// The header's own length field (30 in every known export).
    pub length: u16,
    pub flatbuffer_offset: u32,
    pub flatbuffer_size: u32,
    pub constant_data_offset: u32,
    pub constant_data_size: u64,
}

impl XnnHeader {
    /// Reads and checks the header at the start of `blob`.
    pub fn parse(blob: &[u8]) -> Result<XnnHeader> {
        let header = |msg: String| XnnError::Header(msg);
        if blob.len() < HEADER_LEN {
            return Err(header(format!(
                "blob is {} bytes, shorter than the {HEADER_LEN}-byte XH00 header",
                blob.len()
            )));
        }
        // The magic sits at 4..8, where a bare flatbuffer keeps its identifier.
        if &blob[4..8] != MAGIC {
            return Err(header(format!(
                "bytes 4..8 are {:?}, expected \"XH00\" (a header-less flatbuffer blob is not supported)",
                String::from_utf8_lossy(&blob[4..8])
            )));
        }
        let fbe = |e: crate::fb::FbError| header(e.to_string());
        let h = XnnHeader {
            length: read_u16(blob, 8).map_err(fbe)?,
            flatbuffer_offset: read_u32(blob, 10).map_err(fbe)?,
            flatbuffer_size: read_u32(blob, 14).map_err(fbe)?,
            constant_data_offset: read_u32(blob, 18).map_err(fbe)?,
            constant_data_size: read_u64(blob, 22).map_err(fbe)?,
        };
        h.check(blob.len())?;
        Ok(h)
    }

    fn check(&self, blob_len: usize) -> Result<()> {
        let fail = |msg: String| Err(XnnError::Header(msg));
        if (self.length as usize) < HEADER_LEN {
            return fail(format!(
                "header length is {}, less than the {HEADER_LEN} bytes its fields need",
                self.length
            ));
        }
        if (self.flatbuffer_offset as u64) < self.length as u64 {
            return fail(format!(
                "flatbuffer offset {} lies inside the {}-byte header",
                self.flatbuffer_offset, self.length
            ));
        }
        if self.flatbuffer_size < 8 {
            return fail(format!(
                "flatbuffer size {} is too small for a root offset and identifier",
                self.flatbuffer_size
            ));
        }
        let fb_end = self.flatbuffer_offset as u64 + self.flatbuffer_size as u64;
        if fb_end > blob_len as u64 {
            return fail(format!(
                "flatbuffer {}..{fb_end} extends past the end of the {blob_len}-byte blob",
                self.flatbuffer_offset
            ));
        }
        // `XNNHeader.is_valid`: constant data follows the flatbuffer.
        if (self.constant_data_offset as u64) < fb_end {
            return fail(format!(
                "constant data offset {} lies inside the flatbuffer {}..{fb_end}",
                self.constant_data_offset, self.flatbuffer_offset
            ));
        }
        match (self.constant_data_offset as u64).checked_add(self.constant_data_size) {
            Some(end) if end <= blob_len as u64 => Ok(()),
            _ => fail(format!(
                "constant data of {} bytes at offset {} extends past the end of the {blob_len}-byte blob",
                self.constant_data_size, self.constant_data_offset
            )),
        }
    }

    /// Byte range of the flatbuffer within the blob.
    pub fn flatbuffer_range(&self) -> Range<usize> {
        let start = self.flatbuffer_offset as usize;
        start..start + self.flatbuffer_size as usize
    }

    /// Byte range of the inline constant data within the blob (empty in current exports, which
    /// keep every constant in named data).
    pub fn constant_data_range(&self) -> Range<usize> {
        let start = self.constant_data_offset as usize;
        // check() bounded the end by the blob length, so it fits in usize.
        start..start + self.constant_data_size as usize
    }
}
