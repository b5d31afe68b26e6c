use super::*;
use crate::model::PortMap;

fn svc(cluster: &str, ns: &str, name: &str, uid: Option<&str>) -> ServiceNodes {
    let mut ports = PortMap::new();
    ports.insert(
        "port".into(),
        vec![
            Node::new("10.5.10.109", 3306, 50),
            Node::new("10.5.10.110", 3306, 50),
        ],
    );
    ServiceNodes::new(
        ServiceKey::new(cluster, ns, name),
        SourceKind::Endpoints,
        ports,
        uid.map(str::to_string),
    )
}

/// Set `UPDATE_CRDS=1` to rewrite the file after an intended change.
#[test]
fn crd_file_is_up_to_date() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../crds/discoveredservices.yaml"
    );
    let want = crd_yaml();
    if std::env::var("UPDATE_CRDS").as_deref() == Ok("1") {
        std::fs::write(path, &want).unwrap();
    }
    let have = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!("cannot read {path}: {e}; run with UPDATE_CRDS=1 to generate it")
    });
    assert!(
        have == want,
        "{path} is stale; regenerate it with `UPDATE_CRDS=1 cargo nextest run -p kube-discovery-core crd_file_is_up_to_date`"
    );
}

#[test]
fn crd_has_names_columns_and_status_but_no_status_subresource() {
    let crd = definition();
    assert_eq!(crd.spec.group, GROUP);
    assert_eq!(crd.spec.names.plural, "discoveredservices");
    assert_eq!(crd.spec.names.kind, "DiscoveredService");
    assert_eq!(crd.spec.names.short_names, Some(vec!["dsvc".to_string()]));
    assert_eq!(crd.spec.scope, "Namespaced");
    let v = &crd.spec.versions[0];
    assert_eq!(v.name, VERSION);
    assert_eq!(crd.spec.versions.len(), 1);
    // kube's derive adds the subresource; `definition` must remove it.
    assert!(
        DiscoveredService::crd().spec.versions[0]
            .subresources
            .is_some(),
        "kube-derive no longer adds a status subresource: simplify `definition`"
    );
    assert!(v.subresources.is_none(), "{:?}", v.subresources);
    // `status` stays in the schema as an ordinary field.
    let props = v
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .unwrap();
    assert!(props.contains_key("status"), "{:?}", props.keys());
    let cols: Vec<_> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| (c.name.as_str(), c.json_path.as_str()))
        .collect();
    assert_eq!(
        cols,
        vec![
            ("Ready", r#".status.conditions[?(@.type=="Ready")].status"#),
            ("Ports", ".status.ports"),
            ("Nodes", ".status.nodeCount"),
            ("Source", ".spec.source"),
            ("Age", ".metadata.creationTimestamp")
        ]
    );
    let yaml = crd_yaml();
    assert!(yaml.contains("sourceNamespace"));
    assert!(yaml.contains("lastSyncTime"));
    assert!(!yaml.contains("subresources"), "{yaml}");
}

#[test]
fn single_cluster_object_mirrors_source_with_owner() {
    let s = svc("", "default", "plat-dev", Some("uid-1"));
    let ds = desired_object(&s, &ObjectNaming::source());
    assert_eq!(ds.metadata.name.as_deref(), Some("plat-dev"));
    assert_eq!(ds.metadata.namespace.as_deref(), Some("default"));
    let owners = ds.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].name.as_str(),
            owners[0].uid.as_str()
        ),
        ("Service", "plat-dev", "uid-1")
    );
    let labels = ds.metadata.labels.unwrap();
    assert_eq!(labels[LABEL_SERVICE_NAMESPACE], "default");
    assert_eq!(labels[LABEL_SERVICE_NAME], "plat-dev");
    assert_eq!(labels[LABEL_CLUSTER], "");
    assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY);
    assert_eq!(ds.spec.service, "default/plat-dev");
    assert_eq!(ds.spec.version, s.version);
    assert_eq!(ds.spec.ports, s.ports);
    assert_eq!(
        key_of(&DiscoveredService {
            metadata: ObjectMeta::default(),
            spec: ds.spec,
            status: None
        }),
        s.key
    );
}

#[test]
fn no_owner_without_uid_or_across_namespaces_or_clusters() {
    let s = svc("", "default", "web", None);
    assert!(
        desired_object(&s, &ObjectNaming::source())
            .metadata
            .owner_references
            .is_none()
    );
    let s = svc("", "default", "web", Some("u"));
    assert!(
        desired_object(&s, &ObjectNaming::fixed("kd"))
            .metadata
            .owner_references
            .is_none()
    );
    let s = svc("c1", "default", "web", Some("u"));
    assert!(
        desired_object(&s, &ObjectNaming::source())
            .metadata
            .owner_references
            .is_none()
    );
}

