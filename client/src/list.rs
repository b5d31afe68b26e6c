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

/// What [`for_each_managed_in`] hands over.
#[derive(Debug)]
pub enum Listed<K> {
    /// The next object of the list.
    Object(K),
    /// Forget every object handed over so far: the `continue` token of a
    /// page expired (`410 Expired`, its revision was compacted away), and the
    /// list starts over in one request, as client-go's pager does
    /// (`FullListIfExpired`).
    Restart,
}

/// Hands every object of type `K` with the managed-by label (all
/// namespaces, `page` objects per request) to `each`, one page at a time.
pub async fn for_each_managed<K>(
    client: &Client,
    page: u32,
    each: impl FnMut(Listed<K>),
) -> Result<()>
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
    each: impl FnMut(Listed<K>),
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
/// page of `page` objects at a time ([`Listed::Restart`] when an expired
/// `continue` token makes the list start over in one request).
pub async fn for_each_in<K>(
    client: &Client,
    namespace: Option<&str>,
    selector: Option<&str>,
    page: u32,
    mut each: impl FnMut(Listed<K>),
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
        let page = match api.list(&lp).await {
            Ok(page) => page,
            Err(kube::Error::Api(status)) if status.code == 410 && lp.continue_token.is_some() => {
                tracing::warn!(message = %status.message, "the continue token of a paged list expired; listing again in one request");
                each(Listed::Restart);
                lp.continue_token = None;
                lp.limit = None;
                api.list(&lp).await?
            }
            Err(e) => return Err(e.into()),
        };
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        page.items.into_iter().for_each(|o| each(Listed::Object(o)));
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
    for_each_managed(client, LIST_PAGE_SIZE, |listed| match listed {
        Listed::Object(ds) => out.push(ds),
        Listed::Restart => out.clear(),
    })
    .await?;
    Ok(out)
}
