//! Issue 29 item 2: what readers see at every point of a write that changes
//! a service's shard count. The API server is scripted: a prefix of the
//! plan's requests is applied (an apply replaces the object, as a
//! server-side apply by its only manager does; a delete removes it; before
//! the fix a merge patch first removed `spec.shard` from the old shard 0,
//! which readers then took alone as the whole service), the write stops
//! there (a failed request, a lost lease, a crash), and THE reader rule
//! (`ReaderRule::check`, then `crd::consistent_shards`) reads the objects.
//! Then the write is done again from that state, as a retry (the planner's
//! shard slots) and as a restart (the slots the start-up list finds), and
//! every prefix of that is read too.

use std::collections::BTreeMap;

use super::tests::{LIMIT, lazy, ops_over, show};
use super::*;
use crate::crd::{
    DiscoveredService, Incomplete, ReaderRule, ShardHead, consistent_shards,
    desired_objects_with_limit,
};
use crate::{Node, PortMap, ServiceNodes, SourceKind};

fn key() -> ServiceKey {
    ServiceKey::new("", "ns", "web")
}

/// `web` with the `n` nodes `10.0.0.<from>..`.
fn service(from: usize, n: usize) -> ServiceNodes {
    let mut list: Vec<Node> = (from..from + n)
        .map(|i| Node::new(format!("10.0.{}.{}", i / 256, i % 256), 80, 50))
        .collect();
    crate::model::sort_nodes(&mut list);
    ServiceNodes::new(
        key(),
        SourceKind::EndpointSlice,
        PortMap::from([("http".to_string(), list)]),
        None,
    )
}

/// The API server: the service's objects by name.
type Server = BTreeMap<String, DiscoveredService>;

/// The server as a [`ServerView`]: "intact" is "holds the same spec".
struct Holds<'a>(&'a Server);

impl ServerView for Holds<'_> {
    fn intact(&self, desired: &DesiredObjects<'_>, index: u32) -> bool {
        let Some(obj) = desired.object(index) else {
            return false;
        };
        self.0
            .get(obj.metadata.name.as_deref().unwrap_or_default())
            .is_some_and(|o| o.spec == obj.spec)
    }
    fn taken(&self, _ns: &str, _name: &str) -> Option<crate::crd::Owner> {
        None
    }
    fn objects_of(&self, _key: &ServiceKey) -> Vec<ObjName> {
        self.0
            .keys()
            .map(|n| ("ns".to_string(), n.clone()))
            .collect()
    }
}

/// Sends `ops` of the write of `desired` to `server`.
fn send(server: &mut Server, desired: &DesiredObjects<'_>, ops: &[ObjectOp]) {
    for op in ops {
        match op {
            ObjectOp::Apply { index, name } => {
                let obj = desired.build(&[*index]).remove(0);
                server.insert(name.1.clone(), obj);
            }
            ObjectOp::Delete((_, name), _) => {
                server.remove(name);
            }
        }
    }
}

/// What a reader takes of `server`: the nodes of every port, merged over
/// the shards the reader rule takes.
fn read(server: &Server) -> Result<PortMap, Incomplete> {
    let rule = ReaderRule::new(ObjectNaming::source());
    let mine: Vec<&DiscoveredService> = server.values().filter(|o| rule.check(o).is_ok()).collect();
    let heads: Vec<ShardHead<'_>> = mine.iter().map(|o| ShardHead::of(o)).collect();
    let (take, _) = consistent_shards(&heads)?;
    let mut out = PortMap::new();
    for i in take {
        for (port, nodes) in &mine[i].spec.ports {
            out.entry(port.clone())
                .or_default()
                .extend(nodes.iter().cloned());
        }
    }
    for nodes in out.values_mut() {
        crate::model::sort_nodes(nodes);
    }
    Ok(out)
}