#[test]
fn naming_table() {
    let k1 = ServiceKey::new("", "ns", "web");
    let k2 = ServiceKey::new("c1", "ns", "web");
    let src = ObjectNaming::source();
    let fixed = ObjectNaming::fixed("kd");
    assert_eq!(
        (src.namespace(&k1), src.name(&k1)),
        ("ns".into(), "web".into())
    );
    assert_eq!(
        (fixed.namespace(&k1), fixed.name(&k1)),
        ("kd".into(), "ns.web".into())
    );
    assert_eq!(
        (src.namespace(&k2), src.name(&k2)),
        ("ns".into(), "c1.web".into())
    );
    assert_eq!(
        (fixed.namespace(&k2), fixed.name(&k2)),
        ("kd".into(), "c1.ns.web".into())
    );
    let ds = desired_object(&svc("c1", "ns", "web", None), &src);
    assert_eq!(ds.metadata.labels.unwrap()[LABEL_CLUSTER], "c1");
    assert_eq!(ds.spec.service, "c1/ns/web");
}

#[test]
fn naming_is_collision_free_where_dashes_would_collide() {
    let fixed = ObjectNaming::fixed("kd");
    let a = fixed.name(&ServiceKey::new("", "a-b", "c"));
    let b = fixed.name(&ServiceKey::new("", "a", "b-c"));
    assert_ne!(a, b);
}

#[test]
fn naming_handles_any_length_deterministically() {
    let long = "x".repeat(300);
    let fixed = ObjectNaming::fixed("kd");
    let k = ServiceKey::new("c1", &long, &long);
    let n = fixed.name(&k);
    assert!(is_dns_name(&n), "{n}");
    assert!(n.len() <= 253);
    assert_eq!(n, fixed.name(&k));
    let k2 = ServiceKey::new("c1", &long, format!("{long}y"));
    assert_ne!(n, fixed.name(&k2));
    let odd = ObjectNaming::source().name(&ServiceKey::new("", "ns", "Bad_Name"));
    assert!(is_dns_name(&odd), "{odd}");
}

#[test]
fn label_values_are_valid() {
    assert_eq!(label_value("web"), "web");
    assert_eq!(label_value(""), "");
    let v = label_value(&"a".repeat(100));
    assert!(is_label_value(&v) && v.len() <= 63, "{v}");
    assert_ne!(v, label_value(&"a".repeat(101)));
}

#[test]
fn written_objects_carry_their_status() {
    let mut s = svc("", "default", "plat-dev", None);
    s.ports
        .insert("admin".into(), vec![Node::new("10.5.10.111", 9000, 1)]);
    let s = ServiceNodes::new(s.key.clone(), s.source, s.ports.clone(), None);
    let now = Time(jiff::Timestamp::UNIX_EPOCH);
    let written = desired_objects_at(&s, &ObjectNaming::source(), &[], &now);
    let plain = desired_objects(&s, &ObjectNaming::source());
    assert_eq!(written.len(), 1);
    assert!(plain[0].status.is_none());
    // Same object as compared/rendered, plus the status.
    let mut without = written[0].clone();
    let st = without.status.take().unwrap();
    assert_eq!(without, plain[0]);
    assert_eq!(st.node_count, 3);
    assert_eq!(st.ports, "admin,port");
    assert_eq!(st.last_sync_time, Some(now.clone()));
    assert_eq!(
        st.conditions,
        crate::crd::conditions::conditions(&s, &[], &now)
    );
    let c = &st.conditions[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        (
            "Ready",
            "True",
            crate::crd::conditions::ALL_PORTS_HAVE_NODES
        )
    );
    assert_eq!(c.message, "3 node(s) on port(s) admin, port");
    assert_eq!(c.last_transition_time, now);
    // A later write keeps the transition time of an unchanged condition.
    let later = Time(jiff::Timestamp::from_second(60).unwrap());
    let again = desired_objects_at(&s, &ObjectNaming::source(), &st.conditions, &later);
    let st2 = again[0].status.as_ref().unwrap();
    assert_eq!(st2.last_sync_time, Some(later));
    assert_eq!(st2.conditions[0].last_transition_time, now);
    // It serializes as a top-level `status` next to `spec` (one apply body).
    let json = serde_json::to_value(&written[0]).unwrap();
    assert_eq!(json["status"]["nodeCount"], 3);
    assert_eq!(json["status"]["ports"], "admin,port");
}

