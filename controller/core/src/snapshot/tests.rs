use super::builder::*;
use super::layout::*;
use super::*;
use std::collections::BTreeSet;

/// Node `i`; its host sorts like `i` (the state's node lists are sorted,
/// and the lists of a split service are sorted again when assembled).
fn node(i: u32) -> Node {
    Node::new(format!("h{i:07}.example"), 8080, 100)
}

/// `(cluster, namespace, name, [(port, node count)])`.
type Spec<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, u32)]);

fn dump_of(spec: &[Spec<'_>]) -> Dump {
    let mut d = Dump::with_clusters([""]);
    let mut n = 0;
    for (c, ns, name, ports) in spec {
        let mut pm = PortMap::new();
        for (p, count) in *ports {
            let nodes = (0..*count)
                .map(|_| {
                    n += 1;
                    node(n)
                })
                .collect();
            pm.insert((*p).to_string(), nodes);
        }
        d.insert(&ServiceKey::new(*c, *ns, *name), pm);
    }
    d
}

fn files(l: &Layout) -> HashMap<String, String> {
    l.shards
        .iter()
        .map(|s| (s.name.clone(), s.text.clone()))
        .collect()
}

fn roundtrip(d: &Dump, max: usize) -> Layout {
    let l = build(d, "snap", max).unwrap();
    let f = files(&l);
    let back = assemble(&l.index, |r| f.get(&r.name).cloned()).unwrap();
    assert_eq!(&back, d);
    assert_eq!(back.to_apisix_endpoints(), d.to_apisix_endpoints());
    for s in &l.shards {
        assert!(escaped_len(&s.text) <= max, "{} over {max}", s.name);
    }
    l
}

#[test]
fn apisix_shape_and_small_state_is_one_shard() {
    let d = dump_of(&[("", "default", "web", &[("http", 2), ("admin", 0)])]);
    let v = d.to_apisix_endpoints();
    assert_eq!(v[0]["id"], "");
    assert_eq!(v[0]["endpoints"][0]["name"], "default/web");
    let inner: PortMap =
        serde_json::from_str(v[0]["endpoints"][0]["value"].as_str().unwrap()).unwrap();
    assert_eq!(inner["http"].len(), 2);
    assert!(inner["admin"].is_empty());
    let l = roundtrip(&d, DEFAULT_MAX_SHARD_BYTES);
    assert_eq!(l.shards.len(), 1);
    assert_eq!(l.shards[0].name, "snap-0");
    assert_eq!(l.shards[0].key, "snap-0.json");
    let idx = parse_index(&l.index).unwrap();
    assert_eq!((idx.services, idx.nodes), (1, 2));
    // Format 2's version names the shard hashes and the clusters.
    let shas = [shard_sha256(&l.shards[0].text)];
    assert_eq!(
        idx.version,
        layout_version(&[String::new()], shas.iter().map(String::as_str))
    );
    assert_eq!(l.version, idx.version);
}

#[test]
fn empty_state_and_empty_clusters_round_trip() {
    let d = Dump::with_clusters(["east", "west"]);
    let l = roundtrip(&d, MIN_SHARD_BYTES);
    assert_eq!(l.shards.len(), 1);
    assert_eq!(d.to_apisix_endpoints()[1]["id"], "west");
}

#[test]
fn many_services_make_several_shards_under_the_budget() {
    let spec: Vec<(String, u32)> = (0..200).map(|i| (format!("svc-{i}"), i % 7 + 1)).collect();
    let mut d = Dump::with_clusters(["a", "b"]);
    let mut n = 0;
    for (i, (name, k)) in spec.iter().enumerate() {
        let c = if i % 3 == 0 { "a" } else { "b" };
        let nodes = (0..*k).map(|_| {
            n += 1;
            node(n)
        });
        d.insert(
            &ServiceKey::new(c, "ns", name.as_str()),
            PortMap::from([("http".to_string(), nodes.collect())]),
        );
    }
    let l = roundtrip(&d, 4096);
    assert!(l.shards.len() > 5, "{} shards", l.shards.len());
    let names: Vec<_> = l.shards.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names[2], "snap-2");
}

