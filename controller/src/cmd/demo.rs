//! `kube-discovery demo`: everything in one process, nothing to install.
//!
//! 1. starts kube-sim (HTTPS, self-signed CA) and installs the CRD;
//! 2. seeds namespaces `shop`, `payments` and `dev` with Services, their
//!    EndpointSlices (owned by the Service, as the EndpointSlice controller
//!    does) and the mirrored core/v1 Endpoints;
//! 3. runs the controller with the embedded default configuration
//!    ([`DEMO_CONFIG`], EndpointSlices) against it;
//! 4. writes a kubeconfig and prints commands to look around;
//! 5. every `--interval` seconds scales `shop/web` between 1 and 4 endpoints
//!    and flips one `payments/api` endpoint's readiness, so the
//!    DiscoveredServices visibly change; stops on Ctrl-C/SIGTERM or after
//!    `--duration` seconds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_discovery_core::crd::DiscoveredService;
use serde_json::{Value, json};

use crate::{Error, HttpError, Result};

/// The embedded default configuration of the demo (`{KUBECONFIG}` is replaced).
pub const DEMO_CONFIG: &str = r#"# kube-discovery demo configuration
discovery:
  kubernetes:
    kubeconfig: "{KUBECONFIG}"
    watch_endpoint_slices: true
    default_weight: 50
    namespace_selector:
      not_equal: kube-system
kube_discovery:
  coalesce_window: 100ms
"#;

/// Options of `demo`.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Stop after this many seconds.
    pub duration: Option<u64>,
    /// Controller HTTP address.
    pub http_addr: SocketAddr,
    /// Where to write the kubeconfig.
    pub dir: Option<PathBuf>,
    /// Seconds between changes.
    pub interval: u64,
}

fn sim_err(e: kube_sim::Error) -> Error {
    HttpError::Sim(e).into()
}

const MANAGER: &str = "kube-discovery-demo";

async fn apply<K>(api: Api<K>, obj: Value) -> Result<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok(api
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&obj),
        )
        .await?)
}

struct Workload {
    ns: &'static str,
    name: &'static str,
    ports: Vec<(&'static str, i32)>,
    uid: String,
}

fn slice_json(w: &Workload, ips: &[(String, bool)]) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{}-abc12", w.name), "namespace": w.ns,
            "labels": {"kubernetes.io/service-name": w.name, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": w.name, "uid": w.uid}],
        },
        "addressType": "IPv4",
        "endpoints": ips.iter().map(|(ip, ready)| json!({
            "addresses": [ip], "conditions": {"ready": ready, "serving": ready, "terminating": false},
            "nodeName": "node-1", "zone": "zone-a",
        })).collect::<Vec<_>>(),
        "ports": w.ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect::<Vec<_>>(),
    })
}

fn endpoints_json(w: &Workload, ips: &[(String, bool)]) -> Value {
    let ready: Vec<Value> = ips
        .iter()
        .filter(|(_, r)| *r)
        .map(|(ip, _)| json!({"ip": ip}))
        .collect();
    let not_ready: Vec<Value> = ips
        .iter()
        .filter(|(_, r)| !*r)
        .map(|(ip, _)| json!({"ip": ip}))
        .collect();
    let mut subset = json!({"ports": w.ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect::<Vec<_>>()});
    if !ready.is_empty() {
        subset["addresses"] = json!(ready);
    }
    if !not_ready.is_empty() {
        subset["notReadyAddresses"] = json!(not_ready);
    }
    let subsets = if ips.is_empty() {
        json!([])
    } else {
        json!([subset])
    };
    json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": w.name, "namespace": w.ns}, "subsets": subsets})
}

async fn set_endpoints(client: &Client, w: &Workload, ips: &[(String, bool)]) -> Result<()> {
    apply::<EndpointSlice>(Api::namespaced(client.clone(), w.ns), slice_json(w, ips)).await?;
    apply::<Endpoints>(
        Api::namespaced(client.clone(), w.ns),
        endpoints_json(w, ips),
    )
    .await?;
    Ok(())
}

