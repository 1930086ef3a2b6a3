//! A small, fully bounds-checked FlatBuffers reader.
//!
//! Every `.pte`, `.ptd` and delegate-blob parser in Pteria reads through this module. Nothing here
//! trusts the input: each offset, vtable, vector length and string is checked against the buffer
//! before use, so a hostile file yields an `FbError` and never a panic or an unchecked allocation.
//! Field slots are numbered in schema declaration order; a union field takes two slots
//! (`<name>_type` first, then the value).

use std::fmt;

/// A FlatBuffers decoding failure: where in the buffer, and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FbError {
    pub at: usize,
    pub what: String,
}

impl fmt::Display for FbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.what, self.at)
    }
}

impl std::error::Error for FbError {}

pub type Result<T> = std::result::Result<T, FbError>;

fn err<T>(at: usize, what: impl Into<String>) -> Result<T> {
    Err(FbError {
        at,
        what: what.into(),
    })
}

fn read_array<const N: usize>(buf: &[u8], pos: usize) -> Result<[u8; N]> {
    match pos.checked_add(N).and_then(|end| buf.get(pos..end)) {
        Some(s) => {
            let mut a = [0u8; N];
            a.copy_from_slice(s);
            Ok(a)
        }
        None => err(
            pos,
            format!("{N}-byte read past the end of a {}-byte buffer", buf.len()),
        ),
    }
}

pub fn read_u8(buf: &[u8], pos: usize) -> Result<u8> {
    Ok(read_array::<1>(buf, pos)?[0])
}
pub fn read_u16(buf: &[u8], pos: usize) -> Result<u16> {
    Ok(u16::from_le_bytes(read_array(buf, pos)?))
}
pub fn read_u32(buf: &[u8], pos: usize) -> Result<u32> {
    Ok(u32::from_le_bytes(read_array(buf, pos)?))
}
pub fn read_i32(buf: &[u8], pos: usize) -> Result<i32> {
    Ok(i32::from_le_bytes(read_array(buf, pos)?))
}
pub fn read_u64(buf: &[u8], pos: usize) -> Result<u64> {
    Ok(u64::from_le_bytes(read_array(buf, pos)?))
}

/// Follows a `uoffset_t` stored at `pos` (relative to `pos` itself).
fn follow(buf: &[u8], pos: usize) -> Result<usize> {
    let off = read_u32(buf, pos)? as usize;
    match pos.checked_add(off) {
        Some(t) if t < buf.len() => Ok(t),
        _ => err(pos, "offset points outside the buffer"),
    }
}

/// A scalar that can live in a FlatBuffers table or vector.
pub trait Scalar: Copy + Default {
    const SIZE: usize;
    fn read(buf: &[u8], pos: usize) -> Result<Self>;
}

macro_rules! scalar {
    ($t:ty, $n:expr) => {
        impl Scalar for $t {
            const SIZE: usize = $n;
            fn read(buf: &[u8], pos: usize) -> Result<Self> {
                Ok(<$t>::from_le_bytes(read_array(buf, pos)?))
            }
        }
    };
}
scalar!(u8, 1);
scalar!(i8, 1);
scalar!(u16, 2);
scalar!(i16, 2);
scalar!(u32, 4);
scalar!(i32, 4);
scalar!(u64, 8);
scalar!(i64, 8);
scalar!(f32, 4);
scalar!(f64, 8);

impl Scalar for bool {
    const SIZE: usize = 1;
    fn read(buf: &[u8], pos: usize) -> Result<Self> {
        Ok(read_u8(buf, pos)? != 0)
    }
}

/// A table inside a FlatBuffer.
#[derive(Clone, Copy)]
pub struct Table<'a> {
    buf: &'a [u8],
    pos: usize,
    vtable: usize,
    vtable_len: usize,
    table_len: usize,
}

impl<'a> Table<'a> {
    /// The root table of a buffer that starts with a root `uoffset_t`.
    pub fn root(buf: &'a [u8]) -> Result<Self> {
        let pos = follow(buf, 0)?;
        Self::at(buf, pos)
    }

    /// The root table, after checking the 4-byte file identifier at bytes 4..8.
    pub fn root_with_identifier(buf: &'a [u8], ident: &[u8; 4]) -> Result<Self> {
        let got = read_array::<4>(buf, 4)?;
        if &got != ident {
            return err(
                4,
                format!(
                    "file identifier is {:?}, expected {:?}",
                    String::from_utf8_lossy(&got),
                    String::from_utf8_lossy(ident)
                ),
            );
        }
        Self::root(buf)
    }

