//! The relay's HTTP clients toward the upstreams: one direct, and one per account proxy, built
//! the first time an account behind it is called and kept (a proxy's connections are reused
//! like the direct ones).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::request::{HttpClientError, build_client};

pub struct HttpClients {
    timeout: Duration,
    direct: reqwest::Client,
    proxied: Mutex<HashMap<String, reqwest::Client>>,
    /// HTTP/1.1 only, for the upstream sockets' upgrades (an upgrade is HTTP/1.1's), direct
    /// and per proxy.
    sockets: reqwest::Client,
    proxied_sockets: Mutex<HashMap<String, reqwest::Client>>,
}

impl HttpClients {
    pub fn new(timeout: Duration) -> Result<Self, HttpClientError> {
        Ok(HttpClients {
            timeout,
            direct: build_client(timeout, None, false)?,
            proxied: Mutex::new(HashMap::new()),
            sockets: build_client(timeout, None, true)?,
            proxied_sockets: Mutex::new(HashMap::new()),
        })
    }

    /// The client for an account's proxy (built once per proxy), or the direct one. A proxy
    /// URL the client cannot be built with is called directly, with a warning (the URL is not
    /// printed: it may carry the proxy's password).
    pub fn for_proxy(&self, proxy: Option<&str>) -> reqwest::Client {
        self.pick(proxy, false)
    }

    /// The same, for an upstream socket's upgrade (HTTP/1.1 only).
    pub fn for_socket(&self, proxy: Option<&str>) -> reqwest::Client {
        self.pick(proxy, true)
    }

    fn pick(&self, proxy: Option<&str>, socket: bool) -> reqwest::Client {
        let direct = if socket { &self.sockets } else { &self.direct };
        let Some(proxy) = proxy.filter(|p| !p.is_empty()) else {
            return direct.clone();
        };
        let proxied = if socket {
            &self.proxied_sockets
        } else {
            &self.proxied
        };
        let mut proxied = proxied.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = proxied.get(proxy) {
            return client.clone();
        }
        match build_client(self.timeout, Some(proxy), socket) {
            Ok(client) => {
                proxied.insert(proxy.to_owned(), client.clone());
                client
            }
            Err(error) => {
                tracing::warn!(%error, "account proxy unusable; calling directly");
                direct.clone()
            }
        }
    }
}