/// 20,000 endpoints x 3 ports: the nodes of every port, in order, over shards.
fn big(endpoints: usize) -> ServiceNodes {
    let mut ports = PortMap::new();
    for (name, port) in [("http", 8080), ("grpc", 9090), ("metrics", 9100)] {
        let mut nodes: Vec<Node> = (0..endpoints)
            .map(|i| {
                Node::new(
                    format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                    port,
                    100,
                )
            })
            .collect();
        crate::model::sort_nodes(&mut nodes);
        ports.insert(name.to_string(), nodes);
    }
    ServiceNodes::new(
        ServiceKey::new("", "shop", "big"),
        SourceKind::EndpointSlice,
        ports,
        Some("uid-1".into()),
    )
}

/// What a reader assembles: the node lists of every shard per port, sorted.
fn merged(objs: &[DiscoveredService]) -> PortMap {
    let mut out = PortMap::new();
    for o in objs {
        for (p, n) in &o.spec.ports {
            out.entry(p.clone()).or_default().extend(n.iter().cloned());
        }
    }
    for nodes in out.values_mut() {
        crate::model::sort_nodes(nodes);
    }
    out
}

#[test]
fn small_service_is_one_unsharded_object() {
    let s = svc("", "default", "plat-dev", Some("u"));
    let objs = desired_objects(&s, &ObjectNaming::source());
    assert_eq!(objs, vec![desired_object(&s, &ObjectNaming::source())]);
    assert_eq!(shard_of(&objs[0]), (0, 1));
    assert!(
        !objs[0]
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key(LABEL_SHARD)
    );
}

#[test]
fn big_service_is_split_under_the_limit_and_merges_back() {
    let s = big(20_000);
    let whole = serde_json::to_vec(&s.ports).unwrap().len();
    assert!(
        whole > 1_572_864,
        "the test service must not fit one object ({whole} bytes)"
    );
    let objs = desired_objects(&s, &ObjectNaming::source());
    let count = objs.len();
    assert!(
        count >= whole / MAX_OBJECT_PORTS_BYTES,
        "{count} shards for {whole} bytes"
    );
    for (i, o) in objs.iter().enumerate() {
        let i = u32::try_from(i).unwrap();
        let ports_len = serde_json::to_vec(&o.spec.ports).unwrap().len();
        assert!(
            ports_len <= MAX_OBJECT_PORTS_BYTES,
            "shard {i}: {ports_len} bytes"
        );
        assert!(serde_json::to_vec(o).unwrap().len() < 1_572_864);
        assert_eq!(shard_of(o), (i, u32::try_from(count).unwrap()));
        assert_eq!(
            o.metadata.name.as_deref(),
            Some(shard_name("big", i).as_str())
        );
        assert_eq!(
            o.metadata.labels.as_ref().unwrap()[LABEL_SHARD],
            i.to_string()
        );
        // Shard 0: the service's version and the manifest; others their own.
        let manifest = &objs[0].spec.shard.as_ref().unwrap().versions;
        assert_eq!(manifest.len(), count);
        if i == 0 {
            assert_eq!(o.spec.version, s.version);
        } else {
            assert_eq!(o.spec.version, manifest[i as usize]);
            assert!(o.spec.shard.as_ref().unwrap().versions.is_empty());
        }
        assert_eq!(
            o.metadata.owner_references.as_ref().unwrap()[0].uid,
            "uid-1"
        );
        assert!(o.spec.ports.values().all(|n| !n.is_empty()));
        for nodes in o.spec.ports.values() {
            assert!(nodes.is_sorted_by(|a, b| (&a.host, a.port) <= (&b.host, b.port)));
        }
        assert_eq!(key_of(o), s.key);
    }
    assert_eq!(merged(&objs), s.ports);
    // Per-object status counts that object's nodes; the conditions are
    // the whole service's, the same on every shard.
    let now = Time(jiff::Timestamp::UNIX_EPOCH);
    let written = desired_objects_at(&s, &ObjectNaming::source(), &[], &now);
    assert_eq!(written.len(), count);
    let mut total = 0;
    for (w, o) in written.iter().zip(&objs) {
        let st = w.status.as_ref().unwrap();
        let nodes: usize = o.spec.ports.values().map(Vec::len).sum();
        assert_eq!(st.node_count, i64::try_from(nodes).unwrap());
        assert_eq!(
            st.conditions[0].message,
            "60000 node(s) on port(s) grpc, http, metrics"
        );
        assert_eq!(w.spec, o.spec);
        total += st.node_count;
    }
    assert_eq!(total, 60_000);
}