    pub fn at(buf: &'a [u8], pos: usize) -> Result<Self> {
        let soff = read_i32(buf, pos)? as i64;
        let vtable = pos as i64 - soff;
        if vtable < 0 || vtable as usize >= buf.len() {
            return err(pos, "table's vtable lies outside the buffer");
        }
        let vtable = vtable as usize;
        let vtable_len = read_u16(buf, vtable)? as usize;
        let table_len = read_u16(buf, vtable + 2)? as usize;
        if vtable_len < 4 || vtable_len % 2 != 0 || vtable + vtable_len > buf.len() {
            return err(vtable, "malformed vtable");
        }
        if table_len < 4 || pos + table_len > buf.len() {
            return err(pos, "table extends past the end of the buffer");
        }
        Ok(Table {
            buf,
            pos,
            vtable,
            vtable_len,
            table_len,
        })
    }

    pub fn buf(&self) -> &'a [u8] {
        self.buf
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Absolute position of a field of `size` bytes, or None when absent.
    fn field(&self, slot: usize, size: usize) -> Result<Option<usize>> {
        let entry = 4 + 2 * slot;
        if entry + 2 > self.vtable_len {
            return Ok(None);
        }
        let off = read_u16(self.buf, self.vtable + entry)? as usize;
        if off == 0 {
            return Ok(None);
        }
        if off + size > self.table_len {
            return err(self.pos, format!("field {slot} lies outside its table"));
        }
        Ok(Some(self.pos + off))
    }

    pub fn has(&self, slot: usize) -> bool {
        matches!(self.field(slot, 1), Ok(Some(_)))
    }

    pub fn scalar<T: Scalar>(&self, slot: usize, default: T) -> Result<T> {
        match self.field(slot, T::SIZE)? {
            Some(p) => T::read(self.buf, p),
            None => Ok(default),
        }
    }

    fn offset_field(&self, slot: usize) -> Result<Option<usize>> {
        match self.field(slot, 4)? {
            Some(p) => Ok(Some(follow(self.buf, p)?)),
            None => Ok(None),
        }
    }

    pub fn table(&self, slot: usize) -> Result<Option<Table<'a>>> {
        match self.offset_field(slot)? {
            Some(p) => Ok(Some(Table::at(self.buf, p)?)),
            None => Ok(None),
        }
    }

    pub fn string(&self, slot: usize) -> Result<Option<&'a str>> {
        match self.offset_field(slot)? {
            Some(p) => Ok(Some(read_string(self.buf, p)?)),
            None => Ok(None),
        }
    }

    /// A vector of bytes, borrowed from the buffer (zero-copy).
    pub fn bytes(&self, slot: usize) -> Result<Option<&'a [u8]>> {
        Ok(self.vector::<u8>(slot)?.map(|v| v.as_bytes()))
    }

    /// Byte offset (within the buffer) of a byte vector's first element.
    pub fn bytes_pos(&self, slot: usize) -> Result<Option<(usize, usize)>> {
        Ok(self.vector::<u8>(slot)?.map(|v| (v.start, v.len)))
    }

    pub fn vector<T: Scalar>(&self, slot: usize) -> Result<Option<Vector<'a, T>>> {
        match self.offset_field(slot)? {
            Some(p) => Ok(Some(Vector::at(self.buf, p, T::SIZE)?)),
            None => Ok(None),
        }
    }

    /// A vector of scalars, copied out (empty when absent).
    pub fn vec_of<T: Scalar>(&self, slot: usize) -> Result<Vec<T>> {
        match self.vector::<T>(slot)? {
            Some(v) => v.to_vec(),
            None => Ok(Vec::new()),
        }
    }

    pub fn tables(&self, slot: usize) -> Result<Option<Tables<'a>>> {
        match self.offset_field(slot)? {
            Some(p) => {
                let v = Vector::<u32>::at(self.buf, p, 4)?;
                Ok(Some(Tables {
                    buf: self.buf,
                    start: v.start,
                    len: v.len,
                }))
            }
            None => Ok(None),
        }
    }

    pub fn strings(&self, slot: usize) -> Result<Vec<&'a str>> {
        match self.tables(slot)? {
            Some(t) => (0..t.len())
                .map(|i| read_string(self.buf, follow(self.buf, t.start + 4 * i)?))
                .collect(),
            None => Ok(Vec::new()),
        }
    }

    /// Inline struct bytes of a known size.
    pub fn struct_bytes(&self, slot: usize, size: usize) -> Result<Option<&'a [u8]>> {
        match self.field(slot, size)? {
            Some(p) => Ok(Some(&self.buf[p..p + size])),
            None => Ok(None),
        }
    }

    /// A union's (type tag, value table) pair; the tag lives at `slot`, the value at `slot + 1`.
    pub fn union(&self, slot: usize) -> Result<Option<(u8, Table<'a>)>> {
        let tag: u8 = self.scalar(slot, 0)?;
        if tag == 0 {
            return Ok(None);
        }
        match self.table(slot + 1)? {
            Some(t) => Ok(Some((tag, t))),
            None => err(self.pos, format!("union has type tag {tag} but no value")),
        }
    }
}

