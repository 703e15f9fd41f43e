//! poolgate's shared contracts: the generated gRPC APIs, their conversions to and from the domain
//! types of `poolgate-core` ([`convert`], the only place they are written), and the record of
//! released protos ([`release`]) that new protos are checked against ([`compat`]). (The Redis key
//! layout is `poolgate_runtime::redis_keys`, where both engines read it.)

pub mod compat;
pub mod convert;
pub mod release;

/// `poolgate.admission.v1`: leases on upstream accounts.
pub mod admission {
    pub mod v1 {
        tonic::include_proto!("poolgate.admission.v1");
    }
}

/// `poolgate.selector.v1`: account selection, health, and the operator API.
pub mod selector {
    pub mod v1 {
        tonic::include_proto!("poolgate.selector.v1");
    }
}

/// The encoded file descriptor set of every poolgate proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("poolgate_descriptor");
