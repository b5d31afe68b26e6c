//! The DiscoveredService sink: ONE server-side apply per object (field
//! manager `kube-discovery/<instance>`) carrying spec AND status, delete when
//! the source is gone. It decides nothing and keeps no state of its own
//! about a service: what the API server holds of our objects (the
//! generations it stamps from, the conditions an object holds, names held
//! by others) is the shared record ([`crate::write::record`]), which the
//! sink feeds with the start-up list and the answers to its writes and
//! reads before each write. WHEN and whether to write is the planner's
//! ([`kube_discovery_core::write_plan::Planner`], run by [`crate::write::writer`]),
//! WHICH objects one write touches is
//! [`kube_discovery_core::write_plan::object_ops`] (pure, from the desired
//! objects, the [`Prior`] the planner hands along and what the record shows);
//! this file only sends those requests, in order, each fenced.
//!
//! The CRD has no status subresource (`kube_discovery_core::crd::definition`):
//! the status is derived from the object's own spec, so it is an ordinary
//! field written in the same request
//! (`kube_discovery_core::crd::DesiredObjects::at`), one API write per object
//! and change instead of two.
//!
//! # Big services (shards)
//!
//! A service whose nodes do not fit one object is written as several
//! (`kube_discovery_core::crd::DesiredObjects`): shard 0 keeps the usual
//! name, shard `i` is `<name>.<i>` and carries the version of its own
//! content, shard 0 the service's version and the manifest of every shard's
//! version, all `spec.shard = {index, count}`. [`KubeSink::apply`] writes
//! the changed shards `1..` first and shard 0 LAST (shard 0 carries the
//! count and manifest a reader trusts), each with its own status, then
//! deletes the surplus shards of a shrink. Which objects a write sends is
//! decided from names and versions (`object_ops`); only those are built
//! (one change in a big service copies the nodes of two shards, not all).
//! The shard count per service is the record's (from
//! [`Sink::list_versions`], then from every apply's answer, which the
//! writer puts there), handed to a write by the planner in
//! [`Prior::shards`], so a shrink needs no extra LIST.
//! [`Sink::list_versions`] reports a service's version only when shards
//! `0..count` are all present with that version; a half-written service
//! (crash between shards) gets the version `""`, which forces a rewrite.
//!
//! # Drift
//!
//! With a [`DriftView`] attached ([`KubeSink::with_drift`]), the sink shares
//! its record with the drift watch: the resourceVersion every write records
//! lets late watch events of our own writes be recognised, and
//! [`Sink::drift_facts`] gathers
//! what the planner compares to answer "is what the API server holds still
//! what we want?" (the watch's copies next to the wanted objects; it
//! changes and decides nothing). A key the planner judges drifted is a
//! repair ([`Prior::repair`]): `object_ops` then writes only the objects the
//! record does NOT show intact (`record::intact_of`: watched, not older than
//! our last write, content as wanted) and deletes stray objects the record
//! holds for the service. Port keys someone else added survive server-side
//! apply (not ours) and are removed by a merge patch after the apply.
//!
//! # Fencing
//!
//! With leader election, the sink is given the election's [`Fence`]
//! ([`KubeSink::with_fence`]): an apply or delete carries the leadership
//! epoch the planner decided it in and checks, right before each request (every shard, the
//! merge patches, the deletes), that this epoch is still the current leading
//! one, and a request in flight is abandoned when that epoch ends
//! ([`Fence::send`], at the renew deadline at the latest). Otherwise it stops
//! with [`crate::Error::Fenced`], which the writer counts
//! (`writes_total{result="fenced"}`) and does not treat as a failure.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use crate::{Error, Result};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource};
use kube_discovery_core::crd::{
    DesiredObjects, DiscoveredService, LABEL_INSTANCE, LABEL_SHARD, ObjectNaming, Owner, Shard,
    generation_fix, key_of, shard_of, stamp_generation, stamped_generation,
};
use kube_discovery_core::write_plan::answer::{self, Answer, Next, Sending, classify};
use kube_discovery_core::write_plan::record::{Listing, RecordView, WantedShards};
use kube_discovery_core::write_plan::{
    DeleteWhy, DriftFacts, Held, NameTaken, ObjectOp, ObjectPlan, Prior, ServerFacts, object_ops,
};
use kube_discovery_core::{ServiceKey, ServiceNodes};