/// `read(server)` is the whole old or the whole new node set; "not
/// complete" (the reader keeps its last answer) only where `incomplete`
/// allows it. Returns which.
fn check(
    server: &Server,
    old: &ServiceNodes,
    new: &ServiceNodes,
    incomplete: bool,
    at: &str,
) -> &'static str {
    match read(server) {
        Ok(p) if p == new.ports => "new",
        Ok(p) if p == old.ports => "old",
        Err(_) if incomplete => "incomplete",
        Ok(p) => panic!(
            "{at}: a reader takes {} nodes as the whole service (old {}, new {}); objects: {:?}",
            p.values().map(Vec::len).sum::<usize>(),
            old.ports.values().map(Vec::len).sum::<usize>(),
            new.ports.values().map(Vec::len).sum::<usize>(),
            server
                .values()
                .map(|o| format!(
                    "{} shard={:?} nodes={}",
                    o.metadata.name.as_deref().unwrap_or_default(),
                    o.spec.shard.as_ref().map(|s| (s.index, s.count)),
                    o.spec.ports.values().map(Vec::len).sum::<usize>()
                ))
                .collect::<Vec<_>>()
        ),
        Err(e) => panic!("{at}: incomplete ({e}) where a whole set must be read"),
    }
}

/// The write of `new` over `server` (shard slots `slots`) and its ops.
fn plan(server: &Server, new: &DesiredObjects<'_>, slots: u32) -> Vec<ObjectOp> {
    ops_over(
        &key(),
        &ObjectNaming::source(),
        Some(new),
        Prior {
            shards: slots,
            repair: false,
        },
        &Holds(server),
    )
    .unwrap()
    .ops
}

/// The slots the start-up list finds: the highest index + 1.
fn listed_slots(server: &Server) -> u32 {
    server
        .values()
        .map(|o| o.spec.shard.as_ref().map_or(0, |s| s.index) + 1)
        .max()
        .unwrap_or(1)
}

#[test]
fn readers_take_the_whole_old_or_the_whole_new_set_at_every_point_of_a_count_change() {
    // (old first node, old nodes, new first node, new nodes): with at
    // most 4 nodes per object, 1 object, 2 shards or 4.
    let cases = [
        ((0, 12), (0, 1)),  // 4 shards -> 1 object
        ((0, 6), (3, 2)),   // 2 -> 1
        ((0, 12), (20, 4)), // 4 -> 1, no node in common
        ((0, 1), (0, 12)),  // 1 -> 4
        ((0, 3), (5, 6)),   // 1 -> 2
        ((0, 12), (0, 6)),  // 4 -> 2
        ((0, 6), (0, 12)),  // 2 -> 4
        ((0, 12), (1, 12)), // 4 -> 4, other nodes
    ];
    for ((of, on), (nf, nn)) in cases {
        let old = service(of, on);
        let new = service(nf, nn);
        let before = desired_objects_with_limit(&old, &ObjectNaming::source(), LIMIT);
        let desired = lazy(&new);
        let (from, to) = (before.len() as u32, desired.len());
        let case = format!("{from} -> {to} objects");
        // Only a rewrite of shards in place (both sides sharded) has
        // moments that read "not complete yet".
        let incomplete = from > 1 && to > 1;
        let start: Server = before
            .iter()
            .map(|o| (o.metadata.name.clone().unwrap(), o.clone()))
            .collect();
        assert_eq!(check(&start, &old, &new, false, &case), "old");
        let ops = plan(&start, &desired, from);
        let mut seen = Vec::new();
        for k in 0..=ops.len() {
            let mut mid = start.clone();
            send(&mut mid, &desired, &ops[..k]);
            let at = format!("{case}, after {:?}", &show_ops(&ops[..k]));
            seen.push(check(&mid, &old, &new, incomplete, &at));
            // The write again from here: retried (the planner still
            // holds the old slots) or after a restart (the list's).
            for (how, slots) in [("retry", from), ("restart", listed_slots(&mid))] {
                let again = plan(&mid, &desired, slots);
                for j in 0..=again.len() {
                    let mut then = mid.clone();
                    send(&mut then, &desired, &again[..j]);
                    let at = format!("{at}, {how}: {:?}", show_ops(&again[..j]));
                    check(&then, &old, &new, incomplete, &at);
                    if j == again.len() {
                        assert_eq!(check(&then, &old, &new, false, &at), "new");
                        let names: Vec<&String> = then.keys().collect();
                        let want: Vec<String> = (0..to).map(|i| desired.name(i).1).collect();
                        assert_eq!(names, want.iter().collect::<Vec<_>>(), "{at}");
                    }
                }
            }
        }
        assert_eq!(seen.last(), Some(&"new"), "{case}");
        eprintln!("{case}: {:?} -> {seen:?}", show_ops(&ops));
    }
}

fn show_ops(ops: &[ObjectOp]) -> Vec<String> {
    show(&ObjectPlan {
        ops: ops.to_vec(),
        left_alone: Vec::new(),
    })
}
