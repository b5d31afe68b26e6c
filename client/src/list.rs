//! One-shot, paginated lists of the objects kube-discovery manages (label
//! [`MANAGED_BY_SELECTOR`], all namespaces): what `kube-discovery nodes`
//! reads, and what the controller's start-up list folds page by page.

use kube::api::{Api, ListParams};
use kube::core::NamespaceResourceScope;
use kube::{Client, Resource};
use kube_discovery_core::crd::{DiscoveredService, MANAGED_BY_SELECTOR};

use crate::Result;

/// Objects per page of [`list_managed`]. A page is received and decoded
/// whole, so its size bounds the transient memory of a list (a sharded
/// DiscoveredService carries up to
/// [`kube_discovery_core::crd::MAX_OBJECT_PORTS_BYTES`] of ports; kube-runtime's
/// default page is 500 objects).
pub const LIST_PAGE_SIZE: u32 = 100;

/// Hands every object of type `K` with the managed-by label (all
/// namespaces, `page` objects per request) to `each`, one page at a time.
pub async fn for_each_managed<K>(client: &Client, page: u32, each: impl FnMut(K)) -> Result<()>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    for_each_managed_in(client, None, page, each).await
}

/// [`for_each_managed`] in one namespace (`Some`: a namespaced request, which
/// a Role there authorizes) or in all (`None`).
pub async fn for_each_managed_in<K>(
    client: &Client,
    namespace: Option<&str>,
    page: u32,
    each: impl FnMut(K),
) -> Result<()>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    for_each_in(client, namespace, Some(MANAGED_BY_SELECTOR), page, each).await
}

/// Hands every object of type `K` in `namespace` (all when `None`) that
/// matches the label `selector` (every object when `None`) to `each`, one
/// page of `page` objects at a time.
pub async fn for_each_in<K>(
    client: &Client,
    namespace: Option<&str>,
    selector: Option<&str>,
    page: u32,
    mut each: impl FnMut(K),
) -> Result<()>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut lp = ListParams::default().limit(page);
    if let Some(s) = selector {
        lp = lp.labels(s);
    }
    loop {
        let page = api.list(&lp).await?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        page.items.into_iter().for_each(&mut each);
        match next {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(()),
        }
    }
}

/// Lists every DiscoveredService kube-discovery manages (all namespaces,
/// [`LIST_PAGE_SIZE`] per request).
pub async fn list_managed(client: &Client) -> Result<Vec<DiscoveredService>> {
    let mut out = Vec::new();
    for_each_managed(client, LIST_PAGE_SIZE, |ds| out.push(ds)).await?;
    Ok(out)
}
