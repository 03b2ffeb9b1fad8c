//! What the Redis tests share: the conformance factory and the check that nothing is left
//! on the server.

pub mod redis_factory;
pub mod redis_garbage;
