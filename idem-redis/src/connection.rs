//! One connection type over a single Redis and a Redis Cluster, so the store's code is the
//! same for both: the cluster connection routes each command by its first key.

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{cmd, pipe, Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::builder::ReplicaWait;

/// A connection to the store's Redis: one server (reconnecting), or a cluster (following
/// its slot map and redirections).
#[derive(Clone)]
pub(super) enum Conn {
    /// One Redis server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl Conn {
    /// True for a Redis Cluster.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

impl Conn {
    /// Sends `call` with `WAIT` behind it, in one pipeline on one connection, and returns
    /// its reply and how many replicas confirmed it within `wait`'s timeout.
    ///
    /// `WAIT` counts the replicas that acknowledged every write this connection sent
    /// before it: sent together, nothing else of ours (no reconnection) can come between
    /// the write and the wait. On a cluster the pipeline goes where its first keyed
    /// command does, the master of `call`'s slot, so the wait is that shard's.
    pub(super) async fn query_confirmed(
        &mut self,
        call: &Cmd,
        wait: ReplicaWait,
    ) -> RedisResult<(Value, u32)> {
        let mut waiting = cmd("WAIT");
        waiting
            .arg(wait.replicas)
            .arg(u64::try_from(wait.timeout.as_millis()).unwrap_or(u64::MAX));
        let mut both = pipe();
        both.add_command(call.clone()).add_command(waiting);
        let (reply, acks): (Value, u32) = both.query_async(self).await?;
        Ok((reply, acks))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