use crate::k8s::events::Events;
use crate::k8s::leader::{Fence, FenceToken};
use crate::write::drift::{DriftView, Lean};
use crate::write::explain::Explain;
use crate::write::generation::Stamping;
use crate::write::record::SharedRecord;

/// Where the writer puts DiscoveredServices (the API server in production,
/// [`KubeSink`]; a fake in tests). The writer decides what and when; a sink
/// only carries it out.
pub trait Sink: Clone + Send + Sync + 'static {
    /// Lists the objects that already exist into the record
    /// ([`Sink::record`]: version and shard slots per service, and what the
    /// record keeps of each object); returns the versions it found, one
    /// entry per service.
    fn list_versions(&self) -> impl Future<Output = Result<Vec<(ServiceKey, Held)>>> + Send;
    /// The record this sink feeds (the planner reads it).
    fn record(&self) -> SharedRecord;
    /// Creates or updates the objects for `svc` (and their status), starting
    /// from what `prior` says the API server holds; returns how many objects
    /// (shards) the service has now. Every request is fenced by `epoch`, the
    /// leadership epoch the planner decided the write in.
    fn apply(
        &self,
        svc: Arc<ServiceNodes>,
        prior: Prior,
        epoch: u64,
    ) -> impl Future<Output = Result<u32>> + Send;
    /// Deletes the objects for `key` (absent is success), fenced by `epoch`
    /// like [`Sink::apply`].
    fn delete(
        &self,
        key: ServiceKey,
        prior: Prior,
        epoch: u64,
    ) -> impl Future<Output = Result<()>> + Send;
    /// What the API server holds of `key`'s objects (as last seen) next to
    /// what `desired` wants, for the planner to judge
    /// ([`kube_discovery_core::write_plan::judge_drift`]): a question, it
    /// changes and decides nothing. Sinks without a cache of their objects
    /// have nothing to compare.
    fn drift_facts(&self, _key: &ServiceKey, _desired: Option<&ServiceNodes>) -> DriftFacts {
        DriftFacts::unwatched()
    }
    /// The writer's report that writes of `key` started failing (or fail
    /// for another reason now) with `error`; `desired` is what was to be
    /// written. Sinks that emit Events say so ([`crate::k8s::events`]).
    fn failing(&self, _key: &ServiceKey, _desired: Option<&ServiceNodes>, _error: &Error) {}
}

// Field managers: every write of an object (metadata, spec and status in one
// server-side apply) is `ObjectNaming::field_manager` (`kube-discovery/<instance>`);
// the merge patches that remove what server-side apply leaves because someone
// else co-owns it (port keys someone else added, the `shard` field of a
// service that fits one object again) are `ObjectNaming::drift_field_manager`.

/// What a write needs from the API server's answer: the object's new
/// resourceVersion (for drift), its port keys (to spot keys someone else
/// added) and whether it has a `shard` field. Everything else in the answer
/// is skipped while parsing.
#[derive(Debug, serde::Deserialize)]
struct Written {
    metadata: WrittenMeta,
    #[serde(default)]
    spec: WrittenSpec,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    #[serde(default)]
    resource_version: Option<String>,
    /// For Events about the object (`kubectl describe` matches the uid).
    #[serde(default)]
    uid: Option<String>,
    /// To check the `observedGeneration` the write stamped
    /// ([`kube_discovery_core::crd::generation_fix`]).
    #[serde(default)]
    generation: Option<i64>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct WrittenSpec {
    #[serde(default)]
    ports: BTreeMap<String, serde::de::IgnoredAny>,
    #[serde(default)]
    shard: Option<serde::de::IgnoredAny>,
}

impl Written {
    fn resource_version(&self) -> Option<u64> {
        self.metadata.resource_version.as_deref()?.parse().ok()
    }
}

/// Writes DiscoveredServices to one API server.
#[derive(Clone)]
pub struct KubeSink {
    client: Client,
    naming: ObjectNaming,
    drift: Option<DriftView>,
    /// The one namespace holding all our objects, if there is one
    /// (`Plan::home_namespace`): the start-up list is then namespaced.
    namespace: Option<String>,
    /// What the API server holds of our objects (names held by others,
    /// generations, conditions), shared with the drift watch.
    record: SharedRecord,
    /// The wanted form of unchanged shards, remembered across writes
    /// ([`kube_discovery_core::write_plan::record::intact_of`]).
    wanted_shards: Arc<Mutex<WantedShards>>,
    /// Checked before every write request ([`Fence::always`] without leader election).
    fence: Fence,
    /// Events explaining the writes.
    explain: Explain,
    /// Whether writes carry `observedGeneration` now.
    stamping: Stamping,
}

impl KubeSink {
    /// A sink writing through `client`, naming objects with `naming`.
    pub fn new(client: Client, naming: ObjectNaming) -> Self {
        Self {
            client,
            naming,
            drift: None,
            namespace: None,
            record: SharedRecord::default(),
            wanted_shards: Arc::default(),
            fence: Fence::always(),
            explain: Explain::default(),
            stamping: Stamping::default(),
        }
    }