async fn install_crd(client: &Client) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match api
        .create(
            &PostParams::default(),
            &kube_discovery_core::crd::definition(),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let ds: Api<DiscoveredService> = Api::all(client.clone());
    for _ in 0..100 {
        if ds.list(&ListParams::default().limit(1)).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(HttpError::CrdNotServed.into())
}

fn ips(prefix: &str, n: usize) -> Vec<(String, bool)> {
    (1..=n).map(|i| (format!("{prefix}.{i}"), true)).collect()
}

/// Runs the demo.
pub async fn run(opts: DemoOptions) -> Result<()> {
    let sim = kube_sim::Sim::start(kube_sim::SimConfig {
        tls: true,
        ..kube_sim::SimConfig::default()
    })
    .await
    .map_err(sim_err)?;
    let (dir, tmp) = match &opts.dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| Error::Io {
                path: d.display().to_string(),
                source: e,
            })?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile_dir()?;
            (t.clone(), Some(t))
        }
    };
    let kubeconfig = dir.join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig, &sim.admin_token())
        .map_err(sim_err)?;
    let client = crate::k8s::client::client(
        &crate::k8s::client::Connection::Kubeconfig {
            path: Some(kubeconfig.clone()),
            context: None,
        },
        &crate::k8s::client::ClientLimits::default(),
    )
    .await?;
    install_crd(&client).await?;

    let mut workloads = Vec::new();
    for (ns, name, ports, n) in [
        (
            "shop",
            "web",
            vec![("http", 8080), ("metrics", 9090)],
            2usize,
        ),
        ("shop", "cart", vec![("http", 8080)], 3),
        ("payments", "api", vec![("grpc", 50051)], 3),
        ("dev", "plat-dev", vec![("port", 3306)], 2),
    ] {
        apply::<Namespace>(
            Api::all(client.clone()),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await?;
        let svc: Service = apply(
            Api::namespaced(client.clone(), ns),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
                   "spec": {"ports": ports.iter().map(|(pn, p)| json!({"name": pn, "port": p, "targetPort": p})).collect::<Vec<_>>(),
                            "selector": {"app": name}}}),
        )
        .await?;
        let w = Workload {
            ns,
            name,
            ports,
            uid: svc.metadata.uid.unwrap_or_default(),
        };
        let octet = workloads.len() + 1;
        set_endpoints(&client, &w, &ips(&format!("10.{octet}.0"), n)).await?;
        workloads.push(w);
    }

    let config_path = dir.join("demo-config.yaml");
    let config_text = DEMO_CONFIG.replace("{KUBECONFIG}", &kubeconfig.display().to_string());
    std::fs::write(&config_path, &config_text).map_err(|e| Error::Io {
        path: config_path.display().to_string(),
        source: e,
    })?;
    let plan = crate::cmd::run::run_options_from_text(&config_text, Some(opts.http_addr), None)?;
    let running = crate::cmd::run::start(plan).await?;
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "kube-discovery".into());
    let addr = running.http_addr;
    println!(
        "kube-discovery demo is running.\n\
         \n  kube-sim API server:   {url}\n  kubeconfig:            {kc}\n  controller config:     {cfg}\n\
         \nLook around:\n\
         \n  KUBECONFIG={kc} kubectl get dsvc -A\
         \n  KUBECONFIG={kc} kubectl get dsvc -n shop web -o yaml\
         \n  curl http://{addr}/v1/discovery/kubernetes/dump\
         \n  curl 'http://{addr}/v1/discovery/kubernetes/nodes?service=shop/web:http'\
         \n  KUBECONFIG={kc} {exe} nodes shop/web:http\
         \n  curl http://{addr}/metrics\
         \n\nshop/web scales between 1 and 4 endpoints and payments/api flaps one endpoint every {i} s. Ctrl-C to stop.",
        url = sim.url(),
        kc = kubeconfig.display(),
        cfg = config_path.display(),
        i = opts.interval,
    );

    let stop = async {
        match opts.duration {
            Some(s) => tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(s)) => {}
                () = crate::cmd::run::shutdown_signal() => {}
            },
            None => crate::cmd::run::shutdown_signal().await,
        }
    };
    let changes = async {
        let mut step = 0usize;
        let mut tick = tokio::time::interval(Duration::from_secs(opts.interval.max(1)));
        tick.tick().await;
        loop {
            tick.tick().await;
            step += 1;
            let n = [2, 3, 4, 3, 1][step % 5];
            let web = &workloads[0];
            if let Err(e) = set_endpoints(&client, web, &ips("10.1.0", n)).await {
                tracing::warn!(error = %e, "demo: cannot scale shop/web");
            } else {
                println!("demo: shop/web now has {n} endpoint(s)");
            }
            let api = &workloads[2];
            let mut a = ips("10.3.0", 3);
            a[2].1 = step.is_multiple_of(2);
            if let Err(e) = set_endpoints(&client, api, &a).await {
                tracing::warn!(error = %e, "demo: cannot update payments/api");
            }
        }
    };
    tokio::select! {
        () = stop => {}
        () = changes => {}
    }
    println!("demo: stopping");
    running.stop().await;
    sim.shutdown().await;
    if let Some(t) = tmp {
        let _ = std::fs::remove_dir_all(t);
    }
    Ok(())
}

fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("kube-discovery-demo-{}", std::process::id()));
    std::fs::create_dir_all(&d).map_err(|e| Error::Io {
        path: d.display().to_string(),
        source: e,
    })?;
    Ok(d)
}