/// Names of the shards whose text differs between `a` and `b` (or that
/// only one of them has).
fn changed(a: &Layout, b: &Layout) -> Vec<String> {
    let (fa, fb) = (files(a), files(b));
    let mut names: BTreeSet<&String> = fa.keys().collect();
    names.extend(fb.keys());
    names
        .into_iter()
        .filter(|n| fa.get(*n) != fb.get(*n))
        .cloned()
        .collect()
}

/// A service of `n` endpoints (nodes `from..from + n`) on ports `http`
/// and `metrics` (the same hosts), plus a port without nodes.
fn two_port_service(from: u32, n: u32) -> PortMap {
    let http: Vec<Node> = (from..from + n).map(node).collect();
    let metrics = http
        .iter()
        .map(|x| Node::new(x.host.as_str(), 9090, 1))
        .collect();
    PortMap::from([
        ("http".to_string(), http),
        ("metrics".to_string(), metrics),
        ("none".to_string(), Vec::new()),
    ])
}

#[test]
fn one_service_bigger_than_a_shard_is_split_by_node_host_hash() {
    let mut d = dump_of(&[
        ("", "a", "small", &[("http", 1)]),
        ("", "z", "after", &[("http", 3)]),
    ]);
    d.insert(
        &ServiceKey::new("", "big", "svc"),
        two_port_service(100, 500),
    );
    let l = roundtrip(&d, 4096);
    // The small services share bucket 0; the big one's parts follow, a
    // power of two of them, all in order.
    let parts: Vec<&ShardData> = l
        .shards
        .iter()
        .map(|s| &**s)
        .filter(|s| s.text.contains("\"part\""))
        .collect();
    assert!(
        parts.len() >= 8 && parts.len().is_power_of_two(),
        "{} parts",
        parts.len()
    );
    assert_eq!(l.shards.len(), parts.len() + 1);
    assert!(!l.shards[0].text.contains("\"part\""));
    // Every endpoint's ports are in one part: the part holding a host's
    // http node holds its metrics node.
    for p in &parts {
        let doc: ShardDoc = serde_json::from_str(&p.text).unwrap();
        let pm: PortMap = serde_json::from_str(&doc.endpoints[0].endpoints[0].value).unwrap();
        let hosts = |k: &str| -> Vec<String> {
            pm.get(k)
                .into_iter()
                .flatten()
                .map(|n| n.host.to_string())
                .collect()
        };
        assert_eq!(hosts("http"), hosts("metrics"), "{}", p.name);
        assert!(!hosts("http").is_empty(), "{} is empty", p.name);
    }
    // Part 0 carries every port key, the empty one too.
    assert!(parts[0].text.contains("none"));
}

fn big(d: &mut Dump) -> &mut PortMap {
    d.clusters
        .get_mut("")
        .unwrap()
        .get_mut(&("big".into(), "svc".into()))
        .unwrap()
}

#[test]
fn one_endpoint_change_in_a_big_service_changes_one_shard() {
    // 5,000 endpoints x 2 ports in 16 KiB shards, among small services
    // (the 100,000-endpoint case is in the planner's tests).
    let mut d = dump_of(&[
        ("", "a", "small", &[("http", 2)]),
        ("", "z", "after", &[("http", 3)]),
    ]);
    let key = ServiceKey::new("", "big", "svc");
    d.insert(&key, two_port_service(1000, 5_000));
    let max = 16 * 1024;
    let base = roundtrip(&d, max);

    let add = |d: &mut Dump, i: u32| {
        let p = big(d);
        let n = node(i);
        let m = Node::new(n.host.as_str(), 9090, 1);
        for (k, x) in [("http", n), ("metrics", m)] {
            let list = p.get_mut(k).unwrap();
            let at = list.binary_search(&x).unwrap_err();
            list.insert(at, x);
        }
    };
    let mut cases: Vec<(&str, Dump)> = Vec::new();
    let mut first = d.clone();
    add(&mut first, 0);
    cases.push(("added, sorting first", first));
    let mut last = d.clone();
    add(&mut last, 900_000);
    cases.push(("added, sorting last", last));
    let mut removed = d.clone();
    for k in ["http", "metrics"] {
        big(&mut removed).get_mut(k).unwrap().remove(2_000);
    }
    cases.push(("removed", removed));
    let mut weight = d.clone();
    big(&mut weight).get_mut("http").unwrap()[4_321].weight = 5;
    cases.push(("weight changed", weight));
    for (what, changed_dump) in cases {
        let l = build(&changed_dump, "snap", max).unwrap();
        assert_eq!(l.shards.len(), base.shards.len(), "{what}");
        assert_eq!(
            changed(&base, &l).len(),
            1,
            "{what}: {:?}",
            changed(&base, &l)
        );
        assert_ne!(l.index, base.index, "{what}");
    }
}

