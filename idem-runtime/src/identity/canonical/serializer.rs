//! Canonical JSON straight from a typed value, without building a `serde_json::Value`.
//!
//! A write's identity is the canonical JSON of its *typed* arguments, re-serialized (so field
//! order, whitespace and ignored fields never split one operation into two). Going through
//! `serde_json::to_value` first would allocate a tree on every call, replays included, only
//! to walk it once and drop it. This serializer writes the canonical bytes in one pass:
//! objects are written in the order serde hands us their entries and, when that order is not
//! already sorted (struct fields in declaration order, a `HashMap`), their entries are
//! reordered in place at the object's end.
//!
//! It must give exactly the bytes of `write_canonical(&to_value(x))`. Anything where that is
//! not obvious (floats, 128-bit integers, serde_json's private magic types, map keys that are
//! neither strings nor integers, duplicate keys), and any error at all, makes [`to_canonical`]
//! return `None`, and the caller takes the `to_value` path instead: the shortcut covers the common shapes, the reference
//! covers everything.

use std::cell::Cell;
use std::fmt;
use std::io::Write as _;

use serde::ser::{self, Serialize};

use super::{write_canonical, write_string};

/// Why the one-pass serializer stopped: a shape it leaves to the `to_value` reference path, or
/// an error of the value's own `Serialize`.
///
/// Creating one marks the current serialization as failed (see [`FAILED`]): user code may
/// wrap, swallow or ignore the error and carry on, and bytes written around a swallowed
/// error are not to be trusted. Any error at all sends the call down the reference path,
/// which then decides (and words any error) exactly as before this writer existed.
#[derive(Debug)]
pub(crate) struct Error(String);

impl Error {
    fn fallback() -> Self {
        mark_failed();
        Error("not handled by the one-pass canonical serializer".to_owned())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        mark_failed();
        Error(msg.to_string())
    }
}

type Result<T> = std::result::Result<T, Error>;

thread_local! {
    /// Set when any [`Error`] is created during the current serialization on this thread.
    static FAILED: Cell<bool> = const { Cell::new(false) };
}

fn mark_failed() {
    // During thread teardown the flag may be gone; `to_canonical` then never started.
    let _ = FAILED.try_with(|f| f.set(true));
}

/// What [`to_canonical`] wrote.
pub(crate) struct Written {
    /// The canonical bytes of the value.
    pub(crate) bytes: Vec<u8>,
    /// The canonical bytes of the selected key fields.
    pub(crate) key_fields: KeyFields,
}

/// The `key(…)` selection of a value.
pub(crate) enum KeyFields {
    /// No fields were named.
    NotAsked,
    /// Fields were named, but the value is not an object.
    NotAnObject,
    /// Canonical JSON of `{field: value}` for the named fields.
    Selected(Vec<u8>),
}

/// The canonical bytes of `value`, and of its top-level object's `key_fields`; `None` when
/// the reference path (`to_value` + [`write_canonical`]) must decide instead.
pub(crate) fn to_canonical<T: Serialize + ?Sized, S: AsRef<str>>(
    value: &T,
    key_fields: &[S],
) -> Option<Written> {
    // Saved and restored, so an `identify` nested inside a `Serialize` impl neither clears nor
    // inherits the outer call's failure. Unreachable thread-locals (thread teardown): take the
    // reference path.
    let outer = FAILED.try_with(|f| f.replace(false)).ok()?;
    // The entry list and the reorder buffer are scratch space: reuse this thread's, so a
    // call allocates only the output it keeps.
    let (entries, scratch) = SCRATCH
        .try_with(Cell::take)
        .ok()
        .flatten()
        .unwrap_or_default();
    let mut ser = Canonicalizer {
        out: Vec::with_capacity(128),
        entries,
        scratch,
        depth: 0,
        capture_top: !key_fields.is_empty(),
        top: None,
    };
    let written = value.serialize(&mut ser);
    let failed = FAILED.try_with(|f| f.replace(outer)).unwrap_or(true);
    let Canonicalizer {
        out,
        mut entries,
        mut scratch,
        top,
        depth,
        ..
    } = ser;
    // Kept only while small: one huge call must not pin its buffers to the thread forever.
    if scratch.capacity() <= 64 * 1024 && entries.capacity() <= 4096 {
        entries.clear();
        scratch.clear();
        let _ = SCRATCH.try_with(|cell| cell.set(Some((entries, scratch))));
    }
    if failed || written.is_err() || depth != 0 {
        return None;
    }
    let key_fields = match (key_fields.is_empty(), &top) {
        (true, _) => KeyFields::NotAsked,
        (false, None) => KeyFields::NotAnObject,
        (false, Some(top)) => KeyFields::Selected(top.select(&out, key_fields)),
    };
    Some(Written {
        bytes: out,
        key_fields,
    })
}