    /// Emits Events through `events` ([`crate::k8s::events`]).
    #[must_use]
    pub fn with_events(mut self, events: Events) -> Self {
        self.explain.events = events;
        self
    }

    /// Writes only while the election behind `fence` says this replica
    /// leads in the epoch the write started in (see the module docs).
    #[must_use]
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// Lists our objects in `namespace` only (`None`: in all namespaces).
    #[must_use]
    pub fn in_namespace(mut self, namespace: Option<String>) -> Self {
        self.namespace = namespace;
        self
    }

    /// Attaches the drift checks, sharing their record of our objects.
    #[must_use]
    pub fn with_drift(mut self, view: DriftView) -> Self {
        self.record = view.record().clone();
        self.drift = Some(view);
        self
    }

    fn api(&self, namespace: &str) -> Api<DiscoveredService> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// What a write of `key` over `prior` reads of the record before it is
    /// planned ([`ServerFacts::gather`], then [`object_ops`]): read once,
    /// never asked while deciding (the record is locked around each read,
    /// not while a wanted object is built).
    fn server_facts(
        &self,
        key: &ServiceKey,
        desired: Option<&DesiredObjects<'_>>,
        prior: Prior,
    ) -> ServerFacts {
        let mut shards = self
            .wanted_shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let view = RecordView::new(self.record.mutex(), &mut shards);
        ServerFacts::gather(key, &self.naming, desired, prior, &view)
    }

    /// Sends the requests of one write of `key` in order (each fenced by
    /// `token`); stops at the first failure. `repair`: the write repairs
    /// drift (an object of a service without source is then an orphan).
    async fn execute(
        &self,
        token: FenceToken,
        key: &ServiceKey,
        plan: ObjectPlan,
        built: &[DiscoveredService],
        repair: bool,
    ) -> Result<Option<String>> {
        // The uid of the last object applied: shard 0 comes last, and its uid
        // is the one Events about the service point at.
        let mut uid = None;
        for ((ns, name), owner) in &plan.left_alone {
            tracing::info!(service = %key, object = %format!("{ns}/{name}"), %owner, "not ours: not deleted");
        }
        for op in plan.ops {
            match op {
                ObjectOp::Apply { index, .. } => {
                    // `built` is `DesiredObjects::build` of the plan's
                    // `applied()`: every index it can build is there.
                    if let Some(obj) = built.iter().find(|o| shard_of(o).0 == index) {
                        uid = self.write_one(token, key, obj).await?;
                    }
                }
                ObjectOp::Delete((ns, name), why) => {
                    let object = format!("{ns}/{name}");
                    match why {
                        DeleteWhy::Surplus => {
                            tracing::info!(service = %key, %object, "deleting surplus shard");
                        }
                        DeleteWhy::Stray => {
                            tracing::info!(service = %key, %object, "deleting stray object");
                        }
                        DeleteWhy::Gone => {}
                    }
                    let removed = self.delete_one(token, &ns, &name).await?;
                    let orphan = match why {
                        DeleteWhy::Stray => Some(false),
                        DeleteWhy::Gone if repair => Some(true),
                        _ => None,
                    };
                    if let (true, Some(no_source)) = (removed, orphan) {
                        self.explain.orphan_deleted(key, &ns, &name, no_source);
                    }
                }
            }
        }
        Ok(uid)
    }

