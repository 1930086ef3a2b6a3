//! `.ptd` external data files (`FT01` flatbuffer behind an `FH01` header): named blobs that
//! merge into a program's named-data map.

use super::{invalid, Blob, Bytes, Ctx, NamedData, Result};
use crate::fb::{read_u32, read_u64, Table};
use std::path::Path;
use std::sync::Arc;

pub struct DataFile {
    pub named: NamedData,
}

impl DataFile {
    pub fn open(path: &Path) -> Result<DataFile> {
        DataFile::parse(Bytes::map(path)?)
    }

    pub fn parse(bytes: Arc<Bytes>) -> Result<DataFile> {
        let buf: &[u8] = &bytes;
        if buf.len() < 48 || &buf[4..8] != b"FT01" || &buf[8..12] != b"FH01" {
            return invalid("not a .ptd file: expected \"FT01\" and an \"FH01\" header");
        }
        let rd = |p| read_u64(buf, p).ctx(|| ".ptd header".into());
        let hlen = read_u32(buf, 12).ctx(|| ".ptd header".into())?;
        if hlen < 40 {
            return invalid(format!(".ptd header length {hlen} is below 40"));
        }
        let (fb_off, fb_size, seg_base, seg_size) = (rd(16)?, rd(24)?, rd(32)?, rd(40)?);
        let len = buf.len() as u64;
        let fb_end = fb_off.checked_add(fb_size).filter(|&e| e <= len);
        let seg_end = seg_base.checked_add(seg_size).filter(|&e| e <= len);
        let (Some(fb_end), Some(_)) = (fb_end, seg_end) else {
            return invalid(format!(".ptd file is truncated ({len} bytes)"));
        };
        // The root offset at byte 0 is relative to the whole file; the flatbuffer occupies [0, fb_end).
        let root = Table::root(&buf[..fb_end as usize]).ctx(|| ".ptd flatbuffer".into())?;
        let mut segments = Vec::new();
        if let Some(segs) = root.tables(1).ctx(|| ".ptd segments".into())? {
            for (i, s) in segs.iter().enumerate() {
                let s = s.ctx(|| format!(".ptd segment {i}"))?;
                let off: u64 = s.scalar(0, 0).ctx(|| ".ptd segment".into())?;
                let size: u64 = s.scalar(1, 0).ctx(|| ".ptd segment".into())?;
                let start = seg_base.checked_add(off);
                match start.and_then(|s| s.checked_add(size)) {
                    Some(e) if e <= len => segments.push(start.unwrap() as usize..e as usize),
                    _ => {
                        return invalid(format!(
                            ".ptd segment {i} extends past the end of the file"
                        ))
                    }
                }
            }
        }
        let mut named = NamedData::default();
        if let Some(nd) = root.tables(2).ctx(|| ".ptd named_data".into())? {
            for (i, n) in nd.iter().enumerate() {
                let n = n.ctx(|| format!(".ptd named_data {i}"))?;
                let key = n.string(0).ctx(|| ".ptd key".into())?.unwrap_or("");
                let idx: u32 = n.scalar(1, 0).ctx(|| ".ptd segment index".into())?;
                let Some(r) = segments.get(idx as usize) else {
                    return invalid(format!(".ptd key `{key}` refers to missing segment {idx}"));
                };
                named.insert(key, Blob::new(bytes.clone(), r.clone())?)?;
            }
        }
        Ok(DataFile { named })
    }
}