thread_local! {
    static SCRATCH: Cell<Option<(Vec<Entry>, Vec<u8>)>> = const { Cell::new(None) };
}

/// An object key, as it sorts: by its raw UTF-8 bytes (not its escaped JSON form).
#[derive(Clone, Copy)]
enum KeyText {
    /// A struct field or variant name.
    Static(&'static str),
    /// Bytes `out[start..end]`: a key written without any escape, so its raw and written
    /// bytes agree.
    Written(usize, usize),
    /// A key that needed escaping: its raw text is `owned[index]`.
    Escaped(usize),
}

/// One written entry of the object being built: `out[start..end]` is `"key":value`.
#[derive(Clone, Copy)]
struct Entry {
    key: KeyText,
    start: usize,
    value_start: usize,
    end: usize,
}

/// The top-level object's entries, with their final positions, for `key(…)` selection.
struct TopObject {
    entries: Vec<(Vec<u8>, std::ops::Range<usize>)>,
}

impl TopObject {
    /// Canonical JSON of `{field: value}` for each named field (absent reads as null, as it
    /// does for a skipped `None`), fields sorted and deduplicated like any object's keys.
    fn select<S: AsRef<str>>(&self, out: &[u8], fields: &[S]) -> Vec<u8> {
        let mut names: Vec<&str> = fields.iter().map(AsRef::as_ref).collect();
        names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        names.dedup();
        let mut selected = Vec::with_capacity(64);
        selected.push(b'{');
        for (i, name) in names.into_iter().enumerate() {
            if i > 0 {
                selected.push(b',');
            }
            write_string(name, &mut selected);
            selected.push(b':');
            match self.entries.iter().find(|(k, _)| k == name.as_bytes()) {
                Some((_, range)) => selected.extend_from_slice(&out[range.clone()]),
                None => selected.extend_from_slice(b"null"),
            }
        }
        selected.push(b'}');
        selected
    }
}

/// Objects of up to this many entries are sorted by [`insertion_sort`].
const SMALL_OBJECT: usize = 16;

/// Sorts a small object's entries by `key`, comparing each entry only with its neighbours
/// as it moves into place: an object already in order costs one comparison per entry, and
/// a struct's few fields a handful. Every adjacent pair of the result is compared on the
/// way (an entry stops next to the one it is not less than, and anything later inserted
/// between two entries is compared with both), so duplicates are caught here too.
///
/// `None` on a duplicate key; otherwise whether any entry moved.
fn insertion_sort<'k>(entries: &mut [Entry], key: impl Fn(&Entry) -> &'k [u8]) -> Option<bool> {
    let mut moved = false;
    for i in 1..entries.len() {
        let mut j = i;
        while j > 0 {
            match key(&entries[j - 1]).cmp(key(&entries[j])) {
                std::cmp::Ordering::Less => break,
                std::cmp::Ordering::Equal => return None,
                std::cmp::Ordering::Greater => {
                    entries.swap(j - 1, j);
                    moved = true;
                    j -= 1;
                }
            }
        }
    }
    Some(moved)
}