#[test]
fn one_change_among_many_small_services_changes_one_shard() {
    // 2,000 services in two clusters over 64 KiB shards (the planner's
    // tests count the writes among 10,000 at the default budget).
    let mut d = Dump::with_clusters(["", "east"]);
    for i in 0..2_000u32 {
        let c = if i % 4 == 0 { "east" } else { "" };
        let nodes = (0..2).map(|k| node(i * 2 + k)).collect();
        d.insert(
            &ServiceKey::new(c, format!("ns{}", i % 7), format!("svc-{i:05}")),
            PortMap::from([("http".to_string(), nodes)]),
        );
    }
    let base = roundtrip(&d, 64 * 1024);
    assert!(base.shards.len() >= 8, "{} shards", base.shards.len());
    assert!(base.shards.len().is_power_of_two());
    // One node more in a service, a service added, one removed.
    let mut grown = d.clone();
    let k = ("ns3".to_string(), "svc-00003".to_string());
    grown
        .clusters
        .get_mut("")
        .unwrap()
        .get_mut(&k)
        .unwrap()
        .get_mut("http")
        .unwrap()
        .push(node(999_999));
    let mut added = d.clone();
    added.insert(
        &ServiceKey::new("", "aaa", "first"),
        PortMap::from([("http".to_string(), vec![node(1)])]),
    );
    let mut removed = d.clone();
    removed
        .clusters
        .get_mut("east")
        .unwrap()
        .remove(&("ns0".to_string(), "svc-00000".to_string()));
    for (what, x) in [("grown", grown), ("added", added), ("removed", removed)] {
        let l = build(&x, "snap", 64 * 1024).unwrap();
        assert_eq!(
            changed(&base, &l).len(),
            1,
            "{what}: {:?}",
            changed(&base, &l)
        );
    }
}

#[test]
fn a_split_service_out_of_order_is_an_error_naming_it() {
    let mut d = Dump::with_clusters(["c1"]);
    let mut p = two_port_service(0, 200);
    p.get_mut("http").unwrap().reverse();
    d.insert(&ServiceKey::new("c1", "ns", "big"), p);
    let e = build(&d, "snap", 4096).unwrap_err();
    assert!(matches!(e, BuildError::Unsorted { .. }), "{e}");
    assert!(e.to_string().contains("c1/ns/big"), "{e}");
}

#[test]
fn format_1_is_refused_naming_the_format_and_what_to_do() {
    // What a controller before format 2 wrote: a service split by node
    // ranges into consecutive parts. No longer read: a clear error, never a
    // panic or a wrong set.
    let d = dump_of(&[
        ("", "a", "small", &[("http", 2)]),
        ("", "big", "svc", &[("http", 40), ("grpc", 5)]),
    ]);
    let all = &d.clusters[""];
    let big = &all[&("big".to_string(), "svc".to_string())];
    let flat: Vec<(&String, &Node)> = big
        .iter()
        .flat_map(|(p, ns)| ns.iter().map(move |n| (p, n)))
        .collect();
    let entry = |name: &str, pm: &PortMap, part: Option<Part>| Entry {
        name: name.to_string(),
        value: port_json(pm),
        part,
    };
    let mut entries = vec![entry(
        "a/small",
        &all[&("a".to_string(), "small".to_string())],
        None,
    )];
    for (i, chunk) in flat.chunks(16).enumerate() {
        let mut pm = PortMap::new();
        for (p, n) in chunk {
            pm.entry((*p).clone()).or_default().push((*n).clone());
        }
        entries.push(entry(
            "big/svc",
            &pm,
            Some(Part {
                index: i as u32,
                count: 3,
            }),
        ));
    }
    let texts: Vec<String> = entries
        .chunks(2)
        .enumerate()
        .map(|(i, es)| {
            json(&ShardDoc {
                format: 1,
                index: i,
                endpoints: vec![Group {
                    id: String::new(),
                    endpoints: es.to_vec(),
                }],
            })
        })
        .collect();
    let index = json(&IndexDoc {
        format: 1,
        version: "0123456789abcdef".to_string(),
        clusters: vec![String::new()],
        services: d.services(),
        nodes: d.nodes(),
        shards: texts
            .iter()
            .enumerate()
            .map(|(i, t)| ShardRef {
                name: shard_configmap_name("snap", i),
                key: format!("snap-{i}.json"),
                sha256: sha256_hex(t),
                bytes: t.len(),
            })
            .collect(),
    });
    let e = assemble(&index, |r| {
        texts.get(r.name[5..].parse::<usize>().unwrap()).cloned()
    })
    .unwrap_err();
    assert!(matches!(e, AssembleError::Index(_)), "{e:?}");
    assert!(!e.is_retryable(), "reading again cannot help: {e}");
    assert!(
        e.to_string().contains("format 1") && e.to_string().contains("re-sync"),
        "{e}"
    );
    assert_eq!(parse_index(&index).unwrap_err(), e);
    // A format this reader does not know is refused, naming both.
    let e = assemble(&index.replace("\"format\":1", "\"format\":3"), |_| None).unwrap_err();
    assert!(e.to_string().contains("format 3"), "{e}");
}