/// The lazy objects ([`DesiredObjects`]) against an eager build written
/// out here from the shard rules (partition every node, version every
/// part from its own nodes): every shard built alone, in any order and
/// in pairs, is that object, status included; names and versions come
/// without building one. With and without the index's kept buckets, with
/// a port of few nodes (absent from most shards) and unsharded.
#[test]
fn lazy_objects_are_the_eager_build_one_shard_at_a_time() {
    use crate::model::SharedBuckets;
    use crate::model::version::{Buckets, PortsDigest};
    let now = Time(jiff::Timestamp::UNIX_EPOCH);
    let naming = ObjectNaming::source();
    let mut sparse = big(20_000);
    sparse.ports.insert(
        "admin".into(),
        vec![Node::new("10.0.0.3", 1, 1), Node::new("10.0.0.9", 1, 1)],
    );
    let sparse = ServiceNodes::new(sparse.key, sparse.source, sparse.ports, sparse.owner_uid);
    let mut kept = sparse.clone();
    kept.buckets = SharedBuckets(Some(std::sync::Arc::new(Buckets::of(&kept.ports))));
    let small = svc("", "default", "plat-dev", Some("u"));
    for (what, s, limit) in [
        ("sharded", &sparse, MAX_OBJECT_PORTS_BYTES),
        ("kept buckets", &kept, MAX_OBJECT_PORTS_BYTES),
        ("tiny limit", &small, 1),
        ("unsharded", &small, MAX_OBJECT_PORTS_BYTES),
    ] {
        let lazy = DesiredObjects::with_limit(s, &naming, limit).at(&[], &now);
        let count = lazy.len();
        // The eager build, from the rules.
        let want: Vec<DiscoveredService> = if count == 1 {
            let mut o = desired_object(s, &naming);
            let conditions = crate::crd::conditions::conditions(s, &[], &now);
            o.status = Some(object_status(&o, conditions, now.clone()));
            vec![o]
        } else {
            let parts = crate::crd::shards::partition(&s.ports, count);
            let versions: Vec<String> = parts
                .iter()
                .zip(0u32..)
                .map(|(p, i)| {
                    crate::crd::shards::shard_version(
                        i,
                        count,
                        s.source,
                        p,
                        &PortsDigest::of(p),
                        s.owner_uid.as_deref(),
                        &s.extras,
                    )
                })
                .collect();
            parts
                .into_iter()
                .zip(0u32..)
                .map(|(p, i)| {
                    let mut o = desired_object(s, &naming);
                    o.metadata.name = Some(shard_name("plat-dev", i))
                        .filter(|_| s.key.name == "plat-dev")
                        .or_else(|| Some(shard_name("big", i)));
                    o.metadata
                        .labels
                        .as_mut()
                        .unwrap()
                        .insert(LABEL_SHARD.into(), i.to_string());
                    o.spec.ports = p;
                    if i > 0 {
                        o.spec.version = versions[i as usize].clone();
                    }
                    o.spec.shard = Some(Shard {
                        index: i,
                        count,
                        versions: if i == 0 { versions.clone() } else { Vec::new() },
                    });
                    let conditions = crate::crd::conditions::conditions(s, &[], &now);
                    o.status = Some(object_status(&o, conditions, now.clone()));
                    o
                })
                .collect()
        };
        assert!(lazy.all() == want, "{what}");
        assert!(
            limit != MAX_OBJECT_PORTS_BYTES || desired_objects_at(s, &naming, &[], &now) == want,
            "{what}"
        );
        for (i, w) in (0u32..).zip(&want) {
            assert!(lazy.object(i).as_ref() == Some(w), "{what} {i}");
            assert_eq!(lazy.version(i), w.spec.version, "{what} {i}");
            assert_eq!(
                lazy.name(i),
                (
                    w.metadata.namespace.clone().unwrap(),
                    w.metadata.name.clone().unwrap()
                )
            );
            assert_eq!(lazy.is_later_shard(i), i > 0);
            // In pairs, shard 0 last (how a write sends them).
            let pair = lazy.build(&[i, 0]);
            assert!(pair == [w.clone(), want[0].clone()], "{what} {i}");
        }
        assert!(lazy.object(count).is_none());
        match what {
            "unsharded" => assert_eq!(count, 1),
            "tiny limit" => assert_eq!(count, 2),
            _ => {
                assert!(count >= 4, "{what}: {count}");
                // The sparse port sits in shard 0 (every key) and in
                // the shards of its nodes only.
                let with_admin = want
                    .iter()
                    .filter(|o| o.spec.ports.contains_key("admin"))
                    .count();
                assert!(with_admin <= 3, "{with_admin}");
            }
        }
    }
}

