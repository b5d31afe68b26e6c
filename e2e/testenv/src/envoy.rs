//! Envoy as a real process, for the xDS tests: Envoy 1.40 from
//! `.tools/bin/envoy` (`e2e/tools/install-envoy.sh`), started with a
//! bootstrap YAML the test writes, and read back through its admin API: which
//! endpoints each cluster has (`/clusters?format=json`), the stats
//! (`update_success`, `update_rejected`), the listeners' bound addresses.
//!
//! The admin listener binds port 0 and Envoy writes the address it got to a
//! file (`--admin-address-path`), so no port is guessed; `--use-dynamic-base-id`
//! keeps parallel Envoys from sharing hot-restart memory. [`Bootstrap`] is
//! the bootstrap of a plain ADS client (SotW or delta, CDS or a static EDS
//! cluster, a bearer token or none) with one HTTP listener.
//!
//! Test-harness style, like [`crate::gateways`]: what does not start panics
//! with the log.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::gateways::{Proc, eventually};

/// Upper bound of the waits here.
const LIMIT: Duration = Duration::from_secs(30);

/// A program of the repository's `.tools/bin` (installed by `script`): its
/// path, panicking with how to install it when missing.
pub fn tools_bin(name: &str, script: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.tools/bin")
        .join(name);
    assert!(
        p.is_file(),
        "{} is missing: run `bash e2e/tools/{script}` (./test.sh does)",
        p.display()
    );
    p
}

/// `.tools/bin/envoy`, or `KD_ENVOY_BIN` when set.
pub fn envoy_bin() -> PathBuf {
    match std::env::var_os("KD_ENVOY_BIN") {
        Some(p) => PathBuf::from(p),
        None => tools_bin("envoy", "install-envoy.sh"),
    }
}

/// Which ADS variant a bootstrap asks for (`ads_config.api_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdsApi {
    /// State of the world (`GRPC`).
    Sotw,
    /// Incremental (`DELTA_GRPC`).
    Delta,
}

impl AdsApi {
    /// The `api_type` value.
    pub fn api_type(self) -> &'static str {
        match self {
            AdsApi::Sotw => "GRPC",
            AdsApi::Delta => "DELTA_GRPC",
        }
    }
}

/// The bootstrap of an Envoy that takes its clusters (CDS, EDS clusters) over
/// ADS from `xds` (plaintext gRPC, `api`), as node `node_id`, and routes all
/// HTTP requests of the listener `http` (127.0.0.1, port 0: see
/// [`Envoy::listener_addr`]) to the cluster `route_to`: [`Bootstrap::new`].
pub fn ads_bootstrap(node_id: &str, xds: SocketAddr, api: AdsApi, route_to: &str) -> String {
    Bootstrap::new(node_id, xds, api, route_to).yaml()
}

/// An Envoy bootstrap for an ADS server: one HTTP listener `http`
/// (127.0.0.1, port 0) routing everything to one cluster.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    /// `node.id`.
    pub node_id: String,
    /// The ADS server (plaintext gRPC).
    pub xds: SocketAddr,
    /// SotW or delta.
    pub api: AdsApi,
    /// The cluster the listener routes to.
    pub route_to: String,
    /// `true`: clusters come over CDS (`cds_config: {ads: {}}`); `false`: no
    /// CDS, `route_to` is a static cluster of type EDS (`eds_config: {ads: {}}`).
    pub cds: bool,
    /// Sent as `authorization: Bearer <token>` on the ADS stream
    /// (`initial_metadata` of the gRPC service).
    pub token: Option<String>,
}

impl Bootstrap {
    /// CDS, no token.
    pub fn new(node_id: &str, xds: SocketAddr, api: AdsApi, route_to: &str) -> Bootstrap {
        Bootstrap {
            node_id: node_id.to_string(),
            xds,
            api,
            route_to: route_to.to_string(),
            cds: true,
            token: None,
        }
    }

    /// The YAML.
    pub fn yaml(&self) -> String {
        let Bootstrap {
            node_id,
            xds,
            api,
            route_to,
            cds,
            token,
        } = self;
        let api_type = api.api_type();
        let (ip, port) = (xds.ip(), xds.port());
        let metadata = token
            .as_ref()
            .map(|t| format!(", initial_metadata: [{{key: authorization, value: \"Bearer {t}\"}}]"))
            .unwrap_or_default();
        let cds_config = if *cds {
            "  cds_config: {resource_api_version: V3, ads: {}}\n"
        } else {
            ""
        };
        let eds_cluster = if *cds {
            String::new()
        } else {
            format!(
                "  - name: \"{route_to}\"\n    type: EDS\n    connect_timeout: 1s\n    eds_cluster_config: {{eds_config: {{resource_api_version: V3, ads: {{}}}}}}\n"
            )
        };
        format!(
            r#"node: {{id: "{node_id}", cluster: kd-test}}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services: [{{envoy_grpc: {{cluster_name: xds}}{metadata}}}]
{cds_config}static_resources:
  clusters:
{eds_cluster}  - name: xds
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: xds
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: "{ip}", port_value: {port}}}}}}}}}]}}]
  listeners:
  - name: http
    address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: http
          route_config:
            # The cluster may come over CDS after the listener is loaded.
            validate_clusters: false
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{{match: {{prefix: "/"}}, route: {{cluster: "{route_to}"}}}}]
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
"#
        )
    }
}