#[test]
fn a_node_that_cannot_fit_is_an_error_naming_the_service() {
    let mut d = Dump::with_clusters([""]);
    let mut n = Node::new("x".repeat(2000), 80, 1);
    n.set_zone(Some("z".into()));
    d.insert(
        &ServiceKey::new("", "ns", "huge"),
        PortMap::from([("p".to_string(), vec![n.clone(), n])]),
    );
    let e = build(&d, "snap", MIN_SHARD_BYTES).unwrap_err();
    assert!(e.to_string().contains("ns/huge"), "{e}");
    assert!(
        build(&d, "snap", 10)
            .unwrap_err()
            .to_string()
            .contains("minimum")
    );
}

#[test]
fn unchanged_shards_keep_their_text() {
    let spec: Vec<String> = (0..100).map(|i| format!("svc-{i:03}")).collect();
    let mut d = Dump::with_clusters([""]);
    for (i, s) in spec.iter().enumerate() {
        d.insert(
            &ServiceKey::new("", "ns", s.as_str()),
            PortMap::from([("http".to_string(), vec![node(i as u32)])]),
        );
    }
    let a = build(&d, "snap", 2048).unwrap();
    // Change the last service only.
    d.insert(
        &ServiceKey::new("", "ns", "svc-099"),
        PortMap::from([("http".to_string(), vec![node(9999)])]),
    );
    let b = build(&d, "snap", 2048).unwrap();
    assert_ne!(a.version, b.version);
    assert_eq!(a.shards.len(), b.shards.len());
    let changed: Vec<_> = a
        .shards
        .iter()
        .zip(&b.shards)
        .filter(|(x, y)| x.text != y.text)
        .map(|(x, _)| x.name.clone())
        .collect();
    // Only the shard holding svc-099 (its hash bucket), wherever it is.
    let holder: Vec<_> = a
        .shards
        .iter()
        .filter(|s| s.text.contains("ns/svc-099"))
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(changed, holder);
}

#[test]
fn mixed_versions_are_refused_naming_shard_and_version() {
    let d1 = dump_of(&[
        ("", "ns", "a", &[("http", 60)]),
        ("", "ns", "b", &[("http", 60)]),
    ]);
    let mut d2 = d1.clone();
    d2.insert(
        &ServiceKey::new("", "ns", "b"),
        PortMap::from([("http".to_string(), vec![node(77_777)])]),
    );
    let l1 = build(&d1, "snap", 2048).unwrap();
    let l2 = build(&d2, "snap", 2048).unwrap();
    // Shards of version 2 written, index still version 1: refused, retryable.
    let f2 = files(&l2);
    let e = assemble(&l1.index, |r| f2.get(&r.name).cloned()).unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains(&l1.version), "{e}");
    assert!(e.to_string().contains("snap-"), "{e}");
    // A shard the index lists is gone.
    let f1 = files(&l1);
    let last = l1.shards.last().unwrap().name.clone();
    let e = assemble(&l1.index, |r| {
        (r.name != last).then(|| f1.get(&r.name).cloned()).flatten()
    })
    .unwrap_err();
    assert!(matches!(e, AssembleError::ShardMissing { ref shard, .. } if *shard == last));
    // An index whose hashes match but whose version lies: not retryable.
    let mut idx = parse_index(&l1.index).unwrap();
    idx.version = "0000000000000000".into();
    let e = assemble(&serde_json::to_string(&idx).unwrap(), |r| {
        f1.get(&r.name).cloned()
    })
    .unwrap_err();
    assert!(!e.is_retryable());
    assert!(e.to_string().contains("0000000000000000"), "{e}");
    // Garbage index.
    assert!(matches!(
        assemble("{", |_| None),
        Err(AssembleError::Index(_))
    ));
}