#[test]
fn tiny_limit_splits_by_node_and_shard_zero_keeps_every_port_key() {
    let mut s = svc("", "default", "plat-dev", None);
    s.ports.insert("admin".into(), Vec::new());
    let s = ServiceNodes::new(s.key.clone(), s.source, s.ports.clone(), None);
    let objs = desired_objects_with_limit(&s, &ObjectNaming::source(), 1);
    // Two nodes: the count stops at 2 (a node cannot be split).
    assert_eq!(objs.len(), 2, "{objs:#?}");
    assert_eq!(merged(&objs), s.ports);
    assert_eq!(
        objs[0].spec.ports.keys().collect::<Vec<_>>(),
        ["admin", "port"]
    );
}

/// What a reader assembles of `objs` under [`consistent_shards`].
fn assembled(objs: &[&DiscoveredService]) -> Result<PortMap, Incomplete> {
    let hs: Vec<ShardHead<'_>> = objs.iter().map(|o| ShardHead::of(o)).collect();
    let (take, legacy) = consistent_shards(&hs)?;
    assert!(!legacy);
    Ok(merged(
        &take.iter().map(|i| objs[*i].clone()).collect::<Vec<_>>(),
    ))
}

/// The shard count and the manifest: one endpoint more changes exactly
/// one shard `i > 0` (and shard 0, whose manifest lists it), wherever
/// it sorts; a reader takes a consistent set only.
#[test]
fn one_endpoint_more_changes_one_shard_and_shard_zero() {
    let s = big(20_000);
    let before = desired_objects(&s, &ObjectNaming::source());
    assert!(before.len() >= 4 && before.len().is_power_of_two());
    fn all(objs: &[DiscoveredService]) -> Vec<&DiscoveredService> {
        objs.iter().collect()
    }
    assert_eq!(assembled(&all(&before)).unwrap(), s.ports);
    for host in ["0.0.0.1", "10.0.0.0", "99.9.9.9", "10.0.0.1"] {
        // The endpoint on all three ports.
        let mut ports = s.ports.clone();
        for (port, nodes) in ports.iter_mut() {
            if host == "10.0.0.1" {
                // A removal.
                nodes.retain(|n| n.host != host);
            } else {
                let number = nodes[0].port;
                nodes.push(Node::new(host, number, 100));
            }
            crate::model::sort_nodes(nodes);
            assert!(!port.is_empty());
        }
        let t = ServiceNodes::new(s.key.clone(), s.source, ports, s.owner_uid.clone());
        let after = desired_objects(&t, &ObjectNaming::source());
        assert_eq!(after.len(), before.len());
        let changed: Vec<usize> = (0..after.len())
            .filter(|i| after[*i].spec != before[*i].spec)
            .collect();
        assert!(changed[0] == 0 && changed.len() <= 2, "{host}: {changed:?}");
        // Readers: the new set, the old set, and never the mixes.
        assert_eq!(assembled(&all(&after)).unwrap(), t.ports);
        if let [_, i] = changed[..] {
            // The changed shard written, shard 0 not yet.
            let mut mid = all(&before);
            mid[i] = &after[i];
            assert!(matches!(assembled(&mid), Err(Incomplete::Mismatch { .. })));
            // Shard 0 written, the changed shard not (or deleted).
            let mut mid = all(&after);
            mid[i] = &before[i];
            assert!(matches!(assembled(&mid), Err(Incomplete::Mismatch { .. })));
            mid.remove(i);
            assert_eq!(
                assembled(&mid),
                Err(Incomplete::Missing {
                    index: u32::try_from(i).unwrap(),
                    count: u32::try_from(after.len()).unwrap()
                })
            );
        }
    }
}

