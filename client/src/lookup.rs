//! [`lookup`]: `[id/]ns/name:port` against DiscoveredServices, the one
//! answer every reader gives (the resolver, `kube-discovery nodes`,
//! `kube-discovery render --nodes`, the syncs). Only objects that pass the
//! [`ReaderRule`] count ([`accept`]): a DiscoveredService whose namespace,
//! name or labels disagree with its spec (a hand-made one in another
//! namespace claiming `default/web`) adds no node; of a big service only the
//! shards that form one version count (`crd::consistent_shards`).

use kube::ResourceExt;
use kube_discovery_core::crd::{
    DiscoveredService, Incomplete, ObjectNaming, ReaderRule, ShardHead, consistent_shards,
};
use kube_discovery_core::model::sort_nodes;
use kube_discovery_core::{Node, NodeQuery};

/// The rule for a controller writing with `namespace_mode: fixed` into
/// `fixed_namespace` (`Some`), or with `namespace_mode: source` (`None`),
/// counting only the objects of the installation `instance` (`None`: of
/// any): what the `--fixed-namespace` and `--instance` flags of
/// `kube-discovery nodes` and `sync` give.
pub fn reader_rule(fixed_namespace: Option<&str>, instance: Option<&str>) -> ReaderRule {
    ReaderRule::new(fixed_namespace.map_or_else(ObjectNaming::source, ObjectNaming::fixed))
        .for_instance(instance.map(str::to_string))
}

/// Whether `ds` counts under `rule` ([`ReaderRule::check`]). A refused
/// object is logged as a warning naming it and the disagreement, and skipped.
pub fn accept(ds: &DiscoveredService, rule: &ReaderRule) -> bool {
    match rule.check(ds) {
        Ok(_) => true,
        Err(why) => {
            let dsvc = format!("{}/{}", ds.namespace().unwrap_or_default(), ds.name_any());
            tracing::warn!(%dsvc, "ignoring DiscoveredService {dsvc}: {why}");
            false
        }
    }
}

/// Resolves `query` against DiscoveredServices: the nodes of the port, merged
/// over the shards of the service and sorted; `Ok(None)` when the service or
/// the port is unknown (`Ok(Some(vec![]))`: known port with no ready node).
/// Objects claiming the service that `rule` refuses are skipped
/// ([`accept`]).
///
/// Of a big service only shard 0 and the shards whose version shard 0's
/// manifest lists are taken ([`consistent_shards`], the reader rule): while
/// the controller rewrites a shard, this is [`Incomplete`] (read again, or
/// keep the previous answer, as [`crate::NodesResolver`] does), never a mix
/// of two versions.
pub fn lookup<'a>(
    objects: impl IntoIterator<Item = &'a DiscoveredService>,
    query: &NodeQuery,
    rule: &ReaderRule,
) -> Result<Option<Vec<Node>>, Incomplete> {
    let mine: Vec<&DiscoveredService> = objects
        .into_iter()
        .filter(|d| {
            d.spec.cluster == query.cluster
                && d.spec.source_namespace == query.namespace
                && d.spec.source_name == query.name
                && accept(d, rule)
        })
        .collect();
    if mine.is_empty() {
        return Ok(None);
    }
    let heads: Vec<ShardHead<'_>> = mine.iter().map(|d| ShardHead::of(d)).collect();
    let (take, _legacy) = consistent_shards(&heads)?;
    let shards: Vec<&DiscoveredService> = take.iter().map(|i| mine[*i]).collect();
    // A port key of any shard (shard 0 carries them all, older objects
    // only those they hold nodes of), else a Service-port alias
    // (`spec.aliases`, the same map on every shard): the rule of
    // `PortExtras::resolve`.
    let key = if shards
        .iter()
        .any(|d| d.spec.ports.contains_key(&query.port))
    {
        Some(query.port.as_str())
    } else {
        shards[0].spec.aliases.get(&query.port).map(String::as_str)
    };
    let mut found = false;
    let mut nodes = Vec::new();
    for ds in &shards {
        if let Some(n) = key.and_then(|k| ds.spec.ports.get(k)) {
            found = true;
            nodes.extend(n.iter().cloned());
        }
    }
    if !found {
        return Ok(None);
    }
    sort_nodes(&mut nodes);
    nodes.dedup_by(|b, a| a.host == b.host && a.port == b.port);
    Ok(Some(nodes))
}