/// A small deterministic generator (no external crate): `next(m)` is
/// in `0..m`.
fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m.max(1)
    }
}

#[test]
fn property_round_trip_over_generated_states() {
    // A small deterministic generator (no external crate): many shapes,
    // several budgets, including services split into parts.
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    for case in 0..60 {
        let clusters: Vec<String> = (0..=next(3)).map(|i| format!("c{i}")).collect();
        let mut d = Dump::with_clusters(clusters.iter().map(String::as_str));
        let services = next(40);
        let mut n = 0u32;
        for s in 0..services {
            let c = &clusters[next(clusters.len() as u64) as usize];
            let ports = next(4);
            let mut pm = PortMap::new();
            for p in 0..ports {
                let count = if next(10) == 0 { next(400) } else { next(6) };
                let nodes = (0..count)
                    .map(|_| {
                        n += 1;
                        node(n)
                    })
                    .collect();
                pm.insert(format!("p{p}"), nodes);
            }
            d.insert(
                &ServiceKey::new(c.as_str(), format!("ns{}", next(5)), format!("s{s}")),
                pm,
            );
        }
        let max = [MIN_SHARD_BYTES, 1500, 4096, 65536][case % 4];
        let l = roundtrip(&d, max);
        let names: BTreeSet<_> = l.shards.iter().map(|s| s.name.clone()).collect();
        assert_eq!(names.len(), l.shards.len());
    }
}

#[test]
fn nodes_cost_from_the_text_is_the_sum_of_node_costs() {
    let mut odd = Node::new("h\"q\\u\u{1}ü.example", 80, 3);
    odd.set_zone(Some("z\n".into()));
    for pm in [
        PortMap::new(),
        PortMap::from([("http".to_string(), Vec::new())]),
        PortMap::from([("a\"b".to_string(), vec![odd.clone()])]),
        two_port_service(0, 7),
        PortMap::from([
            ("".to_string(), vec![node(1), odd.clone(), node(2)]),
            ("x".to_string(), Vec::new()),
            ("y".to_string(), vec![odd]),
        ]),
    ] {
        let want: usize = pm.values().flatten().map(node_cost).sum();
        let twice = escaped_twice_len(&port_json(&pm));
        assert_eq!(nodes_cost(&pm, twice), want, "{pm:?}");
    }
}

#[test]
fn escaped_len_matches_serde_json() {
    for s in [
        "plain",
        "q\"uo\\te",
        "ctl\u{1}\n\u{8}\u{c}\u{1f}\u{7f}\r\t",
        "ünï€𝄞",
    ] {
        assert_eq!(
            escaped_len(s) + 2,
            serde_json::to_string(s).unwrap().len(),
            "{s:?}"
        );
        assert_eq!(escaped_twice_len(s), escaped_len(&inner(s)), "{s:?}");
    }
}

/// The state a [`Builder`] reads: values behind `Arc`s, in key order.
type State = BTreeMap<ServiceKey, Arc<ServiceNodes>>;

fn dump_from(clusters: &BTreeSet<String>, state: &State) -> Dump {
    let mut d = Dump::with_clusters(clusters.iter().map(String::as_str));
    for s in state.values() {
        d.insert(&s.key, s.ports.clone());
    }
    d
}

fn value(key: &ServiceKey, ports: PortMap) -> Arc<ServiceNodes> {
    Arc::new(ServiceNodes::new(
        key.clone(),
        crate::model::SourceKind::EndpointSlice,
        ports,
        None,
    ))
}

