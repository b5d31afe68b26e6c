use super::*;

fn ports(n: usize) -> PortMap {
    let nodes = (0..n)
        .map(|i| Node::new(format!("10.0.{}.{}", i / 256, i % 256), 8080, 1))
        .collect();
    PortMap::from([("http".to_string(), nodes)])
}

fn len(_: &Node) -> usize {
    40
}

const PINNED: u64 = 0x87f7_ef5d_e06f_f78d;

#[test]
fn the_hash_is_fnv1a_and_never_changes() {
    // The published FNV-1a 64 test vector: "a" -> 0xaf63dc4c8601ec8c.
    assert_eq!(node_hash("a"), 0xaf63_dc4c_8601_ec8c);
    // Pinned: objects on API servers depend on it.
    assert_eq!(node_hash("10.0.0.1"), PINNED);
    assert_ne!(node_hash("10.0.0.1"), node_hash("10.0.0.10"));
    // Every port of one endpoint is in one shard.
    let a = Node::new("10.0.0.1", 80, 1);
    let b = Node::new("10.0.0.1", 9090, 1);
    assert!((1..64).all(|c| shard_index(&a, c) == shard_index(&b, c)));
}

#[test]
fn the_masked_index_is_the_remainder() {
    let p = ports(3000);
    for c in [1, 2, 3, 4, 7, 16, 64, 4096] {
        for n in p.values().flatten() {
            assert_eq!(fast_index(n, c), shard_index(n, c), "{c}");
        }
        // Some shards, in any order: what `partition` gives of them.
        let all = partition(&p, c);
        let wanted: Vec<u32> = [c - 1, 0, c / 2].into_iter().fold(Vec::new(), |mut v, i| {
            if !v.contains(&i) {
                v.push(i);
            }
            v
        });
        let some = partition_some(&p, c, &wanted);
        for (i, part) in wanted.iter().zip(&some) {
            assert_eq!(*part, all[*i as usize], "{c}: shard {i}");
            assert_eq!(
                shard_keys(&p, *i, c).keys().collect::<Vec<_>>(),
                part.keys().collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn counts_are_powers_of_two_and_every_shard_fits() {
    let p = ports(1000);
    assert_eq!(shard_count(&p, 1_000_000, len), 1);
    for max in [5_000, 10_000, 20_000] {
        let c = shard_count(&p, max, len);
        assert!(c.is_power_of_two() && c >= 2, "{c}");
        for (i, s) in partition(&p, c).iter().enumerate() {
            let nodes: usize = s.values().map(Vec::len).sum();
            assert!(nodes * 41 + 2 + 10 <= max, "shard {i} of {c}: {nodes}");
        }
        // The next smaller power of two does not fit (smallest count).
        if c > 2 {
            let half = partition(&p, c / 2);
            assert!(
                half.iter()
                    .any(|s| { s.values().map(Vec::len).sum::<usize>() * 41 + 2 + 10 > max })
            );
        }
    }
    // A single node over the limit: one object is all there is.
    assert_eq!(shard_count(&ports(1), 10, len), 1);
    assert_eq!(shard_count(&ports(3), 10, len), 4);
}

#[test]
fn one_node_more_changes_one_shard_and_order_is_kept() {
    let mut p = ports(1000);
    let before = partition(&p, 8);
    p.get_mut("http")
        .unwrap()
        .insert(0, Node::new("10.0.0.0", 1, 1));
    let after = partition(&p, 8);
    let changed: Vec<usize> = (0..8).filter(|i| before[*i] != after[*i]).collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    // Shard 0 has every key; the lists are subsequences of the input.
    assert!(after[0].contains_key("http"));
    let mut back: Vec<Node> = after
        .iter()
        .flat_map(|s| s.values().flatten().cloned())
        .collect();
    crate::model::sort_nodes(&mut back);
    let mut want = p.get("http").unwrap().clone();
    crate::model::sort_nodes(&mut want);
    assert_eq!(back, want);
}

#[test]
fn buckets_give_what_the_nodes_give() {
    let mut p = ports(3000);
    p.insert("grpc".to_string(), vec![Node::new("10.0.0.7", 9090, 1)]);
    let mut b = Buckets::of(&p);
    for max in [1_000_000, 20_000, 5_000, 100] {
        assert_eq!(
            b.shard_count(&p, max),
            shard_count(&p, max, crate::crd::node_json_len),
            "{max}"
        );
        assert_eq!(b.fits(&p, max), crate::crd::ports_fit(&p, max), "{max}");
    }
    assert_eq!(*b.digest(), PortsDigest::of(&p));
    for count in [2, 8, 64] {
        for (i, part) in partition(&p, count).iter().enumerate() {
            let i = u32::try_from(i).unwrap();
            assert_eq!(b.shard_digest(i, count), PortsDigest::of(part));
        }
    }
    // Kept per node: the same as computed afresh.
    let n = Node::new("10.9.9.9", 8080, 1);
    b.add("http", &n);
    p.get_mut("http").unwrap().push(n.clone());
    assert_eq!(b, Buckets::of(&p));
    b.remove("grpc", &Node::new("10.0.0.7", 9090, 1));
    p.remove("grpc");
    assert_eq!(b.digest(), &PortsDigest::of(&p));
}

#[test]
fn shard_versions_depend_on_content_index_and_count() {
    let p = ports(10);
    let e = PortExtras::default();
    let v = |i, c, p: &PortMap| {
        let d = PortsDigest::of(p);
        shard_version(i, c, SourceKind::EndpointSlice, p, &d, None, &e)
    };
    assert_eq!(v(1, 4, &p), v(1, 4, &p));
    assert_ne!(v(1, 4, &p), v(2, 4, &p));
    assert_ne!(v(1, 4, &p), v(1, 8, &p));
    assert_ne!(v(1, 4, &p), v(1, 4, &ports(11)));
    assert_eq!(v(1, 4, &p).len(), 16);
}