#[cfg(test)]
mod tests {
    //! The lookups of what `kube_discovery_core::render` produces (moved here
    //! with `lookup` from the core's render tests).

    use super::*;
    use kube_discovery_core::crd::desired_objects;
    use kube_discovery_core::render::{RenderOptions, render};
    use kube_discovery_core::{PortMap, ServiceKey, ServiceNodes, SourceKind, parse_service_name};
    use serde_json::{Value, json};

    /// [`super::lookup`] of objects that form one version.
    fn lookup<'a>(
        objects: impl IntoIterator<Item = &'a DiscoveredService>,
        query: &NodeQuery,
        rule: &ReaderRule,
    ) -> Option<Vec<Node>> {
        super::lookup(objects, query, rule).expect("one consistent version")
    }

    /// `obj` (unsharded) as two shards the way the controller writes them:
    /// the first node of every port in shard 1, the rest in shard 0.
    fn in_two_shards(obj: &DiscoveredService) -> Vec<DiscoveredService> {
        use kube_discovery_core::crd::{LABEL_SHARD, Shard, shard_name};
        let mut zero = obj.clone();
        let mut one = obj.clone();
        for (port, nodes) in zero.spec.ports.iter_mut() {
            let first: Vec<Node> = nodes.drain(..1.min(nodes.len())).collect();
            one.spec.ports.insert(port.clone(), first);
        }
        one.spec.version = "one".into();
        for (o, index) in [(&mut zero, 0u32), (&mut one, 1)] {
            o.metadata.name = Some(shard_name(&obj.name_any(), index));
            o.metadata
                .labels
                .get_or_insert_default()
                .insert(LABEL_SHARD.into(), index.to_string());
            o.spec.shard = Some(Shard {
                index,
                count: 2,
                versions: if index == 0 {
                    vec!["zero".into(), "one".into()]
                } else {
                    Vec::new()
                },
            });
        }
        vec![zero, one]
    }

    fn plat_dev() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "plat-dev", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": "10.5.10.109"}, {"ip": "10.5.10.110"}],
                         "ports": [{"name": "port", "port": 3306}]}]
        })
    }

    fn web_slice(name: &str, ip: &str) -> Value {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}]
        })
    }

    #[test]
    fn reference_example_looks_up() {
        let out = render(&[plat_dev()], &RenderOptions::default()).unwrap();
        let q = parse_service_name("default/plat-dev:port").unwrap();
        assert_eq!(
            serde_json::to_value(lookup(&out, &q, &ReaderRule::default()).unwrap()).unwrap(),
            json!([{"host": "10.5.10.109", "port": 3306, "weight": 50},
                   {"host": "10.5.10.110", "port": 3306, "weight": 50}])
        );
        assert_eq!(
            lookup(
                &out,
                &parse_service_name("default/plat-dev:nope").unwrap(),
                &ReaderRule::default()
            ),
            None
        );
        assert_eq!(
            lookup(
                &out,
                &parse_service_name("default/other:port").unwrap(),
                &ReaderRule::default()
            ),
            None
        );
        assert_eq!(
            lookup(
                &out,
                &parse_service_name("c1/default/plat-dev:port").unwrap(),
                &ReaderRule::default()
            ),
            None
        );
    }

    #[test]
    fn merged_slices_look_up_sorted() {
        let out = render(
            &[
                web_slice("web-a", "10.0.0.2"),
                web_slice("web-b", "10.0.0.1"),
            ],
            &RenderOptions::default(),
        )
        .unwrap();
        let nodes = lookup(
            &out,
            &parse_service_name("shop/web:http").unwrap(),
            &ReaderRule::default(),
        )
        .unwrap();
        assert_eq!(
            nodes.iter().map(|n| n.host.as_str()).collect::<Vec<_>>(),
            vec!["10.0.0.1", "10.0.0.2"]
        );
    }

    #[test]
    fn flattened_lists_and_port_numbers_look_up() {
        let list = json!({"apiVersion": "v1", "kind": "EndpointsList", "items": [
            {"metadata": {"name": "a"}, "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]}
        ]});
        let out = render(&[list], &RenderOptions::default()).unwrap();
        let q = parse_service_name("default/a:80").unwrap();
        assert!(lookup(&out, &q, &ReaderRule::default()).is_some());
    }

    /// Service-port aliases resolve to the nodes of the port key they name,
    /// over all shards; a port key of the same text wins; unknown stays None.
    #[test]
    fn service_port_aliases_resolve_over_shards() {
        let svc = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": "web"}]}});
        let out = render(
            &[
                svc,
                web_slice("web-a", "10.0.0.2"),
                web_slice("web-b", "10.0.0.1"),
            ],
            &RenderOptions {
                convert: kube_discovery_core::ConvertOptions {
                    service_port_aliases: true,
                    ..Default::default()
                },
                ..RenderOptions::default()
            },
        )
        .unwrap();
        assert_eq!(out[0].spec.aliases["80"], "http");
        let get = |objs: &[DiscoveredService], p: &str| {
            lookup(
                objs,
                &parse_service_name(&format!("shop/web:{p}")).unwrap(),
                &ReaderRule::default(),
            )
        };
        let by_name = get(&out, "http").unwrap();
        assert_eq!(by_name.len(), 2);
        assert_eq!(get(&out, "80"), Some(by_name.clone()));
        assert_eq!(get(&out, "81"), None);
        // Split over two shards (each carries the alias map): still merged.
        let shards = in_two_shards(&out[0]);
        assert_eq!(shards[1].spec.ports["http"].len(), 1);
        assert_eq!(get(&shards, "80"), Some(by_name));
        // A real key "80" wins over the alias.
        let mut real = out[0].clone();
        real.spec.ports.insert("80".into(), Vec::new());
        assert_eq!(get(&[real], "80"), Some(Vec::new()));
    }

    #[test]
    fn multi_cluster_names_look_up() {
        let cfg = kube_discovery_core::parse_config(
            "discovery: {kubernetes: [{id: c1, kubeconfig: /k, namespace_selector: {equal: shop}}]}\n\
             kube_discovery: {index_port_numbers: true, sinks: {discoveredservices: {namespace_mode: fixed, namespace: kd}}}",
            &|_| None,
        )
        .unwrap();
        let opts = RenderOptions {
            source: Some(SourceKind::EndpointSlice),
            ..RenderOptions::from_config(&cfg, "c1").unwrap()
        };
        let out = render(&[web_slice("web-a", "10.0.0.1")], &opts).unwrap();
        let q = parse_service_name("c1/shop/web:8080").unwrap();
        assert!(lookup(&out, &q, &ReaderRule::new(opts.naming.clone())).is_some());
        // The default rule expects source naming: the object in `kd` is refused.
        assert!(lookup(&out, &q, &ReaderRule::default()).is_none());
    }

    /// The reader rule of big services: shard 0's manifest decides which
    /// shards count; a shard of another version (being rewritten) or a
    /// missing one is `Incomplete`, never merged.
    #[test]
    fn lookup_takes_the_shards_shard_zero_lists_and_never_a_mix() {
        let out = render(&[plat_dev()], &RenderOptions::default()).unwrap();
        let shards = in_two_shards(&out[0]);
        let q = parse_service_name("default/plat-dev:port").unwrap();
        let all = lookup(&shards, &q, &ReaderRule::default()).unwrap();
        assert_eq!(
            all.iter().map(|n| n.host.as_str()).collect::<Vec<_>>(),
            vec!["10.5.10.109", "10.5.10.110"]
        );
        let mut rewritten = shards.clone();
        rewritten[1].spec.version = "newer".into();
        rewritten[1].spec.ports.get_mut("port").unwrap()[0].host = "10.9.9.9".into();
        assert_eq!(
            super::lookup(&rewritten, &q, &ReaderRule::default()),
            Err(Incomplete::Mismatch {
                index: 1,
                expected: "one".into(),
                actual: "newer".into()
            })
        );
        assert_eq!(
            super::lookup(&shards[..1], &q, &ReaderRule::default()),
            Err(Incomplete::Missing { index: 1, count: 2 })
        );
        assert_eq!(
            super::lookup(&shards[1..], &q, &ReaderRule::default()),
            Err(Incomplete::NoShardZero)
        );
        // Another service being rewritten does not matter.
        let other = parse_service_name("default/other:port").unwrap();
        assert_eq!(
            super::lookup(&rewritten, &other, &ReaderRule::default()),
            Ok(None)
        );
    }

    /// Readers get the whole, sorted list of a service the controller splits
    /// into several objects back (moved from the core's crd tests).
    #[test]
    fn lookup_merges_the_shards_of_a_big_service() {
        let mut ports = PortMap::new();
        for (name, port) in [("http", 8080), ("grpc", 9090), ("metrics", 9100)] {
            let mut nodes: Vec<Node> = (0..20_000)
                .map(|i| {
                    Node::new(
                        format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                        port,
                        100,
                    )
                })
                .collect();
            sort_nodes(&mut nodes);
            ports.insert(name.to_string(), nodes);
        }
        let s = ServiceNodes::new(
            ServiceKey::new("", "shop", "big"),
            SourceKind::EndpointSlice,
            ports,
            Some("uid-1".into()),
        );
        let objs = desired_objects(&s, &ObjectNaming::source());
        assert!(objs.len() > 1, "{} objects", objs.len());
        let q = parse_service_name("shop/big:grpc").unwrap();
        assert_eq!(
            lookup(&objs, &q, &ReaderRule::default()).as_ref(),
            s.ports.get("grpc")
        );
    }

    /// `default/web:http` at 10.0.0.1 as the controller writes it, and a
    /// copy with the node 6.6.6.6 that `spoof` changes.
    fn real_and_spoof(spoof: impl Fn(&mut DiscoveredService)) -> Vec<DiscoveredService> {
        let s = ServiceNodes::new(
            ServiceKey::new("", "default", "web"),
            SourceKind::EndpointSlice,
            PortMap::from([("http".to_string(), vec![Node::new("10.0.0.1", 8080, 1)])]),
            None,
        );
        let real = desired_objects(&s, &ObjectNaming::source()).remove(0);
        let mut fake = real.clone();
        fake.spec
            .ports
            .insert("http".into(), vec![Node::new("6.6.6.6", 8080, 1)]);
        spoof(&mut fake);
        vec![real, fake]
    }

    fn hosts(objs: &[DiscoveredService], rule: &ReaderRule) -> Option<Vec<String>> {
        let q = parse_service_name("default/web:http").unwrap();
        lookup(objs, &q, rule).map(|n| n.into_iter().map(|n| n.host.to_string()).collect())
    }

    #[test]
    fn a_spoof_in_another_namespace_adds_no_node() {
        let objs = real_and_spoof(|o| o.metadata.namespace = Some("evil".into()));
        assert_eq!(
            hosts(&objs, &ReaderRule::default()),
            Some(vec!["10.0.0.1".into()])
        );
        // Alone it does not even make the service known.
        assert_eq!(hosts(&objs[1..], &ReaderRule::default()), None);
        // Fixed mode: only the configured namespace counts.
        let fixed = ReaderRule::new(ObjectNaming::fixed("kd"));
        let objs = real_and_spoof(|o| {
            o.metadata.namespace = Some("kd".into());
            o.metadata.name = Some("default.web".into());
        });
        assert_eq!(hosts(&objs, &fixed), Some(vec!["6.6.6.6".into()]));
    }

    #[test]
    fn a_spoof_under_another_name_adds_no_node() {
        for name in ["web-2", "web.1", "evil"] {
            let objs = real_and_spoof(|o| o.metadata.name = Some(name.into()));
            assert_eq!(
                hosts(&objs, &ReaderRule::default()),
                Some(vec!["10.0.0.1".into()]),
                "{name}"
            );
        }
    }

    #[test]
    fn a_spoof_with_labels_of_another_service_adds_no_node() {
        use kube_discovery_core::crd::LABEL_SERVICE_NAME;
        // Named and placed as `default/web` but labelled for `default/api`
        // (what a label-selecting reader of `api` would pick up).
        let objs = real_and_spoof(|o| {
            o.metadata
                .labels
                .get_or_insert_default()
                .insert(LABEL_SERVICE_NAME.into(), "api".into());
        });
        assert_eq!(
            hosts(&objs, &ReaderRule::default()),
            Some(vec!["10.0.0.1".into()])
        );
        let objs = real_and_spoof(|o| o.metadata.labels = None);
        assert_eq!(
            hosts(&objs, &ReaderRule::default()),
            Some(vec!["10.0.0.1".into()])
        );
    }
}