#[test]
fn objects_of_the_old_scheme_are_taken_when_their_versions_agree() {
    let s = big(20_000);
    let mut old = desired_objects(&s, &ObjectNaming::source());
    for o in &mut old {
        o.spec.version = s.version.clone();
        o.spec.shard.as_mut().unwrap().versions.clear();
    }
    let hs: Vec<ShardHead<'_>> = old.iter().map(ShardHead::of).collect();
    let (take, legacy) = consistent_shards(&hs).unwrap();
    assert!(legacy);
    assert_eq!(take, (0..old.len()).collect::<Vec<_>>());
    old[1].spec.version = "other".into();
    let hs: Vec<ShardHead<'_>> = old.iter().map(ShardHead::of).collect();
    assert!(matches!(
        consistent_shards(&hs),
        Err(Incomplete::Mismatch { index: 1, .. })
    ));
    // No shard 0 is incomplete; surplus shards of another count are ignored.
    let hs: Vec<ShardHead<'_>> = old.iter().skip(1).map(ShardHead::of).collect();
    assert_eq!(consistent_shards(&hs), Err(Incomplete::NoShardZero));
    let one = desired_objects(
        &svc("", "default", "plat-dev", None),
        &ObjectNaming::source(),
    );
    let mut with_surplus: Vec<ShardHead<'_>> = one.iter().map(ShardHead::of).collect();
    with_surplus.push(ShardHead::of(&old[1]));
    assert_eq!(consistent_shards(&with_surplus), Ok((vec![0], false)));
}

#[test]
fn ports_fit_is_exactly_a_shard_count_of_one() {
    let s = big(30);
    let empty_lists = PortMap::from([("p".to_string(), vec![]), ("q".to_string(), vec![])]);
    for max in 0..4000 {
        assert_eq!(
            ports_fit(&s.ports, max),
            crate::crd::shards::shard_count(&s.ports, max, node_json_len) == 1,
            "max {max}"
        );
        // Nothing to split: one object, fitting or not.
        assert_eq!(
            crate::crd::shards::shard_count(&empty_lists, max, node_json_len),
            1
        );
    }
    assert!(ports_fit(&s.ports, MAX_OBJECT_PORTS_BYTES));
    assert!(ports_fit(&PortMap::new(), 0));
}

#[test]
fn one_node_over_the_limit_stays_one_unsharded_object() {
    let s = svc("", "default", "plat-dev", None);
    let one = ServiceNodes::new(
        s.key.clone(),
        s.source,
        PortMap::from([("port".to_string(), vec![Node::new("10.0.0.1", 80, 1)])]),
        None,
    );
    assert!(!ports_fit(&one.ports, 8));
    let objs = desired_objects_with_limit(&one, &ObjectNaming::source(), 8);
    assert_eq!(objs, vec![desired_object(&one, &ObjectNaming::source())]);
}

