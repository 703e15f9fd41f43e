//! poolgate-client: the selection API and the lease API over the selector's and admission's gRPC
//! services — the same APIs their engines implement in process
//! (`poolgate_select::api::SelectionApi`, `poolgate_lease::api::LeaseApi`), so a relay holds
//! either and does not know which. The proto conversions are at this crate's edge
//! (`poolgate_proto::convert`); no domain decision is made here: a plan, a key's verdict, what an
//! outcome applies are the selector's answers, read strictly.
//!
//! - `edge`: [`edge::EdgeSelection`], the selection API of a distributed relay: plans, key
//!   checks and model lists in the relay's process over the view the selector streams
//!   (`WatchView`), every write through [`RemoteSelection`].
//! - `selection`: [`RemoteSelection`], the selector: success reports and usage-window readings
//!   coalesced per account (they change nothing the caller acts on), other outcomes at once.
//! - `leases`: [`RemoteLeases`], admission: leases multiplexed on a few lease channels, or one
//!   lease per stream (`lease_channels` 0, or an admission that does not serve the channel);
//!   one acquire per task, retried on another replica, withdrawn when the caller leaves.
//! - `channel`: the lease channel multiplexer (tags, one reader per channel, close on drop,
//!   reopened after a break, the fallback to streams) and the resume pacer.
//! - `keeper`: the task that owns a granted lease's conversation (heartbeats every ttl/3,
//!   attempts, release, `Resume` on another replica when it breaks) and the lease handle.
//! - `balancer`: the balanced channel over every replica of an endpoint (resolved and probed).
//! - `error`: a call's error inside the crate, and the APIs' error at its edge.
//! - `metrics`: the clients' counters (leases lost and resumed, channel events, window writes).
//! - `throttle`: a warning let through once per period.

mod balancer;
mod channel;
pub mod edge;
pub mod error;
mod keeper;
mod leases;
pub mod metrics;
mod selection;
mod throttle;

use std::sync::Arc;

use poolgate_rpc::service_auth::WithToken;
use tonic::transport::Channel;

use poolgate_lease::api::LeaseApi;
use poolgate_select::api::SelectionApi;

use crate::metrics::Metrics;

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

/// The two APIs over gRPC.
pub type Backends = (Arc<dyn SelectionApi>, Arc<dyn LeaseApi>);

/// The selection API over the selector at `selector`, the lease API over admission at
/// `admission` (each balanced over every replica its endpoints resolve to). With `edge`, the
/// relay selects in its own process over the selector's view ([`edge::EdgeSelection`]), built
/// with `engine` (the relay's selection settings) and counted in `metrics.registry`; without, it
/// asks the selector for every plan.
pub fn remote_backends(
    selector: &[String],
    admission: &[String],
    client: &GrpcClient,
    metrics: Metrics,
    edge: Option<(
        edge::EdgeSelectionSettings,
        poolgate_select::engine::SelectorSettings,
    )>,
) -> Result<Backends, RemoteConfigError> {
    let grpc_metrics = poolgate_rpc::grpc_metrics::GrpcMetrics::client(&metrics.registry);
    let token = client.service_token.as_deref();
    let remote = RemoteSelection::new(
        WithToken::new(
            balanced_channel(selector, client).map_err(RemoteConfigError::Selector)?,
            token,
        ),
        &grpc_metrics,
        metrics.window_writes.clone(),
    );
    let selection: Arc<dyn SelectionApi> = match edge {
        Some((settings, engine_settings)) => {
            let view = Arc::new(poolgate_select::edge::EdgeView::new());
            let engine = poolgate_select::edge::edge_selector(
                view.clone(),
                engine_settings,
                poolgate_select::metrics::Metrics::registered_in(metrics.registry.clone()),
                poolgate_core::Clock::system(),
            );
            Arc::new(edge::EdgeSelection::start(
                engine,
                view,
                Arc::new(remote),
                settings,
                edge::EdgeMetrics::registered_in(&metrics.registry),
            ))
        }
        None => Arc::new(remote),
    };
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
    Ok((selection, Arc::new(leases)))
}