struct Canonicalizer {
    out: Vec<u8>,
    /// Entries of every object still open, innermost last.
    entries: Vec<Entry>,
    /// Raw text of keys that needed escaping, and the buffer objects are reordered through.
    scratch: Vec<u8>,
    depth: usize,
    /// Keep the top-level object's entries (only `key(…)` selection needs them).
    capture_top: bool,
    top: Option<TopObject>,
}

impl Canonicalizer {
    fn key_bytes<'a>(out: &'a [u8], escaped: &'a [String], key: KeyText) -> &'a [u8] {
        match key {
            KeyText::Static(s) => s.as_bytes(),
            KeyText::Written(start, end) => &out[start..end],
            KeyText::Escaped(i) => escaped[i].as_bytes(),
        }
    }

    fn begin_object(&mut self) -> Object {
        self.out.push(b'{');
        self.depth += 1;
        Object {
            base: self.entries.len(),
            content_start: self.out.len(),
            escaped: Vec::new(),
            pending: None,
        }
    }

    /// Writes a key that is a `&str` and starts its entry.
    fn write_key(&mut self, object: &mut Object, key: &str) -> (KeyText, usize) {
        let start = self.separate(object);
        let before = self.out.len();
        write_string(key, &mut self.out);
        let text = if self.out.len() == before + key.len() + 2 {
            KeyText::Written(before + 1, before + 1 + key.len())
        } else {
            object.escaped.push(key.to_owned());
            KeyText::Escaped(object.escaped.len() - 1)
        };
        self.out.push(b':');
        (text, start)
    }

    /// Writes the comma before an entry (if it is not the first) and returns where the entry
    /// starts.
    fn separate(&mut self, object: &Object) -> usize {
        if self.entries.len() > object.base {
            self.out.push(b',');
        }
        self.out.len()
    }

    fn push_entry(&mut self, key: KeyText, start: usize, value_start: usize) {
        let end = self.out.len();
        self.entries.push(Entry {
            key,
            start,
            value_start,
            end,
        });
    }

    fn field<T: Serialize + ?Sized>(
        &mut self,
        object: &mut Object,
        key: &'static str,
        value: &T,
    ) -> Result<()> {
        let start = self.separate(object);
        write_string(key, &mut self.out);
        self.out.push(b':');
        let value_start = self.out.len();
        value.serialize(&mut *self)?;
        self.push_entry(KeyText::Static(key), start, value_start);
        Ok(())
    }

    fn end_object(&mut self, object: Object) -> Result<()> {
        let Object {
            base,
            content_start,
            escaped,
            ..
        } = object;
        let out = &self.out;
        let entries = &mut self.entries[base..];
        let key = |e: &Entry| Self::key_bytes(out, &escaped, e.key);
        let moved = if entries.len() <= SMALL_OBJECT {
            insertion_sort(entries, key)
        } else {
            let in_order = entries.windows(2).all(|w| key(&w[0]) < key(&w[1]));
            if !in_order {
                entries.sort_by(|a, b| key(a).cmp(key(b)));
            }
            Some(!in_order).filter(|_| entries.windows(2).all(|w| key(&w[0]) != key(&w[1])))
        };
        let Some(moved) = moved else {
            // Duplicate keys: `to_value` keeps the last one written. Leave that to it.
            return Err(Error::fallback());
        };
        if moved {
            // Rewrite the object's content in key order, through the scratch buffer.
            self.scratch.clear();
            for (i, e) in entries.iter_mut().enumerate() {
                if i > 0 {
                    self.scratch.push(b',');
                }
                let shift = content_start + self.scratch.len();
                self.scratch.extend_from_slice(&self.out[e.start..e.end]);
                // Entries now point at their new place (after the copy back below).
                let (old_start, len) = (e.start, e.end - e.start);
                if let KeyText::Written(ks, ke) = &mut e.key {
                    *ks = *ks - old_start + shift;
                    *ke = *ke - old_start + shift;
                }
                e.value_start = e.value_start - old_start + shift;
                e.start = shift;
                e.end = shift + len;
            }
            self.out.truncate(content_start);
            self.out.extend_from_slice(&self.scratch);
        }
        self.out.push(b'}');
        self.depth -= 1;
        if self.depth == 0 && self.capture_top {
            let out = &self.out;
            self.top = Some(TopObject {
                entries: self.entries[base..]
                    .iter()
                    .map(|e| {
                        (
                            Self::key_bytes(out, &escaped, e.key).to_vec(),
                            e.value_start..e.end,
                        )
                    })
                    .collect(),
            });
        }
        self.entries.truncate(base);
        Ok(())
    }