    /// Applies one object (spec and status in one request).
    async fn write_one(
        &self,
        token: FenceToken,
        key: &ServiceKey,
        obj: &DiscoveredService,
    ) -> Result<Option<String>> {
        let ns = obj.metadata.namespace.clone().unwrap_or_default();
        let name = obj.metadata.name.clone().unwrap_or_default();
        // Without force first: an apply over fields someone else set to other
        // values is refused (409) instead of taking them over. That is how an
        // object created by another instance or by hand since our cache last
        // looked is never overwritten; our own object edited by hand is
        // then applied again with force (the repair).
        let mut pp = PatchParams::apply(&self.naming.field_manager());
        // The stamp `apply` put on the object may be stale, or must go (an
        // older CRD refused it: `crate::write::generation`).
        let want = self
            .stamping
            .on()
            .then(|| self.record.lock().next_generation(&ns, &name));
        let mut obj = Cow::Borrowed(obj);
        if stamped_generation(&obj) != want {
            stamp_generation(obj.to_mut(), want);
        }
        // Which request follows which answer is `answer::next`'s; this loop
        // only builds and sends them.
        let mut sending = Sending::first(want.is_some(), obj.spec.shard.is_none());
        let mut one_of_one: Option<DiscoveredService> = None;
        let got = loop {
            let body = one_of_one.as_ref().unwrap_or(&obj);
            let answer = self
                .patch_answer(token, &ns, &name, &pp, &Patch::Apply(body))
                .await;
            let class = match &answer {
                Ok(_) => Answer::Applied,
                Err(Error::Kube(kube::Error::Api(s))) => classify(s.code, &s.message),
                Err(_) => Answer::Failed,
            };
            match answer::next(sending, class) {
                Next::Done | Next::Fail => break answer?,
                Next::Unstamped => {
                    if self.stamping.refused() {
                        tracing::warn!(object = %format!("{ns}/{name}"), "the installed DiscoveredService CRD does not declare status.observedGeneration (older than this controller): writing without it; update the CRD (crds/discoveredservices.yaml; helm upgrade does it)");
                    }
                    stamp_generation(obj.to_mut(), None);
                    if let Some(o) = one_of_one.as_mut() {
                        stamp_generation(o, None);
                    }
                    sending.stamped = false;
                }
                Next::OneOfOne => {
                    // The service fits one object again, but someone else
                    // co-owns part of `spec.shard`: without our fields the
                    // rest is invalid. Every node as the one shard of one
                    // first (readers take shard 0 alone, whole); the merge
                    // patch below removes the field.
                    tracing::info!(service = %key, object = %name, "service fits one object again and someone else co-owns its shard field: written as one shard of one first");
                    let mut o = obj.clone().into_owned();
                    o.spec.shard = Some(Shard {
                        index: 0,
                        count: 1,
                        versions: Vec::new(),
                    });
                    o.metadata
                        .labels
                        .get_or_insert_default()
                        .insert(LABEL_SHARD.to_string(), "0".to_string());
                    one_of_one = Some(o);
                    sending.one_of_one = true;
                }
                Next::AskOwner => {
                    // Without force first: an apply over fields someone else
                    // set to other values is refused (409) instead of taking
                    // them over, so an object created by another instance or
                    // by hand since the record last looked is never
                    // overwritten; our own object edited by hand is applied
                    // again with force (the repair).
                    let owner = self.owner_on_server(&ns, &name).await?;
                    let Some(forced) = answer::after_owner(sending, &owner) else {
                        return Err(Error::NameTaken {
                            object: format!("{ns}/{name}"),
                            owner,
                        });
                    };
                    sending = forced;
                    pp = pp.force();
                }
            }
        };
        let obj = &*obj;
        // Port keys someone else added survive a server-side apply (we do not
        // own them), and so does the `shard` field of a service that fits one
        // object again where someone else co-owns part of it (an apply by a
        // version before instances, `crd::LEGACY_FIELD_MANAGER`): removed by
        // a merge patch after the apply, which already wrote every node.
        let left = answer::leftovers(
            |k| obj.spec.ports.contains_key(k),
            got.spec.ports.keys(),
            sending.unsharded,
            got.spec.shard.is_some(),
        );
        let got = if left.is_empty() {
            got
        } else {
            let mut body = serde_json::json!({"spec": {}});
            if !left.ports.is_empty() {
                tracing::info!(service = %key, object = %name, ports = ?left.ports, "removing port keys added by someone else");
                let nulls: serde_json::Map<String, serde_json::Value> = left
                    .ports
                    .iter()
                    .map(|k| (k.clone(), serde_json::Value::Null))
                    .collect();
                body["spec"]["ports"] = nulls.into();
            }
            if left.shard {
                tracing::info!(service = %key, object = %name, "service fits one object again: removing the shard field someone else co-owns");
                body["spec"]["shard"] = serde_json::Value::Null;
            }
            let mpp = PatchParams {
                field_manager: Some(self.naming.drift_field_manager()),
                ..PatchParams::default()
            };
            self.patch_answer(token, &ns, &name, &mpp, &Patch::Merge(&body))
                .await?
        };
        let got = self.settle_generation(token, key, obj, &pp, got).await?;
        self.note_written(&ns, &name, &got);
        Ok(got.metadata.uid)
    }