/// [`value`], with the kept buckets when `buckets`.
fn value_any(key: &ServiceKey, ports: PortMap, buckets: bool) -> Arc<ServiceNodes> {
    if buckets {
        value_with_buckets(key, ports)
    } else {
        value(key, ports)
    }
}

/// [`value`] with the kept buckets the index gives a big service.
fn value_with_buckets(key: &ServiceKey, ports: PortMap) -> Arc<ServiceNodes> {
    let b = crate::model::version::Buckets::of(&ports);
    Arc::new(ServiceNodes::with_buckets(
        key.clone(),
        crate::model::SourceKind::EndpointSlice,
        ports,
        None,
        crate::model::PortExtras::default(),
        Vec::new(),
        Some(b),
    ))
}

/// Issue 19 item 2: the incremental builder gives exactly what `build`
/// gives, over random sequences of changes that move services between
/// buckets and shards of their own (growing big, shrinking small),
/// double and halve the bucket count, and add and remove clusters
/// (with services of their own and without), at several budgets.
#[test]
fn builder_equals_build_over_random_sequences_of_changes() {
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    let mut kinds = [0usize; 9];
    let mut resplits = 0;
    let mut by_digest = 0;
    for case in 0..16 {
        let max = [MIN_SHARD_BYTES, 1500, 4096, 16 * 1024][case % 4];
        let mut b = Builder::new("snap", max).unwrap();
        let mut clusters: BTreeSet<String> = ["".to_string(), "c1".to_string()].into();
        let mut state = State::new();
        let mut n = 0u32;
        let mut nodes = |count: u64| -> Vec<Node> {
            (0..count)
                .map(|_| {
                    n += 1;
                    node(n)
                })
                .collect()
        };
        for step in 0..40 {
            let pick = |state: &State, r: u64| state.keys().nth(r as usize).cloned();
            let r = next(1 << 20);
            let kind = next(9) as usize;
            kinds[kind] += 1;
            match kind {
                // A service added, small.
                0 | 1 => {
                    let c = clusters
                        .iter()
                        .nth(next(clusters.len() as u64) as usize)
                        .unwrap();
                    let k = ServiceKey::new(c.as_str(), format!("ns{}", next(4)), format!("s{r}"));
                    let ports = PortMap::from([("http".to_string(), nodes(next(4)))]);
                    state.insert(k.clone(), value_any(&k, ports, next(3) > 0));
                }
                // One removed.
                2 => {
                    if let Some(k) = pick(&state, r % (state.len() as u64).max(1)) {
                        state.remove(&k);
                    }
                }
                // One growing big (a shard of its own, or parts).
                3 => {
                    if let Some(k) = pick(&state, r % (state.len() as u64).max(1)) {
                        let mut p = state[&k].ports.clone();
                        let grow = nodes(20 + next(300));
                        p.entry("http".to_string()).or_default().extend(grow);
                        p.insert("grpc".to_string(), nodes(next(3)));
                        state.insert(k.clone(), value_any(&k, p, next(3) > 0));
                    }
                }
                // One shrinking back to small.
                4 => {
                    if let Some(k) = pick(&state, r % (state.len() as u64).max(1)) {
                        let p = PortMap::from([("http".to_string(), nodes(1))]);
                        state.insert(k.clone(), value_any(&k, p, next(3) > 0));
                    }
                }
                // Many small services at once (the bucket count doubles).
                5 => {
                    for i in 0..(10 + next(40)) {
                        let k = ServiceKey::new("", "bulk", format!("b{r}-{i}"));
                        let p = PortMap::from([("http".to_string(), nodes(2))]);
                        state.insert(k.clone(), value_any(&k, p, next(3) > 0));
                    }
                }
                // A cluster added (empty) or removed with its services.
                6 => {
                    if next(2) == 0 {
                        clusters.insert(format!("c{}", next(4)));
                    } else if clusters.len() > 1
                        && let Some(c) = clusters
                            .iter()
                            .nth(next(clusters.len() as u64) as usize)
                            .cloned()
                    {
                        clusters.remove(&c);
                        state.retain(|k, _| k.cluster != c);
                    }
                }
                // One node changed in place (a weight), removed, or
                // added (sorting last), in a random service: in a split
                // one, one part changes.
                7 => {
                    // Half of the time in the biggest service.
                    let biggest = state
                        .iter()
                        .max_by_key(|(_, v)| v.node_count())
                        .map(|(k, _)| k.clone());
                    let k = if next(2) == 0 {
                        biggest
                    } else {
                        pick(&state, r % (state.len() as u64).max(1))
                    };
                    if let Some(k) = k {
                        let mut p = state[&k].ports.clone();
                        let how = next(3);
                        let added = nodes(1);
                        if let Some(list) = p.values_mut().find(|l| !l.is_empty()) {
                            let i = next(list.len() as u64) as usize;
                            match how {
                                0 => list[i].weight = list[i].weight.wrapping_add(1),
                                1 => drop(list.remove(i)),
                                _ => list.extend(added),
                            }
                        }
                        state.insert(k.clone(), value_any(&k, p, next(3) > 0));
                    }
                }
                // Same content, new value (the builder must not care).
                _ => {
                    if let Some(k) = pick(&state, r % (state.len() as u64).max(1)) {
                        let v = value_any(&k, state[&k].ports.clone(), next(3) > 0);
                        state.insert(k, v);
                    }
                }
            }
            let want = build(&dump_from(&clusters, &state), "snap", max).unwrap();
            let got = b
                .build(clusters.iter().map(String::as_str), state.values())
                .unwrap();
            assert_eq!(got, want, "case {case} step {step} (change kind {kind})");
        }
        resplits += b.resplits;
        by_digest += b.by_digest;
    }
    assert!(resplits > 10, "the incremental split ran {resplits} times");
    assert!(
        by_digest > 10,
        "the changed parts were found by their digests {by_digest} times"
    );
    assert!(
        kinds.iter().all(|k| *k > 20),
        "every kind of change ran: {kinds:?}"
    );
}