fn read_string(buf: &[u8], pos: usize) -> Result<&str> {
    let len = read_u32(buf, pos)? as usize;
    let start = pos + 4;
    let bytes = match start.checked_add(len).and_then(|e| buf.get(start..e)) {
        Some(b) => b,
        None => return err(pos, "string extends past the end of the buffer"),
    };
    std::str::from_utf8(bytes).or_else(|_| err(pos, "string is not valid UTF-8"))
}

/// A vector of fixed-size elements (scalars or inline structs).
#[derive(Clone, Copy)]
pub struct Vector<'a, T> {
    buf: &'a [u8],
    start: usize,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<'a, T: Scalar> Vector<'a, T> {
    fn at(buf: &'a [u8], pos: usize, elem: usize) -> Result<Self> {
        let len = read_u32(buf, pos)? as usize;
        let start = pos + 4;
        match len.checked_mul(elem).and_then(|n| start.checked_add(n)) {
            Some(end) if end <= buf.len() => Ok(Vector {
                buf,
                start,
                len,
                _t: std::marker::PhantomData,
            }),
            _ => err(
                pos,
                format!("vector of {len} elements extends past the end of the buffer"),
            ),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, i: usize) -> Result<T> {
        if i >= self.len {
            return err(
                self.start,
                format!("index {i} out of a vector of {}", self.len),
            );
        }
        T::read(self.buf, self.start + i * T::SIZE)
    }

    pub fn to_vec(&self) -> Result<Vec<T>> {
        (0..self.len).map(|i| self.get(i)).collect()
    }

    pub fn as_bytes(&self) -> &'a [u8] {
        &self.buf[self.start..self.start + self.len * T::SIZE]
    }
}

/// A vector of tables.
#[derive(Clone, Copy)]
pub struct Tables<'a> {
    buf: &'a [u8],
    start: usize,
    len: usize,
}

impl<'a> Tables<'a> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, i: usize) -> Result<Table<'a>> {
        if i >= self.len {
            return err(
                self.start,
                format!("index {i} out of a vector of {}", self.len),
            );
        }
        Table::at(self.buf, follow(self.buf, self.start + 4 * i)?)
    }

    pub fn iter(&self) -> impl Iterator<Item = Result<Table<'a>>> + '_ {
        (0..self.len).map(move |i| self.get(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-assembled buffer: root -> table { a: u32 = 7 (slot 0), s: string "hi" (slot 1) }.
    fn sample() -> Vec<u8> {
        let mut b = vec![0u8; 64];
        // root offset at 0 -> table at 16
        b[0..4].copy_from_slice(&16u32.to_le_bytes());
        // vtable at 8: len 8, table len 12, slot0 at +4, slot1 at +8
        b[8..10].copy_from_slice(&8u16.to_le_bytes());
        b[10..12].copy_from_slice(&12u16.to_le_bytes());
        b[12..14].copy_from_slice(&4u16.to_le_bytes());
        b[14..16].copy_from_slice(&8u16.to_le_bytes());
        // table at 16: soffset = 16 - 8 = 8
        b[16..20].copy_from_slice(&8i32.to_le_bytes());
        b[20..24].copy_from_slice(&7u32.to_le_bytes());
        // string offset at 24 -> 32
        b[24..28].copy_from_slice(&8u32.to_le_bytes());
        b[32..36].copy_from_slice(&2u32.to_le_bytes());
        b[36..38].copy_from_slice(b"hi");
        b
    }

    #[test]
    fn reads_scalars_and_strings_with_defaults_for_absent_slots() {
        let b = sample();
        let t = Table::root(&b).unwrap();
        assert_eq!(t.scalar::<u32>(0, 0).unwrap(), 7);
        assert_eq!(t.string(1).unwrap(), Some("hi"));
        assert_eq!(t.scalar::<u32>(5, 42).unwrap(), 42);
    }

    #[test]
    fn rejects_out_of_bounds_string_and_every_truncation() {
        let mut b = sample();
        b[32..36].copy_from_slice(&1000u32.to_le_bytes());
        let t = Table::root(&b).unwrap();
        assert!(t.string(1).is_err());
        let good = sample();
        for n in 0..38 {
            let cut = &good[..n];
            let r = Table::root(cut).and_then(|t| t.string(1).map(|_| ()));
            assert!(r.is_err(), "truncation to {n} bytes was accepted");
        }
    }
}
