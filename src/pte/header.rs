//! The `eh00` extended header that follows the flatbuffer identifier when a program has segments.

use super::{invalid, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendedHeader {
    pub length: u32,
    /// Size of the flatbuffer data including headers: bytes `[0, program_size)`.
    pub program_size: u64,
    /// File offset of the first segment.
    pub segment_base_offset: u64,
    /// Bytes from the segment base to the end of the last segment (0 in pre-1.0 files).
    pub segment_data_size: u64,
}

impl ExtendedHeader {
    /// Reads the header at byte 8, if its magic is there.
    pub fn parse(buf: &[u8]) -> Result<Option<Self>> {
        if buf.len() < 12 || &buf[8..12] != b"eh00" {
            return Ok(None);
        }
        let u32_at = |p: usize| {
            buf.get(p..p + 4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        };
        let u64_at = |p: usize| {
            buf.get(p..p + 8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        };
        let Some(length) = u32_at(12) else {
            return invalid("extended header is truncated");
        };
        // Version 0 headers are 24 bytes; 32 and up carry segment_data_size.
        if length < 24 {
            return invalid(format!(
                "extended header length {length} is below the minimum of 24"
            ));
        }
        let (Some(program_size), Some(segment_base_offset)) = (u64_at(16), u64_at(24)) else {
            return invalid("extended header is truncated");
        };
        let segment_data_size = if length >= 32 {
            match u64_at(32) {
                Some(v) => v,
                None => return invalid("extended header is truncated"),
            }
        } else {
            0
        };
        Ok(Some(ExtendedHeader {
            length,
            program_size,
            segment_base_offset,
            segment_data_size,
        }))
    }

    pub fn check(&self, file_len: usize) -> Result<()> {
        let len = file_len as u64;
        if self.program_size < 16 || self.program_size > len {
            return invalid(format!(
                "extended header says the program is {} bytes, but the file is {file_len}",
                self.program_size
            ));
        }
        if self.segment_base_offset != 0 && self.segment_base_offset < self.program_size {
            return invalid(format!(
                "segments start at {} inside the {}-byte program data",
                self.segment_base_offset, self.program_size
            ));
        }
        let end = self.segment_base_offset.checked_add(self.segment_data_size);
        if end.is_none_or(|e| e > len) {
            return invalid(format!(
                "file is truncated: segments need {} + {} bytes, the file has {file_len}",
                self.segment_base_offset, self.segment_data_size
            ));
        }
        Ok(())
    }
}