    fn begin_array(&mut self) {
        self.out.push(b'[');
        self.depth += 1;
    }

    fn element<T: Serialize + ?Sized>(&mut self, array: &mut Array, value: &T) -> Result<()> {
        if !array.first {
            self.out.push(b',');
        }
        array.first = false;
        value.serialize(self)
    }

    fn end_array(&mut self) {
        self.out.push(b']');
        self.depth -= 1;
    }

    /// Writes a scalar the way `to_value` + `write_canonical` would, by doing exactly that:
    /// for the few types whose JSON form has subtleties (floats, 128-bit integers).
    fn via_value<T: Serialize>(&mut self, v: T) -> Result<()> {
        let value = serde_json::to_value(v).map_err(ser::Error::custom)?;
        write_canonical(&value, &mut self.out);
        Ok(())
    }

    fn integer(&mut self, n: impl fmt::Display) -> Result<()> {
        // `Display` of an integer is exactly serde_json's (itoa's) digits.
        write!(self.out, "{n}").expect("writing to a Vec cannot fail");
        Ok(())
    }

    /// `{"variant": …}` around whatever `inner` writes.
    fn variant_object(
        &mut self,
        variant: &'static str,
        inner: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<Object> {
        let mut object = self.begin_object();
        let start = self.separate(&object);
        write_string(variant, &mut self.out);
        self.out.push(b':');
        let value_start = self.out.len();
        inner(self)?;
        object.pending = Some((KeyText::Static(variant), start, value_start));
        Ok(object)
    }

    /// Closes an object opened by [`Canonicalizer::variant_object`].
    fn end_variant_object(&mut self, mut object: Object) -> Result<()> {
        if let Some((key, start, value_start)) = object.pending.take() {
            self.push_entry(key, start, value_start);
        }
        self.end_object(object)
    }
}

/// An object being written.
struct Object {
    base: usize,
    content_start: usize,
    /// Raw text of this object's keys that needed escaping ([`KeyText::Escaped`]).
    escaped: Vec<String>,
    /// A map key written by `serialize_key`, or a variant name, waiting for its value.
    pending: Option<(KeyText, usize, usize)>,
}

struct Array {
    first: bool,
}

/// What the serializer hands back for compound values.
enum Compound<'a> {
    Array(&'a mut Canonicalizer, Array),
    Object(&'a mut Canonicalizer, Object),
    /// `{"variant": [ … ]}`.
    TupleVariant(&'a mut Canonicalizer, Object, Array),
    /// `{"variant": { … }}`.
    StructVariant(&'a mut Canonicalizer, Object, Object),
}

fn is_serde_json_magic(name: &str) -> bool {
    // `RawValue` and arbitrary-precision `Number` serialize as structs of these names;
    // `to_value` gives them their meaning.
    name.starts_with("$serde_json::private::")
}

impl<'a> ser::Serializer for &'a mut Canonicalizer {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn serialize_bool(self, v: bool) -> Result<()> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<()> {
        self.integer(v)
    }
    fn serialize_i16(self, v: i16) -> Result<()> {
        self.integer(v)
    }
    fn serialize_i32(self, v: i32) -> Result<()> {
        self.integer(v)
    }
    fn serialize_i64(self, v: i64) -> Result<()> {
        self.integer(v)
    }
    fn serialize_i128(self, v: i128) -> Result<()> {
        self.via_value(v)
    }
    fn serialize_u8(self, v: u8) -> Result<()> {
        self.integer(v)
    }
    fn serialize_u16(self, v: u16) -> Result<()> {
        self.integer(v)
    }
    fn serialize_u32(self, v: u32) -> Result<()> {
        self.integer(v)
    }
    fn serialize_u64(self, v: u64) -> Result<()> {
        self.integer(v)
    }
    fn serialize_u128(self, v: u128) -> Result<()> {
        self.via_value(v)
    }
    fn serialize_f32(self, v: f32) -> Result<()> {
        self.via_value(v)
    }
    fn serialize_f64(self, v: f64) -> Result<()> {
        self.via_value(v)
    }
    fn serialize_char(self, v: char) -> Result<()> {
        write_string(v.encode_utf8(&mut [0; 4]), &mut self.out);
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<()> {
        write_string(v, &mut self.out);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<()> {
        // `to_value` makes bytes an array of numbers.
        self.out.push(b'[');
        for (i, b) in v.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.integer(b)?;
        }
        self.out.push(b']');
        Ok(())
    }
    fn serialize_none(self) -> Result<()> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<()> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<()> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<()> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<()> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<()> {
        if is_serde_json_magic(name) {
            return Err(Error::fallback());
        }
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<()> {
        let object = self.variant_object(variant, |s| value.serialize(s))?;
        self.end_variant_object(object)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'a>> {
        self.begin_array();
        Ok(Compound::Array(self, Array { first: true }))
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'a>> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Compound<'a>> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>> {
        let object = self.variant_object(variant, |s| {
            s.begin_array();
            Ok(())
        })?;
        Ok(Compound::TupleVariant(self, object, Array { first: true }))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'a>> {
        let object = self.begin_object();
        Ok(Compound::Object(self, object))
    }
    fn serialize_struct(self, name: &'static str, _len: usize) -> Result<Compound<'a>> {
        if is_serde_json_magic(name) {
            return Err(Error::fallback());
        }
        self.serialize_map(None)
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>> {
        let mut inner = None;
        let object = self.variant_object(variant, |s| {
            inner = Some(s.begin_object());
            Ok(())
        })?;
        let inner = inner.expect("set by the closure above");
        Ok(Compound::StructVariant(self, object, inner))
    }
}

impl Compound<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        match self {
            Compound::Array(ser, array) | Compound::TupleVariant(ser, _, array) => {
                ser.element(array, value)
            }
            _ => Err(Error::fallback()),
        }
    }

    fn field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<()> {
        match self {
            Compound::Object(ser, object) | Compound::StructVariant(ser, _, object) => {
                ser.field(object, key, value)
            }
            _ => Err(Error::fallback()),
        }
    }

    fn end(self) -> Result<()> {
        match self {
            Compound::Array(ser, _) => {
                ser.end_array();
                Ok(())
            }
            // A key without its value: `to_value` drops it; leave that to it.
            Compound::Object(_, object) if object.pending.is_some() => Err(Error::fallback()),
            Compound::Object(ser, object) => ser.end_object(object),
            Compound::TupleVariant(ser, object, _) => {
                ser.end_array();
                ser.end_variant_object(object)
            }
            Compound::StructVariant(ser, object, inner) => {
                ser.end_object(inner)?;
                ser.end_variant_object(object)
            }
        }
    }
}

impl ser::SerializeSeq for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.element(value)
    }
    fn end(self) -> Result<()> {
        Compound::end(self)
    }
}

impl ser::SerializeTuple for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.element(value)
    }
    fn end(self) -> Result<()> {
        Compound::end(self)
    }
}

impl ser::SerializeTupleStruct for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.element(value)
    }
    fn end(self) -> Result<()> {
        Compound::end(self)
    }
}

impl ser::SerializeTupleVariant for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.element(value)
    }
    fn end(self) -> Result<()> {
        Compound::end(self)
    }
}