/// The builder is incremental: after one change it hands out the very
/// shards (the same allocations) of the previous round but the changed
/// one, for a service split into parts and among many small services.
#[test]
fn builder_rebuilds_only_the_shards_that_changed() {
    let max = 16 * 1024;
    let mut state = State::new();
    let big = ServiceKey::new("", "big", "svc");
    state.insert(big.clone(), value(&big, two_port_service(1000, 2_000)));
    for i in 0..300u32 {
        let k = ServiceKey::new("", "ns", format!("s{i:03}"));
        state.insert(
            k.clone(),
            value(&k, PortMap::from([("http".to_string(), vec![node(i)])])),
        );
    }
    let clusters = [""];
    let mut b = Builder::new("snap", max).unwrap();
    let first = b.build(clusters, state.values()).unwrap();
    assert!(first.shards.len() >= 8, "{} shards", first.shards.len());
    let rebuilt = |a: &Layout, b: &Layout| -> Vec<String> {
        a.shards
            .iter()
            .zip(&b.shards)
            .filter(|(x, y)| !Arc::ptr_eq(x, y))
            .map(|(x, _)| x.name.clone())
            .collect()
    };
    // Unchanged: nothing rebuilt.
    let again = b.build(clusters, state.values()).unwrap();
    assert_eq!(rebuilt(&first, &again), Vec::<String>::new());
    // One endpoint added to the big service: its part only.
    let mut p = state[&big].ports.clone();
    for (k, n) in [
        ("http", node(900_000)),
        ("metrics", Node::new(node(900_000).host.as_str(), 9090, 1)),
    ] {
        p.get_mut(k).unwrap().push(n);
    }
    state.insert(big.clone(), value(&big, p));
    let one = b.build(clusters, state.values()).unwrap();
    assert_eq!(b.resplits, 1, "re-cut at its part count, not from scratch");
    assert_eq!(
        one,
        build(&dump_from(&[String::new()].into(), &state), "snap", max).unwrap()
    );
    assert_eq!(one.shards.len(), first.shards.len());
    assert_eq!(
        rebuilt(&again, &one).len(),
        1,
        "{:?}",
        rebuilt(&again, &one)
    );
    // One small service changed: its bucket only.
    let k = ServiceKey::new("", "ns", "s123");
    state.insert(
        k.clone(),
        value(&k, PortMap::from([("http".to_string(), vec![node(77)])])),
    );
    let two = b.build(clusters, state.values()).unwrap();
    assert_eq!(rebuilt(&one, &two).len(), 1, "{:?}", rebuilt(&one, &two));
    assert_eq!(
        two,
        build(&dump_from(&[String::new()].into(), &state), "snap", max).unwrap()
    );
}