/// One endpoint of a cluster as Envoy's admin `/clusters?format=json` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Its IP address.
    pub address: String,
    /// Its port.
    pub port: u16,
    /// Its load-balancing weight.
    pub weight: u32,
    /// The health status the control plane gave it (`eds_health_status`:
    /// `HEALTHY`, `DRAINING`, ...; Envoy 1.40 shows an unset one as `HEALTHY`).
    pub eds_health_status: String,
    /// The health flags that are set (`pending_dynamic_removal`,
    /// `failed_active_health_check`, ...), sorted.
    pub flags: Vec<String>,
}

impl Host {
    /// `address:port`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.address, self.port)
    }

    /// Whether the control plane marked it DRAINING.
    pub fn draining(&self) -> bool {
        self.eds_health_status == "DRAINING"
    }
}

/// A running Envoy.
pub struct Envoy {
    /// Its admin API.
    pub admin: SocketAddr,
    /// The process (log `<name>.log` in its directory).
    pub proc: Proc,
}

impl Envoy {
    /// Writes `bootstrap_yaml` to `<dir>/<name>.yaml`, starts Envoy with it
    /// (`--concurrency 1`, admin on 127.0.0.1 port 0) and waits until its
    /// admin `/ready` answers `LIVE` (its initial xDS fetches are done).
    pub async fn start(dir: &Path, name: &str, bootstrap_yaml: &str) -> Envoy {
        let config = dir.join(format!("{name}.yaml"));
        std::fs::write(&config, bootstrap_yaml).expect("write the Envoy bootstrap");
        let admin_file = dir.join(format!("{name}.admin"));
        let _ = std::fs::remove_file(&admin_file);
        let mut cmd = tokio::process::Command::new(envoy_bin());
        cmd.arg("-c")
            .arg(&config)
            .arg("--config-yaml")
            .arg("{admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}}")
            .arg("--admin-address-path")
            .arg(&admin_file)
            .args(["--use-dynamic-base-id", "--concurrency", "1"])
            .args(["--log-level", "info", "--drain-time-s", "1"]);
        let mut proc = Proc::spawn_in(dir, name, &mut cmd);
        let admin = eventually(&format!("{name}: admin address written"), LIMIT, || {
            let exited = proc.child.try_wait().ok().flatten();
            let (log, file) = (proc.log.clone(), admin_file.clone());
            async move {
                if let Some(s) = exited {
                    panic!("{}", exit_message("envoy", s, &log));
                }
                std::fs::read_to_string(&file).ok()?.trim().parse().ok()
            }
        })
        .await;
        // Not `eventually`: a timeout says what /ready last answered, with the log.
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            if let Ok(Some(s)) = proc.child.try_wait() {
                panic!("{}", exit_message("envoy", s, &proc.log));
            }
            let answer = admin_get(admin, "/ready").await;
            if matches!(&answer, Ok((200, body)) if body.trim() == "LIVE") {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "{name}: /ready did not answer LIVE within {LIMIT:?} (last: {answer:?}):\n{}",
                    crate::process::log_tail(&proc.log)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Envoy { admin, proc }
    }

    /// `GET path` on the admin API: `(status, body)`; panics when Envoy
    /// does not answer.
    pub async fn get(&self, path: &str) -> (u16, String) {
        admin_get(self.admin, path).await.unwrap_or_else(|e| {
            panic!(
                "envoy admin GET {path}: {e}\n{}",
                crate::process::log_tail(&self.proc.log)
            )
        })
    }

    /// The endpoints of every cluster (admin `/clusters?format=json`), by
    /// cluster name; static clusters included.
    pub async fn clusters(&self) -> BTreeMap<String, Vec<Host>> {
        let (code, body) = self.get("/clusters?format=json").await;
        assert_eq!(code, 200, "envoy /clusters: {body}");
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("envoy /clusters is not JSON ({e}): {body}"));
        parse_clusters(&v)
    }

    /// The counters and gauges whose names start with `prefix` (admin
    /// `/stats?format=json`; histograms left out), by name.
    pub async fn stats(&self, prefix: &str) -> BTreeMap<String, u64> {
        let (code, body) = self.get("/stats?format=json").await;
        assert_eq!(code, 200, "envoy /stats: {body}");
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("envoy /stats is not JSON ({e}): {body}"));
        parse_stats(&v, prefix)
    }

    /// The counters and gauges of the cluster `cluster` (`update_success`,
    /// `update_rejected`, ...: the names after `cluster.<name>.`).
    pub async fn cluster_stats(&self, cluster: &str) -> BTreeMap<String, u64> {
        let prefix = format!("cluster.{}.", stat_name(cluster));
        self.stats(&prefix)
            .await
            .into_iter()
            .map(|(k, v)| (k[prefix.len()..].to_string(), v))
            .collect()
    }

    /// The address the listener `name` is bound to (admin `/listeners`).
    pub async fn listener_addr(&self, name: &str) -> SocketAddr {
        let (code, body) = self.get("/listeners?format=json").await;
        assert_eq!(code, 200, "envoy /listeners: {body}");
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("envoy /listeners is not JSON ({e}): {body}"));
        v["listener_statuses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["name"] == name)
            .and_then(|l| {
                let sa = &l["local_address"]["socket_address"];
                format!("{}:{}", sa["address"].as_str()?, sa["port_value"].as_u64()?)
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("envoy has no listener {name}: {body}"))
    }

    /// SIGTERM and wait (bounded).
    pub async fn stop(self) {
        self.proc.stop().await;
    }
}