impl ser::SerializeStruct for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<()> {
        self.field(key, value)
    }
    fn end(self) -> Result<()> {
        Compound::end(self)
    }
}

impl ser::SerializeStructVariant for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<()> {
        self.field(key, value)
    }
    fn end(self) -> Result<()> {
        Compound::end(self)
    }
}

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<()> {
        let Compound::Object(ser, object) = self else {
            return Err(Error::fallback());
        };
        if object.pending.is_some() {
            return Err(Error::fallback());
        }
        let pending = key.serialize(MapKey { ser, object })?;
        object.pending = Some(pending);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        let Compound::Object(ser, object) = self else {
            return Err(Error::fallback());
        };
        let Some((key, start, _)) = object.pending.take() else {
            return Err(Error::fallback());
        };
        let value_start = ser.out.len();
        value.serialize(&mut **ser)?;
        ser.push_entry(key, start, value_start);
        Ok(())
    }
    fn end(self) -> Result<()> {
        Compound::end(self)
    }
}

/// Serializes a map key as `to_value` would accept it: strings, chars, integers and bools
/// (as their text). Anything else falls back to the reference path, which decides.
struct MapKey<'a> {
    ser: &'a mut Canonicalizer,
    object: &'a mut Object,
}

impl MapKey<'_> {
    fn text(self, key: &str) -> Result<(KeyText, usize, usize)> {
        let (text, start) = self.ser.write_key(self.object, key);
        Ok((text, start, self.ser.out.len()))
    }
}