#[test]
fn builder_names_a_service_out_of_order() {
    let (a, z) = (
        ServiceKey::new("", "ns", "a"),
        ServiceKey::new("", "ns", "z"),
    );
    let (va, vz) = (value(&a, PortMap::new()), value(&z, PortMap::new()));
    let mut b = Builder::new("snap", MIN_SHARD_BYTES).unwrap();
    let e = b.build([""], [&vz, &va]).unwrap_err();
    assert!(e.to_string().contains("ns/a"), "{e}");
    assert!(b.build([""], [&va, &vz]).is_ok());
    assert!(
        Builder::new("snap", 10)
            .unwrap_err()
            .to_string()
            .contains("minimum")
    );
    // A part budget too small is refused the same way, naming it.
    let e = Builder::with_part_bytes("snap", 4096, 10).unwrap_err();
    assert!(e.to_string().contains("size 10 is below"), "{e}");
    let e = build_with(&Dump::default(), "snap", 4096, 20).unwrap_err();
    assert!(e.to_string().contains("size 20 is below"), "{e}");
}

/// Upgrading from a release whose parts filled whole shards (before
/// [`DEFAULT_MAX_PART_BYTES`]; the same format): this reader reads that
/// layout, and while the new layout replaces it the way the planner
/// writes (changed shards in order, the index last, then stale shards
/// deleted), every read gives the old state, the new one or "read
/// again", never a mix; and back (a downgrade, fewer shards).
#[test]
fn an_old_layout_is_read_and_replaced_without_a_mixed_read() {
    let max = 16 * 1024;
    let mut d0 = dump_of(&[("", "a", "small", &[("http", 2)])]);
    d0.insert(
        &ServiceKey::new("", "big", "svc"),
        two_port_service(1000, 2_000),
    );
    let mut d1 = d0.clone();
    big(&mut d1).get_mut("http").unwrap().push(node(900_000));
    let old = build_with(&d0, "snap", max, max).unwrap();
    let new = build_with(&d1, "snap", max, 4096).unwrap();
    assert!(
        new.shards.len() > 2 * old.shards.len(),
        "{} -> {} shards",
        old.shards.len(),
        new.shards.len()
    );
    for (from, to, a, b) in [(&old, &new, &d0, &d1), (&new, &old, &d1, &d0)] {
        let mut server = files(from);
        let read = |index: &str, server: &HashMap<String, String>| {
            assemble(index, |r| server.get(&r.name).cloned())
        };
        assert_eq!(&read(&from.index, &server).unwrap(), a);
        let mut again = 0;
        for s in &to.shards {
            if server.get(&s.name) != Some(&s.text) {
                server.insert(s.name.clone(), s.text.clone());
                match read(&from.index, &server) {
                    Ok(d) => assert_eq!(&d, a, "after writing {}", s.name),
                    Err(e) => {
                        assert!(e.is_retryable(), "after writing {}: {e}", s.name);
                        again += 1;
                    }
                }
            }
        }
        assert!(again > 0, "the old index met rewritten shards");
        assert_eq!(&read(&to.index, &server).unwrap(), b);
        let listed: BTreeSet<&String> = to.shards.iter().map(|s| &s.name).collect();
        let stale: Vec<String> = server
            .keys()
            .filter(|n| !listed.contains(n))
            .cloned()
            .collect();
        for n in stale {
            server.remove(&n);
            assert_eq!(&read(&to.index, &server).unwrap(), b, "after deleting {n}");
        }
    }
}

/// Format 2's version is checked from the index: an index listing
/// another cluster set than its version names is refused.
#[test]
fn a_format_2_version_that_does_not_name_its_shards_is_refused() {
    let d = dump_of(&[("", "ns", "a", &[("http", 3)])]);
    let l = build(&d, "snap", 4096).unwrap();
    let f = files(&l);
    let mut idx = parse_index(&l.index).unwrap();
    idx.clusters.push("east".into());
    let e = assemble(&serde_json::to_string(&idx).unwrap(), |r| {
        f.get(&r.name).cloned()
    })
    .unwrap_err();
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains(&l.version), "{e}");
}