    /// Makes `obj`'s `observedGeneration` equal the generation the API
    /// server answered (`got`): at most two more applies of the same object
    /// with the corrected stamp ([`generation_fix`] says why two are
    /// enough). Only needed when the remembered generation was wrong:
    /// someone else wrote the object, it was recreated, or a merge patch of
    /// this write (foreign port keys, a co-owned shard field) bumped it.
    async fn settle_generation(
        &self,
        token: FenceToken,
        key: &ServiceKey,
        obj: &DiscoveredService,
        pp: &PatchParams,
        mut got: Written,
    ) -> Result<Written> {
        let ns = obj.metadata.namespace.as_deref().unwrap_or_default();
        let name = obj.metadata.name.as_deref().unwrap_or_default();
        let mut sent = stamped_generation(obj);
        if sent.is_none() {
            // Written without the stamp (an older CRD): nothing to settle.
            return Ok(got);
        }
        for _ in 0..2 {
            let Some(stamp) = generation_fix(sent, got.metadata.generation) else {
                return Ok(got);
            };
            tracing::debug!(service = %key, object = %name, ?sent, generation = ?got.metadata.generation, ?stamp, "correcting observedGeneration");
            let mut again = obj.clone();
            stamp_generation(&mut again, stamp);
            got = self
                .patch_answer(token, ns, name, pp, &Patch::Apply(&again))
                .await?;
            sent = stamp;
        }
        if generation_fix(sent, got.metadata.generation).is_some() {
            // Someone keeps writing the object: drift correction takes over.
            tracing::warn!(service = %key, object = %format!("{ns}/{name}"), ?sent, generation = ?got.metadata.generation, "observedGeneration could not be settled: the object changed between our writes");
        }
        Ok(got)
    }

    /// Whose the object `ns/name` on the API server is. A LIST by name (the
    /// `list` the role already grants; a GET would need one more verb),
    /// decoded lean; gone meanwhile is an error (the write is retried).
    async fn owner_on_server(&self, ns: &str, name: &str) -> Result<Owner> {
        let api: Api<Lean> = Api::namespaced(self.client.clone(), ns);
        let lp = ListParams::default().fields(&format!("metadata.name={name}"));
        let Some(obj) = api.list(&lp).await?.items.into_iter().next() else {
            return Err(Error::Kube(kube::Error::Api(Box::new(
                kube::core::Status::failure(
                    &format!("{ns}/{name} was deleted while being written"),
                    "NotFound",
                )
                .with_code(404),
            ))));
        };
        Ok(self.naming.owner_of_meta(&obj.into_inner().metadata))
    }