macro_rules! key_falls_back {
    ($($method:ident($($arg:ty),*)),* $(,)?) => {
        $(fn $method(self, $(_: $arg),*) -> Result<(KeyText, usize, usize)> {
            Err(Error::fallback())
        })*
    };
}

macro_rules! key_integer {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(fn $method(self, v: $ty) -> Result<(KeyText, usize, usize)> {
            self.text(&v.to_string())
        })*
    };
}

impl ser::Serializer for MapKey<'_> {
    type Ok = (KeyText, usize, usize);
    type Error = Error;
    type SerializeSeq = ser::Impossible<Self::Ok, Error>;
    type SerializeTuple = ser::Impossible<Self::Ok, Error>;
    type SerializeTupleStruct = ser::Impossible<Self::Ok, Error>;
    type SerializeTupleVariant = ser::Impossible<Self::Ok, Error>;
    type SerializeMap = ser::Impossible<Self::Ok, Error>;
    type SerializeStruct = ser::Impossible<Self::Ok, Error>;
    type SerializeStructVariant = ser::Impossible<Self::Ok, Error>;

    fn serialize_str(self, v: &str) -> Result<Self::Ok> {
        self.text(v)
    }
    fn serialize_char(self, v: char) -> Result<Self::Ok> {
        self.text(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_bool(self, v: bool) -> Result<Self::Ok> {
        self.text(if v { "true" } else { "false" })
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<Self::Ok> {
        self.text(variant)
    }
    key_integer!(
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
    );
    key_falls_back!(
        serialize_i128(i128),
        serialize_u128(u128),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
    );
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<Self::Ok> {
        Err(Error::fallback())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _value: &T,
    ) -> Result<Self::Ok> {
        Err(Error::fallback())
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<Self::Ok> {
        Err(Error::fallback())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq> {
        Err(Error::fallback())
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple> {
        Err(Error::fallback())
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct> {
        Err(Error::fallback())
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant> {
        Err(Error::fallback())
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap> {
        Err(Error::fallback())
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeStruct> {
        Err(Error::fallback())
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant> {
        Err(Error::fallback())
    }
}