#[test]
fn shard_names_stay_valid_for_long_names() {
    let long = ServiceKey::new("c1", "n".repeat(63), "s".repeat(63));
    let base = ObjectNaming::fixed("kd").name(&long);
    let name = shard_name(&base, 4_000_000_000);
    assert!(is_dns_name(&name), "{name}");
    assert_ne!(shard_name(&base, 1), base);
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn whose_an_object_is_follows_the_instance_label_then_the_appliers_then_the_legacy_marks() {
    let managed = (LABEL_MANAGED_BY, MANAGED_BY);
    let none: [&str; 0] = [];
    // 1. The instance label decides, whoever applied.
    let ours = labels(&[managed, (LABEL_INSTANCE, "a")]);
    assert_eq!(owner_of("a", Some(&ours), ["kube-discovery/b"]), Owner::Us);
    assert_eq!(
        owner_of("b", Some(&ours), ["kube-discovery/b"]),
        Owner::Instance("a".into())
    );
    // 2. Label removed by someone: the applier names the instance.
    let stripped = labels(&[("app", "x")]);
    assert_eq!(
        owner_of("a", Some(&stripped), ["kubectl-edit", "kube-discovery/a"]),
        Owner::Us
    );
    assert_eq!(
        owner_of("a", Some(&stripped), ["kube-discovery/b"]),
        Owner::Instance("b".into())
    );
    // The drift manager and look-alikes are not instances.
    assert_eq!(
        owner_of(
            "a",
            Some(&stripped),
            ["kube-discovery-drift/b", "kube-discoveryx/a"]
        ),
        Owner::Unmanaged
    );
    // 3. Written before instances existed: adopted by every instance.
    let legacy = labels(&[managed]);
    assert_eq!(owner_of("a", Some(&legacy), none), Owner::Us);
    assert_eq!(owner_of("b", None, ["kube-discovery"]), Owner::Us);
    // 4. Anything else is not ours.
    assert_eq!(owner_of("a", None, none), Owner::Unmanaged);
    assert_eq!(
        owner_of(
            "a",
            Some(&labels(&[(LABEL_MANAGED_BY, "helm")])),
            ["kubectl-create"]
        ),
        Owner::Unmanaged
    );
}

#[test]
fn only_server_side_apply_managers_say_whose_an_object_is() {
    let entry = |manager: Option<&str>, operation: &str| ManagedFieldsEntry {
        manager: manager.map(str::to_string),
        operation: Some(operation.to_string()),
        ..ManagedFieldsEntry::default()
    };
    let fields = vec![
        entry(Some("kube-discovery/b"), "Update"),
        entry(Some("kubectl-client-side-apply"), "Apply"),
        entry(None, "Apply"),
        entry(Some("kube-discovery/a"), "Apply"),
    ];
    let got: Vec<&str> = apply_managers(Some(&fields)).collect();
    assert_eq!(got, ["kubectl-client-side-apply", "kube-discovery/a"]);
    assert_eq!(apply_managers(None).count(), 0);
    let meta = ObjectMeta {
        managed_fields: Some(fields),
        ..ObjectMeta::default()
    };
    let a = ObjectNaming::source().with_instance("a");
    assert_eq!(a.owner_of_meta(&meta), Owner::Us);
    // The `Update` by instance b does not make it b's.
    let c = ObjectNaming::source().with_instance("c");
    assert_eq!(c.owner_of_meta(&meta), Owner::Instance("a".into()));
    // Issue 29 item 5: an instance that adopts `a` (its earlier name)
    // owns `a`'s objects; others' stay others'.
    let renamed = c.clone().with_adopted(vec!["a".into()]);
    assert_eq!(renamed.owner_of_meta(&meta), Owner::Us);
    let labelled = BTreeMap::from([(LABEL_INSTANCE.to_string(), "b".to_string())]);
    assert_eq!(
        renamed.owner_of(Some(&labelled), []),
        Owner::Instance("b".into())
    );
    assert_eq!(adopted(Owner::Unmanaged, &["a".into()]), Owner::Unmanaged);
}

#[test]
fn objects_carry_the_instance_label_and_field_manager() {
    let naming = ObjectNaming::source().with_instance("edge");
    let obj = desired_object(&svc("", "default", "web", None), &naming);
    let l = obj.metadata.labels.unwrap();
    assert_eq!(l[LABEL_INSTANCE], "edge");
    assert_eq!(naming.owner_of(Some(&l), []), Owner::Us);
    assert_eq!(naming.field_manager(), "kube-discovery/edge");
    assert_eq!(naming.drift_field_manager(), "kube-discovery-drift/edge");
    assert_eq!(ObjectNaming::default().instance, DEFAULT_INSTANCE);
}

#[test]
fn a_64_character_cluster_id_gives_valid_names_and_labels_and_stays_whole_in_the_spec() {
    let id = "a123456789b123456789c123456789d123456789e123456789f123456789abcd";
    assert_eq!(id.len(), 64);
    for naming in [ObjectNaming::source(), ObjectNaming::fixed("kd")] {
        let obj = desired_object(&svc(id, "default", "web", None), &naming);
        let name = obj.metadata.name.as_deref().unwrap();
        assert!(is_dns_name(name) && name.len() <= 63, "{name}");
        let labels = obj.metadata.labels.as_ref().unwrap();
        let cluster = &labels[LABEL_CLUSTER];
        assert!(is_label_value(cluster) && cluster.len() <= 63, "{cluster}");
        assert_ne!(cluster, id);
        assert_eq!(obj.spec.cluster, id);
        assert_eq!(obj.spec.service, format!("{id}/default/web"));
        // Another long id gets other names.
        let other = id.replace('a', "z");
        let o2 = desired_object(&svc(&other, "default", "web", None), &naming);
        assert_ne!(o2.metadata.name, obj.metadata.name);
        assert_ne!(o2.metadata.labels.unwrap()[LABEL_CLUSTER], *cluster);
    }
}

#[test]
fn stamp_sets_status_and_every_condition() {
    let s = svc("", "default", "web", None);
    let now = Time(jiff::Timestamp::UNIX_EPOCH);
    let mut obj = desired_objects_at(&s, &ObjectNaming::source(), &[], &now).remove(0);
    assert_eq!(stamped_generation(&obj), None);
    stamp_generation(&mut obj, Some(7));
    let st = obj.status.as_ref().unwrap();
    assert_eq!(st.observed_generation, Some(7));
    assert!(!st.conditions.is_empty());
    assert!(
        st.conditions
            .iter()
            .all(|c| c.observed_generation == Some(7))
    );
    stamp_generation(&mut obj, None);
    assert_eq!(stamped_generation(&obj), None);
    let json = serde_json::to_value(&obj).unwrap();
    assert!(json["status"].get("observedGeneration").is_none());
}

/// The API server as far as generations go: an apply bumps the
/// generation by one when it changes the object (here: the stamp or the
/// content), else leaves it.
struct Server {
    generation: i64,
    stamp: Option<i64>,
    content: u32,
}

impl Server {
    fn apply(&mut self, content: u32, stamp: Option<i64>) -> i64 {
        if (content, stamp) != (self.content, self.stamp) {
            self.generation += 1;
        }
        (self.content, self.stamp) = (content, stamp);
        self.generation
    }
}

/// From every starting state (what the server holds, what the writer
/// remembers, whether the content changes) the writer's first apply
/// plus at most two corrections end with `observedGeneration ==
/// generation`, and a right guess needs no correction.
#[test]
fn generation_fix_always_settles_within_two_more_applies() {
    for generation in 1..6_i64 {
        for stamp in [
            None,
            Some(0),
            Some(generation - 1),
            Some(generation),
            Some(generation + 1),
            Some(generation + 2),
        ] {
            for remembered in [
                None,
                Some(generation - 2),
                Some(generation - 1),
                Some(generation),
                Some(generation + 3),
            ] {
                for content in [1_u32, 2] {
                    let mut server = Server {
                        generation,
                        stamp,
                        content: 1,
                    };
                    let mut sent = Some(remembered.map_or(1, |g| g + 1));
                    let mut got = server.apply(content, sent);
                    let mut extra = 0;
                    while let Some(next) = generation_fix(sent, Some(got)) {
                        extra += 1;
                        assert!(
                            extra <= 2,
                            "no end: g{generation} s{stamp:?} m{remembered:?} c{content}"
                        );
                        sent = next;
                        got = server.apply(content, sent);
                    }
                    assert_eq!(sent, Some(got));
                    assert_eq!((server.generation, server.stamp), (got, Some(got)));
                    let right = remembered == Some(generation)
                        && (content != 1 || stamp != Some(generation + 1));
                    if right {
                        assert_eq!(extra, 0, "g{generation} s{stamp:?} c{content}");
                    }
                }
            }
        }
    }
    assert_eq!(
        generation_fix(Some(3), None),
        None,
        "no generation in the answer: nothing to check"
    );
}

/// One `label_value` for DiscoveredService labels and the snapshot
/// ConfigMaps' `kubediscovery.io/snapshot` label. It is the DiscoveredService
/// scheme (46 sanitized characters + `-` + 16 hex), so no DiscoveredService
/// label changes; the snapshot's former scheme (40 raw characters + hash)
/// gave the same value for every name of up to 63 characters (every such
/// object name is a valid label value, kept as is), and differs only for
/// snapshot names longer than 63 characters.
#[test]
fn one_label_value_keeps_the_values_already_on_the_api_server() {
    use sha2::{Digest, Sha256};
    // The snapshot's former `label_value` (dump.rs before this change).
    fn old_snapshot(name: &str) -> String {
        if k8s_syntax::is_label_value(name) {
            return name.to_string();
        }
        let mut h = hex::encode(Sha256::digest(name.as_bytes()));
        h.truncate(16);
        let head: String = name.chars().take(40).collect();
        let head = head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        format!("{head}-{h}")
    }
    // DiscoveredService labels: namespaces and Service names (always valid
    // label values) and cluster ids up to 64 characters; the values the
    // former code gave (pinned).
    let id64 = "c".repeat(64);
    assert_eq!(
        label_value(&id64),
        format!(
            "{}-{}",
            "c".repeat(46),
            &hex::encode(Sha256::digest(&id64))[..16]
        )
    );
    assert_eq!(label_value(&id64).len(), 63);
    for v in ["", "default", "plat-dev", "a1", &"n".repeat(63)] {
        assert_eq!(label_value(v), v);
    }
    // Snapshot names of up to 63 characters: the same value as before.
    let names = [
        "kube-discovery-nodes".to_string(),
        "snap".to_string(),
        "a.b-c.d".to_string(),
        "x".repeat(63),
        format!("{}.{}", "a".repeat(31), "b".repeat(31)),
    ];
    for n in &names {
        assert_eq!(label_value(n), old_snapshot(n), "{n}");
    }
    // Longer names: still a valid label value, distinct per name.
    let long = format!("{}.x", "a".repeat(70));
    let v = label_value(&long);
    assert!(k8s_syntax::is_label_value(&v), "{v}");
    assert_ne!(v, label_value(&format!("{}.y", "a".repeat(70))));
}