    /// PATCHes `ns/name` and decodes only what a write needs from the answer
    /// ([`Written`]), not the whole object: decoding the returned object
    /// (nodes, managedFields) was the biggest CPU cost of a write after the
    /// request itself. Sends nothing when the write's epoch is over.
    async fn patch_answer<P: serde::Serialize + std::fmt::Debug>(
        &self,
        token: FenceToken,
        ns: &str,
        name: &str,
        pp: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<Written> {
        self.fence.check(token)?;
        let url = DiscoveredService::url_path(&(), Some(ns));
        let mut req = kube::core::Request::new(url)
            .patch(name, pp, patch)
            .map_err(kube::Error::BuildRequest)?;
        req.extensions_mut().insert("patch");
        Ok(self
            .fence
            .send(token, self.client.request::<Written>(req))
            .await??)
    }

    /// Records the resourceVersion of our write of `ns/name` (for drift)
    /// and its generation.
    fn note_written(&self, ns: &str, name: &str, got: &Written) {
        self.record
            .lock()
            .written(ns, name, got.resource_version(), got.metadata.generation);
    }

    /// Deletes `ns/name`; absent is success (`false`: there was nothing to
    /// delete). Sends nothing when the write's epoch is over.
    async fn delete_one(&self, token: FenceToken, ns: &str, name: &str) -> Result<bool> {
        self.fence.check(token)?;
        let api = self.api(ns);
        let res = self
            .fence
            .send(token, api.delete(name, &DeleteParams::default()))
            .await?;
        self.record.lock().removed(ns, name);
        match res {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

impl From<NameTaken> for Error {
    fn from(t: NameTaken) -> Self {
        let (ns, name) = t.object;
        Error::NameTaken {
            object: format!("{ns}/{name}"),
            owner: t.owner,
        }
    }
}

/// Objects per page of our lists.
const PAGE: u32 = crate::k8s::client::LIST_PAGE_SIZE;

pub use kube_discovery_client::list::list_managed;
use kube_discovery_client::list::{Listed, for_each_in};

pub use kube_discovery_core::write_plan::record::{Found, FoundShard, versions_of};

impl Sink for KubeSink {
    /// Reads our objects page by page, decoded lean (`drift::Lean`: no
    /// nodes, managedFields, annotations or status), and keeps only
    /// [`Found`] of each, never the whole list (BENCHMARKS.md, issue 6: the
    /// start-up list folded page by page).
    async fn list_versions(&self) -> Result<Vec<(ServiceKey, Held)>> {
        let ticket = self.record.lock().list_begins();
        let mut found = Found::default();
        let mut listing = Listing::default();
        // Every DiscoveredService, not only labelled ones: a hand-made object
        // holding a name we need must be seen before the first write.
        for_each_in(
            &self.client,
            self.namespace.as_deref(),
            None,
            PAGE,
            |listed: Listed<Lean>| {
                let lean = match listed {
                    Listed::Object(lean) => lean,
                    Listed::Restart => {
                        found = Found::default();
                        listing = Listing::default();
                        return;
                    }
                };
                let ds = lean.into_inner();
                match self.naming.owner_of_meta(&ds.metadata) {
                    Owner::Us => {
                        let mut ds = ds;
                        let labelled = ds
                            .metadata
                            .labels
                            .as_ref()
                            .is_some_and(|l| l.contains_key(LABEL_INSTANCE));
                        if !labelled {
                            // Written before instances existed (or the label
                            // was removed): rewritten once, which stamps it.
                            ds.spec.version.clear();
                        }
                        if let Some(g) = ds.metadata.generation {
                            if stamped_generation(&ds) != Some(g) {
                                // Written by a version without the stamp,
                                // or changed since our last write: rewritten
                                // once, which stamps it.
                                ds.spec.version.clear();
                            }
                            let ns = ds.metadata.namespace.clone().unwrap_or_default();
                            let name = ds.metadata.name.clone().unwrap_or_default();
                            listing.ours((ns, name), g);
                        }
                        found.add(&ds);
                        if shard_of(&ds).0 == 0
                            && let Some(st) = ds.status.take()
                        {
                            listing.conditions(&key_of(&ds), &st.conditions);
                        }
                    }
                    other => {
                        let ns = ds.metadata.namespace.clone().unwrap_or_default();
                        let name = ds.metadata.name.clone().unwrap_or_default();
                        listing.foreign((ns, name), other);
                    }
                }
            },
        )
        .await?;
        if listing.foreign_len() > 0 {
            tracing::info!(
                objects = listing.foreign_len(),
                instance = %self.naming.instance,
                "DiscoveredServices of other instances or made by hand: left alone"
            );
        }
        let held: Vec<(ServiceKey, Held)> = found
            .versions()
            .map(|(key, (version, shards))| (key, Held { version, shards }))
            .collect();
        for (key, h) in &held {
            listing.service(key, h);
        }
        self.record.lock().listed(ticket, listing);
        Ok(held)
    }

    fn record(&self) -> SharedRecord {
        self.record.clone()
    }

    async fn apply(&self, svc: Arc<ServiceNodes>, prior: Prior, epoch: u64) -> Result<u32> {
        let token = self.fence.begin_in(epoch)?;
        let previous = self.record.lock().conditions(&svc.key);
        let desired =
            DesiredObjects::new(&svc, &self.naming).at(&previous, &Time(jiff::Timestamp::now()));
        // Decided from names and versions; then only the objects sent are
        // built (one change in a big service: its shard and shard 0).
        let facts = self.server_facts(&svc.key, Some(&desired), prior);
        let plan = object_ops(&svc.key, &self.naming, Some(&desired), prior, &facts)?;
        let mut objs = desired.build(&plan.applied());
        if self.stamping.on() {
            let record = self.record.lock();
            for o in &mut objs {
                let want = record.next_generation(
                    o.metadata.namespace.as_deref().unwrap_or_default(),
                    o.metadata.name.as_deref().unwrap_or_default(),
                );
                stamp_generation(o, Some(want));
            }
        }
        let uid = self
            .execute(token, &svc.key, plan, &objs, prior.repair)
            .await?;
        // Shard 0 (or the one object) says what the service's conditions
        // are; a repair that found it intact did not build it.
        let first = match objs.iter().find(|o| shard_of(o).0 == 0) {
            Some(o) => Some(std::borrow::Cow::Borrowed(o)),
            None => desired.object(0).map(std::borrow::Cow::Owned),
        };
        if let Some(first) = first {
            self.explain
                .written(&svc.key, &first, &previous, uid, prior.repair);
            let conditions = first.status.as_ref().map(|s| s.conditions.as_slice());
            self.record
                .lock()
                .conditions_written(&svc.key, conditions.unwrap_or_default());
        }
        Ok(desired.len())
    }

    async fn delete(&self, key: ServiceKey, prior: Prior, epoch: u64) -> Result<()> {
        let token = self.fence.begin_in(epoch)?;
        let facts = self.server_facts(&key, None, prior);
        let plan = object_ops(&key, &self.naming, None, prior, &facts)?;
        self.execute(token, &key, plan, &[], prior.repair).await?;
        self.record.lock().service_removed(&key);
        Ok(())
    }

    fn drift_facts(&self, key: &ServiceKey, desired: Option<&ServiceNodes>) -> DriftFacts {
        match &self.drift {
            Some(v) => v.facts(key, desired),
            None => DriftFacts::unwatched(),
        }
    }

    fn failing(&self, key: &ServiceKey, desired: Option<&ServiceNodes>, error: &Error) {
        let (reason, note) = match error {
            Error::NameTaken { object, owner } => (
                "NameTaken",
                format!(
                    "{key}: the DiscoveredService {object} belongs to {owner}; left alone, this service is not published by instance {:?}{}",
                    self.naming.instance,
                    if matches!(owner, Owner::Instance(_)) {
                        " (unready until then; if that instance was renamed to this one, list it in kube_discovery.adopt_instances)"
                    } else {
                        ""
                    }
                ),
            ),
            e => (
                "WriteFailed",
                format!(
                    "{key}: writing its DiscoveredService failed ({}): {e}; retried with backoff",
                    e.metric_label()
                ),
            ),
        };
        let owner_uid = desired.and_then(|d| d.owner_uid.clone());
        self.explain.events.emit(
            crate::k8s::events::service_target(key, owner_uid, &self.naming),
            crate::k8s::events::Report {
                warning: true,
                reason,
                action: "Write",
                note,
            },
        );
    }
}

#[cfg(test)]
mod tests;
