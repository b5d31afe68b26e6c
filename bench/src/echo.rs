//! The "floor": a minimal kube-rs client with no logic. It watches the same
//! source objects as the controller (all namespaces) and, for EVERY watch event,
//! server-side-applies one trivial ConfigMap `echo-<source name>` carrying the
//! source's resourceVersion (so every apply is a real write). No index, no
//! conversion, no hashing, no coalescing: the latency and CPU of this process
//! are what any watcher-plus-writer costs on the same machine and load.
//!
//! Applies run concurrently (up to 8 in flight, like the controller's default
//! `write_concurrency`). `synced` is printed on stdout once every object of the
//! first list has been applied.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Config, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::Semaphore;

const IN_FLIGHT: usize = 8;

/// Runs the echo client until killed.
pub async fn run(kubeconfig: &Path, slices: bool) -> Result<()> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).context("reading kubeconfig")?;
    let cfg = Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .context("kube config")?;
    let client = Client::try_from(cfg).context("kube client")?;
    if slices {
        echo::<EndpointSlice>(client).await
    } else {
        echo::<Endpoints>(client).await
    }
}

async fn echo<K>(client: Client) -> Result<()>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    let sem = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    let mut init: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let mut in_init = false;
    let mut synced = false;
    while let Some(ev) = stream.next().await {
        let obj = match ev {
            Ok(Event::Init) => {
                in_init = true;
                continue;
            }
            Ok(Event::InitDone) => {
                in_init = false;
                if !synced {
                    for h in init.drain(..) {
                        let _ = h.await;
                    }
                    synced = true;
                    println!("synced");
                }
                continue;
            }
            Ok(Event::Apply(o) | Event::InitApply(o) | Event::Delete(o)) => o,
            Err(e) => {
                eprintln!("watch error: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                continue;
            }
        };
        let ns = obj.namespace().unwrap_or_default();
        let name = format!("echo-{}", obj.name_any());
        let rv = obj.resource_version().unwrap_or_default();
        let cm: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let permit = sem
            .clone()
            .acquire_owned()
            .await
            .context("semaphore closed")?;
        let h = tokio::spawn(async move {
            let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"rv": rv}});
            if let Err(e) = cm
                .patch(
                    &name,
                    &PatchParams::apply("kd-echo").force(),
                    &Patch::Apply(&body),
                )
                .await
            {
                eprintln!("apply {ns}/{name}: {e}");
            }
            drop(permit);
        });
        if in_init && !synced {
            init.push(h);
        }
    }
    Ok(())
}