/// `name` as it appears in Envoy's stat names (it turns `:` into `_`).
pub fn stat_name(name: &str) -> String {
    name.replace(':', "_")
}

fn exit_message(what: &str, status: std::process::ExitStatus, log: &Path) -> String {
    format!(
        "{what} exited ({status}):\n{}",
        crate::process::log_tail(log)
    )
}

/// The `cluster_statuses` of `/clusters?format=json`.
pub fn parse_clusters(v: &Value) -> BTreeMap<String, Vec<Host>> {
    let mut out = BTreeMap::new();
    for c in v["cluster_statuses"].as_array().into_iter().flatten() {
        let Some(name) = c["name"].as_str() else {
            continue;
        };
        let hosts = c["host_statuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| {
                let sa = &h["address"]["socket_address"];
                let health = &h["health_status"];
                let mut flags: Vec<String> = health
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(_, v)| v.as_bool() == Some(true))
                    .map(|(k, _)| k.clone())
                    .collect();
                flags.sort();
                Some(Host {
                    address: sa["address"].as_str()?.to_string(),
                    port: u16::try_from(sa["port_value"].as_u64()?).ok()?,
                    weight: u32::try_from(h["weight"].as_u64().unwrap_or(1)).ok()?,
                    eds_health_status: health["eds_health_status"]
                        .as_str()
                        .unwrap_or("UNKNOWN")
                        .to_string(),
                    flags,
                })
            })
            .collect();
        out.insert(name.to_string(), hosts);
    }
    out
}

/// The numeric entries of `/stats?format=json` whose names start with `prefix`.
pub fn parse_stats(v: &Value, prefix: &str) -> BTreeMap<String, u64> {
    v["stats"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| Some((s["name"].as_str()?, s["value"].as_u64()?)))
        .filter(|(n, _)| n.starts_with(prefix))
        .map(|(n, v)| (n.to_string(), v))
        .collect()
}

/// One `GET path` on `addr` over its own HTTP/1.1 connection (Envoy's admin
/// API refuses HTTP/1.0), bounded by 5 s: `(status, body)`.
pub async fn admin_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    use http_body_util::{BodyExt, Empty};
    let fut = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
        let conn = tokio::spawn(conn);
        let req = http::Request::get(path)
            .header(http::header::HOST, addr.to_string())
            .body(Empty::<bytes::Bytes>::new())
            .map_err(|e| format!("request: {e}"))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| format!("GET {path}: {e}"))?;
        let code = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("GET {path} body: {e}"))?
            .to_bytes();
        conn.abort();
        Ok((code, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .unwrap_or_else(|_| Err(format!("GET {path}: no answer within 5s")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clusters_and_flags() {
        let v = json!({"cluster_statuses": [
            {"name": "shop/web:http", "host_statuses": [
                {"address": {"socket_address": {"address": "10.0.0.1", "port_value": 80}},
                 "weight": 3,
                 "health_status": {"eds_health_status": "DRAINING", "pending_dynamic_removal": true}},
                {"address": {"socket_address": {"address": "10.0.0.2", "port_value": 80}},
                 "health_status": {"eds_health_status": "HEALTHY"}}
            ]},
            {"name": "empty"}
        ]});
        let c = parse_clusters(&v);
        assert_eq!(c["empty"], vec![]);
        let hosts = &c["shop/web:http"];
        assert_eq!(hosts.len(), 2);
        assert_eq!(hosts[0].addr(), "10.0.0.1:80");
        assert_eq!(hosts[0].weight, 3);
        assert!(hosts[0].draining());
        assert_eq!(hosts[0].flags, vec!["pending_dynamic_removal"]);
        assert!(!hosts[1].draining());
        assert_eq!(hosts[1].weight, 1);
    }

    #[test]
    fn stats_by_prefix() {
        let v = json!({"stats": [
            {"name": "cluster_manager.cds.update_success", "value": 2},
            {"name": "cluster_manager.cds.update_rejected", "value": 0},
            {"name": "http.downstream_rq_total", "value": 7},
            {"histograms": {}}
        ]});
        let s = parse_stats(&v, "cluster_manager.cds.");
        assert_eq!(s.len(), 2);
        assert_eq!(s["cluster_manager.cds.update_success"], 2);
    }
}
