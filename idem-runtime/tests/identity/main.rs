//! What makes two calls one operation: canonical JSON (reference and optimized writers),
//! key properties, the golden vectors of `docs/keys.md`, key-format migrations, and records
//! of earlier formats that still read.

mod canonical_reference;
mod canonical_serializer;
mod key_migration;
mod key_vectors;
mod properties;
mod record_format;
