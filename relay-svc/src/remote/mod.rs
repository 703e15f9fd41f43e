//! The gRPC-client backends: the selector (with usage records batched) and admission (leases
//! multiplexed on a few lease channels, or one lease per stream with `--lease-channels 0` or an
//! admission that does not serve the channel; heartbeats every ttl/3, `Resume` on another
//! replica when a conversation breaks, and the upstream call finishing anyway when that fails).
//! Channels balance over every endpoint given.
//!
//! - `balancer`: the balanced channel over every replica of an endpoint (resolved and probed).
//! - `selection`: [`Selection`](crate::ports::Selection) over the selector, successes
//!   coalesced, usage batched.
//! - `leases`: [`Leases`](crate::ports::Leases) over admission: one acquire per task, retried
//!   on another replica, withdrawn when the caller leaves; a lease conversation's two halves,
//!   the same on a channel and on a stream.
//! - `channel`: the lease channel multiplexer (tags, one reader per channel, close on drop,
//!   reopened after a break, the fallback to streams) and the resume pacer.
//! - `keeper`: the task that owns a granted lease's conversation (heartbeats, attempts,
//!   release, resume) and the [`Lease`](crate::ports::Lease) handle that talks to it.
//! - `throttle`: a warning let through once per period.

mod balancer;
mod channel;
mod keeper;
mod leases;
mod selection;
mod throttle;

use std::sync::Arc;

use poolgate_rpc::service_auth::WithToken;
use tonic::transport::Channel;

use crate::metrics::Metrics;
use crate::ports::Backends;

pub use balancer::{
    ChannelError, DEFAULT_LEASE_CHANNELS, GrpcClient, ReplicaSet, balanced_channel,
    balanced_channel_with_replicas,
};
pub use leases::RemoteLeases;
pub use selection::RemoteSelection;

/// A balanced channel that carries the current trace context in every request's metadata, and
/// counts every call (`grpc_client_*` metrics).
pub type Traced = poolgate_rpc::grpc_metrics::GrpcMetricsService<
    poolgate_rpc::telemetry::Inject<WithToken<Channel>>,
>;

fn traced(
    channel: WithToken<Channel>,
    metrics: &poolgate_rpc::grpc_metrics::GrpcMetrics,
) -> Traced {
    tower::Layer::layer(metrics, poolgate_rpc::telemetry::Inject::new(channel))
}

/// Endpoints the remote backends cannot use: a configuration mistake, named by its flag.
#[derive(Debug, thiserror::Error)]
pub enum RemoteConfigError {
    #[error("--selector-url: {0}")]
    Selector(ChannelError),
    #[error("--admission-url: {0}")]
    Admission(ChannelError),
}

/// Shared by both backends' constructors.
pub fn remote_backends(
    selector: &[String],
    admission: &[String],
    client: &GrpcClient,
    metrics: Metrics,
) -> Result<Backends, RemoteConfigError> {
    let grpc_metrics = poolgate_rpc::grpc_metrics::GrpcMetrics::client(&metrics.registry);
    let token = client.service_token.as_deref();
    let selection = RemoteSelection::new(
        WithToken::new(
            balanced_channel(selector, client).map_err(RemoteConfigError::Selector)?,
            token,
        ),
        &grpc_metrics,
        metrics.usage_lost.clone(),
        metrics.window_writes.clone(),
    );
    let (channel, replicas) =
        balanced_channel_with_replicas(admission, client).map_err(RemoteConfigError::Admission)?;
    let leases = RemoteLeases::new(
        channel,
        replicas,
        token,
        metrics,
        &grpc_metrics,
        client.lease_channels,
    );
    Ok((Arc::new(selection), Arc::new(leases)))
}
