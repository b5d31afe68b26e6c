//! The DiscoveredService sink: server-side apply with field manager
//! `kube-discovery`, status through the status subresource, delete when the
//! source is gone. All decisions (what and when to write) are in
//! [`crate::writer`]; this file is only the API calls.

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube_discovery_core::crd::{
    DiscoveredService, MANAGED_BY_SELECTOR, ObjectNaming, desired_object, desired_status, key_of,
};
use kube_discovery_core::{ServiceKey, ServiceNodes};

use crate::Result;
use crate::writer::Sink;

/// Field manager of every spec/metadata write.
pub const FIELD_MANAGER: &str = "kube-discovery";
/// Field manager of status writes. Separate from [`FIELD_MANAGER`] so the
/// ownership of spec fields never depends on how an API server records
/// subresource applies (kube-sim once merged both into one managedFields
/// entry, which made removed port keys linger).
pub const STATUS_FIELD_MANAGER: &str = "kube-discovery-status";

/// Writes DiscoveredServices to one API server.
#[derive(Clone)]
pub struct KubeSink {
    client: Client,
    naming: ObjectNaming,
}

impl KubeSink {
    /// A sink writing through `client`, naming objects with `naming`.
    pub fn new(client: Client, naming: ObjectNaming) -> Self {
        Self { client, naming }
    }

    fn api(&self, namespace: &str) -> Api<DiscoveredService> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

/// Lists every DiscoveredService we manage (all namespaces, paginated).
pub async fn list_managed(client: &Client) -> Result<Vec<DiscoveredService>> {
    let api: Api<DiscoveredService> = Api::all(client.clone());
    let mut lp = ListParams::default().labels(MANAGED_BY_SELECTOR).limit(500);
    let mut out = Vec::new();
    loop {
        let page = api.list(&lp).await?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        out.extend(page.items);
        match next {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(out),
        }
    }
}

impl Sink for KubeSink {
    async fn list_versions(&self) -> Result<HashMap<ServiceKey, String>> {
        let items = list_managed(&self.client).await?;
        Ok(items
            .into_iter()
            .map(|ds| (key_of(&ds), ds.spec.version))
            .collect())
    }

    async fn apply(&self, svc: ServiceNodes) -> Result<()> {
        let obj = desired_object(&svc, &self.naming);
        let ns = self.naming.namespace(&svc.key);
        let name = self.naming.name(&svc.key);
        let api = self.api(&ns);
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        api.patch(&name, &pp, &Patch::Apply(&obj)).await?;
        let status = desired_status(&svc, Time(jiff::Timestamp::now()));
        let body = serde_json::json!({
            "apiVersion": DiscoveredService::api_version(&()),
            "kind": DiscoveredService::kind(&()),
            "status": status,
        });
        let spp = PatchParams::apply(STATUS_FIELD_MANAGER).force();
        if let Err(e) = api.patch_status(&name, &spp, &Patch::Apply(&body)).await {
            // The spec (what gateways read) is written; a failed status update
            // is visible in the logs and metrics but does not block progress.
            tracing::warn!(service = %svc.key, error = %e, "status update failed");
        }
        Ok(())
    }

    async fn delete(&self, key: ServiceKey) -> Result<()> {
        let api = self.api(&self.naming.namespace(&key));
        match api
            .delete(&self.naming.name(&key), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
