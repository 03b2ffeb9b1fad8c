//! What the Redis conformance factories' `corrupt` writes: bytes that are not a record, in
//! place of one, over any connection (one server, a cluster, over TLS or not).

use idem_runtime::store::StoreError;

/// Replaces whatever `record_key` holds (`SET` overwrites a value of any type) with a
/// string that is not a record hash.
pub async fn overwrite_with_garbage(
    conn: &mut impl redis::aio::ConnectionLike,
    record_key: &str,
) -> Result<bool, StoreError> {
    redis::cmd("SET")
        .arg(record_key)
        .arg(b"\xff not a record".as_slice())
        .query_async::<()>(conn)
        .await
        .map_err(|e| StoreError::Backend(e.to_string()))?;
    Ok(true)
}
