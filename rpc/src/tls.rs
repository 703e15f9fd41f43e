//! TLS files of a gRPC server identity.

use std::path::PathBuf;

/// PEM files of a server identity, and the CA its callers' certificates must chain to when
/// mutual TLS is on.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Mutual TLS: every caller presents a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// The tonic server TLS config, reading the files.
    pub fn server_config(&self) -> Result<tonic::transport::ServerTlsConfig, std::io::Error> {
        let cert = std::fs::read(&self.cert)?;
        let key = std::fs::read(&self.key)?;
        let mut config = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(cert, key));
        if let Some(ca) = &self.client_ca {
            config =
                config.client_ca_root(tonic::transport::Certificate::from_pem(std::fs::read(ca)?));
        }
        Ok(config)
    }
}
